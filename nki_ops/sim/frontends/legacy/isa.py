"""``neuronxcc.nki.isa`` (``nisa``) for the simulator: the NeuronCore instructions kernels use most.

Legacy call style: each instruction returns a new tile. Vector/Scalar arithmetic is fp32,
bitwise ALU ops work on the integers; outputs round into ``dtype`` (default: the input's).
"""

from __future__ import annotations

import enum

import numpy as np

from ... import core
from ...core import (
    Access,
    IndexExpr,
    Mask,
    Tensor,
    gpsimd,
    instructions,
    mask_values,
    read,
    tile_from_values,
    write,
)
from ...core import dtypes as dt
from ...core.errors import (
    KernelUsageError,
    UnsupportedError,
    refuse_unknown,
)
from . import language as nl


class engine(enum.IntEnum):
    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    vector = 5


_Engine = engine
unknown_engine, tensor_engine, scalar_engine = engine.unknown, engine.tensor, engine.scalar
gpsimd_engine, vector_engine = engine.gpsimd, engine.vector


class reduce_cmd(enum.IntEnum):
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4  # neuronxcc 2.27: tensor_scalar_cumulative's accumulator starts at imm1


class nc_version(enum.IntEnum):
    gen2 = 2
    gen3 = 3


class oob_mode(enum.IntEnum):
    error = 0
    skip = 1


_OobMode = oob_mode


class dge_mode(enum.IntEnum):
    unknown = 0
    none = 1
    swdge = 2
    hwdge = 3


def get_nc_version() -> nc_version:
    return nc_version(core.active_config().nc_version)


# Operator resolution, reductions and engine rules are the shared instruction core's.
_alu, _reduce = instructions.alu_op, instructions.reduce_values


def _out_dtype(dtype, default):
    return dt.as_dtype(dtype) if dtype is not None else default


# -------------------------------------------------------------------------------- Tensor engine

def nc_matmul(stationary, moving, *, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              tile_position=(), tile_size=(), mask=None, perf_mode=None, name=None):
    """``stationary.T @ moving`` into a new fp32 PSUM tile; accumulate with ``psum += nc_matmul(...)``.

    ``is_transpose`` (moving is an identity) and the one-zero hints do not change the product; PE
    tiling (``tile_position``/``tile_size``) is checked against its documented rules and computes the
    same product; ``perf_mode="double_row_gen3"`` (trn2 FP8) contracts ``[K, 2, F]`` operands over
    both K and the pair axis; ``mask`` and masked operands (``stationary[mask]``) restrict the result
    elements written."""
    api = "nc_matmul"
    stationary, moving, selected = nl._masked_operands(api, stationary, moving)
    if is_transpose and core.trace.listening:
        core.trace.engine(instructions.TENSOR, transpose=True)  # the profile's transpose FLOPs, as neuron-profile's
    instructions.check_pe_tiling(api, tile_position, tile_size, stationary, moving)
    if perf_mode is None:
        result = nl._matmul_values(api, stationary, moving)
    elif perf_mode == "double_row_gen3":
        result = _double_row_values(api, stationary, moving)
    else:
        raise UnsupportedError(f"nki.isa.nc_matmul(perf_mode={perf_mode!r})", "simulated: 'double_row_gen3'")
    written = mask_values(mask)
    if selected is not None:
        written = selected if written is None else selected & np.broadcast_to(written, selected.shape)
    return nl._matmul_result(result, "nisa.nc_matmul", mask=written)


