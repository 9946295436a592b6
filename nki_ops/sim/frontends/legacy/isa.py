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
)
from ...core.memory import column
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
    if tile_position or tile_size:
        _check_pe_tiling(api, stationary, tile_position, tile_size)
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


def _check_pe_tiling(api: str, stationary, tile_position, tile_size) -> None:
    """The documented PE-tiling rules: both given, multiples of 32, the tile holding the stationary
    operand, and not 32 x 32 on NeuronCore-v2."""
    if not (tile_position and tile_size) or len(tile_position) != 2 or len(tile_size) != 2:
        raise KernelUsageError(f"{api}: tile_position and tile_size must both be (row, column) pairs, got "
                               f"{tile_position!r} and {tile_size!r}")
    values = [int(v) for v in (*tile_position, *tile_size)]
    if any(v % 32 or v < 0 for v in values) or any(v == 0 for v in values[2:]):
        raise KernelUsageError(f"{api}: tile_position and tile_size values must be multiples of 32, got "
                               f"{tile_position!r} and {tile_size!r}")
    (row, col), (rows, cols) = values[:2], values[2:]
    if row + rows > 128 or col + cols > 128:
        raise KernelUsageError(f"{api}: PE tile at {tile_position!r} of size {tile_size!r} leaves the 128 x 128 array")
    k, m = stationary.shape[0], int(np.prod(stationary.shape[1:]))
    if rows < k or cols < m:
        raise KernelUsageError(f"{api}: tile_size {tile_size!r} is smaller than the stationary operand "
                               f"({k}, {m})")
    if rows == 32 and cols == 32 and core.active_config().nc_version < 3:
        raise KernelUsageError(f"{api}: a 32 x 32 PE tile is not supported on NeuronCore-v2 (trn1/inf2)")


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
    if reduce_res is not None:
        if reduce_op is None or _alu(reduce_op, api)[0] != "add":
            raise KernelUsageError(f"{api}: the Scalar engine reduces only with add (reduce_op=nl.add)")
        result = column(result)
        axes = tuple(range(1, result.ndim))
        write(reduce_res, _reduce("add", result, axes, True, api, selected), "nisa.activation reduce_res")
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
    return keep if selected is None else keep & core.indexing.mask_for(selected, keep.shape)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise UnsupportedError(f"nki.isa.{name}")
