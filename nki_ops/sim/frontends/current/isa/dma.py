"""The DMA instructions of the current API: ``dma_copy``, ``dma_compute``, ``dma_transpose`` and
``nc_stream_shuffle``."""

from __future__ import annotations

import warnings

import numpy as np

from ....core import dtypes as dt
from ....core import instructions, isa, memory
from ....core.errors import (
    KernelUsageError,
    OutOfBoundsError,
    SimulatorWarning,
    user_site,
)
from ....core.outputs import Dst, touch
from ....core.run import active_config
from . import constants
from .constants import (
    dge_mode,
    engine,
    oob_mode,
)
from .instruction import instruction

# ----------------------------------------------------------------------------------------- DMA

@instruction
def dma_copy(dst, src, priority=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown, engine=engine.unknown,
             name=None):
    """Copy ``src`` to ``dst`` (HBM <-> SBUF, HBM -> HBM, SBUF -> SBUF); a cast goes through fp32.
    Either side may be a gather/scatter access (``.ap(vector_offset=...)``): with ``oob_mode.skip``
    elements whose index falls outside the tensor are not transferred, else they are an error.
    ``priority`` (DMA class of service) and ``engine`` (which queue generates HWDGE descriptors) change
    timing only."""
    api = "nisa.dma_copy"
    _dma_priority(api, priority)
    hwdge = dge_mode == constants.dge_mode.hwdge
    if hwdge:
        _hwdge_target(api)
    if engine not in (constants.engine.unknown, constants.engine.dma):
        if engine not in (constants.engine.sync, constants.engine.scalar):
            raise KernelUsageError(f"{api}: engine must be nisa.engine.sync or nisa.engine.scalar (HWDGE "
                                   f"descriptor generation), got {engine!r}")
        if dge_mode != constants.dge_mode.hwdge:
            raise KernelUsageError(f"{api}: engine={engine!r} picks the HWDGE descriptor generator, so it needs "
                                   f"dge_mode=nisa.dge_mode.hwdge, got {dge_mode!r}")
    instructions.dma_operands(api, dst, src)
    isa.dma_copy(Dst(dst, api, on_chip=False), src, oob_mode, hwdge)


@instruction
def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=oob_mode.error, name=None):
    """``dst = srcs[0] * scales[0] + srcs[1] * scales[1] + ...`` in fp32 inside the DMA engines; with a
    scatter ``dst`` that one of the sources also reads this is a read-add-write. With an indirect
    (``vector_offset``) access ``unique_indices`` must be True, as the page states ("non-unique not
    yet supported")."""
    api = "nisa.dma_compute"
    if instructions.op_name(reduce_op) != "add":
        raise KernelUsageError(f"{api}: only reduce_op=nl.add is supported by the DMA engines")
    srcs = list(srcs)
    scales = [1.0] * len(srcs) if scales is None else list(scales)
    if len(scales) != len(srcs) or any(float(v) != 1.0 for v in scales):
        raise KernelUsageError(f"{api}: scales must be None or all 1.0, one per source; got {scales!r}")
    for src in srcs:
        instructions.dma_operands(api, dst, src)
        if src.size != dst.size:
            raise KernelUsageError(f"{api}: src {list(src.shape)} and dst {list(dst.shape)} element counts differ")
    indirect = [side for side in (*srcs, dst) if side.gathers]
    if indirect and not unique_indices:
        raise KernelUsageError(f"{api}: unique_indices must be True with an indirect (vector_offset) access, as "
                               f"non-unique indices are not supported yet; got unique_indices={unique_indices!r} "
                               f"with indirect '{indirect[0].name}'")
    Dst(dst, api, on_chip=False)
    moved = isa.dma_moved(indirect, dst.shape)
    if moved is not None and not moved.all() and oob_mode != constants.oob_mode.skip:
        raise OutOfBoundsError(f"{api}: an indirect access has indices outside its tensor; pass "
                               f"oob_mode=oob_mode.skip to drop them")
    touch(dst, *srcs)
    total = sum(dt.to_f32(s.data).reshape(dst.shape) for s in srcs)
    values = dt.cast(total, dst.dtype)
    if dst.gathers:
        dst.scatter(values, moved)
    else:
        np.copyto(dst.data, values, where=True if moved is None else moved)


@instruction
def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    """Within each 32-partition quadrant, ``dst[i] = src[shuffle_mask[i]]`` (partitions counted from each
    operand's first, so a 1-partition src can feed a quadrant); 255 leaves ``dst[i]`` as is."""
    isa.nc_stream_shuffle(Dst(dst, "nisa.nc_stream_shuffle"), src, shuffle_mask)