def _double_row_values(api: str, stationary, moving) -> np.ndarray:
    """FP8 double-row matmul (trn2+): operands ``[K, 2, M]`` and ``[K, 2, N]`` contract over K x 2."""
    if core.active_config().nc_version < 3:
        raise KernelUsageError(f"{api}: perf_mode='double_row_gen3' needs NeuronCore-v3 (trn2) or newer, the "
                               f"target is {core.active_config().target}")
    s, m = read(stationary, api, "stationary"), read(moving, api, "moving")
    if s.ndim != 3 or m.ndim != 3 or s.shape[1] != 2 or m.shape[1] != 2 or s.shape[0] != m.shape[0]:
        raise KernelUsageError(f"{api}: double-row operands are [K, 2, F] with equal K, got {list(s.shape)} and "
                               f"{list(m.shape)}")
    for values, arg in ((s, "stationary"), (m, "moving")):
        if values.dtype not in (dt.float8_e4m3, dt.float8_e5m2):
            raise KernelUsageError(f"{api}: perf_mode='double_row_gen3' takes FP8 operands, got {arg} {values.dtype}")
    limits = ((s.shape[0], 128, "contraction (partition) size"), (s.shape[2], 128, "stationary free size"),
              (m.shape[2], 512, "moving free size"))
    for size, limit, what in limits:
        if size > limit:
            core.violation(core.TileLimitError(f"{api}: {what} {size} exceeds the Tensor engine limit of {limit}"))
    k2 = 2 * s.shape[0]
    return dt.to_f32(s).reshape(k2, -1).T @ dt.to_f32(m).reshape(k2, -1)


def nc_transpose(data, *, mask=None, name=None, dtype=None, engine=engine.unknown):
    """Partition <-> free transpose: Tensor engine (<= 128 x 128, SBUF -> PSUM) or Vector engine
    (<= 32 x 32, SBUF/PSUM -> SBUF). ``engine.unknown`` picks Vector when both sizes are <= 32."""
    values, on_vector = instructions.transpose("nc_transpose", data, engine, mask_values(mask), copies_psum=True)
    return tile_from_values(values, _out_dtype(dtype, data.dtype), "nisa.nc_transpose",
                            buffer=core.sbuf if on_vector else core.psum, account=on_vector)


# ---------------------------------------------------------------------------------- Scalar engine

def activation(op, data, *, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
               mask=None, name=None, dtype=None):
    """``op(data * scale + bias)``; scale is a scalar or (P, 1), bias is (P, 1). With ``reduce_res``,
    also writes the sum over the free axes into that (P, 1) tile."""
    api = "activation"
    selected = mask_values(mask)
    if bias is not None and not isinstance(bias, (Tensor, Access)):
        raise KernelUsageError(f"{api}: bias must be a (P, 1) tile, got {type(bias).__name__}")
    result = instructions.activation(api, op, data, bias, scale, selected)
    out = tile_from_values(result, _out_dtype(dtype, data.dtype), "nisa.activation", mask=selected)
    registers = instructions.activation_accumulate(api, reduce_op, result, reduce_cmd, reduce_res, selected)
    if reduce_res is not None:
        write(reduce_res, registers, "nisa.activation reduce_res")
    return out


def activation_reduce(op, data, *, reduce_op, reduce_res, bias=None, scale=1.0, mask=None, name=None, dtype=None):
    """``activation`` with the add-reduction into ``reduce_res`` always on."""
    return activation(op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
                      reduce_cmd=reduce_cmd.reset_reduce, mask=mask, dtype=dtype)


# ---------------------------------------------------------------------------------- Vector engine

def tensor_tensor(data1, data2, op, *, dtype=None, mask=None, name=None, engine=engine.unknown):
    """Element-wise ``op(data1, data2)`` of two tiles with equal partition counts and sizes."""
    selected = mask_values(mask)
    result, promoted = instructions.tensor_tensor("tensor_tensor", data1, data2, op, engine, selected)
    return tile_from_values(result, _out_dtype(dtype, promoted), "nisa.tensor_tensor", mask=selected)


def tensor_scalar(data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False, *, dtype=None,
                  mask=None, name=None, engine=engine.unknown):
    """``(data op0 operand0) op1 operand1``; operands are scalars or (P, 1) vectors."""
    selected = mask_values(mask)
    result = instructions.tensor_scalar("tensor_scalar", data, op0, operand0, reverse0, op1, operand1, reverse1,
                                        engine, selected)
    return tile_from_values(result, _out_dtype(dtype, data.dtype), "nisa.tensor_scalar", mask=selected)


def scalar_tensor_tensor(*, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, dtype=None,
                         mask=None, name=None):
    """``(data op0 operand0) op1 operand1`` with ``operand0`` scalar/(P, 1) and ``operand1`` a full tile."""
    selected = mask_values(mask)
    result = instructions.scalar_tensor_tensor("scalar_tensor_tensor", data, op0, operand0, op1, operand1, reverse0,
                                               reverse1, selected)
    return tile_from_values(result, _out_dtype(dtype, data.dtype), "nisa.scalar_tensor_tensor", mask=selected)


