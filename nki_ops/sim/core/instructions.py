"""NeuronCore instruction semantics shared by both API generations.

Each instruction takes resolved operands (tensors or accesses, already restricted to their
region; ``selected`` is the legacy mask as a boolean array or None), checks what the hardware
checks (engine access to buffers, partition counts, Tensor-engine limits), and returns the
result values computed as the engine does (fp32 arithmetic, integer bit operations).
``core/isa.py`` (and ``isa_dma``, ``isa_mx``, ``isa_random``) call these with an output spec
(``core/outputs.py``) that says where the values land: the legacy API in a new tile, the
current API in ``dst``. ``engine`` is an engine number (``core/enums.py``).
"""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np

from . import alu, blas, indexing, memory, random, replay, tensors, trace
from . import dtypes as dt
from . import run as _run
from .errors import (
    KernelUsageError,
    MemorySpaceError,
    OutOfBoundsError,
    SimulatorWarning,
    TileLimitError,
    UnsupportedError,
    user_site,
)
from .memory import column, read, value_of
from .run import active_config, current_run, unfit, violation

UNKNOWN, TENSOR, SCALAR, GPSIMD, DMA, VECTOR = 0, 1, 2, 3, 4, 5
BN_STATS_FMAX = 512

# NumPy callables accepted wherever an NKI operator is expected, mapped to the operator names.
NUMPY_ALU = {
    np.add: "add", np.subtract: "subtract", np.multiply: "multiply", np.divide: "divide", np.power: "power",
    np.maximum: "maximum", np.minimum: "minimum", np.max: "maximum", np.min: "minimum", np.amax: "maximum",
    np.amin: "minimum", np.sum: "add",
    np.equal: "equal", np.not_equal: "not_equal", np.greater: "greater", np.greater_equal: "greater_equal",
    np.less: "less", np.less_equal: "less_equal", np.logical_and: "logical_and", np.logical_or: "logical_or",
    np.logical_xor: "logical_xor", np.bitwise_and: "bitwise_and", np.bitwise_or: "bitwise_or",
    np.bitwise_xor: "bitwise_xor", np.left_shift: "left_shift", np.right_shift: "right_shift",
    np.mod: "mod", np.fmod: "fmod",
}
NUMPY_ACT = {np.exp: "exp", np.log: "log", np.tanh: "tanh", np.square: "square", np.sqrt: "sqrt",
             np.abs: "abs", np.sign: "sign", np.sin: "sin", np.cos: "cos", np.arctan: "arctan",
             np.reciprocal: "reciprocal", np.negative: "negative", np.copy: "copy"}
# Unary ALU operators (the ISA operator table lists abs, rsqrt, reciprocal and logical_not): they
# apply to the instruction's first input; the other operand is ignored.
UNARY_ALU = {"abs": np.abs, "rsqrt": alu.UNARY["rsqrt"], "reciprocal": np.reciprocal,
             "logical_not": lambda x: np.logical_not(x).astype(np.float32)}
REDUCIBLE = {"add", "multiply", "maximum", "minimum", "bitwise_and", "bitwise_or", "bitwise_xor",
             "logical_and", "logical_or", "logical_xor"}


def op_name(op):
    """The operator name of an ``nl`` function (its ``alu`` attribute) or a NumPy function."""
    if hasattr(op, "alu"):
        return op.alu[0]
    try:
        return NUMPY_ALU.get(op) or NUMPY_ACT.get(op)
    except TypeError:
        return None


def alu_op(op, api: str):
    """(name, function, float_compute) of an ALU operator."""
    if getattr(op, "refused", None):
        raise KernelUsageError(f"{api}: {op.refused}")
    name = op_name(op)
    if name in alu.BINARY:
        return name, alu.BINARY[name], True
    if name in alu.COMPARE:
        return name, alu.COMPARE[name], True
    if name in alu.BITWISE:
        return name, alu.BITWISE[name], False
    if name in UNARY_ALU:
        fn = UNARY_ALU[name]
        return name, lambda a, b: fn(a), True
    if name in alu.MAGNITUDE:
        config = active_config()
        if config.nc_version < 4:
            raise KernelUsageError(f"{api}: nl.{name} is available only on NeuronCore-v4 (trn3) and newer; target "
                                   f"is {config.target}")
        return name, alu.MAGNITUDE[name], True
    raise UnsupportedError(f"nki.isa ALU operator {getattr(op, '__name__', op)!r} in {api}")


def activation_fn(op, api: str, range_reduced: bool = False):
    """The Scalar engine's function for ``op``; ``range_reduced``: the argument was first brought into
    the valid input range (as ``nl.sin`` does), so the exact function applies."""
    name = op_name(op)
    if name == "copy":
        return lambda x: x
    if name in alu.SCALAR_ENGINE and not range_reduced:
        return alu.SCALAR_ENGINE[name]
    if name in alu.ACTIVATION:
        return alu.ACTIVATION[name]
    raise UnsupportedError(f"activation function {getattr(op, '__name__', op)!r} in {api}")


def reduce_values(name: str, values: np.ndarray, axes, keepdims: bool, api: str, selected=None) -> np.ndarray:
    """Reduce ``values`` over ``axes``; under a mask only selected elements count, and results with
    no selected element hold poison."""
    if name == "subtract":  # a legal reduction in the operator table, but no page says in which order
        raise UnsupportedError(f"{api} with a subtract reduction", "the API pages do not define its order")
    if name not in REDUCIBLE:
        raise KernelUsageError(f"{api}: {name} is not a reduction operator; use one of {sorted(REDUCIBLE)}")
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
    return np.where(nothing_selected, active_config().fill_value(result.dtype), result)


def check_engine_access(x, engine, api: str, arg: str) -> None:
    if engine == GPSIMD and getattr(x, "buffer", None) is memory.psum:
        raise MemorySpaceError(f"Expected operand '{arg}' of '{api}' to be in address space 'sbuf', but got a tile "
                               f"in 'psum' instead (the GpSimd engine cannot access PSUM)")


def require_power_operand(x, api: str, arg: str) -> None:
    """tensor_tensor pages (NKI 0.6; legacy likewise): "Since GpSimd Engine cannot access PSUM, the
    input/output tiles cannot be in PSUM if op is nl.power"."""
    if getattr(x, "buffer", None) is memory.psum:
        raise MemorySpaceError(f"Expected operand '{arg}' of '{api}' with op=nl.power to be in address space "
                               f"'sbuf', but got a tile in 'psum' instead (tensor '{x.name}'; power runs on the "
                               f"GpSimd engine, which cannot access PSUM)")


def require_tile_operand(x, api: str, arg: str) -> None:
    if not isinstance(x, alu.TILES):
        raise KernelUsageError(f"operand '{arg}' of '{api}' must be a tile, got {type(x).__name__}")


def require_sbuf(x, api: str, arg: str) -> None:
    if x.buffer is not memory.sbuf:
        raise MemorySpaceError(f"Expected operand '{arg}' of '{api}' to be in address space 'sbuf', but got a "
                               f"tile in '{x.buffer.space}' instead (tensor '{x.name}'; the Tensor engine reads "
                               f"only SBUF)")


def per_partition(operand, partitions: int, api: str, arg: str, ndim: int = 2) -> np.ndarray:
    """A scalar or a (P, 1) per-partition column, as fp32 broadcastable against a (P, F...) operand
    of rank ``ndim``."""
    values = dt.to_f32(value_of(operand, api, arg))
    if values.ndim == 0:
        return values
    if values.ndim == 1:
        values = values[:, None]
    if values.shape[0] != partitions or values.size != partitions:
        raise KernelUsageError(f"{api}: '{arg}' must be a scalar or a ({partitions}, 1) per-partition vector, "
                               f"got shape {list(values.shape)}")
    return values.reshape((partitions,) + (1,) * (max(ndim, 2) - 1))


def _scalar_op(values, op, operand, reverse, partitions, api, arg, out=None):
    return scalar_stages(values, [scalar_stage(op, operand, reverse, partitions, values.ndim, api, arg)], out)


def scalar_stage(op, operand, reverse, partitions, ndim, api, arg):
    """A tensor_scalar stage ``(fn, operand values, reverse)``: an arithmetic operand as fp32, a scalar or
    (P, 1...) of rank ``ndim``; a bitwise one as it is."""
    _, fn, float_compute = alu_op(op, api)
    operand_v = per_partition(operand, partitions, api, arg, ndim) if float_compute else \
        np.asarray(value_of(operand, api, arg))
    return fn, operand_v, reverse


def scalar_stages(values, stages, out=None):
    """``values`` through each stage in turn (``scalar_stage``), the last computed into ``out`` where it may."""
    for fn, operand, reverse in stages[:-1]:
        values = _apply(fn, operand, values, None) if reverse else _apply(fn, values, operand, None)
    fn, operand, reverse = stages[-1]
    return _apply(fn, operand, values, out) if reverse else _apply(fn, values, operand, out)


def live(operands, arrays) -> bool:
    """Whether each of ``arrays`` (the values an instruction took from ``operands``: tensors, accesses or
    scalars) is a view of its tensor's storage (a scalar's: a constant), so that an array form reading it
    reads each call's values (``replay.form``)."""
    for x, values in zip(operands, arrays):
        if isinstance(x, tensors.Access):
            x = x.tensor
        if isinstance(x, tensors.Tensor):
            if not np.may_share_memory(values, replay.array_of(x)):
                return False
        elif x is not None and not isinstance(x, (int, float, np.number, np.bool_)):
            return False
    return True


