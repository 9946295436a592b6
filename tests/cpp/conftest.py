"""Shared builds for the C++ tests: compiling is slow, so each library is built once per session
into build/ (ninja and build.py's hash make later sessions reuse it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nki_ops.cpp import custom_op

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
TEST_BUILD_DIR = REPO_ROOT / "build" / "tests"


@pytest.fixture(scope="session")
def built_operators():
    """This project's operators, built (or found up to date) by build.py as `make test` does."""
    result = subprocess.run([sys.executable, str(REPO_ROOT / "build.py"), "--target", "cpu"],
                            capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def load_fixture(name: str, *, multicore: bool) -> None:
    folder = FIXTURES / name
    custom_op.load(name, sorted(str(p) for p in folder.glob("*.cpp") if p.name != "shape.cpp"),
                   [str(folder / "shape.cpp")], build_directory=str(TEST_BUILD_DIR), multicore=multicore)


@pytest.fixture(scope="session")
def published_giou():
    """The published multicore GIoU kernel (offset bugs included) as torch.ops.my_ops.giou."""
    load_fixture("published_giou", multicore=True)


@pytest.fixture(scope="session")
def faults():
    """Kernels that each break one device rule, as torch.ops.emulation_faults.*."""
    load_fixture("faults", multicore=True)


@pytest.fixture(scope="session")
def single_core():
    """Single-core kernels using streams, the standard accessor and the tensor library, as
    torch.ops.single_core_ops.*."""
    load_fixture("single_core", multicore=False)


# tryfirst: pytest-xdist reads the group marks in its own pytest_collection_modifyitems, which a worker may call
# before this one (then the C++ tests went to both workers, each building the same libraries).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Under pytest-xdist (``make test``) the C++ tests share build/tests: one worker runs them all, so no two
    processes build one library into it at once."""
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(item.fspath).resolve().parents:
            item.add_marker(pytest.mark.xdist_group("cpp-build"))