def tensor_reduce(op, data, axis, *, mask=None, name=None, dtype=None, negate=False, keepdims=False):
    """Reduce along free axes ``axis`` with an ALU operator; ``negate`` multiplies the result by -1."""
    api = "tensor_reduce"
    result = instructions.tensor_reduce(api, op, data, nl._axes(api, data, axis), negate, keepdims, mask_values(mask))
    return tile_from_values(result, _out_dtype(dtype, data.dtype), "nisa.tensor_reduce")


def tensor_scalar_reduce(*, data, op0, operand0, reduce_op, reduce_res, reverse0=False, dtype=None, mask=None,
                         name=None):
    """``tensor_scalar`` with one op, plus a reduction over all free axes into ``reduce_res`` (P, 1)."""
    api = "tensor_scalar_reduce"
    out = tensor_scalar(data, op0, operand0, reverse0, dtype=dtype, mask=mask)
    name, _, _ = _alu(reduce_op, api)
    values = dt.to_f32(out.data)
    write(reduce_res, _reduce(name, values, tuple(range(1, values.ndim)), True, api, mask_values(mask)),
          "nisa.tensor_scalar_reduce")
    return out


def tensor_tensor_scan(data0, data1, initial, op0, op1, reverse0=False, reverse1=False, *, dtype=None, mask=None,
                       name=None):
    """``r[:, i] = op1(op0(data0[:, i], r[:, i-1]), data1[:, i])`` per partition from ``initial`` (a
    scalar or (P, 1) tile), on the Vector engine; the result has ``data0``'s shape."""
    api = "tensor_tensor_scan"
    selected = mask_values(mask)
    result = instructions.tensor_tensor_scan(api, data0, data1, initial, op0, op1, reverse0, reverse1)
    result = result.reshape(data0.shape)
    if selected is not None:
        # The scan is computed over whole rows and written where the mask holds; that is the masked
        # instruction only when each row's selection starts at its first element.
        rows = np.broadcast_to(selected, result.shape).reshape(result.shape[0], -1)
        if np.any(rows[:, 1:] > rows[:, :-1]):
            raise UnsupportedError("nki.isa.tensor_tensor_scan with a mask that does not start at the first "
                                   "free element")
    return tile_from_values(result, _out_dtype(dtype, data0.dtype), "nisa.tensor_tensor_scan", mask=selected)


def tensor_copy(src, *, mask=None, name=None, dtype=None, engine=engine.unknown):
    """Copy a tile into a new SBUF tile, casting to ``dtype``."""
    instructions.check_engine_access(src, engine, "tensor_copy", "src")
    selected = mask_values(mask)
    return tile_from_values(read(src, "tensor_copy", "src", selected), _out_dtype(dtype, src.dtype),
                            "nisa.tensor_copy", mask=selected)


def reciprocal(data, *, dtype=None, mask=None, name=None):
    selected = mask_values(mask)
    result = instructions.reciprocal("reciprocal", data, selected)
    return tile_from_values(result, _out_dtype(dtype, data.dtype), "nisa.reciprocal", mask=selected)


def memset(shape, value, dtype, *, mask=None, name=None, engine=engine.unknown):
    """A new SBUF tile of ``shape`` filled with ``value``."""
    selected = mask_values(mask)
    return tile_from_values(np.full(tuple(shape), value, dtype=np.float64 if dt.is_float(dt.as_dtype(dtype))
                                    else np.int64), dt.as_dtype(dtype), "nisa.memset", mask=selected)


def bn_stats(data, *, mask=None, name=None, dtype=None):
    """Per partition: (count, mean, count * variance) of the even- and of the odd-indexed elements,
    six values; concatenate several along the free axis and combine them with ``bn_aggr``. Under a
    mask only the selected elements count (a partition with none selected keeps poison)."""
    stats, rows = instructions.bn_stats("bn_stats", data, mask_values(mask))
    return tile_from_values(stats, _out_dtype(dtype, dt.float32), "nisa.bn_stats", mask=rows)


def bn_aggr(data, *, mask=None, name=None, dtype=None):
    """Combine ``bn_stats`` outputs (P, 6k) into per-partition (mean, population variance) (P, 2)."""
    return tile_from_values(instructions.bn_aggr("bn_aggr", data, mask_values(mask)), _out_dtype(dtype, dt.float32),
                            "nisa.bn_aggr")