def _apply(fn, lhs, rhs, out):
    """``fn(lhs, rhs)``, computed into ``out`` (an fp32 destination) when ``fn`` is a NumPy ufunc and the
    fp32 result has exactly ``out``'s shape: the same values without a temporary and a copy. Operands
    are fp32, or one is bool (a comparison's result): NumPy then runs the fp32 loop either way."""
    if fn in _NO_SCALAR_LOOP:
        lhs, rhs = _vector_operands(lhs, rhs)
    if (out is not None and isinstance(fn, np.ufunc) and lhs.dtype in _FP32_LOOP and rhs.dtype in _FP32_LOOP
            and (lhs.dtype == dt.float32 or rhs.dtype == dt.float32)
            and ((lhs.shape == out.shape and _broadcasts(rhs.shape, out.shape))
                 or (rhs.shape == out.shape and _broadcasts(lhs.shape, out.shape)))):
        return fn(lhs, rhs, out=out)
    return fn(lhs, rhs)


def _ufunc_into(dst: np.ndarray, fn, operands, out) -> tuple | None:
    """The one call a binary form comes to when it computes into ``dst`` (``replay.direct``): ``fn`` a binary
    ufunc on two fp32 arrays of dst's shape (so neither is converted, broadcast or replaced by an array of a
    scalar), ``out`` dst itself."""
    if (out is dst and isinstance(fn, np.ufunc) and fn.nin == 2 and len(operands) == 2
            and all(isinstance(v, np.ndarray) and v.dtype == dt.float32 and v.shape == dst.shape for v in operands)):
        return replay.binary, [dst, fn, *operands]
    return None


_FP32_LOOP = (dt.float32, dt.bool_)
# NumPy's maximum and minimum have no vector loop for a one-element operand: against an array of the
# scalar they run about five times as fast (the same values, NaN and signed zeros included), from
# _SCALAR_FULL elements on, where that outweighs filling the array.
_NO_SCALAR_LOOP = (np.maximum, np.minimum)
_SCALAR_FULL = 2048


