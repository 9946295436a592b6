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
    alu,
    mask_values,
    read,
    tile_from_values,
    value_of,
    write,
)
from ...core import dtypes as dt
from ...core.errors import (
    KernelUsageError,
    MemorySpaceError,
    TileLimitError,
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


# NumPy callables accepted wherever an NKI op is expected, mapped to the nl op names.
_NUMPY_ALU = {
    np.add: "add", np.subtract: "subtract", np.multiply: "multiply", np.divide: "divide", np.power: "power",
    np.maximum: "maximum", np.minimum: "minimum", np.max: "maximum", np.min: "minimum", np.sum: "add",
    np.equal: "equal", np.not_equal: "not_equal", np.greater: "greater", np.greater_equal: "greater_equal",
    np.less: "less", np.less_equal: "less_equal", np.logical_and: "logical_and", np.logical_or: "logical_or",
    np.logical_xor: "logical_xor", np.bitwise_and: "bitwise_and", np.bitwise_or: "bitwise_or",
    np.bitwise_xor: "bitwise_xor", np.left_shift: "left_shift", np.right_shift: "right_shift",
    np.mod: "mod", np.fmod: "fmod",
}
_NUMPY_ACT = {np.exp: "exp", np.log: "log", np.tanh: "tanh", np.square: "square", np.sqrt: "sqrt",
              np.abs: "abs", np.sign: "sign", np.sin: "sin", np.cos: "cos", np.arctan: "arctan",
              np.reciprocal: "reciprocal", np.negative: "negative"}
_REDUCIBLE = {"add", "multiply", "maximum", "minimum", "bitwise_and", "bitwise_or", "bitwise_xor",
              "logical_and", "logical_or", "logical_xor"}


def _alu(op, api: str):
    """(name, function) of an ALU operator given as an nl function or a NumPy function."""
    if hasattr(op, "alu"):
        name = op.alu[0]
    else:
        name = _NUMPY_ALU.get(op)
    if name in alu.BINARY:
        return name, alu.BINARY[name], True
    if name in alu.COMPARE:
        return name, alu.COMPARE[name], True
    if name in alu.BITWISE:
        return name, alu.BITWISE[name], False
    raise UnsupportedError(f"nki.isa ALU operator {getattr(op, '__name__', op)!r} in {api}")


def _activation_fn(op, api: str):
    name = op.alu[0] if hasattr(op, "alu") else _NUMPY_ACT.get(op)
    if name == "copy":
        return lambda x: x
    if name in alu.UNARY:
        return alu.UNARY[name]
    raise UnsupportedError(f"activation function {getattr(op, '__name__', op)!r} in {api}")


def _reduce(name: str, values: np.ndarray, axes, keepdims: bool, api: str, selected=None) -> np.ndarray:
    """Reduce ``values`` over ``axes``; under a mask only selected elements count, and results with
    no selected element hold poison."""
    if name not in _REDUCIBLE:
        raise KernelUsageError(f"{api}: {name} is not a reduction operator; use one of {sorted(_REDUCIBLE)}")
    ufunc = getattr(np, name)
    if selected is None:
        return ufunc.reduce(values, axis=axes, keepdims=keepdims)
    where = np.broadcast_to(selected, values.shape)
    if name in ("maximum", "minimum"):
        info = np.finfo(values.dtype) if values.dtype.kind == "f" else np.iinfo(values.dtype)
        initial = info.min if name == "maximum" else info.max
    else:
        initial = ufunc.identity
    result = ufunc.reduce(values, axis=axes, keepdims=keepdims, where=where, initial=initial)
    nothing_selected = ~np.logical_or.reduce(where, axis=axes, keepdims=keepdims)
    return np.where(nothing_selected, core.active_config().fill_value(result.dtype), result)


def _check_engine_access(x, engine_, api: str, arg: str) -> None:
    if engine_ == engine.gpsimd and x.buffer is core.psum:
        raise MemorySpaceError(f"Expected operand '{arg}' of '{api}' to be in address space 'sbuf', but got a tile "
                               f"in 'psum' instead (the GpSimd engine cannot access PSUM)")


def _per_partition(operand, partitions: int, api: str, arg: str) -> np.ndarray:
    """A scalar or a (P, 1) per-partition column, as fp32 broadcastable against (P, F...)."""
    values = dt.to_f32(value_of(operand, api, arg))
    if values.ndim == 0:
        return values
    if values.ndim == 1:
        values = values[:, None]
    if values.shape[0] != partitions or values.size != partitions:
        raise KernelUsageError(f"{api}: '{arg}' must be a scalar or a ({partitions}, 1) per-partition vector, "
                               f"got shape {list(values.shape)}")
    return values.reshape((partitions,) + (1,) * (values.ndim - 1))


def _out_dtype(dtype, default):
    return dt.as_dtype(dtype) if dtype is not None else default


# -------------------------------------------------------------------------------- Tensor engine

def nc_matmul(stationary, moving, *, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              tile_position=(), tile_size=(), mask=None, **unsupported):
    """``stationary.T @ moving`` into a new fp32 PSUM tile; accumulate with ``psum += nc_matmul(...)``."""
    if unsupported:
        raise UnsupportedError(f"nki.isa.nc_matmul({', '.join(unsupported)}=...)")
    if is_transpose or tile_position or tile_size or mask is not None:
        raise UnsupportedError("nki.isa.nc_matmul with is_transpose, tile_position, tile_size or mask")
    result = nl._matmul_values("nc_matmul", stationary, moving)
    return nl._matmul_result(result, "nisa.nc_matmul")


def nc_transpose(data, *, mask=None, dtype=None, engine=engine.unknown):
    """Partition <-> free transpose: Tensor engine (<= 128 x 128, SBUF -> PSUM) or Vector engine
    (<= 32 x 32, SBUF/PSUM -> SBUF). ``engine.unknown`` picks Vector when both sizes are <= 32."""
    values = read(data, "nc_transpose", "data", mask_values(mask))
    if values.ndim != 2:
        values = values.reshape(values.shape[0], -1)
    on_vector = engine == _Engine.vector or (engine == _Engine.unknown and max(values.shape) <= 32)
    limit = 32 if on_vector else 128
    if max(values.shape) > limit:
        core.violation(TileLimitError(f"nc_transpose on the {'Vector' if on_vector else 'Tensor'} engine supports "
                                      f"at most {limit} x {limit}, got {list(values.shape)}"))
    return tile_from_values(values.T, _out_dtype(dtype, data.dtype), "nisa.nc_transpose",
                            buffer=core.sbuf if on_vector else core.psum, account=on_vector)


# ---------------------------------------------------------------------------------- Scalar engine

def activation(op, data, *, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
               mask=None, dtype=None):
    """``op(data * scale + bias)``; scale is a scalar or (P, 1), bias is (P, 1). With ``reduce_res``,
    also writes the sum over the free axes into that (P, 1) tile."""
    api = "activation"
    selected = mask_values(mask)
    fn = _activation_fn(op, api)
    raw = read(data, api, "data", selected)
    values = dt.to_f32(column(raw))
    partitions = values.shape[0]
    scale_v = _per_partition(scale, partitions, api, "scale")
    with np.errstate(all="ignore"):
        pre = values * scale_v
        if bias is not None:
            if not isinstance(bias, (Tensor, Access)):
                raise KernelUsageError(f"{api}: bias must be a ({partitions}, 1) tile, got {type(bias).__name__}")
            pre = pre + _per_partition(bias, partitions, api, "bias")
        result = np.asarray(fn(pre), dtype=np.float32)
    out = tile_from_values(result.reshape(raw.shape), _out_dtype(dtype, data.dtype), "nisa.activation",
                           mask=selected)
    if reduce_res is not None:
        if reduce_op is None or _alu(reduce_op, api)[0] != "add":
            raise KernelUsageError(f"{api}: the Scalar engine reduces only with add (reduce_op=nl.add)")
        axes = tuple(range(1, result.ndim))
        write(reduce_res, _reduce("add", result, axes, True, api, selected), "nisa.activation reduce_res")
    return out


def activation_reduce(op, data, *, reduce_op, reduce_res, bias=None, scale=1.0, mask=None, dtype=None):
    """``activation`` with the add-reduction into ``reduce_res`` always on."""
    return activation(op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
                      reduce_cmd=reduce_cmd.reset_reduce, mask=mask, dtype=dtype)


# ---------------------------------------------------------------------------------- Vector engine

def tensor_tensor(data1, data2, op, *, dtype=None, mask=None, engine=engine.unknown):
    """Element-wise ``op(data1, data2)`` of two tiles with equal partition counts and sizes."""
    api = "tensor_tensor"
    for x, arg in ((data1, "data1"), (data2, "data2")):
        if not isinstance(x, (Tensor, Access)):
            raise KernelUsageError(f"operand '{arg}' of '{api}' must be a tile, got {type(x).__name__}")
        _check_engine_access(x, engine, api, arg)
    if data1.buffer is core.psum and data2.buffer is core.psum:
        raise MemorySpaceError(f"{api}: data1 and data2 cannot both be in PSUM; copy one to SBUF first")
    name, fn, float_compute = _alu(op, api)
    selected = mask_values(mask)
    a, b = read(data1, api, "data1", selected), read(data2, api, "data2", selected)
    if a.shape[0] != b.shape[0]:
        raise KernelUsageError(f"{api}: number of partitions mismatch: {a.shape[0]} vs {b.shape[0]} (use "
                               f"broadcast_to or nisa.tensor_scalar for a per-partition operand)")
    shape = a.shape
    if a.size == b.size:
        b = b.reshape(a.shape)
    else:
        # Free-axis broadcasting of a (P, 1) operand: legal, though the docs point to tensor_scalar
        # as the faster way to do it.
        a, b = column(a), column(b)
        try:
            shape = np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            raise KernelUsageError(f"{api}: operands must have the same number of elements per partition (or "
                                   f"broadcast along the free axes), got shapes {list(a.shape)} and "
                                   f"{list(b.shape)}") from None
    out_dtype = _out_dtype(dtype, dt.promote(a.dtype, b.dtype))
    with np.errstate(all="ignore"):
        result = fn(dt.to_f32(a), dt.to_f32(b)) if float_compute else fn(a, b)
    return tile_from_values(np.asarray(result).reshape(shape), out_dtype, "nisa.tensor_tensor", mask=selected)


def _scalar_op(values, op, operand, reverse, partitions, api, arg):
    name, fn, float_compute = _alu(op, api)
    operand_v = _per_partition(operand, partitions, api, arg) if float_compute else \
        np.asarray(value_of(operand, api, arg))
    lhs, rhs = (operand_v, values) if reverse else (values, operand_v)
    return fn(lhs, rhs)


def tensor_scalar(data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False, *, dtype=None,
                  mask=None, engine=engine.unknown):
    """``(data op0 operand0) op1 operand1``; operands are scalars or (P, 1) vectors."""
    api = "tensor_scalar"
    _check_engine_access(data, engine, api, "data")
    selected = mask_values(mask)
    raw = read(data, api, "data", selected)
    values = column(dt.to_f32(raw) if _alu(op0, api)[2] else raw)
    with np.errstate(all="ignore"):
        result = _scalar_op(values, op0, operand0, reverse0, raw.shape[0], api, "operand0")
        if op1 is not None:
            result = _scalar_op(result, op1, operand1, reverse1, raw.shape[0], api, "operand1")
    return tile_from_values(np.asarray(result).reshape(raw.shape), _out_dtype(dtype, data.dtype),
                            "nisa.tensor_scalar", mask=selected)


def scalar_tensor_tensor(*, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, dtype=None,
                         mask=None):
    """``(data op0 operand0) op1 operand1`` with ``operand0`` scalar/(P, 1) and ``operand1`` a full tile."""
    api = "scalar_tensor_tensor"
    if data.buffer is core.psum and getattr(operand1, "buffer", None) is core.psum:
        raise MemorySpaceError(f"{api}: data and operand1 cannot both be in PSUM")
    selected = mask_values(mask)
    raw = read(data, api, "data", selected)
    values = column(dt.to_f32(raw))
    other = column(dt.to_f32(read(operand1, api, "operand1", selected)))
    if other.shape != values.shape:
        raise KernelUsageError(f"{api}: operand1 of shape {list(other.shape)} must match data {list(values.shape)}")
    with np.errstate(all="ignore"):
        first = _scalar_op(values, op0, operand0, reverse0, values.shape[0], api, "operand0")
        _, fn1, _ = _alu(op1, api)
        result = fn1(other, first) if reverse1 else fn1(first, other)
    return tile_from_values(np.asarray(result).reshape(raw.shape), _out_dtype(dtype, data.dtype),
                            "nisa.scalar_tensor_tensor", mask=selected)


def tensor_reduce(op, data, axis, *, mask=None, dtype=None, negate=False, keepdims=False):
    """Reduce along free axes ``axis`` with an ALU operator; ``negate`` multiplies the result by -1."""
    api = "tensor_reduce"
    axes = nl._axes(api, data, axis)
    name, _, float_compute = _alu(op, api)
    selected = mask_values(mask)
    raw = read(data, api, "data", selected)
    values = dt.to_f32(raw) if float_compute else raw
    with np.errstate(all="ignore"):
        result = _reduce(name, values, axes, keepdims, api, selected)
        if negate:
            result = -result
    return tile_from_values(np.asarray(result), _out_dtype(dtype, data.dtype), "nisa.tensor_reduce")


def tensor_scalar_reduce(*, data, op0, operand0, reduce_op, reduce_res, reverse0=False, dtype=None, mask=None):
    """``tensor_scalar`` with one op, plus a reduction over all free axes into ``reduce_res`` (P, 1)."""
    api = "tensor_scalar_reduce"
    out = tensor_scalar(data, op0, operand0, reverse0, dtype=dtype, mask=mask)
    name, _, _ = _alu(reduce_op, api)
    values = dt.to_f32(out.data)
    write(reduce_res, _reduce(name, values, tuple(range(1, values.ndim)), True, api, mask_values(mask)),
          "nisa.tensor_scalar_reduce")
    return out


def tensor_copy(src, *, mask=None, dtype=None, engine=engine.unknown):
    """Copy a tile into a new SBUF tile, casting to ``dtype``."""
    _check_engine_access(src, engine, "tensor_copy", "src")
    selected = mask_values(mask)
    return tile_from_values(read(src, "tensor_copy", "src", selected), _out_dtype(dtype, src.dtype),
                            "nisa.tensor_copy", mask=selected)


def reciprocal(data, *, dtype=None, mask=None):
    selected = mask_values(mask)
    with np.errstate(all="ignore"):
        result = 1.0 / dt.to_f32(read(data, "reciprocal", "data", selected))
    return tile_from_values(result, _out_dtype(dtype, data.dtype), "nisa.reciprocal", mask=selected)


def memset(shape, value, dtype, *, mask=None, engine=engine.unknown):
    """A new SBUF tile of ``shape`` filled with ``value``."""
    selected = mask_values(mask)
    return tile_from_values(np.full(tuple(shape), value, dtype=np.float64 if dt.is_float(dt.as_dtype(dtype))
                                    else np.int64), dt.as_dtype(dtype), "nisa.memset", mask=selected)


def bn_stats(data, *, mask=None, dtype=None):
    """Per partition: (count, mean, count * variance) of the even- and of the odd-indexed elements,
    six values; concatenate several along the free axis and combine them with ``bn_aggr``. Under a
    mask only the selected elements count (a partition with none selected keeps poison)."""
    api = "bn_stats"
    selected = mask_values(mask)
    values = column(dt.to_f32(read(data, api, "data", selected)))
    if selected is not None:
        selected = core.indexing.mask_for(selected, values.shape).reshape(values.shape[0], -1)
    values = values.reshape(values.shape[0], -1)
    if values.shape[1] > nl.tile_size.bn_stats_fmax:
        core.violation(TileLimitError(f"{api}: free size {values.shape[1]} exceeds bn_stats_fmax "
                                      f"{nl.tile_size.bn_stats_fmax}"))
    if selected is None:
        selected = np.ones(values.shape, bool)
    # Even and odd by position among the selected elements of each partition.
    position = np.cumsum(selected, axis=1) - 1
    stats = []
    with np.errstate(all="ignore"):
        for parity in (0, 1):
            half = selected & (position % 2 == parity)
            count = half.sum(axis=1, keepdims=True).astype(np.float32)
            mean = np.where(half, values, 0).sum(axis=1, keepdims=True) / np.maximum(count, 1)
            m2 = np.where(half, (values - mean) ** 2, 0).sum(axis=1, keepdims=True)
            stats += [count, mean, m2]
    rows = selected.any(axis=1, keepdims=True) if mask is not None else None
    return tile_from_values(np.concatenate(stats, axis=1), _out_dtype(dtype, dt.float32), "nisa.bn_stats",
                            mask=rows)


def bn_aggr(data, *, mask=None, dtype=None):
    """Combine ``bn_stats`` outputs (P, 6k) into per-partition (mean, population variance) (P, 2)."""
    api = "bn_aggr"
    stats = dt.to_f32(read(data, api, "data", mask_values(mask))).astype(np.float64)
    if stats.shape[-1] % 3:
        raise KernelUsageError(f"{api}: expected a multiple of 6 bn_stats values per partition, got "
                               f"{stats.shape[-1]}")
    groups = stats.reshape(stats.shape[0], -1, 3)
    count, mean, m2 = groups[..., 0], groups[..., 1], groups[..., 2]
    total = count.sum(axis=1, keepdims=True)
    with np.errstate(all="ignore"):
        grand = (count * mean).sum(axis=1, keepdims=True) / total
        variance = (m2.sum(axis=1, keepdims=True) + (count * (mean - grand) ** 2).sum(axis=1, keepdims=True)) / total
    return tile_from_values(np.concatenate([grand, variance], axis=1), _out_dtype(dtype, dt.float32),
                            "nisa.bn_aggr")


# ---------------------------------------------------------------------------------- GpSimd engine

def iota(expr, dtype, *, mask=None):
    """Materialise an affine index expression (``nl.arange``/``nl.mgrid`` arithmetic) as a tile."""
    if not isinstance(expr, IndexExpr):
        raise KernelUsageError(f"iota needs an nl.arange/nl.mgrid expression, got {type(expr).__name__}")
    if expr.ndim < 2:
        raise KernelUsageError("iota needs a 2-D expression with a partition axis, e.g. nl.arange(n)[:, None]")
    values = np.broadcast_to(expr.values, expr.shape).astype(np.int32)
    return tile_from_values(values, dt.as_dtype(dtype), "nisa.iota", mask=mask_values(mask))


def affine_select(pred, on_true_tile, on_false_value, *, mask=None, dtype=None):
    """``on_true_tile`` where the affine predicate holds, else ``on_false_value`` (e.g. causal masks)."""
    if not isinstance(pred, Mask):
        raise KernelUsageError(f"affine_select needs an affine predicate of nl.arange/nl.mgrid expressions, got "
                               f"{type(pred).__name__}")
    # GpSimd reads SBUF, but the legacy compiler moves a PSUM on_true_tile (the public flash-attention
    # kernels select straight from the matmul's PSUM tile); its docs name no memory restriction.
    selected = mask_values(mask)
    values = read(on_true_tile, "affine_select", "on_true_tile", selected)
    result = np.where(np.broadcast_to(pred.values, values.shape), dt.to_f32(values), np.float32(on_false_value))
    return tile_from_values(result, _out_dtype(dtype, on_true_tile.dtype), "nisa.affine_select", mask=selected)


def tensor_partition_reduce(op, data, *, mask=None, dtype=None):
    """Reduce across partitions: (P, F) -> (1, F)."""
    api = "tensor_partition_reduce"
    _check_engine_access(data, engine.gpsimd, api, "data")
    name, _, float_compute = _alu(op, api)
    selected = mask_values(mask)
    raw = read(data, api, "data", selected)
    values = dt.to_f32(raw) if float_compute else raw
    return tile_from_values(_reduce(name, values, (0,), True, api, selected), _out_dtype(dtype, data.dtype),
                            "nisa.tensor_partition_reduce")


# ----------------------------------------------------------------------------------------- DMA

def dma_copy(*, dst, src, mask=None, dst_rmw_op=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown):
    """Copy ``src`` to ``dst`` (HBM or SBUF each; never PSUM); ``dst_rmw_op=np.add`` accumulates."""
    api = "dma_copy"
    for x, arg in ((dst, "dst"), (src, "src")):
        if not isinstance(x, (Tensor, Access)):
            raise KernelUsageError(f"operand '{arg}' of '{api}' must be a tensor, got {type(x).__name__}")
        if x.buffer is core.psum:
            raise MemorySpaceError(f"Expected operand '{arg}' of '{api}' to be in address space 'hbm|sbuf', but "
                                   f"got a tile in 'psum' instead (copy PSUM to SBUF first)")
    if oob_mode != _OobMode.error:
        raise UnsupportedError("nki.isa.dma_copy(oob_mode=skip)")
    selected = mask_values(mask)
    values = nl._hbm_values(src, selected) if not src.buffer.on_chip else read(src, api, "src", selected)
    if values.size != int(np.prod(dst.shape)):
        raise KernelUsageError(f"{api}: element counts differ: src {list(values.shape)} vs dst {list(dst.shape)}")
    values = values.reshape(dst.shape)
    if dst_rmw_op is not None:
        name, fn, _ = _alu(dst_rmw_op, api)
        current = nl._hbm_values(dst, selected) if not dst.buffer.on_chip else read(dst, api, "dst", selected)
        values = fn(dt.to_f32(current), dt.to_f32(values))
    write(dst, dt.to_f32(values) if dst.dtype != values.dtype else values, "nisa.dma_copy", selected)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise UnsupportedError(f"nki.isa.{name}")