# ---------------------------------------------------------------------------------- GpSimd engine

def iota(expr, dtype, *, mask=None, name=None):
    """Materialise an affine index expression (``nl.arange``/``nl.mgrid`` arithmetic) as a tile."""
    if not isinstance(expr, IndexExpr):
        raise KernelUsageError(f"iota needs an nl.arange/nl.mgrid expression, got {type(expr).__name__}")
    if expr.ndim < 2:
        raise KernelUsageError("iota needs a 2-D expression with a partition axis, e.g. nl.arange(n)[:, None]")
    values = np.broadcast_to(expr.values, expr.shape).astype(np.int32)
    return tile_from_values(values, dt.as_dtype(dtype), "nisa.iota", mask=mask_values(mask))


def affine_select(pred, on_true_tile, on_false_value, *, mask=None, name=None, dtype=None):
    """``on_true_tile`` where the affine predicate holds, else ``on_false_value`` (e.g. causal masks)."""
    if not isinstance(pred, Mask):
        raise KernelUsageError(f"affine_select needs an affine predicate of nl.arange/nl.mgrid expressions, got "
                               f"{type(pred).__name__}")
    # GpSimd reads SBUF, but the legacy compiler moves a PSUM on_true_tile (the public flash-attention
    # kernels select straight from the matmul's PSUM tile); its docs name no memory restriction.
    selected = mask_values(mask)
    result = instructions.affine_select("affine_select", pred.values, on_true_tile, on_false_value, selected)
    return tile_from_values(result, _out_dtype(dtype, on_true_tile.dtype), "nisa.affine_select", mask=selected)


def tensor_partition_reduce(op, data, *, mask=None, name=None, dtype=None):
    """Reduce across partitions: (P, F) -> (1, F)."""
    result = instructions.tensor_partition_reduce("tensor_partition_reduce", op, data, mask_values(mask))
    return tile_from_values(result, _out_dtype(dtype, data.dtype), "nisa.tensor_partition_reduce")


# ----------------------------------------------------------------------------------------- DMA

def dma_copy(*, dst, src, mask=None, name=None, dst_rmw_op=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown):
    """Copy ``src`` to ``dst`` (HBM or SBUF each; never PSUM); ``dst_rmw_op=np.add`` accumulates.
    With ``oob_mode=skip``, elements whose runtime (indirect) index is out of range are not moved:
    a gather leaves those destination rows as they were, a scatter does not write them."""
    api = "dma_copy"
    instructions.dma_operands(api, dst, src)
    selected = mask_values(mask)
    if oob_mode == _OobMode.skip:
        if dst_rmw_op is not None:
            raise KernelUsageError(f"{api}: with dst_rmw_op only oob_mode=oob_mode.error is allowed")
        selected = _within_indirect_bounds(api, src, dst, selected)
    elif oob_mode != _OobMode.error:
        raise KernelUsageError(f"{api}: oob_mode must be oob_mode.error or oob_mode.skip, got {oob_mode!r}")
    values = nl._hbm_values(src, selected) if not src.buffer.on_chip else read(src, api, "src", selected)
    if values.size != int(np.prod(dst.shape)):
        raise KernelUsageError(f"{api}: element counts differ: src {list(values.shape)} vs dst {list(dst.shape)}")
    values = values.reshape(dst.shape)
    if dst_rmw_op is not None:
        name, fn, _ = _alu(dst_rmw_op, api)
        current = nl._hbm_values(dst, selected) if not dst.buffer.on_chip else read(dst, api, "dst", selected)
        values = fn(dt.to_f32(current), dt.to_f32(values))
    write(dst, dt.to_f32(values) if dst.dtype != values.dtype else values, "nisa.dma_copy", selected)