def _vector_operands(lhs: np.ndarray, rhs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Operands of ``_NO_SCALAR_LOOP``: a one-element one against an array of at least _SCALAR_FULL elements
    as an array of that shape holding it."""
    if lhs.size == 1 and rhs.size >= _SCALAR_FULL and lhs.ndim <= rhs.ndim:
        return _scalar_array(rhs.shape, lhs), rhs
    if rhs.size == 1 and lhs.size >= _SCALAR_FULL and rhs.ndim <= lhs.ndim:
        return lhs, _scalar_array(lhs.shape, rhs)
    return lhs, rhs


def _scalar_array(shape: tuple[int, ...], scalar: np.ndarray) -> np.ndarray:
    """An array of ``shape`` holding ``scalar`` (one element): kept for the next call up to 256 KiB."""
    if math.prod(shape) * scalar.itemsize <= _KEPT_BYTES:
        return _kept_scalar_array(shape, scalar.dtype, scalar.tobytes())
    return np.full(shape, scalar.reshape(()), scalar.dtype)


_KEPT_BYTES = 256 << 10


@functools.lru_cache(maxsize=32)
def _kept_scalar_array(shape: tuple[int, ...], dtype: np.dtype, value: bytes) -> np.ndarray:
    """A read-only array of ``shape`` holding the scalar whose bytes are ``value`` (bytes: -0.0 is not 0.0)."""
    array = np.full(shape, np.frombuffer(value, dtype)[0], dtype)
    array.flags.writeable = False
    return array


def _broadcasts(shape, to) -> bool:
    """Whether an operand of ``shape`` broadcasts to ``to`` (NumPy rules) without enlarging it."""
    return shape == to or (len(shape) <= len(to) and all(s in (1, t) for s, t in zip(reversed(shape), reversed(to))))


# ------------------------------------------------------------------- element-wise (legacy nl functions)

def as_columns(values: list[np.ndarray]) -> list[np.ndarray]:
    """A reduced (P,) per-partition vector broadcasts as (P, 1) against 2-D tiles."""
    if max(v.ndim for v in values) >= 2:
        return [v[:, None] if v.ndim == 1 else v for v in values]
    return values


def elementwise(api: str, fn, operands, names, dtype, mask, *, default_dtype=None, float_compute=True):
    selected = indexing.mask_values(mask)
    values = [memory.value_of(x, api, n, selected) for x, n in zip(operands, names)]
    if not any(alu.is_tile(x) for x in operands):
        raise KernelUsageError(f"{api} needs at least one tile operand")
    if dtype is not None:
        out_dtype = dt.as_dtype(dtype)
    else:
        out_dtype = default_dtype or dt.result_dtype(v.dtype for v in values)
    values = as_columns(values)
    # Timing-only mode computes integer results: few and small, they may be addresses (indirect DMA).
    if active_config().timing_only and out_dtype.kind not in "iub":
        shape = np.broadcast_shapes(*(v.shape for v in values))
        return memory.tile_from_values(np.zeros(shape, out_dtype), out_dtype, api, mask=selected, fresh=True)
    result = elementwise_values(fn, values, float_compute)
    # A ufunc's result is a new array; an identity-like op may hand back an operand, which must be copied.
    fresh = result.flags.owndata and all(result is not v for v in values)
    tile = memory.tile_from_values(result, out_dtype, api, mask=selected, fresh=fresh)
    if _run.recordings and selected is None and live(operands, values):
        into = tile.data if isinstance(fn, np.ufunc) and tile.dtype == result.dtype == dt.float32 else None
        replay.form(replay.into, tile.data, elementwise_values, fn, values, float_compute, into, writes=(tile,))
    return tile


def elementwise_values(fn, values: list, float_compute: bool, out=None) -> np.ndarray:
    """The element-wise ``fn`` of ``values`` (fp32 when ``float_compute``), into ``out`` when given (a ufunc's
    fp32 result of its shape)."""
    operands = [dt.to_f32(v) for v in values] if float_compute else values
    if fn in _NO_SCALAR_LOOP and len(operands) == 2 and all(isinstance(v, np.ndarray) for v in operands):
        operands = _vector_operands(*operands)
    return np.asarray(fn(*operands)) if out is None else fn(*operands, out=out)


@replay.direct(elementwise_values)
def _elementwise_direct(dst, fn, values, float_compute, out=None):
    return _ufunc_into(dst, fn, values, out)


def binary(name: str, x, y, *, dtype=None, mask=None):
    """Element-wise ``name`` of two operands (tiles or scalars, NumPy broadcasting)."""
    api = f"nl.{name}"
    if name in alu.BITWISE:
        for operand in (x, y):
            kind = operand.dtype.kind if alu.is_tile(operand) else dt.scalar_dtype(operand).kind
            if kind not in "iub":
                shown = operand.dtype if alu.is_tile(operand) else type(operand).__name__
                raise KernelUsageError(f"{api} needs integer operands, got {shown}")
        return elementwise(api, alu.BITWISE[name], (x, y), ("x", "y"), dtype, mask, float_compute=False)
    if name in alu.COMPARE:
        return elementwise(api, alu.COMPARE[name], (x, y), ("x", "y"), dtype, mask, default_dtype=dt.bool_)
    if name == "divide" and _is_integer(x) and _is_integer(y) and (dtype is None or dt.as_dtype(dtype).kind in "iu"):
        # An integer quotient of integers truncates toward zero (C semantics): the public resize-nearest
        # kernel, run on devices, computes row indices as int_tile / width and stays in bounds only so.
        return elementwise(api, _int_divide, (x, y), ("x", "y"), dtype, mask)
    return elementwise(api, alu.BINARY[name], (x, y), ("x", "y"), dtype, mask)


def _is_integer(x) -> bool:
    return (x.dtype if alu.is_tile(x) else dt.scalar_dtype(x)).kind in "iu" and not isinstance(x, bool)


def _int_divide(a, b):
    return np.trunc(a / b)


def unary(name: str, x, *, dtype=None, mask=None):
    return elementwise(f"nl.{name}", alu.UNARY[name], (x,), ("x",), dtype, mask)


def invert(x, *, dtype=None, mask=None):
    """Bitwise NOT of an integer tile (logical NOT of a bool tile)."""
    if x.dtype.kind not in "iub":
        raise KernelUsageError(f"nl.invert needs an integer or bool tile, got {x.dtype}")
    return elementwise("nl.invert", np.invert, (x,), ("x",), dtype, mask, float_compute=False)


# -------------------------------------------------------------------------------- Tensor engine

def check_pe_tiling(api: str, tile_position, tile_size, stationary=None, moving=None) -> None:
    """PE tiling (``nc_matmul``'s tile_position/tile_size, both generations): the 128 x 128 PE array's rows and
    columns each split into 2 x 64 or (NeuronCore-v3+) 4 x 32 tiles, a tile starting at a multiple of its size
    (the nc_matmul pages; the legacy page's "multiples of 32" names no other split the array has); the
    operands' partitions fit the row size and the stationary free size the column size."""
    if not tile_position and not tile_size:
        return
    if len(tile_position) != 2 or len(tile_size) != 2:
        raise KernelUsageError(f"{api}: tile_position and tile_size must both be (row, col) pairs, got "
                               f"{tile_position!r} and {tile_size!r}")
    sizes = (32, 64, 128) if active_config().nc_version >= 3 else (64, 128)
    for pos, size in zip(tile_position, tile_size):
        if size not in sizes or pos % size or pos + size > 128:
            raise KernelUsageError(f"{api}: a PE tile is {' or '.join(map(str, sizes))} rows/columns on "
                                   f"{active_config().target}, starting at a multiple of its size; got "
                                   f"tile_position={tuple(tile_position)} tile_size={tuple(tile_size)}")
    rows, cols = tile_size
    for t, what in ((stationary, "stationary"), (moving, "moving")):
        if t is not None and t.shape[0] > rows:
            raise KernelUsageError(f"{api}: {what} has {t.shape[0]} partitions, more than the PE tile's "
                                   f"{rows} rows (tile_size={tuple(tile_size)})")
    if stationary is not None and math.prod(stationary.shape[1:]) > cols:
        raise KernelUsageError(f"{api}: stationary free size {math.prod(stationary.shape[1:])} exceeds the PE "
                               f"tile's {cols} columns (tile_size={tuple(tile_size)})")


def matmul(api: str, stationary, moving, moving_fmax: int = 512, copies_psum: bool = False,
           flatten_free: bool = False) -> np.ndarray:
    """``stationary.T @ moving`` in fp32 with the Tensor engine's operand checks. The engine reads
    SBUF; ``copies_psum`` accepts PSUM operands for the legacy compiler, which copies them to SBUF
    first (the public flash-attention kernels multiply ``nc_transpose`` results, which land in PSUM).
    ``flatten_free``: operands with several free dims (current-API access patterns) count as
    (partitions, elements per partition)."""
    for operand, arg in ((stationary, "stationary"), (moving, "moving")):
        require_tile_operand(operand, api, arg)
        if not copies_psum:
            require_sbuf(operand, api, arg)
    s = read(stationary, api, "stationary")
    m = read(moving, api, "moving")
    if flatten_free:
        s, m = s.reshape(s.shape[0], -1), m.reshape(m.shape[0], -1)
    if s.ndim != 2 or m.ndim != 2:
        raise KernelUsageError(f"{api}: operands must be 2-D tiles, got {list(s.shape)} and {list(m.shape)}")
    (k_s, free_s), (k_m, free_m) = s.shape, m.shape
    if k_s != k_m:
        raise KernelUsageError(f"{api}: contraction (partition) sizes differ: stationary {list(s.shape)} vs "
                               f"moving {list(m.shape)}; both operands hold K on the partition dimension")
    limits = ((k_s, 128, "contraction (partition) size"), (free_s, 128, "stationary free size"),
              (free_m, moving_fmax, "moving free size"))
    for size, limit, what in limits:
        if size > limit:
            violation(TileLimitError(f"{api}: {what} {size} exceeds the Tensor engine limit of {limit}"))
    if (s.dtype == dt.float32) != (m.dtype == dt.float32):
        raise KernelUsageError(f"{api}: if one operand is float32 the other must be too, got {s.dtype} and "
                               f"{m.dtype}")
    if trace.listening:
        trace.engine(TENSOR)
    if active_config().timing_only:
        return np.zeros((free_s, free_m), np.float32)  # shapes only: the product is not computed
    return product(s, m)


def product(s: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``s.T @ m`` in fp32, of (partitions, elements per partition) operands.

    A one-partition contraction (the ones-row matmul that copies a row to every partition) is an outer
    product, one rounded multiply per element, which BLAS takes about ten times as long over as NumPy's
    multiply; adding +0.0 gives its zeros the sign of a sum that starts from zero, as BLAS's do."""
    s, m = dt.to_f32(s.reshape(s.shape[0], -1)), dt.to_f32(m.reshape(m.shape[0], -1))
    if s.shape[0] == 1:
        values = np.multiply(s.T, m)
        return np.add(values, np.float32(0.0), out=values)
    return blas.matmul(s.T, m)


def transpose(api: str, data, engine, selected=None, copies_psum: bool = False) -> tuple[np.ndarray, bool]:
    """Partition <-> free transpose: Tensor engine (<= 128 x 128, SBUF -> PSUM) or Vector engine
    (<= 32 x 32). ``UNKNOWN`` picks Vector when both sizes are <= 32. Returns (values, on_vector).
    ``copies_psum``: a PSUM input is accepted on the Tensor engine (the legacy compiler copies it)."""
    raw = read(data, api, "data", selected)
    values = raw.reshape(raw.shape[0], -1)
    on_vector = engine == VECTOR or (engine == UNKNOWN and max(values.shape) <= 32)
    limit = 32 if on_vector else 128
    if max(values.shape) > limit:
        violation(TileLimitError(f"{api} on the {'Vector' if on_vector else 'Tensor'} engine supports "
                                 f"at most {limit} x {limit}, got {list(values.shape)}"))
    if not on_vector and not copies_psum:
        require_sbuf(data, api, "data")
    if trace.listening:
        trace.engine(VECTOR if on_vector else TENSOR)
    if selected is None:
        return transposed(raw, on_vector), on_vector
    if on_vector:
        return values.T, True
    selected = tensors.mask_for(selected, column(raw).shape).reshape(values.shape)
    return pe_transpose(values, selected), False


def transposed(raw: np.ndarray, on_vector: bool) -> np.ndarray:
    """``raw`` as (partitions, elements) transposed, on the Vector engine or the Tensor engine."""
    values = raw.reshape(raw.shape[0], -1)
    return values.T if on_vector else pe_transpose(values)


def pe_transpose(values: np.ndarray, selected=None) -> np.ndarray:
    """``values.T`` on the Tensor engine, a matmul against an identity. Before NeuronCore-v3 it is an
    ordinary one, "not bit-accurate if the input data contains NaN/Inf" (nki.isa.nc_transpose page):
    "the NaN/Inf values will propagate through the accumulation chain and spread across the output
    tensor" (trn2 arch guide, "Built-in Transpose Support"). Output [i, j] sums values[k, i] * (k == j)
    over k, so it is NaN when a NaN or Inf sits at any other k of input column i (NaN * 0 = Inf * 0 =
    NaN); finite values keep their bits (the page puts the inexactness on NaN/Inf inputs only).
    NeuronCore-v3's transpose mode is bit-exact. ``selected``
    (broadcast to ``values``): under a mask only the selected elements are read."""
    out = values.T
    if active_config().nc_version >= 3 or not dt.is_float(values.dtype):
        return out
    spreading = ~np.isfinite(dt.to_f32(values))
    if selected is not None:
        selected = np.broadcast_to(selected, values.shape)
        spreading &= selected
    if not spreading.any():
        return out
    nan_out = (spreading.sum(axis=0)[:, None] - spreading.T) > 0
    if selected is not None:
        nan_out &= selected.T
    return np.where(nan_out, np.array(np.nan, values.dtype), out)


# ---------------------------------------------------------------------------------- Scalar engine

def activation_plan(api: str, op, data, bias=None, scale=1.0, selected=None, range_reduced: bool = False,
                    out=None):
    """``op(data * scale + bias)`` in fp32; scale is a scalar or (P, 1), bias is (P, 1);
    ``range_reduced`` as in ``activation_fn``. Checked, operands included: returns ``compute()``, as
    ``tensor_tensor_plan`` does (``out``: the fp32 destination it may compute into)."""
    fn = activation_fn(op, api, range_reduced)
    config = active_config()
    if bias is not None and op_name(op) == "reciprocal" and config.nc_version < 3:
        # "NKI ISA API Common Fields" page of both generations, engine selection: "nki.isa.activation(
        # op=nl.reciprocal) doesn't support setting bias on NeuronCore-v2."
        raise KernelUsageError(f"{api}: op=nl.reciprocal takes no bias on NeuronCore-v2 (target {config.target}); "
                               f"got bias={getattr(bias, 'name', bias)!r} (add it with a separate instruction, or "
                               f"use nisa.reciprocal)")
    if trace.listening:
        trace.engine(SCALAR, function=op_name(op))  # the profile counts transcendental functions

    def operands(raw):
        values = column(raw)
        partitions = values.shape[0]
        return (per_partition(scale, partitions, api, "scale", values.ndim),
                per_partition(bias, partitions, api, "bias", values.ndim) if bias is not None else None)

    raw = read(data, api, "data", selected)
    first = [(raw, *operands(raw))]  # read for the checks: the first computation uses them, later ones read again
    if config.timing_only:
        return lambda: np.zeros(raw.shape, np.float32)  # shapes only: no values are computed

    def compute() -> np.ndarray:
        if first:
            values, scale_v, bias_v = first.pop()
        else:
            values = read(data, api, "data", selected)
            scale_v, bias_v = operands(values)
        return activation_values(fn, values, scale_v, bias_v, out)

    if _run.recordings and selected is None and isinstance(data, tensors.Tensor):
        _, scale_v, bias_v = first[0]
        if live([scale, bias], [scale_v, bias_v]):
            compute.form = (raw.shape, activation_values, fn, replay.array_of(data), scale_v, bias_v, out)
    return compute


def activation(api: str, *args, **kwargs) -> np.ndarray:
    """``activation_plan``'s values."""
    return activation_plan(api, *args, **kwargs)()


def activation_values(fn, raw: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, out=None) -> np.ndarray:
    """``fn(raw * scale + bias)`` in fp32, in ``raw``'s shape; into ``out`` (fp32, raw's shape) when ``fn`` is
    a ufunc."""
    with np.errstate(all="ignore"):
        pre = dt.to_f32(column(raw)) * scale
        if bias is not None:
            pre = pre + bias
        if out is not None and isinstance(fn, np.ufunc) and pre.shape == out.shape == raw.shape:
            return fn(pre, out=out)
        return np.asarray(fn(pre), dtype=np.float32).reshape(raw.shape)


def _prelu(x, slope):
    return np.where(x > 0, x, x * slope)


def _activate2_stage(op, api: str, arg: str):
    """An ALU stage of activate2: an arithmetic operator, or None for ``nl.bypass``."""
    name = op_name(op)
    if name == "bypass":
        return None
    if name not in alu.BINARY:
        raise KernelUsageError(f"{api}: {arg} must be an arithmetic operator (nl.multiply, nl.add, nl.subtract, ...) "
                               f"or nl.bypass, got {getattr(op, '__name__', op)!r}")
    return op


def activate2(api: str, op, data, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False,
              reverse1=False) -> np.ndarray:
    """``op((data op0 imm0) op1 imm1)`` in fp32 on the Scalar engine (NeuronCore-v4 API page): a
    stage given ``nl.bypass`` is skipped, ``reverse`` swaps a stage's operands, the immediates are
    scalars or (P, 1); ``relu_param`` is ``nl.prelu``'s slope for negative inputs."""
    stage0, stage1 = _activate2_stage(op0, api, "op0"), _activate2_stage(op1, api, "op1")
    if stage0 is None and (stage1 is not None or reverse0):
        raise KernelUsageError(f"{api}: {'op1' if stage1 is not None else 'reverse0'} requires op0 to be set "
                               f"(op0 is nl.bypass)")
    if stage1 is None and reverse1:
        raise KernelUsageError(f"{api}: reverse1 requires op1 to be set (op1 is nl.bypass)")
    if alu.is_tile(imm0) and alu.is_tile(imm1) and imm0.dtype != imm1.dtype:
        raise KernelUsageError(f"{api}: imm0 and imm1 must have the same dtype when both are tensors, got "
                               f"{imm0.dtype} and {imm1.dtype}")
    fn = None if op_name(op) == "prelu" else activation_fn(op, api)
    if trace.listening:
        trace.engine(SCALAR, function=op_name(op))
    raw = read(data, api, "data")
    values = dt.to_f32(column(raw))
    partitions = values.shape[0]
    slope = per_partition(relu_param, partitions, api, "relu_param", values.ndim)
    if active_config().timing_only:
        return np.zeros(raw.shape, np.float32)  # shapes only: no values are computed
    with np.errstate(all="ignore"):
        if stage0 is not None:
            values = _scalar_op(values, stage0, imm0, reverse0, partitions, api, "imm0")
        if stage1 is not None:
            values = _scalar_op(values, stage1, imm1, reverse1, partitions, api, "imm1")
        result = _prelu(values, slope) if fn is None else fn(values)
        return np.asarray(result, dtype=np.float32).reshape(raw.shape)


def rms_norm(values: np.ndarray, weight: np.ndarray, axes, n, epsilon) -> np.ndarray:
    """``x / sqrt(sum(x^2 over axes) / n + epsilon) * w`` in fp32 (nl.rms_norm, both generations)."""
    with np.errstate(all="ignore"):
        rms = np.sqrt(np.square(values).sum(axis=axes, keepdims=True) / np.float32(n) + np.float32(epsilon))
        return values / rms * weight


# ---------------------------------------------------------------------------------- Vector engine

def exponential(api: str, src, max_value=0.0) -> np.ndarray:
    """``exp(src - max_value)`` in fp32 on the Vector engine (NeuronCore-v4); ``max_value`` is a scalar
    or (P, 1)."""
    if trace.listening:
        trace.engine(VECTOR)
    raw = read(src, api, "src")
    values = dt.to_f32(column(raw))
    shift = per_partition(max_value, values.shape[0], api, "max_value", values.ndim)
    if active_config().timing_only:
        return np.zeros(raw.shape, np.float32)  # shapes only: no values are computed
    with np.errstate(all="ignore"):
        return np.asarray(np.exp(values - shift), np.float32).reshape(raw.shape)

def tensor_tensor(api: str, data1, data2, op, engine=UNKNOWN, selected=None,
                  out=None, integer: bool = False) -> tuple[np.ndarray, np.dtype]:
    """Element-wise ``op(data1, data2)`` of two tiles with equal partition counts and sizes.
    Returns the values and the promoted operand dtype. ``out``: the fp32 destination array, which
    the values may be computed into (they are then ``out`` itself). ``integer``: exact int64 math
    for integer operands (the GpSimd engine's 32-bit integer arithmetic) instead of fp32."""
    compute, promoted = tensor_tensor_plan(api, data1, data2, op, engine, selected, out, integer)
    return compute(), promoted


def tensor_tensor_plan(api: str, data1, data2, op, engine=UNKNOWN, selected=None, out=None, integer: bool = False):
    """``tensor_tensor`` checked: returns ``compute()``, which reads the operands and computes the values
    (as often as it is called: a replay calls it again), and the promoted operand dtype."""
    for x, arg in ((data1, "data1"), (data2, "data2")):
        require_tile_operand(x, api, arg)
        check_engine_access(x, engine, api, arg)
    if data1.buffer is memory.psum and data2.buffer is memory.psum:
        raise MemorySpaceError(f"{api}: data1 and data2 cannot both be in PSUM; copy one to SBUF first")
    name, fn, float_compute = alu_op(op, api)
    if name == "power":  # both generations' tensor_tensor pages: power runs on GpSimd, which cannot read PSUM
        for x, arg in ((data1, "data1"), (data2, "data2")):
            require_power_operand(x, api, arg)
    if trace.listening and engine != UNKNOWN:
        trace.engine(engine)
    a, b = read(data1, api, "data1", selected), read(data2, api, "data2", selected)
    if a.shape[0] != b.shape[0]:
        raise KernelUsageError(f"{api}: number of partitions mismatch: {a.shape[0]} vs {b.shape[0]} (use "
                               f"broadcast_to or nisa.tensor_scalar for a per-partition operand)")
    shape, same = a.shape, a.size == b.size
    if not same:
        # Free-axis broadcasting of a (P, 1) operand: legal, though the docs point to tensor_scalar
        # as the faster way to do it.
        try:
            shape = np.broadcast_shapes(column(a).shape, column(b).shape)
        except ValueError:
            raise KernelUsageError(f"{api}: operands must have the same number of elements per partition (or "
                                   f"broadcast along the free axes), got shapes {list(a.shape)} and "
                                   f"{list(b.shape)}") from None
    promoted = dt.promote(a.dtype, b.dtype)
    if active_config().timing_only and not (a.dtype.kind in "iub" and b.dtype.kind in "iub"):
        return (lambda: np.zeros(shape, np.float32)), promoted  # shapes only: integers are computed
    operands = [a, b]  # read for the checks: the first computation uses them, later ones read again

    def compute() -> np.ndarray:
        if operands:
            a, b = operands
            operands.clear()
        else:
            a, b = read(data1, api, "data1", selected), read(data2, api, "data2", selected)
        if same:
            if b.shape != a.shape:
                b = b.reshape(a.shape)
        else:
            a, b = column(a), column(b)
        if integer:
            result = fn(a.astype(np.int64), b.astype(np.int64))
        else:
            result = _apply(fn, dt.to_f32(a), dt.to_f32(b), out) if float_compute else fn(a, b)
        return out if result is out else np.asarray(result).reshape(shape)

    if (_run.recordings and same and float_compute and not integer and selected is None and a.shape == b.shape
            and isinstance(data1, tensors.Tensor) and isinstance(data2, tensors.Tensor)):
        compute.form = (shape, _float_binary, fn, replay.array_of(data1), replay.array_of(data2), out)
    return compute, promoted


def _float_binary(fn, a, b, out):
    return _apply(fn, dt.to_f32(a), dt.to_f32(b), out)


@replay.direct(_float_binary)
def _float_binary_direct(dst, fn, a, b, out):
    return _ufunc_into(dst, fn, (a, b), out)


INT32 = (dt.int32, dt.uint32)
EXACT_INT_OPS = {"add", "subtract", "multiply", "maximum", "minimum"} | set(alu.COMPARE)


def gpsimd_integer(engine, op, tiles, out_dtype) -> bool:
    """Whether a tensor_tensor runs as GpSimd's native 32-bit integer arithmetic, the current API's default
    when every input and output tile is int32 or uint32 and none is in PSUM (the nisa.tensor_tensor page,
    NKI 0.6; ``nl`` element-wise calls lower to it): exact for all 32-bit values, sums and products wrap.
    The legacy page computes every arithmetic operator in fp32."""
    return (int(engine) in (UNKNOWN, GPSIMD) and out_dtype in INT32 and op_name(op) in EXACT_INT_OPS
            and all(alu.is_tile(t) and t.dtype in INT32 and t.buffer is not memory.psum for t in tiles))


def integer_tensor_tensor(api: str, data1, data2, op, out_dtype: np.dtype) -> np.ndarray:
    """``op(data1, data2)`` in GpSimd's 32-bit integer arithmetic (see :func:`gpsimd_integer`), as ``out_dtype``."""
    wide, _ = tensor_tensor(api, data1, data2, op, GPSIMD, integer=True)
    if wide.dtype.kind in "iu":  # not a comparison's bools, nor timing-only placeholders
        wide = (wide & 0xFFFFFFFF).astype(np.uint32).view(out_dtype)
    return wide


BITVEC = set(alu.BITWISE) | {"invert"}  # the operator table's bitvec operators


def check_tensor_scalar_ops(api: str, op0, op1, engine) -> None:
    """The nisa.tensor_scalar pages of both generations: "The two operators, op0 and op1, in a
    tensor_scalar instruction must be of the same type (both bitvec or both arithmetic)", and the engine
    ``gpsimd`` is "only allowed for rsqrt" (a GpSimd instruction with no rsqrt operator is refused; one
    with rsqrt and a second operator is let through, the page saying nothing of it)."""
    names = [op_name(op0)] + ([] if op1 is None else [op_name(op1)])
    if len(names) == 2 and (names[0] in BITVEC) != (names[1] in BITVEC):
        kinds = ["bitvec" if name in BITVEC else "arithmetic" for name in names]
        raise KernelUsageError(f"{api}: op0 and op1 must be of the same type (both bitvec or both arithmetic); got "
                               f"op0=nl.{names[0]} ({kinds[0]}) and op1=nl.{names[1]} ({kinds[1]})")
    if int(engine) == GPSIMD and "rsqrt" not in names:
        raise KernelUsageError(f"{api}: engine=gpsimd is only allowed for rsqrt (op0=nl.rsqrt); got "
                               f"{' and '.join(f'op{i}=nl.{n}' for i, n in enumerate(names))} (use the Vector or "
                               f"Scalar engine)")


def tensor_scalar_plan(api: str, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                       engine=UNKNOWN, selected=None, out=None):
    """``(data op0 operand0) op1 operand1``; operands are scalars or (P, 1) vectors. ``out``: as in
    ``tensor_tensor`` (only the last operator writes it). Checked, operands included: returns ``compute()``,
    as ``tensor_tensor_plan`` does."""
    require_tile_operand(data, api, "data")
    check_tensor_scalar_ops(api, op0, op1, engine)
    check_engine_access(data, engine, api, "data")
    if trace.listening and engine != UNKNOWN:
        trace.engine(engine)
    float_first = alu_op(op0, api)[2]

    def operands(raw):
        values = column(dt.to_f32(raw) if float_first else raw)
        first = scalar_stage(op0, operand0, reverse0, raw.shape[0], values.ndim, api, "operand0")
        if op1 is None:
            return values, (first,)
        return values, (first, scalar_stage(op1, operand1, reverse1, raw.shape[0], values.ndim, api, "operand1"))

    raw = read(data, api, "data", selected)
    if out is not None and out.shape != raw.shape:
        out = None
    checked = operands(raw)  # read for the checks: the first computation uses them, later ones read again

    def compute() -> np.ndarray:
        nonlocal checked
        values, stages = checked or operands(read(data, api, "data", selected))
        checked = None
        return _shaped(scalar_stages(values, stages, out), out, raw.shape)

    if _run.recordings and selected is None and isinstance(data, tensors.Tensor):
        stages = checked[1]
        if live([operand0, operand1][:len(stages)], [stage[1] for stage in stages]):
            compute.form = (raw.shape, _tensor_scalar_values, replay.array_of(data), float_first, stages, out)
    return compute


def tensor_scalar(api: str, *args, **kwargs) -> np.ndarray:
    """``tensor_scalar_plan``'s values."""
    return tensor_scalar_plan(api, *args, **kwargs)()


def _tensor_scalar_values(raw, float_first: bool, stages, out):
    return _shaped(scalar_stages(column(dt.to_f32(raw) if float_first else raw), stages, out), out, raw.shape)


@replay.direct(_tensor_scalar_values)
def _tensor_scalar_direct(dst, raw, float_first, stages, out):
    """The ufunc calls a tensor_scalar comes to when it computes into ``dst`` (``replay.direct``): fp32 data of
    dst's shape through one or two binary ufunc stages on fp32 operands that broadcast to it. A first of two
    stages computes into ``dst`` (as fp32 or bool values, exact in fp32) where the original made a temporary,
    so the second's operand must not lie in ``dst``."""
    if out is not dst or raw.dtype != dt.float32 or raw.shape != dst.shape or raw.ndim < 2:
        return None
    calls, values = [], raw
    for fn, operand, reverse in stages:
        if not (isinstance(fn, np.ufunc) and fn.nin == 2 and ("ff->f" in fn.types or "ff->?" in fn.types)
                and isinstance(operand, np.ndarray) and operand.dtype == dt.float32
                and _broadcasts(operand.shape, dst.shape)):
            return None
        if fn in _NO_SCALAR_LOOP and operand.ndim == 0 and dst.nbytes <= _KEPT_BYTES:
            operand = _vector_operands(dst, operand)[1]  # a constant's array, made once (a tile's is read each call)
        calls += [fn, operand, values] if reverse else [fn, values, operand]
        values = dst
    if len(stages) == 1:
        return replay.binary, [dst, *calls]
    if np.may_share_memory(stages[1][1], dst):
        return None
    return _two_stages, [dst, *calls]


def _two_stages(out, fn0, lhs0, rhs0, fn1, lhs1, rhs1) -> None:
    """A two-stage tensor_scalar computed in ``out`` (``_tensor_scalar_direct``)."""
    fn0(lhs0, rhs0, out=out)
    fn1(lhs1, rhs1, out=out)


def _shaped(result, out, shape):
    """An instruction's result: ``out`` if computed in it, else the values in the operand's shape."""
    return out if result is out else np.asarray(result).reshape(shape)


def scalar_tensor_tensor_plan(api: str, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False,
                              selected=None, out=None):
    """``(data op0 operand0) op1 operand1`` with ``operand0`` scalar/(P, 1) and ``operand1`` a full tile.
    ``out`` as in ``tensor_tensor`` (only op1 writes it). Checked: returns ``compute()``, as
    ``tensor_tensor_plan`` does."""
    require_tile_operand(data, api, "data")
    if data.buffer is memory.psum and getattr(operand1, "buffer", None) is memory.psum:
        raise MemorySpaceError(f"{api}: data and operand1 cannot both be in PSUM")

    def operands(raw):
        values = column(dt.to_f32(raw))
        other = read(operand1, api, "operand1", selected)
        if other.shape[0] != values.shape[0] or other.size != values.size:
            raise KernelUsageError(f"{api}: operand1 of shape {list(column(other).shape)} must match data "
                                   f"{list(values.shape)}")
        return raw, other, scalar_stage(op0, operand0, reverse0, values.shape[0], values.ndim, api, "operand0")

    first = [operands(read(data, api, "data", selected))]  # the checks, now; the first computation uses them
    fn1 = alu_op(op1, api)[1]
    raw, other, stage = first[0]
    if out is not None and out.shape != raw.shape:
        out = None

    def compute() -> np.ndarray:
        return scalar_tensor_tensor_values(*(first.pop() if first else operands(read(data, api, "data", selected))),
                                           fn1, reverse1, out)

    if (_run.recordings and selected is None and isinstance(data, tensors.Tensor)
            and isinstance(operand1, tensors.Tensor) and live([operand0], [stage[1]])):
        compute.form = (raw.shape, scalar_tensor_tensor_values, replay.array_of(data), replay.array_of(operand1),
                        stage, fn1, reverse1, out)
    return compute


def scalar_tensor_tensor_values(raw, other, stage, fn1, reverse1: bool, out):
    values = column(dt.to_f32(raw))
    other = column(dt.to_f32(other)).reshape(values.shape)
    first = scalar_stages(values, [stage])
    return _shaped(_apply(fn1, *((other, first) if reverse1 else (first, other)), out), out, raw.shape)


def tensor_reduce(api: str, op, data, axes, negate=False, keepdims=False, selected=None) -> np.ndarray:
    """Reduce along free ``axes`` with an ALU operator; ``negate`` multiplies the result by -1."""
    return reduced(api, op, read(data, api, "data", selected), axes, negate, keepdims, selected)


def reduced(api: str, op, raw: np.ndarray, axes, negate=False, keepdims=False, selected=None) -> np.ndarray:
    """``tensor_reduce``'s values of the data ``raw``."""
    name, _, float_compute = alu_op(op, api)
    values = dt.to_f32(raw) if float_compute else raw
    with np.errstate(all="ignore"):
        result = reduce_values(name, values, axes, keepdims, api, selected)
        return np.asarray(-result if negate else result)


def tensor_partition_reduce(api: str, op, data, selected=None) -> np.ndarray:
    """Reduce across partitions: (P, F) -> (1, F) on the GpSimd engine."""
    check_engine_access(data, GPSIMD, api, "data")
    if trace.listening:
        trace.engine(GPSIMD)
    name, _, float_compute = alu_op(op, api)
    raw = read(data, api, "data", selected)
    values = dt.to_f32(raw) if float_compute else raw
    return reduce_values(name, values, (0,), True, api, selected)


def affine_select(api: str, keep: np.ndarray, on_true_tile, on_false_value, selected=None) -> np.ndarray:
    """``on_true_tile`` where ``keep`` (the evaluated affine predicate) holds, else ``on_false_value``.
    GpSimd reads SBUF, but the compilers move a PSUM ``on_true_tile`` (public flash-attention kernels
    select straight from the matmul's PSUM tile) and the docs name no restriction, so it is accepted."""
    values = read(on_true_tile, api, "on_true_tile", selected)
    return selected_values(values, select_mask(api, keep, values.shape), on_false_value)


def select_mask(api: str, keep, shape) -> np.ndarray:
    """The predicate ``keep`` over an ``on_true_tile`` of ``shape``."""
    try:
        return np.broadcast_to(keep, shape)
    except ValueError:
        if np.size(keep) != math.prod(shape):
            raise KernelUsageError(f"{api}: predicate of shape {list(np.shape(keep))} does not cover on_true_tile "
                                   f"{list(shape)}") from None
        return np.reshape(keep, shape)


def selected_values(values: np.ndarray, keep: np.ndarray, on_false_value) -> np.ndarray:
    if values.dtype.kind in "iu":  # a select copies: integers stay exact, on_false_value as the tile's type
        return np.where(keep, values, dt.cast(np.asarray(on_false_value), values.dtype))
    return np.where(keep, dt.to_f32(values), np.float32(on_false_value))


def tensor_tensor_scan(api: str, data0, data1, initial, op0, op1, reverse0=False, reverse1=False) -> np.ndarray:
    """``r[:, i] = op1(op0(data0[:, i], r[:, i-1]), data1[:, i])`` along the flattened free axis,
    starting from ``initial`` (a scalar or (P, 1)); fp32 throughout."""
    for x, arg in ((data0, "data0"), (data1, "data1")):
        require_tile_operand(x, api, arg)
    if data0.buffer is memory.psum and data1.buffer is memory.psum:
        raise MemorySpaceError(f"{api}: data0 and data1 cannot both be in PSUM; copy one to SBUF first")
    a = dt.to_f32(read(data0, api, "data0"))
    b = dt.to_f32(read(data1, api, "data1"))
    if a.shape[0] != b.shape[0] or a.size != b.size:
        raise KernelUsageError(f"{api}: data0 {list(a.shape)} and data1 {list(b.shape)} must have the same "
                               f"partitions and elements per partition")
    a = a.reshape(a.shape[0], -1)
    b = b.reshape(a.shape)
    _, fn0, _ = alu_op(op0, api)
    _, fn1, _ = alu_op(op1, api)
    previous = np.broadcast_to(per_partition(initial, a.shape[0], api, "initial"), (a.shape[0], 1))
    if active_config().timing_only:
        return np.zeros_like(a)  # shapes only: the column-by-column scan is not computed
    out = np.empty_like(a)
    with np.errstate(all="ignore"):
        for i in range(a.shape[1]):
            column = a[:, i:i + 1]
            first = fn0(previous, column) if reverse0 else fn0(column, previous)
            previous = np.asarray(fn1(b[:, i:i + 1], first) if reverse1 else fn1(first, b[:, i:i + 1]),
                                  np.float32)
            out[:, i:i + 1] = previous
    return out


def bn_stats(api: str, data, selected=None) -> tuple[np.ndarray, np.ndarray | None]:
    """Per partition: (count, mean, count * variance) of the even- and of the odd-indexed elements,
    six values. Under a mask only the selected elements count; also returns which partitions had
    any (None without a mask)."""
    values = column(dt.to_f32(read(data, api, "data", selected)))
    if selected is not None:
        selected = tensors.mask_for(selected, values.shape).reshape(values.shape[0], -1)
    values = values.reshape(values.shape[0], -1)
    if values.shape[1] > BN_STATS_FMAX:
        violation(TileLimitError(f"{api}: free size {values.shape[1]} exceeds bn_stats_fmax {BN_STATS_FMAX}"))
    rows = None if selected is None else selected.any(axis=1, keepdims=True)
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
    return np.concatenate(stats, axis=1), rows


def bn_aggr(api: str, data, selected=None) -> np.ndarray:
    """Combine ``bn_stats`` outputs (P, 6k) into per-partition (mean, population variance) (P, 2)."""
    stats = dt.to_f32(read(data, api, "data", selected)).astype(np.float64)
    stats = stats.reshape(stats.shape[0], -1)
    if stats.shape[-1] % 3:
        raise KernelUsageError(f"{api}: expected a multiple of 6 bn_stats values per partition, got "
                               f"{stats.shape[-1]}")
    groups = stats.reshape(stats.shape[0], -1, 3)
    count, mean, m2 = groups[..., 0], groups[..., 1], groups[..., 2]
    total = count.sum(axis=1, keepdims=True)
    with np.errstate(all="ignore"):
        grand = (count * mean).sum(axis=1, keepdims=True) / total
        variance = (m2.sum(axis=1, keepdims=True) + (count * (mean - grand) ** 2).sum(axis=1, keepdims=True)) / total
    return np.concatenate([grand, variance], axis=1)


def reciprocal(api: str, data, selected=None, out=None) -> np.ndarray:
    """``1 / data`` in fp32; ``out`` as in ``tensor_tensor``."""
    return reciprocal_values(read(data, api, "data", selected), out)


def reciprocal_values(raw: np.ndarray, out=None) -> np.ndarray:
    return _apply(np.divide, _ONE, dt.to_f32(raw), out)


_ONE = np.float32(1.0)


# ----------------------------------------------------------------------------------------- DMA

def dma_operands(api: str, dst, src) -> None:
    """DMA moves between HBM and SBUF (either way, or within one); never PSUM."""
    for x, arg in ((dst, "dst"), (src, "src")):
        if not isinstance(x, alu.TILES):
            raise KernelUsageError(f"operand '{arg}' of '{api}' must be a tensor, got {type(x).__name__}")
        if x.buffer is memory.psum:
            raise MemorySpaceError(f"Expected operand '{arg}' of '{api}' to be in address space 'hbm|sbuf', but "
                                   f"got a tile in 'psum' instead (copy PSUM to SBUF first)")
    if trace.listening:
        trace.engine(DMA)
        trace.read(src)


def dma_values(api: str, values: np.ndarray, dst_shape, dst_dtype) -> np.ndarray:
    """Source values shaped like the destination; a cast goes through fp32."""
    if values.size != math.prod(dst_shape):  # not np.prod: ~3 us on a tuple, per DMA
        raise KernelUsageError(f"{api}: element counts differ: src {list(values.shape)} vs dst {list(dst_shape)}")
    values = values.reshape(dst_shape)
    return dt.to_f32(values) if dst_dtype != values.dtype else values


# ------------------------------------------------------------------- Vector engine: accumulators

IDLE, RESET, REDUCE, RESET_REDUCE, LOAD_REDUCE = 0, 1, 2, 3, 4  # nisa.reduce_cmd values, both generations


def _registers(api: str, engine_name: str, cmd: int) -> np.ndarray:
    """The engine's accumulator registers in this launch, one fp32 per partition, which ``cmd`` is
    about to use. Reading them (``reduce``, ``idle``) before any instruction of the kernel reset or
    loaded them is reported: the device leaves their content undefined (zeros here)."""
    if trace.listening:
        trace.side_effect()  # the instruction's result depends on, or changes, state no region records
    run = current_run(api)
    registers = getattr(run, "accumulators", None)
    if registers is None:
        registers = run.accumulators = {}
        run.accumulators_set = set()
    if cmd in (RESET, RESET_REDUCE, LOAD_REDUCE):
        run.accumulators_set.add(engine_name)
    elif engine_name not in run.accumulators_set:
        run.accumulators_set.add(engine_name)  # once per engine and launch
        unfit("a simulator warning")
        warnings.warn(f"{user_site()}: {api} reads the {engine_name} engine's accumulator registers "
                      f"(reduce_cmd={'reduce' if cmd == REDUCE else 'idle'}) before any instruction of the kernel "
                      f"reset or loaded them (reset, reset_reduce or load_reduce); their content is undefined on "
                      f"the device (zeros here)", SimulatorWarning, stacklevel=2)
    return registers.setdefault(engine_name, np.zeros(memory.PMAX, np.float32))


def accumulate(api: str, reduce_op, values: np.ndarray, cmd: int, engine_name: str, initial=None,
               selected=None) -> np.ndarray:
    """The engine's per-partition accumulator registers (one fp32 per lane, kept in the launch):
    ``reset`` zeroes them, ``reduce`` folds this instruction's free-axis reduction of ``values`` in,
    ``reset_reduce`` stores it, ``load_reduce`` sets them to ``initial`` (a scalar or (P, 1)) and then
    folds it in, ``idle`` leaves them. Under a legacy ``mask`` (``selected``) only the selected elements
    are reduced. Returns the (P, 1) registers after the command."""
    cmd = int(cmd)
    regs = _registers(api, engine_name, cmd)
    start = None
    if cmd == LOAD_REDUCE:
        if initial is None:
            raise UnsupportedError(f"{api}(reduce_cmd=load_reduce)")
        start = per_partition(initial, column(values).shape[0], api, "reduce_init")
    return fold(api, regs, values, cmd, reduce_op, start, selected)


def registers_of(api: str, engine_name: str) -> np.ndarray | None:
    """This launch's accumulator registers of an engine (None before any instruction used them)."""
    return getattr(current_run(api), "accumulators", {}).get(engine_name)


def fold(api: str, regs: np.ndarray, values: np.ndarray, cmd: int, reduce_op, start=None, selected=None) -> np.ndarray:
    """``accumulate`` on the registers ``regs``, ``start`` the fp32 values ``load_reduce`` sets them to."""
    values = column(values)
    partitions = values.shape[0]
    if start is not None:
        regs[:partitions] = np.broadcast_to(start.reshape(-1), (partitions,))
    if cmd == RESET:
        regs[:] = 0
    elif cmd:
        if reduce_op is None:
            raise KernelUsageError(f"{api}: reduce_cmd={cmd} needs reduce_op")
        name = op_name(reduce_op)
        flat = dt.to_f32(values).reshape(partitions, -1)
        if name in ABS_REDUCE:  # magnitudes: abs_max(a, b) = max(|a|, |b|)
            fold = ABS_REDUCE[name]
            reduced = fold.reduce(np.abs(flat), axis=1)
            fn = lambda a, b: fold(np.abs(a), b)  # noqa: E731
        else:
            name, fn, _ = alu_op(reduce_op, api)
            where = None if selected is None else tensors.mask_for(selected, values.shape).reshape(partitions, -1)
            reduced = reduce_values(name, flat, (1,), False, api, where)
        regs[:partitions] = reduced if cmd == RESET_REDUCE else fn(regs[:partitions], reduced)
    return regs[:partitions].reshape(partitions, 1).copy()


def activation_accumulate(api: str, reduce_op, values: np.ndarray, cmd: int, reduce_res, selected=None):
    """The Scalar engine's accumulator registers after an ``activation`` with ``reduce_cmd``, for ``reduce_res``
    (both generations' pages): they only add (reduce_op nl.add/np.add/np.sum). None when the instruction
    neither uses the registers nor writes ``reduce_res``."""
    if reduce_op is not None and op_name(reduce_op) != "add":
        raise KernelUsageError(f"{api}: the Scalar engine accumulates only with add (reduce_op=nl.add)")
    if reduce_res is None and int(cmd) == IDLE:
        return None
    return accumulate(api, reduce_op, values, cmd, "scalar", selected=selected)


ABS_REDUCE = {"abs_max": np.maximum, "abs_min": np.minimum}  # activate2's magnitude reductions


# tensor_scalar_cumulative's accumulator after reset_reduce: op1's identity (API page, NKI 0.6).
CUMULATIVE_START = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": -np.inf, "minimum": np.inf}


def tensor_scalar_cumulative(api: str, data: np.ndarray, op0, imm0, op1, imm1, cmd: int) -> np.ndarray:
    """``out[:, i] = acc = op1(op0(data[:, i], imm0), acc)`` along the flattened free axis in fp32; the
    Vector engine's accumulator starts at op1's identity (reset_reduce), where the last instruction
    left it (reduce) or at ``imm1`` (load_reduce, a scalar or (P, 1)), and keeps the last value."""
    name1, fn1, _ = alu_op(op1, api)
    if name1 not in CUMULATIVE_START:
        raise KernelUsageError(f"{api}: op1 must be one of {', '.join(CUMULATIVE_START)}, got {name1}")
    values = column(dt.to_f32(data))
    partitions = values.shape[0]
    steps = _scalar_op(values, op0, imm0, False, partitions, api, "imm0").reshape(partitions, -1)
    cmd = int(cmd)
    regs = _registers(api, "vector", cmd)
    if cmd == RESET_REDUCE:
        acc = np.full(partitions, CUMULATIVE_START[name1], np.float32)
    elif cmd == REDUCE:
        acc = regs[:partitions].copy()
    elif cmd == LOAD_REDUCE:
        if imm1 is None:
            raise KernelUsageError(f"{api}: reduce_cmd=load_reduce starts the accumulator at imm1, which is None")
        acc = np.broadcast_to(per_partition(imm1, partitions, api, "imm1").reshape(-1), (partitions,)).copy()
    else:
        raise KernelUsageError(f"{api}: reduce_cmd must be reset_reduce, reduce or load_reduce, got {cmd}")
    out = np.empty(steps.shape, np.float32)
    with np.errstate(all="ignore"):
        for i in range(steps.shape[1]):
            acc = np.asarray(fn1(steps[:, i], acc), np.float32)
            out[:, i] = acc
    regs[:partitions] = acc
    return out.reshape(data.shape)


# --------------------------------------------------------------- Vector engine: selects, top-8

FP32_MIN = np.frombuffer(np.uint32(0xFF7FFFFF).tobytes(), np.float32)[0]  # nl.fp32.min, the default fill
TOP8_FMAX = 16384
NOT_FOUND = np.iinfo(np.uint32).max  # nc_find_index8 / nc_match_replace8: a value absent from data


def blend(take: np.ndarray, on_true, on_false) -> np.ndarray:
    """``np.where(take, on_true, on_false)`` bit for bit (NaN payloads, -0.0), as a bitwise blend: NumPy's
    ``where`` branches per element and takes ~15x longer on a mask with no pattern (600 vs 40 us for
    [128, 512] fp32). Operands of different dtypes, or packed ones, fall back to ``where``."""
    on_true, on_false = np.asarray(on_true), np.asarray(on_false)
    if on_true.dtype != on_false.dtype or on_true.dtype.names or on_true.dtype.itemsize not in (1, 2, 4, 8):
        return np.where(take, on_true, on_false)
    bits = np.dtype(f"u{on_true.dtype.itemsize}")
    mask = take.astype(bits)
    np.negative(mask, out=mask)  # all ones where taken
    if not on_false.ndim and on_false.view(bits) == 0:
        return np.bitwise_and(on_true.view(bits), mask).view(on_true.dtype)
    false_bits = on_false.view(bits)
    result = np.bitwise_xor(on_true.view(bits), false_bits)  # ((t ^ f) & mask) ^ f: t where taken, else f
    result &= mask
    result ^= false_bits
    return result.view(on_true.dtype)


def require_predicate(pred: np.ndarray, allowed, api: str) -> None:
    """The Vector engine reads a predicate as an integer bit pattern; the ISA pages list its dtypes."""
    if pred.dtype.name not in allowed:
        raise KernelUsageError(f"{api}: predicate must be {', '.join(allowed)}, got {pred.dtype}")


def copy_predicated(api: str, pred: np.ndarray, src: np.ndarray, current: np.ndarray, reverse_pred) -> np.ndarray:
    """``src`` (an array of ``current``'s size, or a scalar) where the predicate is nonzero (zero with
    ``reverse_pred``), else ``current``: what the destination then holds."""
    take = (pred != 0) != bool(reverse_pred)
    if take.size != current.size:
        raise KernelUsageError(f"{api}: predicate {list(take.shape)} must match dst {list(current.shape)}")
    new = np.broadcast_to(src.reshape(current.shape) if src.ndim else src, current.shape)
    return blend(take.reshape(current.shape), new, current)


def check_select_reduce_dtypes(api: str, on_true, reduce_res) -> None:
    """select_reduce pages of both generations: "on_true can be any supported dtype except tfloat32,
    int32, uint32" (tfloat32 is stored as float32 here, so it goes unnoticed) and "reduce_res dtype must
    of float type"."""
    if on_true.dtype in INT32:
        raise KernelUsageError(f"{api}: on_true can be any dtype except tfloat32, int32 and uint32, got "
                               f"{on_true.dtype} (tensor '{getattr(on_true, 'name', '')}')")
    if reduce_res is not None and not dt.is_float(reduce_res.dtype):
        raise KernelUsageError(f"{api}: reduce_res must have a floating-point dtype, got {reduce_res.dtype} "
                               f"(tensor '{getattr(reduce_res, 'name', '')}')")


def select(api: str, pred: np.ndarray, on_true: np.ndarray, on_false, reverse_pred) -> np.ndarray:
    """``where(predicate, on_true, on_false)`` with a scalar or a (P, 1) ``on_false`` (select_reduce)."""
    if pred.size != on_true.size:
        raise KernelUsageError(f"{api}: predicate {list(pred.shape)} must match on_true {list(on_true.shape)}")
    take = pred.reshape(on_true.shape) == 0 if reverse_pred else pred.reshape(on_true.shape) != 0
    other = per_partition(on_false, on_true.shape[0], api, "on_false", on_true.ndim)
    return blend(take, on_true, np.broadcast_to(other, on_true.shape) if other.ndim else other)


RANGE_COMPARISONS = ("equal", "less", "less_equal", "greater", "greater_equal")


def range_select(api: str, on_true: np.ndarray, comp_op0, comp_op1, bound0, bound1, range_start,
                 on_false_value) -> np.ndarray:
    """Keep element ``j`` of partition ``p`` where ``comp_op0(j + range_start, bound0[p])`` and
    ``comp_op1(j + range_start, bound1[p])`` (compared in fp32), else ``on_false_value``; [P, F] fp32.
    The API pages: the comparisons are equal/less/less_equal/greater/greater_equal, and the hardware
    fills with FP32_MIN only."""
    for op, arg in ((comp_op0, "comp_op0"), (comp_op1, "comp_op1")):
        if op_name(op) not in RANGE_COMPARISONS:
            raise KernelUsageError(f"{api}: {arg} must be one of {', '.join(RANGE_COMPARISONS)}, got "
                                   f"{getattr(op, '__name__', op)!r}")
    if np.float32(on_false_value) != FP32_MIN:
        raise KernelUsageError(f"{api}: on_false_value must be FP32_MIN (nl.fp32.min, -3.4028235e+38), got "
                               f"{on_false_value!r}")
    if not dt.is_float(on_true.dtype):  # both generations' pages: "on_true_tile must be one of the FP dtypes"
        raise KernelUsageError(f"{api}: on_true_tile must have a floating-point dtype, got {on_true.dtype}")
    values = dt.to_f32(on_true).reshape(on_true.shape[0], -1)
    partitions = values.shape[0]
    low = per_partition(bound0, partitions, api, "bound0").reshape(-1, 1)
    high = per_partition(bound1, partitions, api, "bound1").reshape(-1, 1)
    position = np.arange(values.shape[1], dtype=np.float32)[None, :] + np.float32(range_start)
    keep = alu_op(comp_op0, api)[1](position, low) & alu_op(comp_op1, api)[1](position, high)
    return np.where(keep, values, np.float32(on_false_value))


def _rows(values: np.ndarray) -> np.ndarray:
    return dt.to_f32(values).reshape(values.shape[0], -1)


def max8(api: str, values: np.ndarray, selected=None) -> np.ndarray:
    """The 8 largest values of each partition in descending order, [P, 8] fp32. ``selected``: which
    elements are read (the rest do not take part)."""
    values = _rows(values)
    read_count = values.shape[1] if selected is None else int(selected.reshape(values.shape).sum(axis=1).max())
    if not 8 <= read_count <= TOP8_FMAX:
        violation(TileLimitError(f"{api}: {read_count} elements read per partition, expected 8 to {TOP8_FMAX}"))
    if selected is not None:
        values = np.where(selected.reshape(values.shape), values, -np.inf)
    return -_first_eight(-values)


_CANDIDATES = 64  # the widest row of candidates ``_first_eight`` sorts instead of the whole row


def _first_eight(values: np.ndarray) -> np.ndarray:
    """``np.sort(values, axis=1, kind="stable")[:, :8]`` without sorting whole rows: ``np.partition`` finds
    each row's 8th smallest value, and only the values up to it (those equal to it too, in their order, so
    that equal values of other bits, -0.0 and 0.0, come as the stable sort gives them) are sorted. Rows
    with NaN among their 8 smallest or with many values equal to the 8th sort in full."""
    if values.shape[1] <= _CANDIDATES:
        return np.sort(values, axis=1, kind="stable")[:, :8]
    eighth = np.partition(values, 7, axis=1)[:, :8].max(axis=1, keepdims=True)
    candidates = values <= eighth
    counts = candidates.sum(axis=1)
    if np.isnan(eighth).any() or counts.max() > _CANDIDATES:
        return np.sort(values, axis=1, kind="stable")[:, :8]
    rows, cols = np.nonzero(candidates)  # row by row, each row's in ascending position
    kept = np.full((values.shape[0], int(counts.max())), np.inf, values.dtype)
    kept[rows, np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)] = values[rows, cols]
    return np.sort(kept, axis=1, kind="stable")[:, :8]  # a row's padding comes after its >= 8 candidates


def _pair_matches(values: np.ndarray, targets: np.ndarray, order) -> np.ndarray:
    """For each partition, each target (taken in ``order``) is paired with the first position of an
    equal value not yet paired with an earlier target; NOT_FOUND when none is left. [P, 8] uint32.

    Equal values (``==``: -0.0 and 0.0 too, NaN never) form classes whose positions no other target can
    take, so a target whose class had ``r`` targets before it in ``order`` takes its class's ``r + 1``-th
    position in the row."""
    order = list(order)
    index = np.full(targets.shape, NOT_FOUND, np.uint32)
    if not values.shape[1]:
        return index
    targets = targets[:, order]
    earlier = np.tri(8, k=-1, dtype=bool)  # [k, j]: j comes before k in order
    rank = ((targets[:, :, None] == targets[:, None, :]) & earlier).sum(axis=2)
    rows = np.arange(values.shape[0])
    for k in range(8):
        equal = values == targets[:, k:k + 1]
        if rank[:, k].any():
            seen = np.cumsum(equal, axis=1, dtype=np.int32)
            found = seen[:, -1] > rank[:, k]
            index[found, k] = np.argmax(seen[found] > rank[found, k:k + 1], axis=1)
        else:  # each target's first equal value
            first = np.argmax(equal, axis=1)
            found = equal[rows, first]
            index[found, k] = first[found]
    return index[:, np.argsort(order)]


def _eight_values(api: str, vals: np.ndarray, partitions: int) -> np.ndarray:
    targets = _rows(vals)
    if targets.shape != (partitions, 8):
        raise KernelUsageError(f"{api}: vals must hold 8 values in each of data's {partitions} partitions, got "
                               f"shape {list(vals.shape)}")
    return targets


def find_index8(api: str, data: np.ndarray, vals: np.ndarray, selected=None) -> np.ndarray:
    """Per partition, the index of the first occurrence of each of the 8 ``vals`` in ``data`` (flattened
    free axes), [P, 8] uint32; duplicate vals take successive occurrences in ascending order, an
    absent value gives all ones. ``selected`` (the mask) restricts the elements of ``data`` searched."""
    values = _rows(data)
    if not 8 <= values.shape[1] <= TOP8_FMAX:
        violation(TileLimitError(f"{api}: {values.shape[1]} elements per partition, expected 8 to {TOP8_FMAX}"))
    if selected is not None:
        values = np.where(selected.reshape(values.shape), values, np.nan)  # NaN equals nothing
    return _pair_matches(values, _eight_values(api, vals, values.shape[0]), range(8))


def match_replace8(api: str, data: np.ndarray, vals: np.ndarray, imm, selected=None) -> tuple[np.ndarray, np.ndarray]:
    """Replace the first occurrence of each of the 8 ``vals`` in each partition of ``data`` with ``imm``.
    The hardware takes ``vals`` from the last to the first, so duplicate vals pair with successive
    occurrences in descending slot order (API page, NKI 0.6). Returns (values in fp32 with data's
    shape, [P, 8] uint32 matched positions). ``selected``: the elements of ``data`` searched."""
    values = _rows(data).copy()
    if values.shape[1] > TOP8_FMAX:
        violation(TileLimitError(f"{api}: {values.shape[1]} elements per partition, at most {TOP8_FMAX}"))
    searched = values if selected is None else np.where(selected.reshape(values.shape), values, np.nan)
    index = _pair_matches(searched, _eight_values(api, vals, values.shape[0]), range(7, -1, -1))
    rows, slots = np.nonzero(index != NOT_FOUND)
    values[rows, index[rows, slots].astype(np.int64)] = np.float32(imm)
    return values.reshape(data.shape), index


def stream_shuffle(api: str, src: np.ndarray, current: np.ndarray, shuffle_mask) -> np.ndarray:
    """Within each 32-partition quadrant, partition ``i`` of the result is partition ``shuffle_mask[i]``
    of ``src`` (counted from src's first partition, so a 1-partition src can feed a quadrant); 255
    keeps ``current`` (dst's values). ``src`` and ``current`` have the same elements per partition."""
    mask = [int(m) for m in shuffle_mask]
    if len(mask) != 32 or any(not (0 <= m < 32 or m == 255) for m in mask):
        raise KernelUsageError(f"{api}: shuffle_mask must be 32 partition indices in [0, 32) or 255, got {mask}")
    if src.size // src.shape[0] != current.size // current.shape[0]:
        raise KernelUsageError(f"{api}: src {list(src.shape)} and dst {list(current.shape)} must have the same "
                               f"elements per partition")
    src = src.reshape((src.shape[0],) + current.shape[1:])
    result = np.array(current)
    for p in range(current.shape[0]):
        source = mask[p % 32]
        if source != 255:
            q = p - p % 32 + source
            if q >= src.shape[0]:
                raise OutOfBoundsError(f"{api}: partition {p} reads partition {q} of a {src.shape[0]}-partition src")
            result[p] = src[q]
    return result


def dropout(api: str, data: np.ndarray, prob, run) -> np.ndarray:
    """Each element is replaced by zero with probability ``prob`` (a scalar or (P, 1): 1 drops all, 0
    keeps all) from the launch's Vector-engine XORWOW generators (``core/random.py``); kept values
    unscaled, in ``data``'s dtype."""
    values = column(data)
    drop = per_partition(prob, values.shape[0], api, "prob", values.ndim)
    keep = random.uniform(run, "vector", values.shape) >= drop
    return np.where(keep, values, np.zeros((), values.dtype)).reshape(data.shape)


# ----------------------------------------------------------------------------------- gathers, DMA

def gather_flattened(api: str, values: np.ndarray, indices: np.ndarray, name: str) -> np.ndarray:
    """Per partition, ``values.flatten()[indices]`` over the free axes (nc_n_gather, nl.gather_flattened);
    the result has ``indices``' shape. The docs call an index past the row garbage: here it is an error."""
    rows = values.reshape(values.shape[0], -1)
    where = indices.reshape(indices.shape[0], -1).astype(np.int64)
    if where.shape[0] != rows.shape[0]:
        raise KernelUsageError(f"{api}: data {list(values.shape)} and indices {list(indices.shape)} must share "
                               f"partitions")
    if where.size and (where.min() < 0 or where.max() >= rows.shape[1]):
        raise OutOfBoundsError(f"{api}: indices [{where.min()}, {where.max()}] outside the {rows.shape[1]} "
                               f"elements per partition of '{name}'")
    return np.take_along_axis(rows, where, axis=1).reshape(indices.shape)


DMA_TRANSPOSE_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}  # the documented permutation per rank


def dma_transpose(api: str, values: np.ndarray, axes=None) -> np.ndarray:
    """DMA transpose with axes (1, 0), (2, 1, 0) or (3, 1, 2, 0); without axes, the one of the rank."""
    axes = tuple(axes) if axes is not None else DMA_TRANSPOSE_AXES.get(values.ndim, ())
    if axes not in DMA_TRANSPOSE_AXES.values():
        raise KernelUsageError(f"{api}: axes must be (1, 0), (2, 1, 0) or (3, 1, 2, 0), got {axes}")
    if len(axes) != values.ndim:
        raise KernelUsageError(f"{api}: src rank {values.ndim} and axes {axes} must agree")
    return np.transpose(values, axes)


replay.steps(globals(), ("binary", "unary", "matmul", "invert", "dropout"))
