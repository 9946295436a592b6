"""The DMA instructions in the one calling convention (``core/outputs.py``): ``dma_copy`` (both generations,
one representation of a gather's out-of-range elements: ``valid``), ``dma_transpose``, and the current API's
``dma_compute``, with the argument rules the current pages add (``priority``, ``dge_mode``, ``engine``)."""

from __future__ import annotations

import warnings

import numpy as np

from . import dtypes as dt
from . import instructions as ins
from . import memory, replay, trace
from . import run as _run
from .enums import ENGINE, OOB_MODE
from .errors import KernelUsageError, MemorySpaceError, OutOfBoundsError, SimulatorWarning, UnsupportedError, user_site
from .instructions import op_name
from .memory import hbm_values, read
from .outputs import touch
from .run import active_config, unfit
from .tensors import Access, mask_for

ERROR, SKIP = OOB_MODE["error"], OOB_MODE["skip"]
_DMA_QUEUES = (ENGINE["unknown"], ENGINE["dma"])  # the engine values that pick no HWDGE descriptor generator
_HWDGE_ENGINES = (ENGINE["sync"], ENGINE["scalar"])


def dma_moved(indirect, shape) -> np.ndarray | None:
    """Which elements a DMA moves: all (None) unless one of its ``indirect`` sides (a legacy access with
    indirect axes, a current gather view) has runtime indices outside its tensor (``valid`` False there)."""
    if not indirect:
        return None
    moved = np.ones(tuple(shape), bool)
    for side in indirect:
        moved &= side.valid.reshape(tuple(shape))
    return moved


def dma_copy_legacy(out, src, dst_rmw_op=None, oob_mode=0):
    """The legacy ``dma_copy``: ``dst`` (``out.dst``, HBM or SBUF) receives ``src``; ``dst_rmw_op=np.add``
    accumulates. With ``oob_mode=skip``, elements whose runtime (indirect) index is out of range are not
    moved (``dma_moved``): a gather leaves those destination rows as they were, a scatter does not write
    them."""
    api, dst = out.api, out.dst
    ins.dma_operands(api, dst, src)
    selected = out.selected
    if oob_mode == SKIP:
        if dst_rmw_op is not None:
            raise KernelUsageError(f"{api}: with dst_rmw_op only oob_mode=oob_mode.error is allowed")
        moved = dma_moved([x for x in (src, dst) if isinstance(x, Access) and x.indirect], dst.shape)
        if moved is not None:
            if tuple(src.shape) != tuple(dst.shape):
                raise UnsupportedError(f"nki.isa.dma_copy(oob_mode=skip) between shapes {list(src.shape)} and "
                                       f"{list(dst.shape)}", "give src and dst the same shape")
            selected = moved if selected is None else moved & mask_for(selected, moved.shape)
    elif oob_mode != ERROR:
        raise KernelUsageError(f"{api}: oob_mode must be oob_mode.error or oob_mode.skip, got {oob_mode!r}")
    values = hbm_values(src, selected) if not src.buffer.on_chip else read(src, api, "src", selected)
    if values.size != int(np.prod(dst.shape)):
        raise KernelUsageError(f"{api}: element counts differ: src {list(values.shape)} vs dst {list(dst.shape)}")
    values = values.reshape(dst.shape)
    if dst_rmw_op is not None:
        _, fn, _ = ins.alu_op(dst_rmw_op, api)
        current = hbm_values(dst, selected) if not dst.buffer.on_chip else read(dst, api, "dst", selected)
        values = fn(dt.to_f32(current), dt.to_f32(values))
    return out.put(dt.to_f32(values) if dst.dtype != values.dtype else values, where=selected)