def _within_indirect_bounds(api: str, src, dst, selected):
    """``selected`` narrowed to the elements whose indirect indices (in ``src`` or ``dst``) are in range."""
    accesses = [x for x in (src, dst) if isinstance(x, Access) and x.indirect]
    if not accesses:
        return selected
    if tuple(src.shape) != tuple(dst.shape):
        raise UnsupportedError(f"nki.isa.dma_copy(oob_mode=skip) between shapes {list(src.shape)} and "
                               f"{list(dst.shape)}", "give src and dst the same shape")
    keep = np.ones(tuple(dst.shape), bool)
    for access in accesses:
        for axis in access.indirect:
            index = np.broadcast_to(access.comps[axis], keep.shape)
            keep &= (index >= 0) & (index < access.tensor.shape[axis])
    return keep if selected is None else keep & core.tensors.mask_for(selected, keep.shape)


# ------------------------------------------------------- Vector engine: selects, top-8, accumulators

fp32 = nl.fp32


def _keep(selected, shape):
    """The mask over an operand of ``shape`` (None: everything is read)."""
    return None if selected is None else core.tensors.mask_for(selected, tuple(shape))


def _accumulate(api, reduce_op, values, cmd, reduce_res, selected) -> None:
    """The Vector engine's accumulator registers take ``cmd``; ``reduce_res`` then receives them."""
    if int(cmd) == reduce_cmd.idle and reduce_res is None:
        return
    if selected is not None:
        raise UnsupportedError(f"nki.isa.{api} with a mask and a reduction")
    registers = instructions.accumulate(api, reduce_op, values, cmd, "vector")
    if reduce_res is not None:
        write(reduce_res, registers, f"nisa.{api} reduce_res")


def max8(*, src, mask=None, dtype=None, name=None):
    """The 8 largest values of each partition in descending order: a [P, 8] tile."""
    selected = mask_values(mask)
    values = read(src, "max8", "src", selected)
    result = instructions.max8("max8", values, _keep(selected, values.shape))
    return tile_from_values(result, _out_dtype(dtype, src.dtype), "nisa.max8")


def _index_dtype(api, dtype):
    out = dt.as_dtype(dtype) if dtype is not None else dt.uint32
    if out not in (dt.uint16, dt.uint32):
        raise KernelUsageError(f"{api}: indices are uint16 or uint32, got dtype={out}")
    return out


def nc_find_index8(*, data, vals, mask=None, dtype=None, name=None):
    """Per partition, the index of the first occurrence of each of the 8 ``vals`` in ``data`` (the mask
    applies to ``data``): a [P, 8] uint32 (or uint16) tile, all ones for a value not found."""
    api = "nc_find_index8"
    selected = mask_values(mask)
    values = read(data, api, "data", selected)
    index = instructions.find_index8(api, values, read(vals, api, "vals"), _keep(selected, values.shape))
    return tile_from_values(index.astype(_index_dtype(api, dtype)), _index_dtype(api, dtype), "nisa.nc_find_index8")


def nc_match_replace8(*, data, vals, imm, dst_idx=None, mask=None, dtype=None, name=None):
    """``data`` with the first occurrence of each of the 8 ``vals`` per partition replaced by ``imm``
    (the mask applies to ``data``); the matched positions go to ``dst_idx`` when given."""
    api = "nc_match_replace8"
    selected = mask_values(mask)
    values = read(data, api, "data", selected)
    keep = _keep(selected, values.shape)
    result, index = instructions.match_replace8(api, values, read(vals, api, "vals"), imm, keep)
    if dst_idx is not None:
        write(dst_idx, index.reshape(tuple(dst_idx.shape)), "nisa.nc_match_replace8 dst_idx")
    return tile_from_values(result, _out_dtype(dtype, data.dtype), "nisa.nc_match_replace8", mask=keep)


def nc_stream_shuffle(src, dst, shuffle_mask, *, dtype=None, mask=None, name=None):
    """Within each 32-partition quadrant, partition ``i`` of ``dst`` becomes partition
    ``shuffle_mask[i]`` of ``src``; 255 and masked-off elements leave ``dst`` unmodified."""
    api = "nc_stream_shuffle"
    values = read(src, api, "src")
    shape = tuple(dst.shape)
    result = instructions.stream_shuffle(api, values, np.zeros(shape, values.dtype), shuffle_mask)
    rows = np.array([int(shuffle_mask[p % 32]) != 255 for p in range(shape[0])])
    written = np.broadcast_to(rows.reshape((-1,) + (1,) * (len(shape) - 1)), shape)
    selected = mask_values(mask)
    if selected is not None:
        written = written & core.tensors.mask_for(selected, shape)
    write(dst, result, "nisa.nc_stream_shuffle", written)


