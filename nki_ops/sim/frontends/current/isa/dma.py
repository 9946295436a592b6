"""The DMA instructions of the current API: ``dma_copy``, ``dma_compute``, ``dma_transpose`` and
``nc_stream_shuffle``; their rules and semantics are ``core/isa_dma.py``'s."""

from __future__ import annotations

from ....core import isa, isa_dma
from ....core.outputs import Dst
from . import constants
from .constants import dge_mode, engine, oob_mode
from .instruction import instruction


@instruction
def dma_copy(dst, src, priority=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown, engine=engine.unknown,
             name=None):
    """Copy ``src`` to ``dst`` (HBM <-> SBUF, HBM -> HBM, SBUF -> SBUF); a cast goes through fp32.
    Either side may be a gather/scatter access (``.ap(vector_offset=...)``): with ``oob_mode.skip``
    elements whose index falls outside the tensor are not transferred, else they are an error.
    ``priority`` (DMA class of service) and ``engine`` (which queue generates HWDGE descriptors) change
    timing only."""
    isa_dma.dma_copy(Dst(dst, "nisa.dma_copy", on_chip=False, later=True), src, priority, oob_mode, dge_mode, engine,
                     constants.dge_mode)


@instruction
def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=oob_mode.error, name=None):
    """``dst = srcs[0] * scales[0] + srcs[1] * scales[1] + ...`` in fp32 inside the DMA engines; with a
    scatter ``dst`` that one of the sources also reads this is a read-add-write. With an indirect
    (``vector_offset``) access ``unique_indices`` must be True, as the page states ("non-unique not
    yet supported")."""
    isa_dma.dma_compute(Dst(dst, "nisa.dma_compute", on_chip=False, later=True), srcs, reduce_op, scales,
                        unique_indices, oob_mode)


@instruction
def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    """Within each 32-partition quadrant, ``dst[i] = src[shuffle_mask[i]]`` (partitions counted from each
    operand's first, so a 1-partition src can feed a quadrant); 255 leaves ``dst[i]`` as is."""
    isa.nc_stream_shuffle(Dst(dst, "nisa.nc_stream_shuffle"), src, shuffle_mask)


@instruction
def dma_transpose(dst, src, axes=None, priority=None, dge_mode=dge_mode.unknown, oob_mode=oob_mode.error,
                  name=None):
    """DMA transpose: axes (1, 0), (2, 1, 0) or (3, 1, 2, 0); the destination has the source's rank."""
    isa_dma.dma_transpose(Dst(dst, "nisa.dma_transpose", on_chip=False, later=True), src, axes, priority, dge_mode,
                          oob_mode, constants.dge_mode)