def dma_copy(out, src, priority=None, oob_mode=0, dge_mode=0, engine=0, modes=None):
    """The current ``dma_copy``: ``src`` to dst (HBM <-> SBUF, HBM -> HBM, SBUF -> SBUF); a cast goes through
    fp32 (``dge_mode=hwdge``: the hardware DGE moves raw bytes, no cast). Either side may be a gather/scatter
    view: with ``oob_mode.skip`` the elements whose index falls outside its tensor are not transferred
    (``dma_moved``), else they are an error. ``priority`` (DMA class of service) and ``engine`` (which queue
    generates HWDGE descriptors) change timing only. ``modes``: the front end's ``dge_mode`` enum. ``out``
    is a ``Dst(..., later=True)``, checked after the argument rules."""
    api, dst = out.api, out.dst
    dma_priority(api, priority)
    hwdge = dge_mode == modes.hwdge
    if hwdge:
        _hwdge_target(api)
    if engine not in _DMA_QUEUES:
        if engine not in _HWDGE_ENGINES:
            raise KernelUsageError(f"{api}: engine must be nisa.engine.sync or nisa.engine.scalar (HWDGE "
                                   f"descriptor generation), got {engine!r}")
        if not hwdge:
            raise KernelUsageError(f"{api}: engine={engine!r} picks the HWDGE descriptor generator, so it needs "
                                   f"dge_mode=nisa.dge_mode.hwdge, got {dge_mode!r}")
    ins.dma_operands(api, dst, src)
    out.check()
    if (src.dtype.names or dst.dtype.names) and src.dtype != dst.dtype:
        raise KernelUsageError(f"{api}: packed dtypes move without a cast; got {src.dtype} -> {dst.dtype}")
    if hwdge and src.dtype != dst.dtype:
        # NKI 0.3.0 migration guide: "source and destination element types must match when using
        # dge_mode=dge_mode.hwdge" (the hardware DGE moves raw bytes; swdge/none cast).
        raise KernelUsageError(f"{api}: dge_mode=hwdge moves raw bytes, so src and dst must have the same dtype; "
                               f"got src {src.dtype} -> dst {dst.dtype} (reinterpret one side with .view(), or "
                               f"cast with dge_mode=swdge or none)")
    if src.size != dst.size:
        raise KernelUsageError(f"{api}: element counts differ: src {list(src.shape)} vs dst {list(dst.shape)}")
    moved = dma_moved([side for side in (src, dst) if side.gathers], dst.shape) if src.gathers or dst.gathers else None
    if moved is not None and not moved.all() and oob_mode != SKIP:
        bad = next(side for side in (src, dst) if side.gathers and not side.valid.all())
        raise OutOfBoundsError(f"{api}: indirect access to '{bad.name}' (shape {list(bad.root.shape)}) has indices "
                               f"outside it; pass oob_mode=oob_mode.skip to drop them")
    if _run.recordings:
        _move_form(dst, src, moved)
        return replay.tail(_move, api, dst, src, moved)
    return _move(api, dst, src, moved)


def _move(api: str, dst, src, moved):
    """``dma_copy``'s transfer, its operands checked: ``src`` into ``dst`` where ``moved`` holds (None: all)."""
    values = src.data.reshape(dst.shape)
    if not dst.dtype.names:
        values = dt.cast(ins.dma_values(api, values, dst.shape, dst.dtype), dst.dtype)
    touch(dst, src)
    if trace.listening:
        trace.write(dst, api)
    if dst.gathers:
        dst.scatter(values, moved)
        return dst
    if moved is None or moved.all():
        dst.overwrite_all()
        dst.data[...] = values
    else:
        np.copyto(dst.data, values, where=moved)
    if dst.unset is not None:
        dst.unset[... if moved is None else moved] = False
    return dst


def _move_form(dst, src, moved) -> None:
    """``_move``'s array form (``replay.form``): a copy, through fp32 when it casts (``dma_values``)."""
    if dst.gathers or moved is not None or dst.dtype.names:
        return
    try:
        values = np.reshape(replay.array_of(src), dst.shape, copy=False)
    except ValueError:  # the reshape copies: the values would be the recorded call's
        return
    if src.dtype == dst.dtype:
        replay.form(replay.fill, replay.array_of(dst), values, writes=(dst,))
    else:
        replay.form(_cast, replay.array_of(dst), values, dst.dtype, writes=(dst,))