def range_select(*, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=reduce_cmd.idle, reduce_res=None,
                 reduce_op=np.amax, range_start=0, on_false_value=fp32.min, mask=None, dtype=None, name=None):
    """Elements of ``on_true_tile`` whose free index + ``range_start`` passes both comparisons with the
    partition's bounds, else ``on_false_value``; the result's max per partition goes to the Vector
    engine's accumulators (``reduce_cmd``) and ``reduce_res``. NeuronCore-v3 (trn2) and later."""
    api = "range_select"
    if core.active_config().nc_version < 3:
        raise KernelUsageError(f"{api} needs NeuronCore-v3 (trn2) or newer, the target is "
                               f"{core.active_config().target}")
    selected = mask_values(mask)
    values = read(on_true_tile, api, "on_true_tile", selected)
    result = instructions.range_select(api, values, comp_op0, comp_op1, bound0, bound1, range_start, on_false_value)
    _accumulate(api, reduce_op, result, reduce_cmd, reduce_res, selected)
    return tile_from_values(result.reshape(values.shape), _out_dtype(dtype, on_true_tile.dtype), "nisa.range_select",
                            mask=selected)


# The ISA pages list the integer predicate dtypes; AWS's own select_reduce and tensor_copy_predicated
# examples pass bool tiles (one byte, 0 or 1), which the legacy simulator accepts.
_SELECT_PREDICATES = ("int8", "uint8", "int16", "uint16", "bool")
_COPY_PREDICATES = ("uint8", "uint16", "uint32", "bool")


def select_reduce(*, dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=reduce_cmd.idle,
                  reduce_op=np.amax, reverse_pred=False, mask=None, dtype=None, name=None):
    """``dst = where(predicate, on_true, on_false)`` (``on_false`` a scalar or (P, 1)), with the max per
    partition into the Vector engine's accumulators (``reduce_cmd``) and ``reduce_res``."""
    api = "select_reduce"
    selected = mask_values(mask)
    if getattr(on_true, "buffer", None) is core.psum and getattr(predicate, "buffer", None) is core.psum:
        raise core.MemorySpaceError(f"{api}: predicate and on_true cannot both be in PSUM")
    pred = read(predicate, api, "predicate", selected)
    instructions.require_predicate(pred, _SELECT_PREDICATES, api)
    values = dt.to_f32(read(on_true, api, "on_true", selected))
    result = instructions.select(api, pred, values, on_false, reverse_pred)
    _accumulate(api, reduce_op, result, reduce_cmd, reduce_res, selected)
    write(dst, result, "nisa.select_reduce", selected)


def tensor_copy_predicated(*, src, dst, predicate, reverse_pred=False, mask=None, dtype=None, name=None):
    """Copy ``src`` (a tile or a scalar) into ``dst`` where ``predicate`` is nonzero (zero with
    ``reverse_pred``); elsewhere ``dst`` is unmodified."""
    api = "tensor_copy_predicated"
    selected = mask_values(mask)
    pred = read(predicate, api, "predicate", selected)
    instructions.require_predicate(pred, _COPY_PREDICATES, api)
    if isinstance(src, (Tensor, Access)) and src.dtype != dst.dtype:
        raise KernelUsageError(f"{api}: src ({src.dtype}) and dst ({dst.dtype}) must have the same dtype")
    current = read(dst, api, "dst", selected)
    result = instructions.copy_predicated(api, pred, core.value_of(src, api, "src", selected), current, reverse_pred)
    write(dst, result, "nisa.tensor_copy_predicated", selected)


def tensor_scalar_cumulative(*, src, dst, op0, op1, imm0, imm1=None, reduce_cmd=reduce_cmd.reset_reduce, mask=None,
                             name=None):
    """``dst[:, i] = op1(op0(src[:, i], imm0), acc)`` along the free axis, the Vector engine's
    accumulator starting per ``reduce_cmd`` (reset_reduce: op1's identity, reduce: where it was,
    load_reduce: ``imm1``)."""
    api = "tensor_scalar_cumulative"
    if mask is not None:
        raise UnsupportedError("nki.isa.tensor_scalar_cumulative with a mask")
    values = read(src, api, "src")
    result = instructions.tensor_scalar_cumulative(api, values, op0, imm0, op1, imm1, reduce_cmd)
    write(dst, result, "nisa.tensor_scalar_cumulative")


