"""GpSimd instructions of the current API: ``local_gather``, ``sequence_bounds`` and ``topk``; their rules are
``core/isa.py``'s, their semantics ``core/gpsimd.py``'s. The GpSimd engine reads and writes SBUF only."""

from __future__ import annotations

from ....core import isa
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
    isa.topk(Dst(val_dst, "nisa.topk"), Dst(idx_dst, "nisa.topk"), src, n)
