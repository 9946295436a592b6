"""build.py (rebuilds only what changed or was damaged, reports errors with file:line and a non-zero exit,
one run per build folder at a time), loading archives safely, and the hand-over of custom_op to
torch-neuronx on a Neuron host."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types

import pytest
import torch

import build
from nki_ops.cpp import _build, custom_op
from nki_ops.cpp.operators import LIBRARIES, LibrarySpec, build_directory

from .conftest import REPO_ROOT

pytestmark = pytest.mark.cpp


def test_unchanged_libraries_are_not_rebuilt(built_operators):
    result = subprocess.run([sys.executable, "build.py", "--target", "cpu"], capture_output=True, text=True,
                            cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("up to date") == len(LIBRARIES), result.stdout


def test_build_failure_prints_file_line_and_command_and_exits_non_zero(tmp_path, monkeypatch, capsys):
    source = tmp_path / "broken.cpp"
    source.write_text("#include <torch/torch.h>\n\ntorch::Tensor broken(const torch::Tensor& x) {\n  return x +;\n}\n")
    monkeypatch.setitem(build.LIBRARIES, "broken", LibrarySpec("broken", "broken_ops", (source,), (source,), False))
    monkeypatch.setenv("NKI_OPS_BUILD_DIR", str(tmp_path / "build"))
    assert build.main(["--target", "cpu", "--ops", "broken"]) == 1
    err = capsys.readouterr().err
    assert f"{source}:4:" in err and "error" in err
    assert "failing command:" in err and str(source) in err
    assert "build.py: failed: broken" in err


def test_neuron_target_needs_a_neuron_host(capsys):
    if custom_op.neuron_custom_op() is not None:
        pytest.skip("this host has torch-neuronx")
    assert build.main(["--target", "neuron"]) == 2
    assert "--target neuron needs a Neuron host" in capsys.readouterr().err


def test_custom_op_hands_over_to_torch_neuronx_when_present(monkeypatch):
    calls = []
    real = types.SimpleNamespace(load=lambda **kwargs: calls.append(("load", kwargs)),
                                 load_library=lambda path, verbose=False: calls.append(("load_library", path)))
    monkeypatch.setattr(custom_op, "neuron_custom_op", lambda: real)
    custom_op.load("relu", ["relu.cpp"], ["shape.cpp"], build_directory="/tmp/x", multicore=True)
    custom_op.load_library("librelu.so")
    assert calls == [("load", dict(name="relu", compute_srcs=["relu.cpp"], shape_srcs=["shape.cpp"], extra_cflags=[],
                                   extra_include_paths=[], build_directory="/tmp/x", multicore=True, verbose=False)),
                     ("load_library", "librelu.so")]


@pytest.mark.neuron
def test_giou_operator_on_a_neuron_device(tmp_path):
    import torch_xla.core.xla_model as xm

    from nki_ops.ops.giou.reference import giou_reference
    from nki_ops.workloads import giou_workload

    spec = LIBRARIES["giou"]
    custom_op.load("giou", [str(s) for s in spec.compute_srcs], [str(s) for s in spec.shape_srcs],
                   build_directory=str(tmp_path), multicore=True)
    boxes1, boxes2 = giou_workload(16, 256)
    device = xm.xla_device()
    got = torch.ops.nki_ops_giou.giou(boxes1.to(device), boxes2.to(device))
    xm.mark_step()
    torch.testing.assert_close(got.cpu(), giou_reference(boxes1, boxes2), rtol=1e-6, atol=1e-6)


def test_missing_build_says_what_to_run_and_auto_uses_torch(tmp_path, monkeypatch):
    import nki_ops
    from nki_ops._backends import BackendUnavailableError, availability

    monkeypatch.setenv("NKI_OPS_BUILD_DIR", str(tmp_path))
    assert "run `python build.py --ops giou`" in availability("giou")["cpp"]
    boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    assert nki_ops.giou(boxes, boxes).item() == 1.0
    with pytest.raises(BackendUnavailableError, match="the C\\+\\+ library giou is not built"):
        nki_ops.giou(boxes, boxes, backend="cpp")


def copy_of_nms_build(root):
    """The built nms library (archive, stamp, ninja folder) under ``root``/cpu, to damage without harm."""
    source, copy = build_directory("cpu"), root / "cpu"
    copy.mkdir(parents=True)
    for name in ("libnms.so", "libnms.hash"):
        shutil.copy2(source / name, copy / name)
    shutil.copytree(source / "nms.emulation", copy / "nms.emulation")  # copy2 keeps mtimes: ninja has nothing to do
    return copy


def run_build(root, *args, **kwargs):
    return subprocess.Popen([sys.executable, "build.py", "--target", "cpu", "--ops", "nms", *args], cwd=REPO_ROOT,
                            env={**os.environ, "NKI_OPS_BUILD_DIR": str(root)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def test_a_second_build_of_one_folder_waits_for_the_first(built_operators, tmp_path):
    copy_of_nms_build(tmp_path)
    with open(tmp_path / ".cpu.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as a running build.py holds it
        waiting = run_build(tmp_path)
        first_line = waiting.stderr.readline()
        assert first_line == f"build.py: waiting for another build.py to finish with {tmp_path / 'cpu'}\n"
        assert waiting.poll() is None, "build.py went on while another build held the folder's lock"
    out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, err
    assert "nms    cpu: up to date" in out


def test_a_damaged_library_is_rebuilt_not_reported_up_to_date(built_operators, tmp_path):
    copy = copy_of_nms_build(tmp_path)
    archive = copy / "libnms.so"
    archive.write_bytes(archive.read_bytes()[:500_000])  # truncated
    compute = copy / "nms.emulation" / "compute" / "libnmscustomop.so"
    damaged = bytearray(compute.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    compute.write_bytes(damaged)
    result = run_build(tmp_path)
    out, err = result.communicate(timeout=300)
    assert result.returncode == 0, err
    assert (f"build.py: {archive} does not have the SHA-256 recorded when it was built (truncated or modified since): "
            "building it again") in err
    assert "nms    cpu: built" in out
    stamp = json.loads((copy / "libnms.hash").read_text())
    assert stamp["sha256"] == _build.file_sha256(archive)
    # The damaged compute library was relinked, and the new archive packs it.
    assert compute.read_bytes() != damaged and stamp["linked"][compute.name] == _build.file_sha256(compute)
    folder = _build.unpack(archive)[0]
    assert (folder / compute.name).read_bytes() == compute.read_bytes()


def repacked(archive, tmp_path, change):
    """A copy of ``archive`` with ``change(members)`` applied, packed with ar as pack() does."""
    members = _build.read_archive(archive.read_bytes(), archive)
    change(members)
    staging = tmp_path / "staging"
    staging.mkdir()
    for name, content in members.items():
        (staging / name).write_bytes(content)
    copy = tmp_path / archive.name
    subprocess.run(["ar", "rcD", str(copy), *members], cwd=staging, check=True, capture_output=True)
    return copy


def test_a_corrupted_library_inside_an_archive_is_refused_before_loading(built_operators, tmp_path):
    def corrupt_compute_library(members):
        compute = next(name for name in members if name.endswith("customop.so"))
        content = bytearray(members[compute])
        content[64:4096] = bytes(4096 - 64)  # the ELF program headers: loading this could crash
        members[compute] = bytes(content)

    damaged = repacked(build_directory("cpu") / "libnms.so", tmp_path, corrupt_compute_library)
    with pytest.raises(ValueError, match=rf"{damaged} is corrupted: libnmscustomop.so does not match the SHA-256 "
                                         r"recorded when it was packed"):
        custom_op.load_library(str(damaged))


def test_a_truncated_archive_is_refused(built_operators, tmp_path):
    truncated = tmp_path / "libnms.so"
    truncated.write_bytes((build_directory("cpu") / "libnms.so").read_bytes()[:100_000])
    with pytest.raises(ValueError, match=rf"{truncated} is truncated: a member of \d+ bytes at byte \d+ has only"):
        custom_op.load_library(str(truncated))


@pytest.fixture
def private_tmpdir(tmp_path, monkeypatch):
    """A temporary directory of the test's own (sticky, like /tmp), where the extraction folder goes."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp / f"nki-ops-custom-ops-{os.geteuid()}"


