"""Running an emulated custom op: ``torch.ops.<namespace>.<op>`` on CPU tensors.

Each op gets a CPU kernel (``torch.library``) that checks its arguments against the
device's limits, sizes the output by running the shape function on meta tensors, and
calls the op's generated entry point, which runs the compute function on one core or,
for a multicore library, once per core id (spread over host threads) sharing inputs and output.
In checked mode that happens in the library's worker process (``_worker``), so a kernel that
faults raises ``CustomOpError``; the fast mode calls the entry point in this process.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ._build import Metadata, OpInfo
from ._worker import Worker, WorkerFault

TCM_POOL_BYTES = 16 * 1024
DEVICE_CORE_COUNT = 8
MAX_ERROR_BYTES = 64 * 1024
OUTPUT_SPECS_KEPT = 256  # output sizes remembered per op, by argument shapes

# Dtype codes shared with neuron_emulation::ScalarType (cpp_ops/emulation/include/neuron_emulation/dtypes.hpp).
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.int32: 3, torch.int8: 4,
               torch.int16: 5, torch.uint8: 6}


class CustomOpError(RuntimeError):
    """An emulated custom op broke a device rule or faulted; the message names the op and the core, and the
    offending range or the signal."""


@dataclass(frozen=True)
class Options:
    """How emulated ops run. ``checks=False`` is the fast mode (no bounds, TCM-block or ownership checks)."""
    core_count: int = DEVICE_CORE_COUNT
    checks: bool = True
    tcm_pool_bytes: int = TCM_POOL_BYTES


_options = threading.local()


def _default_options() -> Options:
    return Options(checks=os.environ.get("NKI_OPS_CPP_CHECKS", "1") != "0")


def current_options() -> Options:
    return getattr(_options, "value", None) or _default_options()


@contextlib.contextmanager
def options(*, core_count: int | None = None, checks: bool | None = None, tcm_pool_bytes: int | None = None):
    """Run emulated ops in this block with other settings, e.g. ``options(core_count=3)`` or ``options(checks=False)``.

    ``core_count`` (default 8, as on a NeuronCore-v2) applies to multicore libraries; other values expose
    partitioning that assumes 8 cores. ``tcm_pool_bytes`` (default 16 KiB) shrinks or grows each core's pool.
    """
    previous = current_options()
    changes = {k: v for k, v in dict(core_count=core_count, checks=checks, tcm_pool_bytes=tcm_pool_bytes).items()
               if v is not None}
    if "core_count" in changes and not 1 <= changes["core_count"] <= 64:
        raise ValueError(f"core_count must be in [1, 64], got {changes['core_count']}")
    _options.value = replace(previous, **changes)
    try:
        yield _options.value
    finally:
        _options.value = previous


class _TensorDesc(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("sizes", ctypes.POINTER(ctypes.c_int64)), ("name", ctypes.c_char_p)]


class _ArgumentDesc(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("tensor", _TensorDesc), ("real", ctypes.c_double),
                ("integer", ctypes.c_int64)]


class _CallDesc(ctypes.Structure):
    _fields_ = [("op", ctypes.c_char_p), ("num_args", ctypes.c_int32), ("args", ctypes.POINTER(_ArgumentDesc)),
                ("out", _TensorDesc), ("multicore", ctypes.c_int32), ("core_count", ctypes.c_int32),
                ("checks", ctypes.c_int32), ("tcm_pool_bytes", ctypes.c_int64)]


def _describe_tensor(t: torch.Tensor, name: str) -> _TensorDesc:
    sizes = (ctypes.c_int64 * max(1, t.dim()))(*t.shape)
    desc = _TensorDesc(t.data_ptr(), DTYPE_CODES[t.dtype], t.dim(), sizes, name.encode())
    desc._keep = sizes  # the sizes array must outlive the call
    return desc


def check_device_tensor(op: str, name: str, t: torch.Tensor) -> None:
    """The dtype and rank limits of GpSimd custom-op tensors."""
    if t.dtype not in DTYPE_CODES:
        supported = ", ".join(str(d).removeprefix("torch.") for d in DTYPE_CODES)
        raise CustomOpError(f"{op}: {name} has dtype {t.dtype}; GpSimd custom ops support {supported}")
    if t.device.type not in ("cpu", "meta"):
        raise CustomOpError(f"{op}: {name} is on {t.device}; the CPU emulation runs on CPU tensors")
    if t.dim() > 8 or (t.dim() > 4 and max(t.shape, default=0) > 65535) or max(t.shape, default=0) > 2**32 - 1:
        raise CustomOpError(f"{op}: {name} has shape {tuple(t.shape)}; the device allows up to 8 dims of "
                            "at most 65535 each, or up to 4 dims of at most 4294967295")


class EmulatedOp:
    """The CPU kernel of one op: validate, size the output with the shape function, run the compute function."""

    def __init__(self, info: OpInfo, compute_library: ctypes.CDLL, multicore: bool, worker: Worker, index: int):
        self.info = info
        self.worker = worker
        self.index = index  # in the library's op table, which the worker takes ops by
        self.qualified_name = f"{info.namespace}::{info.op}"
        self.multicore = multicore
        self.schema = torch._C.parse_schema(info.schema)
        self.entry = getattr(compute_library, f"neuron_emulation_call_{info.op}")
        self.entry.restype = ctypes.c_int
        self.entry.argtypes = [ctypes.POINTER(_CallDesc), ctypes.c_char_p, ctypes.c_size_t]
        self.shape_function = getattr(getattr(torch.ops, info.namespace), info.op).default
        self._output_specs: collections.OrderedDict[tuple, tuple[torch.Size, torch.dtype]] = collections.OrderedDict()

    def output_spec(self, args: tuple) -> tuple[torch.Size, torch.dtype]:
        """Sizes and dtype of the output, from the shape function run on meta tensors (it must not read data)."""
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        spec = self._output_specs.get(key)
        if spec is None:
            meta_args = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
            shape = self.shape_function(*meta_args)
            check_device_tensor(self.qualified_name, "the shape function's output", shape)
            spec = self._output_specs[key] = (shape.shape, shape.dtype)
            if len(self._output_specs) > OUTPUT_SPECS_KEPT:
                self._output_specs.popitem(last=False)
        return spec

    def __call__(self, *args):
        if len(args) != len(self.schema.arguments):
            raise CustomOpError(f"{self.qualified_name} takes {len(self.schema.arguments)} arguments, got {len(args)}")
        arguments = []  # (kind, value, name) as neuron_emulation::ArgumentKind takes them
        for i, (arg, declared) in enumerate(zip(args, self.schema.arguments)):
            if isinstance(arg, torch.Tensor):
                # Schemas inferred from a shape function's C++ signature name arguments _0, _1, ...
                name = f"input {i}" if declared.name == f"_{i}" else f"input '{declared.name}'"
                check_device_tensor(self.qualified_name, name, arg)
                arguments.append((0, arg.contiguous(), name))
            elif str(declared.type) == "int":
                arguments.append((2, int(arg), None))
            else:
                arguments.append((1, float(arg), None))
        sizes, dtype = self.output_spec(args)
        out = torch.empty(sizes, dtype=dtype)
        settings = current_options()
        core_count = settings.core_count if self.multicore else 1
        if settings.checks:
            try:
                error = self.worker.call(self.index, self.qualified_name, arguments, out, multicore=self.multicore,
                                         core_count=core_count, tcm_pool_bytes=settings.tcm_pool_bytes,
                                         error_bytes=MAX_ERROR_BYTES)
            except WorkerFault as fault:
                raise CustomOpError(str(fault)) from None
            if error is not None:
                raise CustomOpError(error)
            return out
        descs = (_ArgumentDesc * max(1, len(arguments)))()
        for desc, (kind, value, name) in zip(descs, arguments):
            desc.kind = kind
            if kind == 0:
                desc.tensor = _describe_tensor(value, name)
            elif kind == 1:
                desc.real = value
            else:
                desc.integer = value
        call = _CallDesc(self.qualified_name.encode(), len(arguments), descs, _describe_tensor(out, "the output"),
                         int(self.multicore), core_count, 0, settings.tcm_pool_bytes)
        error = ctypes.create_string_buffer(MAX_ERROR_BYTES)
        if self.entry(ctypes.byref(call), error, MAX_ERROR_BYTES) != 0:
            raise CustomOpError(error.value.decode(errors="replace"))
        return out


# Libraries registered in this process, by namespace: torch allows one definition of each.
_LOADED: dict[str, tuple[Path, list]] = {}


def register(shape_path: Path, compute_path: Path, metadata: Metadata) -> None:
    """Load a built library pair and give each op a CPU kernel. Loading the same library again does nothing."""
    namespaces = {info.namespace for info in metadata.ops}
    compute_path = compute_path.resolve()
    for namespace in namespaces:
        if namespace in _LOADED:
            if _LOADED[namespace][0] == compute_path:
                return
            raise CustomOpError(f"the namespace {namespace!r} is already registered in this process by "
                                f"{_LOADED[namespace][0]}; give the other library's NEURON_LIBRARY another namespace")
    if not any(hasattr(getattr(torch.ops, ns), info.op) for ns in namespaces for info in metadata.ops):
        torch.ops.load_library(str(shape_path))
    compute_library = ctypes.CDLL(str(compute_path))
    worker = Worker(compute_path, DTYPE_CODES)
    libraries = []
    for index, info in enumerate(metadata.ops):
        library = torch.library.Library(info.namespace, "IMPL")
        library.impl(info.op, EmulatedOp(info, compute_library, metadata.multicore, worker, index), "CPU")
        libraries.append(library)
    for namespace in namespaces:
        _LOADED[namespace] = (compute_path, libraries)