@instruction
def dma_transpose(dst, src, axes=None, priority=None, dge_mode=dge_mode.unknown, oob_mode=oob_mode.error,
                  name=None):
    """DMA transpose: axes (1, 0), (2, 1, 0) or (3, 1, 2, 0); the destination has the source's rank."""
    api = "nisa.dma_transpose"
    _dma_priority(api, priority)
    instructions.dma_operands(api, dst, src)
    Dst(dst, api, on_chip=False)
    if oob_mode == constants.oob_mode.skip and not _may_be_indirect(src):
        # The page's oob_mode: "oob_mode.skip ... Only valid when src uses indirect indexing."
        raise KernelUsageError(f"{api}: oob_mode=oob_mode.skip is valid only when src uses indirect indexing "
                               f"(.ap(vector_offset=...), vector_select, a dynamic select or scalar_offset); got "
                               f"'{src.name}' with static addresses (leave oob_mode at oob_mode.error)")
    _dma_transpose_lowering(api, src, dge_mode)
    touch(None, src)
    if dst.ndim != src.ndim:
        raise KernelUsageError(f"{api}: src rank {src.ndim} and dst rank {dst.ndim} must agree")
    result = instructions.dma_transpose(api, src.data, axes)
    if result.shape != dst.shape:
        raise KernelUsageError(f"{api}: transposed src has shape {list(result.shape)}, dst {list(dst.shape)}")
    values = instructions.dma_values(api, result, dst.shape, dst.dtype)
    moved = instructions.dma_transpose(api, src.valid, axes) if src.gathers else None
    if moved is None or moved.all():
        memory.write(dst, values, api)
    elif oob_mode != constants.oob_mode.skip:
        raise OutOfBoundsError(f"{api}: indirect access to '{src.name}' (shape {list(src.root.shape)}) has indices "
                               f"outside it; pass oob_mode=oob_mode.skip to drop them")
    else:  # the skipped rows keep what dst held
        memory.write(dst, values, api, mask=moved)


def _dma_transpose_lowering(api: str, src, mode) -> None:
    """The rules of the two lowerings the dma_transpose page lists: the hardware-DGE transpose (an
    explicit ``dge_mode=hwdge``) and the software-DGE gather transpose (a gathered ``src``). Both move
    2-byte elements, at most 128 along the last source dim. The default mode of a plain source may
    lower otherwise, so it is not checked."""
    if mode == constants.dge_mode.hwdge:
        if active_config().nc_version < 3:
            raise KernelUsageError(f"{api}: dge_mode=hwdge needs NeuronCore-v3 or newer; target is "
                                   f"{active_config().target}")
        rows = src.shape[0]
        if src.ndim == 2 and rows != 16:
            raise KernelUsageError(f"{api}: a hardware-DGE transpose of a 2-D src needs src.shape[0] == 16, got "
                                   f"{list(src.shape)}")
        if src.ndim > 2 and (rows not in (1, 2, 4, 8, 16) or rows * src.shape[-2] % 16):
            raise KernelUsageError(f"{api}: a hardware-DGE transpose of a {src.ndim}-D src needs src.shape[0] in "
                                   f"(1, 2, 4, 8, 16) and src.shape[0] * src.shape[-2] a multiple of 16, got "
                                   f"{list(src.shape)}")
    elif src.gathers:
        if mode not in (constants.dge_mode.unknown, constants.dge_mode.swdge):
            raise KernelUsageError(f"{api}: a gathered src transposes through the software DGE; dge_mode must be "
                                   f"unknown or swdge, got {mode!r}")
        if src.shape[0] % 16 or (src.ndim == 4 and 1 not in src.shape[1:3]):
            raise KernelUsageError(f"{api}: a gather transpose needs src.shape[0] a multiple of 16 (and a 4-D src "
                                   f"of size 1 in dim 1 or 2), got {list(src.shape)}")
    else:
        return
    if src.itemsize != 2 or src.shape[-1] > 128:
        raise KernelUsageError(f"{api}: this lowering moves 2-byte elements, at most 128 along the last src dim; "
                               f"got {src.dtype} of shape {list(src.shape)}")


def _dma_priority(api: str, priority) -> None:
    """The DMA quality-of-service level, 0 (highest) to 3; a hint that moves no byte differently. The
    dma_copy and dma_transpose pages: "(NeuronCore-v4+ only)"."""
    if priority is not None and (isinstance(priority, bool) or priority not in (0, 1, 2, 3)):
        raise KernelUsageError(f"{api}: priority must be an int 0-3 (lower is higher priority) or None, "
                               f"got {priority!r}")
    config = active_config()
    if priority is not None and config.nc_version < 4:
        raise KernelUsageError(f"{api}: priority (DMA quality of service) is available only on NeuronCore-v4 "
                               f"(trn3) and newer, so it must be None on target {config.target} (NeuronCore-v"
                               f"{config.nc_version}); got priority={priority!r}")


def _hwdge_target(api: str) -> None:
    """dma_copy page: "Hardware based DGE is only supported for NeuronCore-v3 or newer". A warning, not
    an error: AWS's kernel library (@d2ad3a5) passes dge_mode=hwdge unconditionally in mlp_tkg's
    gate/up projection (gate_up_projection_lhs_rhs_swap), a kernel with NeuronCore-v2 code paths whose
    tests are not excluded from trn1, so the compiler is not shown to refuse it there."""
    config = active_config()
    if config.nc_version < 3:
        warnings.warn(f"{user_site()}: {api}: dge_mode=hwdge needs NeuronCore-v3 (trn2) or newer per the API page; "
                      f"target is {config.target} (NeuronCore-v{config.nc_version}), which has no hardware DGE",
                      SimulatorWarning, stacklevel=3)


def _may_be_indirect(src) -> bool:
    """Whether ``src`` uses indirect indexing: a gather view (``.ap(vector_offset=...)``, ``vector_select``),
    a dynamic ``select``, or a ``.ap(scalar_offset=...)`` view."""
    return src.gathers or src.is_indirect() or src.runtime_offset
