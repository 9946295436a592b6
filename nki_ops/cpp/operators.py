"""This project's C++ operators (``cpp_ops/``): what each library is built from, and loading the built one.

``python build.py`` builds them into ``build/<target>/lib<name>.so`` (``NKI_OPS_BUILD_DIR``
overrides ``build/``); the op backends load them from there through ``custom_op.load_library``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from . import custom_op
from ._build import CPP_OPS_ROOT, archive_path

REPO_ROOT = CPP_OPS_ROOT.parent


@dataclass(frozen=True)
class LibrarySpec:
    name: str
    namespace: str
    compute_srcs: tuple[Path, ...]
    shape_srcs: tuple[Path, ...]
    multicore: bool


LIBRARIES = {
    "giou": LibrarySpec("giou", "nki_ops_giou",
                        (CPP_OPS_ROOT / "giou" / "giou.cpp", CPP_OPS_ROOT / "giou" / "giou_backward.cpp"),
                        (CPP_OPS_ROOT / "giou" / "shape.cpp",), multicore=True),
    "nms": LibrarySpec("nms", "nki_ops_nms", (CPP_OPS_ROOT / "nms" / "nms.cpp",), (CPP_OPS_ROOT / "nms" / "shape.cpp",),
                       multicore=False),
}


def host_target() -> str:
    """"neuron" on a Neuron host (the GpSimd toolchain builds for the device), else "cpu" (the emulation)."""
    return "neuron" if custom_op.neuron_custom_op() is not None else "cpu"


def build_directory(target: str | None = None) -> Path:
    root = Path(os.environ.get("NKI_OPS_BUILD_DIR", REPO_ROOT / "build"))
    return root / (target or host_target())


def unavailable_reason(name: str) -> str | None:
    """None when ``lib<name>.so`` is built for this host, else what to run."""
    path = archive_path(build_directory(), name)
    if not path.is_file():
        return f"the C++ library {name} is not built ({path} is missing): run `python build.py --ops {name}`"
    return None


_loaded: dict[str, object] = {}


def load(name: str):
    """Load (once per process) and return ``torch.ops.<namespace>`` of one of this project's built libraries."""
    import torch

    if name in _loaded:
        return _loaded[name]
    reason = unavailable_reason(name)
    if reason is not None:
        raise FileNotFoundError(reason)
    spec = LIBRARIES[name]
    custom_op.load_library(str(archive_path(build_directory(), name)))
    _loaded[name] = getattr(torch.ops, spec.namespace)
    return _loaded[name]
