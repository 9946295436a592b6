"""GpSimd instructions of the current API: ``local_gather``, ``sequence_bounds`` and ``topk``; their
semantics are in ``core/gpsimd.py``. The GpSimd engine reads and writes SBUF only."""

from __future__ import annotations

import numpy as np

from ....core import dtypes as dt
from ....core import gpsimd, isa, trace
from ....core.errors import KernelUsageError
from ....core.instructions import GPSIMD
from ....core.outputs import Dst
from .instruction import instruction


@instruction
def local_gather(dst, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, name=None):
    """Gather within each GpSimd core's 16 partitions (see ``core.gpsimd.local_gather``); dst keeps
    src_buffer's dtype, indices are uint16."""
    isa.local_gather(Dst(dst, "nisa.local_gather"), src_buffer, index, num_elem_per_idx, num_valid_indices)


@instruction
def sequence_bounds(dst, segment_ids, name=None):
    """``dst [1, 2, n]``: each element's segment start and end (see ``core.gpsimd.sequence_bounds``)."""
    isa.sequence_bounds(Dst(dst, "nisa.sequence_bounds"), segment_ids)


@instruction
def topk(val_dst, idx_dst, src, n, name=None):
    """The K largest bf16 values of each 16-partition snake, ascending, and their snake positions
    (uint32); K is val_dst's free size (see ``core.gpsimd.topk`` for the layouts)."""
    api = "nisa.topk"
    values_out, index_out = Dst(val_dst, api), Dst(idx_dst, api)
    isa.sbuf_operand(val_dst, api, "val_dst")
    isa.sbuf_operand(idx_dst, api, "idx_dst")
    for x, arg, dtype in ((src, "src", dt.bfloat16), (val_dst, "val_dst", dt.bfloat16),
                          (idx_dst, "idx_dst", dt.uint32)):
        if x.dtype != dtype:
            raise KernelUsageError(f"{api}: {arg} must be {dtype}, got {x.dtype}")
    values = dt.to_f32(isa.gpsimd_read(values_out, src, "src"))
    if val_dst.ndim != 2 or idx_dst.shape != val_dst.shape or val_dst.shape[0] != values.shape[0]:
        raise KernelUsageError(f"{api}: val_dst and idx_dst must both be [par_dim, K] with src's "
                               f"{values.shape[0]} partitions; got {list(val_dst.shape)} and {list(idx_dst.shape)}")
    if trace.listening:
        trace.engine(GPSIMD)
    top, positions, written = gpsimd.topk(api, values, int(n), val_dst.shape[1])
    # Slots outside the output snake keep what dst held.
    values_out.put(np.where(written, top, dt.to_f32(val_dst.data)))
    index_out.put(np.where(written, positions, idx_dst.data.astype(np.int64)))