@replay.copies
def _cast(dst: np.ndarray, values: np.ndarray, dtype) -> None:
    dst[...] = dt.cast(dt.to_f32(values), dtype)


def dma_compute(out, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=0):
    """``dst = srcs[0] * scales[0] + srcs[1] * scales[1] + ...`` in fp32 inside the DMA engines; with a
    scatter ``dst`` that one of the sources also reads this is a read-add-write. With an indirect
    (``vector_offset``) access ``unique_indices`` must be True, as the page states ("non-unique not
    yet supported"). ``out``: a ``Dst(..., later=True)``."""
    api, dst = out.api, out.dst
    if op_name(reduce_op) != "add":
        raise KernelUsageError(f"{api}: only reduce_op=nl.add is supported by the DMA engines")
    srcs = list(srcs)
    scales = [1.0] * len(srcs) if scales is None else list(scales)
    if len(scales) != len(srcs) or any(float(v) != 1.0 for v in scales):
        raise KernelUsageError(f"{api}: scales must be None or all 1.0, one per source; got {scales!r}")
    for src in srcs:
        ins.dma_operands(api, dst, src)
        if src.size != dst.size:
            raise KernelUsageError(f"{api}: src {list(src.shape)} and dst {list(dst.shape)} element counts differ")
    indirect = [side for side in (*srcs, dst) if side.gathers]
    if indirect and not unique_indices:
        raise KernelUsageError(f"{api}: unique_indices must be True with an indirect (vector_offset) access, as "
                               f"non-unique indices are not supported yet; got unique_indices={unique_indices!r} "
                               f"with indirect '{indirect[0].name}'")
    out.check()
    moved = dma_moved(indirect, dst.shape)
    if moved is not None and not moved.all() and oob_mode != SKIP:
        raise OutOfBoundsError(f"{api}: an indirect access has indices outside its tensor; pass "
                               f"oob_mode=oob_mode.skip to drop them")
    touch(dst, *srcs)
    total = sum(dt.to_f32(s.data).reshape(dst.shape) for s in srcs)
    values = dt.cast(total, dst.dtype)
    if dst.gathers:
        dst.scatter(values, moved)
    else:
        np.copyto(dst.data, values, where=True if moved is None else moved)
    return dst