def dropout(data, prob, *, mask=None, dtype=None, name=None):
    """Each element replaced by zero with probability ``prob`` (a scalar or (P, 1))."""
    api = "dropout"
    selected = mask_values(mask)
    if data.dtype.kind in "iu" and dtype is not None and dt.as_dtype(dtype) != data.dtype:
        raise KernelUsageError(f"{api}: an integer input keeps its dtype, got dtype={dtype}")
    result = instructions.dropout(api, read(data, api, "data", selected), prob, core.current_run(api))
    return tile_from_values(result, _out_dtype(dtype, data.dtype), "nisa.dropout", mask=selected)


# ------------------------------------------------------------------------------ GpSimd engine, DMA

def local_gather(src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, *, mask=None, name=None):
    """Gather within each GpSimd core's 16 partitions (``core.gpsimd.local_gather``): a
    [P, num_valid_indices * num_elem_per_idx] tile of ``src_buffer``'s dtype; uint16 indices."""
    api = "local_gather"
    if mask is not None:
        raise UnsupportedError("nki.isa.local_gather with a mask")
    if index.dtype != dt.uint16:
        raise KernelUsageError(f"{api}: index must be uint16, got {index.dtype}")
    for x, arg in ((src_buffer, "src_buffer"), (index, "index")):
        instructions.check_engine_access(x, instructions.GPSIMD, api, arg)
    values = read(src_buffer, api, "src_buffer")
    where = read(index, api, "index")
    result = gpsimd.local_gather(api, values.reshape(values.shape[0], -1), where.reshape(where.shape[0], -1),
                                 int(num_elem_per_idx), num_valid_indices)
    return tile_from_values(result, src_buffer.dtype, "nisa.local_gather")


def sequence_bounds(*, segment_ids, dtype=None, name=None):
    """For segment ids [1, n], a [1, 2, n] tile of each element's segment start and end
    (``core.gpsimd.sequence_bounds``); float32 or int32."""
    api = "sequence_bounds"
    out = _out_dtype(dtype, segment_ids.dtype)
    for kind, arg in ((segment_ids.dtype, "segment_ids"), (out, "dtype")):
        if kind not in (dt.float32, dt.int32):
            raise KernelUsageError(f"{api}: {arg} must be float32 or int32, got {kind}")
    instructions.check_engine_access(segment_ids, instructions.GPSIMD, api, "segment_ids")
    ids = read(segment_ids, api, "segment_ids")
    if ids.shape[0] != 1:
        raise KernelUsageError(f"{api}: the partition size must be 1, got segment_ids {list(ids.shape)}")
    bounds = gpsimd.sequence_bounds(api, ids.reshape(-1))
    return tile_from_values(bounds.reshape(1, 2, -1), out, "nisa.sequence_bounds")


def dma_transpose(src, *, axes=None, mask=None, dtype=None, dge_mode=dge_mode.unknown, name=None):
    """``src`` (HBM or SBUF) transposed by the DMA engine into a new SBUF tile: axes (1, 0),
    (2, 1, 0) or (3, 1, 2, 0), by default the one of src's rank."""
    api = "dma_transpose"
    if mask is not None:
        raise UnsupportedError("nki.isa.dma_transpose with a mask")
    if src.buffer is core.psum:
        raise core.MemorySpaceError(f"Expected operand 'src' of '{api}' to be in address space 'hbm|sbuf', but got a "
                                    f"tile in 'psum' instead")
    values = nl._hbm_values(src, None) if not src.buffer.on_chip else read(src, api, "src")
    result = instructions.dma_transpose(api, values, axes)
    return tile_from_values(np.ascontiguousarray(result), _out_dtype(dtype, src.dtype), "nisa.dma_transpose")


def tensor_copy_dynamic_src(src, *, mask=None, dtype=None, engine=engine.unknown, name=None):
    """``tensor_copy`` of a source indexed at a runtime offset (``t[ix, offsets[0, i] + iy]``)."""
    return tensor_copy(src, mask=mask, dtype=dtype, engine=engine)


__getattr__ = refuse_unknown("nki.isa")
