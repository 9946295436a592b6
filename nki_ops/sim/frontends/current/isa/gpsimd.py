"""GpSimd instructions of the current API: ``local_gather``, ``sequence_bounds`` and ``topk``; their
semantics are in ``core/gpsimd.py``. The GpSimd engine reads and writes SBUF only."""

from __future__ import annotations

import numpy as np

from ....core import dtypes as dt
from ....core import gpsimd, memory, trace
from ....core.errors import KernelUsageError, MemorySpaceError
from ....core.instructions import GPSIMD, require_tile_operand
from .instruction import instruction
from .operands import _dst, _write


def _sbuf(x, api: str, arg: str) -> None:
    require_tile_operand(x, api, arg)
    if x.buffer is not memory.sbuf:
        raise MemorySpaceError(f"Expected operand '{arg}' of '{api}' to be in address space 'sbuf', but got a "
                               f"tensor in '{x.buffer.space}' instead (the GpSimd engine reads and writes SBUF)")


def _read(x, api: str, arg: str) -> np.ndarray:
    _sbuf(x, api, arg)
    values = memory.read(x, api, arg)
    return values.reshape(values.shape[0], -1)


@instruction
def local_gather(dst, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, name=None):
    """Gather within each GpSimd core's 16 partitions (see ``core.gpsimd.local_gather``); dst keeps
    src_buffer's dtype, indices are uint16."""
    api = "nisa.local_gather"
    _dst(dst, api)
    _sbuf(dst, api, "dst")
    if index.dtype != dt.uint16:
        raise KernelUsageError(f"{api}: index must be uint16, got {index.dtype}")
    if dst.dtype != src_buffer.dtype:
        raise KernelUsageError(f"{api}: dst ({dst.dtype}) must have src_buffer's dtype ({src_buffer.dtype}); "
                               f"local_gather does not cast")
    values = _read(src_buffer, api, "src_buffer")
    indices = _read(index, api, "index")
    if trace.listening:
        trace.engine(GPSIMD)
    result = gpsimd.local_gather(api, values, indices, int(num_elem_per_idx), num_valid_indices)
    if dst.shape[0] != result.shape[0] or dst.size != result.size:
        raise KernelUsageError(f"{api}: dst {list(dst.shape)} must hold {result.shape[0]} partitions of "
                               f"{result.shape[1]} gathered elements")
    _write(dst, result.reshape(dst.shape), api)


@instruction
def sequence_bounds(dst, segment_ids, name=None):
    """``dst [1, 2, n]``: each element's segment start and end (see ``core.gpsimd.sequence_bounds``)."""
    api = "nisa.sequence_bounds"
    _dst(dst, api)
    _sbuf(dst, api, "dst")
    for x, arg in ((segment_ids, "segment_ids"), (dst, "dst")):
        if x.dtype not in (dt.float32, dt.int32):
            raise KernelUsageError(f"{api}: {arg} must be float32 or int32, got {x.dtype}")
    ids = _read(segment_ids, api, "segment_ids")
    if ids.shape[0] != 1 or dst.shape[0] != 1:
        raise KernelUsageError(f"{api}: the partition size must be 1, got segment_ids {list(segment_ids.shape)} "
                               f"and dst {list(dst.shape)}")
    if dst.size != 2 * ids.size:
        raise KernelUsageError(f"{api}: dst {list(dst.shape)} must hold 2 x {ids.size} values ([1, 2, n])")
    if trace.listening:
        trace.engine(GPSIMD)
    _write(dst, gpsimd.sequence_bounds(api, ids[0]).reshape(dst.shape), api)


@instruction
def topk(val_dst, idx_dst, src, n, name=None):
    """The K largest bf16 values of each 16-partition snake, ascending, and their snake positions
    (uint32); K is val_dst's free size (see ``core.gpsimd.topk`` for the layouts)."""
    api = "nisa.topk"
    _dst(val_dst, api)
    _dst(idx_dst, api)
    _sbuf(val_dst, api, "val_dst")
    _sbuf(idx_dst, api, "idx_dst")
    for x, arg, dtype in ((src, "src", dt.bfloat16), (val_dst, "val_dst", dt.bfloat16),
                          (idx_dst, "idx_dst", dt.uint32)):
        if x.dtype != dtype:
            raise KernelUsageError(f"{api}: {arg} must be {dtype}, got {x.dtype}")
    values = dt.to_f32(_read(src, api, "src"))
    if val_dst.ndim != 2 or idx_dst.shape != val_dst.shape or val_dst.shape[0] != values.shape[0]:
        raise KernelUsageError(f"{api}: val_dst and idx_dst must both be [par_dim, K] with src's "
                               f"{values.shape[0]} partitions; got {list(val_dst.shape)} and {list(idx_dst.shape)}")
    if trace.listening:
        trace.engine(GPSIMD)
    top, positions, written = gpsimd.topk(api, values, int(n), val_dst.shape[1])
    # Slots outside the output snake keep what dst held.
    _write(val_dst, np.where(written, top, dt.to_f32(val_dst.data)), api)
    _write(idx_dst, np.where(written, positions, idx_dst.data.astype(np.int64)), api)