def dma_transpose(out, src, axes=None, priority=None, dge_mode=0, oob_mode=0, modes=None):
    """DMA transpose with axes (1, 0), (2, 1, 0) or (3, 1, 2, 0), by default the one of src's rank: the legacy
    API's ``src`` (HBM or SBUF) into a new SBUF tile; the current API's into dst (a ``Dst(..., later=True)``)
    of the source's rank, where ``priority``, the lowering's rules (``dge_mode``, ``modes`` the front end's
    ``dge_mode`` enum) and ``oob_mode`` (skip: a gathered source's out-of-range rows keep dst's values)
    apply."""
    api, dst = out.api, out.dst
    if not out.current:
        if out.selected is not None:
            raise UnsupportedError("nki.isa.dma_transpose with a mask")
        if src.buffer is memory.psum:
            raise MemorySpaceError(f"Expected operand 'src' of '{api}' to be in address space 'hbm|sbuf', but got "
                                   f"a tile in 'psum' instead")
        values = hbm_values(src, None) if not src.buffer.on_chip else read(src, api, "src")
        return out.put(np.ascontiguousarray(ins.dma_transpose(api, values, axes)), src.dtype, where=None)
    dma_priority(api, priority)
    ins.dma_operands(api, dst, src)
    out.check()
    if oob_mode == SKIP and not (src.gathers or src.is_indirect() or src.runtime_offset):
        # The page's oob_mode: "oob_mode.skip ... Only valid when src uses indirect indexing" (a gather view,
        # .ap(vector_offset=...) or vector_select, a dynamic select, or a .ap(scalar_offset=...) view).
        raise KernelUsageError(f"{api}: oob_mode=oob_mode.skip is valid only when src uses indirect indexing "
                               f"(.ap(vector_offset=...), vector_select, a dynamic select or scalar_offset); got "
                               f"'{src.name}' with static addresses (leave oob_mode at oob_mode.error)")
    _transpose_lowering(api, src, dge_mode, modes)
    touch(None, src)
    if dst.ndim != src.ndim:
        raise KernelUsageError(f"{api}: src rank {src.ndim} and dst rank {dst.ndim} must agree")
    result = ins.dma_transpose(api, src.data, axes)
    if result.shape != dst.shape:
        raise KernelUsageError(f"{api}: transposed src has shape {list(result.shape)}, dst {list(dst.shape)}")
    values = ins.dma_values(api, result, dst.shape, dst.dtype)
    moved = ins.dma_transpose(api, src.valid, axes) if src.gathers else None
    if moved is None or moved.all():
        memory.write(dst, values, api)
    elif oob_mode != SKIP:
        raise OutOfBoundsError(f"{api}: indirect access to '{src.name}' (shape {list(src.root.shape)}) has indices "
                               f"outside it; pass oob_mode=oob_mode.skip to drop them")
    else:  # the skipped rows keep what dst held
        memory.write(dst, values, api, mask=moved)
    return dst


def _transpose_lowering(api: str, src, mode, modes) -> None:
    """The rules of the two lowerings the dma_transpose page lists: the hardware-DGE transpose (an
    explicit ``dge_mode=hwdge``) and the software-DGE gather transpose (a gathered ``src``). Both move
    2-byte elements, at most 128 along the last source dim. The default mode of a plain source may
    lower otherwise, so it is not checked."""
    if mode == modes.hwdge:
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
        if mode not in (modes.unknown, modes.swdge):
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


def dma_priority(api: str, priority) -> None:
    """The DMA quality-of-service level, 0 (highest) to 3; a hint that moves no byte differently. The
    dma_copy and dma_transpose pages: "(NeuronCore-v4+ only)"."""
    if priority is None:
        return
    if isinstance(priority, bool) or priority not in (0, 1, 2, 3):
        raise KernelUsageError(f"{api}: priority must be an int 0-3 (lower is higher priority) or None, "
                               f"got {priority!r}")
    config = active_config()
    if config.nc_version < 4:
        raise KernelUsageError(f"{api}: priority (DMA quality of service) is available only on NeuronCore-v4 "
                               f"(trn3) and newer, so it must be None on target {config.target} (NeuronCore-v"
                               f"{config.nc_version}); got priority={priority!r}")


def _hwdge_target(api: str) -> None:
    """dma_copy page: "Hardware based DGE is only supported for NeuronCore-v3 or newer". A warning, not
    an error: AWS's kernel library (@d2ad3a5) passes dge_mode=hwdge unconditionally in mlp_tkg's
    gate/up projection (gate_up_projection_lhs_rhs_swap), a kernel with NeuronCore-v2 code paths whose
    tests are not excluded from trn1, so the compiler is not shown to refuse it there. (The warning
    points at the front end's instruction call.)"""
    config = active_config()
    if config.nc_version < 3:
        unfit("a simulator warning")
        warnings.warn(f"{user_site()}: {api}: dge_mode=hwdge needs NeuronCore-v3 (trn2) or newer per the API page; "
                      f"target is {config.target} (NeuronCore-v{config.nc_version}), which has no hardware DGE",
                      SimulatorWarning, stacklevel=4)


replay.steps(globals(), helpers=("dma_moved", "dma_priority"))  # an instruction's outermost call: a replay step