def test_an_extraction_folder_of_another_user_is_refused(built_operators, private_tmpdir):
    if os.geteuid() != 0:
        pytest.skip("making a folder of another user's needs root")
    private_tmpdir.mkdir(mode=0o700)
    os.chown(private_tmpdir, 65534, 65534)
    with pytest.raises(PermissionError, match=rf"refusing to load custom-op libraries through {private_tmpdir}: it "
                                              r"belongs to uid 65534, not to this user \(uid 0\)"):
        custom_op.load_library(str(build_directory("cpu") / "libnms.so"))
    assert list(private_tmpdir.iterdir()) == []


def test_a_world_writable_extraction_folder_is_refused(built_operators, private_tmpdir):
    private_tmpdir.mkdir()
    private_tmpdir.chmod(0o777)
    with pytest.raises(PermissionError, match=rf"refusing to load custom-op libraries through {private_tmpdir}: its "
                                              r"mode is 0777, so other users can write to it"):
        custom_op.load_library(str(build_directory("cpu") / "libnms.so"))
    assert list(private_tmpdir.iterdir()) == []


def test_archives_are_extracted_into_a_private_folder_and_checked(built_operators, private_tmpdir):
    archive = build_directory("cpu") / "libnms.so"
    private_tmpdir.mkdir(mode=0o755)  # as earlier versions left it: ours, readable by others
    private_tmpdir.chmod(0o755)
    folder, metadata = _build.unpack(archive)
    assert folder.parent == private_tmpdir and private_tmpdir.stat().st_mode & 0o777 == 0o700
    assert folder.stat().st_mode & 0o777 == 0o700
    compute = folder / metadata.compute_library
    assert _build.file_sha256(compute) == metadata.sha256[metadata.compute_library]
    compute.write_bytes(b"not what the archive holds")  # a damaged extraction is replaced, not loaded
    assert _build.unpack(archive)[0] == folder
    assert _build.file_sha256(compute) == metadata.sha256[metadata.compute_library]
