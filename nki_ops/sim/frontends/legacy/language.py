"""``neuronxcc.nki.language`` (``nl``) for the simulator: the legacy NKI language catalogue.

Element-wise functions compute in fp32 and round into the output dtype: ``dtype=`` when given,
else the promoted operand dtype (comparisons and logical ops: ``bool_``). Each accepts
``mask=`` and then computes only where the mask holds (elsewhere the result is poison).
"""

from __future__ import annotations

import builtins
import math

import ml_dtypes
import numpy as np

from ... import core
from ...core import (
    Access,
    IndexExpr,
    ParDim,
    Tensor,
    alu,
    current_run,
    instructions,
    mask_values,
    memory,
    new_tensor,
    random,
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
from ...core.indexing import MaskedOperand
from .grid import GridDim, positive

# ------------------------------------------------------------------------------------- dtypes
bool_, int8, int16, int32 = dt.bool_, dt.int8, dt.int16, dt.int32
uint8, uint16, uint32 = dt.uint8, dt.uint16, dt.uint32
float16, float32, bfloat16 = dt.float16, dt.float32, dt.bfloat16
float8_e4m3, float8_e5m2 = dt.float8_e4m3, dt.float8_e5m2

# ------------------------------------------------------------------------------------ buffers
sbuf, psum, shared_hbm, private_hbm = core.sbuf, core.psum, core.shared_hbm, core.private_hbm
hbm = private_hbm


def par_dim(size: int) -> ParDim:
    return ParDim(size)


tile_size = memory.TileSize()


def finfo(dtype):
    """Machine limits of a float dtype (bf16 and fp8 included), as ``numpy.finfo``."""
    return ml_dtypes.finfo(dt.as_dtype(dtype))


def iinfo(dtype):
    """Machine limits of an integer dtype, as ``numpy.iinfo``."""
    return np.iinfo(dt.as_dtype(dtype))


class fp32:
    min = np.float32(np.frombuffer(np.uint32(0xFF7FFFFF).tobytes(), np.float32)[0])


class bfp16:
    min = np.frombuffer(np.uint16(0xFF80).tobytes(), bfloat16)[0]


# ------------------------------------------------------------------------------ element-wise

def _make_unary(op_name, fn):
    def op(x, *, dtype=None, mask=None, name=None):
        return instructions.unary(op_name, x, dtype=dtype, mask=mask)
    op.__name__ = op.__qualname__ = op_name
    op.__doc__ = f"Element-wise {op_name} (fp32 compute)."
    op.alu = (op_name, fn)
    return op


def _make_binary(op_name, fn):
    def op(x, y, *, dtype=None, mask=None, name=None):
        return instructions.binary(op_name, x, y, dtype=dtype, mask=mask)
    op.__name__ = op.__qualname__ = op_name
    op.__doc__ = f"Element-wise {op_name} of two tiles or a tile and a scalar (NumPy broadcasting)."
    op.alu = (op_name, fn)
    return op


for _name, _fn in alu.UNARY.items():
    globals()[_name] = _make_unary(_name, _fn)
for _table in (alu.BINARY, alu.COMPARE, alu.BITWISE):
    for _name, _fn in _table.items():
        globals()[_name] = _make_binary(_name, _fn)

def invert(x, *, dtype=None, mask=None, name=None):
    """Bitwise NOT of an integer tile (logical NOT of a bool tile)."""
    return instructions.invert(x, dtype=dtype, mask=mask)


def logical_not(x, *, dtype=bool_, mask=None, name=None):
    return instructions.elementwise("nl.logical_not", np.logical_not, (x,), ("x",), dtype, mask)


invert.alu = ("invert", np.invert)
logical_not.alu = ("logical_not", np.logical_not)


def where(condition, x, y, *, dtype=None, mask=None, name=None):
    """``x`` where ``condition`` is non-zero, else ``y``."""
    selected = mask_values(mask)
    cond = value_of(condition, "nl.where", "condition", selected)
    tiles = [value_of(v, "nl.where", n, selected) for v, n in ((x, "x"), (y, "y"))]
    out_dtype = dt.as_dtype(dtype) if dtype is not None else dt.result_dtype(t.dtype for t in tiles)
    cond, a, b = instructions.as_columns([cond, *tiles])
    return tile_from_values(np.where(cond != 0, dt.to_f32(a), dt.to_f32(b)), out_dtype, "nl.where",
                            mask=selected)


# ------------------------------------------------------------------------------- reductions

def _axes(api: str, x, axis) -> tuple[int, ...]:
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    ndim = x.ndim
    axes = tuple(int(a) % ndim for a in axes)
    if 0 in axes:
        raise KernelUsageError(f"{api}: reducing along the partition dimension (axis 0) is not supported; "
                               f"reduce along free axes, transpose first, or use nisa.tensor_partition_reduce")
    return axes


def _f32_within_mask(x, api: str, selected):
    """fp32 values of tile ``x``; under a mask, a masked array so reductions skip excluded elements."""
    values = dt.to_f32(read(x, api, "x", selected))
    if selected is None:
        return values
    return np.ma.masked_array(values, mask=~np.broadcast_to(selected, values.shape))


def _unmasked(result, dtype) -> np.ndarray:
    """Results with every input element masked out hold poison."""
    return np.ma.filled(result, core.active_config().fill_value(dtype)) if np.ma.isMaskedArray(result) \
        else np.asarray(result)


def _reduction(op_name, fn, *, int_to_float=False, out_bool=False):
    def op(x, axis, *, dtype=None, keepdims=False, mask=None, name=None):
        api = f"nl.{op_name}"
        axes = _axes(api, x, axis)
        values = _f32_within_mask(x, api, mask_values(mask))
        if dtype is not None:
            out_dtype = dt.as_dtype(dtype)
        elif out_bool:
            out_dtype = bool_
        elif int_to_float and x.dtype.kind in "iub":
            out_dtype = float32
        else:
            out_dtype = x.dtype
        with np.errstate(all="ignore"):
            result = fn(values, axis=axes, keepdims=keepdims)
        return tile_from_values(_unmasked(result, out_dtype), out_dtype, api)
    op.__name__ = op.__qualname__ = op_name
    op.__doc__ = f"{op_name} along free axes ``axis`` (partition axis excluded); (P,) results act as (P, 1)."
    return op


sum = _reduction("sum", np.sum)
max = _reduction("max", np.max)
min = _reduction("min", np.min)
mean = _reduction("mean", np.mean, int_to_float=True)
prod = _reduction("prod", np.prod)
var = _reduction("var", np.var, int_to_float=True)
all = _reduction("all", lambda v, axis, keepdims: np.all(v != 0, axis=axis, keepdims=keepdims), out_bool=True)
sum.alu, max.alu, min.alu = ("add", np.add), ("maximum", np.maximum), ("minimum", np.minimum)

def loop_reduce(x, op, loop_indices, *, dtype=None, mask=None, name=None):
    """Reduce ``x`` into the tile it is assigned to across loop iterations: ``dst[...] =
    nl.loop_reduce(x, np.add, [i])`` stores ``op(x, dst)`` (the destination is the right operand).
    Read other than by assignment, the result holds poison."""
    api = "nl.loop_reduce"
    _, fn, float_compute = instructions.alu_op(op, api)
    selected = mask_values(mask)
    values = read(x, api, "x", selected)
    out_dtype = dt.as_dtype(dtype) if dtype is not None else x.dtype
    tile = new_tensor(values.shape, out_dtype, sbuf, api=api, min_rank=1)  # a (P,) vector stays one
    if selected is not None:
        tile.written = core.tensors.mask_for(selected, values.shape).copy()
    tile.combine = (fn, dt.to_f32(values) if float_compute else values)
    return tile


# ------------------------------------------------------------------------------- composites


def softmax(x, axis, *, dtype=None, compute_dtype=None, mask=None, name=None):
    """exp(x - max) / sum(exp(x - max)) along free axis ``axis``."""
    axes = _axes("nl.softmax", x, axis)
    selected = mask_values(mask)
    values = _f32_within_mask(x, "nl.softmax", selected)
    out_dtype = dt.as_dtype(dtype) if dtype is not None else x.dtype
    with np.errstate(all="ignore"):
        shifted = np.exp(values - values.max(axis=axes, keepdims=True))
        result = shifted / shifted.sum(axis=axes, keepdims=True)
    return tile_from_values(_unmasked(result, out_dtype), out_dtype, "nl.softmax", mask=selected)


def rms_norm(x, w, axis, n, *, epsilon=1e-6, dtype=None, compute_dtype=None, mask=None, name=None):
    """x / sqrt(sum(x^2, axis) / n + epsilon) * w."""
    axes = _axes("nl.rms_norm", x, axis)
    selected = mask_values(mask)
    values = _f32_within_mask(x, "nl.rms_norm", selected)
    weight = dt.to_f32(value_of(w, "nl.rms_norm", "w", None))
    out_dtype = dt.as_dtype(dtype) if dtype is not None else x.dtype
    result = instructions.rms_norm(values, weight, axes, n, epsilon)
    return tile_from_values(_unmasked(result, out_dtype), out_dtype, "nl.rms_norm", mask=selected)


def dropout(x, rate, *, dtype=None, mask=None, name=None):
    """Zero each element with probability ``rate`` (a statistical model, not the device RNG stream)."""
    selected = mask_values(mask)
    values = instructions.dropout("nl.dropout", read(x, "nl.dropout", "x", selected), rate,
                                  current_run("nl.dropout"))
    return tile_from_values(values, dt.as_dtype(dtype) if dtype else x.dtype, "nl.dropout", mask=selected)


def _matmul_values(api: str, stationary, moving):
    """``stationary.T @ moving`` in fp32 (the shared Tensor-engine instruction; PSUM operands are
    accepted because the legacy compiler copies them to SBUF first)."""
    return instructions.matmul(api, stationary, moving, copies_psum=True)


def _masked_operands(api: str, stationary, moving):
    """Operand masking (``lhs_T[i_f < 64]``) restricts an operand's free axis, hence the result rows
    (stationary) or columns (moving) computed; a masked operand is read only where selected. Returns
    the operands as tiles and the result elements selected (None: all)."""
    tiles, free = [], []
    for operand, arg in ((stationary, "stationary"), (moving, "moving")):
        if not isinstance(operand, MaskedOperand):
            tiles.append(operand)
            free.append(None)
            continue
        shape = tuple(operand.shape)
        keep = core.tensors.mask_for(operand.mask.values, shape).reshape(shape[0], -1)
        if not np.array_equal(keep.any(axis=0), keep.all(axis=0)):
            raise UnsupportedError(f"{api} with an operand mask on the contraction (partition) axis of '{arg}'",
                                   "mask the free axis")
        values = read(operand.operand, api, arg, operand.mask.values)
        tiles.append(tile_from_values(values, operand.dtype, api, account=False))
        free.append(keep.any(axis=0))
    rows, cols = free
    if rows is None and cols is None:
        return tiles[0], tiles[1], None
    selected = np.ones((math.prod(tiles[0].shape[1:]), math.prod(tiles[1].shape[1:])), bool)
    if rows is not None:
        selected &= rows[:, None]
    if cols is not None:
        selected &= cols[None, :]
    return tiles[0], tiles[1], selected


def matmul(x, y, *, transpose_x=False, mask=None, name=None):
    """``x @ y`` (``x.T @ y`` with ``transpose_x=True``) into a new fp32 PSUM tile; masked operands
    (``x[mask]``, ``y[mask]``) restrict the result elements computed."""
    if mask is not None:
        raise UnsupportedError("nl.matmul(mask=...)", "index the operands to the valid region instead")
    if isinstance(x, MaskedOperand) and not transpose_x:
        raise UnsupportedError("nl.matmul with a masked x and transpose_x=False", "pass x transposed")
    x, y, selected = _masked_operands("nl.matmul", x, y)
    if transpose_x:
        result = _matmul_values("nl.matmul", x, y)
    else:
        x_values = read(x, "nl.matmul", "x")
        if x_values.ndim != 2 or builtins.max(x_values.shape) > 128:
            core.violation(TileLimitError(f"nl.matmul: x of shape {list(x_values.shape)} must be at most "
                                          f"128 x 128 to be transposed on the Tensor engine"))
        if core.trace.listening:
            core.trace.engine(instructions.TENSOR)  # x is transposed on the Tensor engine first
        transposed = tile_from_values(x_values.T.copy(), x.dtype, "nl.transpose")
        result = _matmul_values("nl.matmul", transposed, y)
    return _matmul_result(result, "nl.matmul", mask=selected)


def _matmul_result(values: np.ndarray, api: str, mask=None) -> Tensor:
    """A Tensor-engine result: fp32 in PSUM, accumulating when added into a PSUM tile."""
    tile = tile_from_values(values, float32, api, buffer=psum, account=False, mask=mask)
    tile.accumulates = True
    return tile


def transpose(x, *, dtype=None, mask=None, name=None):
    """2-D transpose of a tile whose dimensions are both at most 128, on the Tensor engine (NaN/Inf
    spread on NeuronCore-v2, ``instructions.pe_transpose``)."""
    selected = mask_values(mask)
    values = read(x, "nl.transpose", "x", selected)
    if values.ndim != 2:
        raise KernelUsageError(f"nl.transpose supports 2-D tiles only, got shape {list(values.shape)}")
    if builtins.max(values.shape) > 128:
        core.violation(TileLimitError(f"nl.transpose: size of dimension exceeds architecture limitation of 128 "
                                      f"(tile shape {list(values.shape)})"))
    if core.trace.listening:
        core.trace.engine(instructions.TENSOR)
    return tile_from_values(instructions.pe_transpose(values, selected),
                            dt.as_dtype(dtype) if dtype is not None else x.dtype, "nl.transpose")


# ------------------------------------------------------------------------------------ memory

def _require_hbm(x, api: str, arg: str) -> None:
    if not alu.is_tile(x):
        raise KernelUsageError(f"operand '{arg}' of '{api}' must be an HBM tensor, got {type(x).__name__}")
    if x.buffer.on_chip:
        raise MemorySpaceError(f"Expected operand '{arg}' of '{api}' to be in address space 'hbm', but got a "
                               f"tile in '{x.buffer.space}' instead (tensor '{x.name}')")


def _hbm_values(src, selected) -> np.ndarray:
    if core.trace.listening:
        core.trace.read(src, selected)
    if isinstance(src, Access):
        return src.read(selected)
    if selected is None:
        return src.data
    return np.where(np.broadcast_to(selected, src.shape), src.data,
                    np.array(core.active_config().fill_value(src.dtype), src.dtype))


def load(src, *, mask=None, name=None, dtype=None):
    """Copy an HBM region into a new SBUF tile (DMA); ``dtype`` casts on the way."""
    _require_hbm(src, "load", "src")
    selected = mask_values(mask)
    values = _hbm_values(src, selected)
    if values.ndim == 0:
        values = values.reshape(1, 1)  # one HBM element lands in a (1, 1) tile
    out_dtype = dt.as_dtype(dtype) if dtype is not None else src.dtype
    # A rank-1 source (x[0:128, 3]) gives a (P,) tile, which instructions treat as a (P, 1) column.
    return tile_from_values(values, out_dtype, "nl.load", mask=selected, min_rank=1)


def store(dst, value, *, mask=None, name=None):
    """Copy an on-chip tile (SBUF or PSUM) into an HBM region (DMA), only where ``mask`` holds."""
    _require_hbm(dst, "store", "dst")
    selected = mask_values(mask)
    values = value_of(value, "store", "value", selected if isinstance(value, Access) else None)
    write(dst, values, "nl.store", selected)


def atomic_rmw(dst, value, op, *, mask=None, name=None):
    """``dst = op(dst, value)`` on an indexed HBM tensor, element by element and atomically: every
    repeated (indirect) index applies its value. Only ``np.add``, as documented; fp32 arithmetic."""
    api = "atomic_rmw"
    _require_hbm(dst, api, "dst")
    if instructions.op_name(op) != "add":
        raise KernelUsageError(f"{api}: only op=np.add is supported, got {getattr(op, '__name__', op)!r}")
    if not isinstance(dst, Access):
        raise KernelUsageError(f"{api}: dst must be an indexed HBM tensor (e.g. t[indices_tile, ix])")
    selected = mask_values(mask)
    values = core.memory.fit(dt.to_f32(value_of(value, api, "value", selected)), tuple(dst.shape), dst.name, api)
    tensor = dst.tensor
    where = dst.gather(np.arange(tensor.data.size).reshape(tensor.shape))  # flat element of each access position
    if selected is not None:
        keep = core.tensors.mask_for(selected, where.shape)
        where, values = where[keep], values[keep]
    if core.trace.listening:
        core.trace.write(dst, f"nl.{api}", mask=selected)
    total = dt.to_f32(tensor.data).reshape(-1)
    np.add.at(total, where.reshape(-1), values.reshape(-1))
    tensor.data[...] = dt.cast(total.reshape(tensor.shape), tensor.dtype)


def load_transpose2d(src, *, mask=None, name=None, dtype=None):
    """Load a 2-D HBM region transposed (DMA transpose)."""
    _require_hbm(src, "load_transpose2d", "src")
    values = _hbm_values(src, mask_values(mask))
    if values.ndim != 2:
        raise KernelUsageError(f"nl.load_transpose2d needs a 2-D source, got shape {list(values.shape)}")
    out_dtype = dt.as_dtype(dtype) if dtype is not None else src.dtype
    return tile_from_values(np.ascontiguousarray(values.T), out_dtype, "nl.load_transpose2d")


def copy(src, *, mask=None, name=None, dtype=None):
    """Copy a tile (optionally casting) into a new SBUF tile."""
    selected = mask_values(mask)
    values = read(src, "nl.copy", "src", selected)
    return tile_from_values(values, dt.as_dtype(dtype) if dtype is not None else src.dtype, "nl.copy",
                            mask=selected)


copy.alu = ("copy", lambda x: x)


def broadcast_to(src, *, shape):
    """Replicate a tile with size-1 dimensions (e.g. (1, F) over partitions) to ``shape``."""
    return core.memory.broadcast_tile(src, shape)


def expand_dims(data, axis):
    """Add a size-1 axis after the last axis of a tile."""
    values = read(data, "nl.expand_dims", "data")
    if axis not in (values.ndim, -1):
        raise KernelUsageError(f"nl.expand_dims only adds an axis after the last one (axis={values.ndim}), "
                               f"got axis={axis}")
    return tile_from_values(values[..., None], data.dtype, "nl.expand_dims")


# ----------------------------------------------------------------------------------- creation

def _buffer(buffer):
    if buffer is None:
        return sbuf
    if not isinstance(buffer, core.Buffer):
        raise KernelUsageError(f"buffer must be nl.sbuf, nl.psum, nl.hbm, nl.private_hbm or nl.shared_hbm, "
                               f"got {buffer!r}")
    return buffer


def ndarray(shape, dtype, *, buffer=None, name="", **_allocation_hints):
    """An uninitialised tensor (poison-filled so reads before writes show). In PSUM, the first
    matmul added into an element (``t += nisa.nc_matmul(...)``) overwrites it."""
    tensor = new_tensor(shape, dtype, _buffer(buffer), name=name, api="nl.ndarray")
    if tensor.buffer is psum:
        tensor.unset = np.ones(tensor.shape, bool)
    return tensor


def _filled(api, shape, dtype, buffer, name, value):
    buffer = _buffer(buffer)
    if not buffer.on_chip:
        raise KernelUsageError(f"{api}: HBM tensors created in a kernel cannot be initialised with values; "
                               f"create them with nl.ndarray and write them with nl.store")
    if np.ndim(value):  # an array of values (nl.rand): adopted as the tile's data
        return new_tensor(shape, dtype, buffer, name=name, api=api, data=dt.cast(value, dt.as_dtype(dtype)))
    return new_tensor(shape, dtype, buffer, name=name, api=api, fill=value)


def zeros(shape, dtype, *, buffer=None, name="", **_allocation_hints):
    return _filled("nl.zeros", shape, dtype, buffer, name, 0)


def ones(shape, dtype, *, buffer=None, name="", **_allocation_hints):
    return _filled("nl.ones", shape, dtype, buffer, name, 1)


def full(shape, fill_value, dtype, *, buffer=None, name="", **_allocation_hints):
    return _filled("nl.full", shape, dtype, buffer, name, fill_value)


def empty_like(a, dtype=None, *, buffer=None, name=""):
    return ndarray(a.shape, dtype or a.dtype, buffer=buffer or a.buffer, name=name)


def zeros_like(a, dtype=None, *, buffer=None, name=""):
    return zeros(a.shape, dtype or a.dtype, buffer=buffer or a.buffer, name=name)


def rand(shape, dtype=float32, *, buffer=None, name=""):
    """Uniform [0, 1) values from the simulator's seeded generator (not the device RNG stream)."""
    run = current_run("nl.rand")
    if core.trace.listening:
        core.trace.side_effect()  # a draw from the launch's generator: not a function of what it reads
    return _filled("nl.rand", shape, dtype, buffer, name, run.random.random(tuple(shape)).astype(np.float32))


def random_seed(seed):
    """Seeds ``rand`` (a NumPy generator) and ``dropout`` (the Vector engine's XORWOW generators)."""
    run = current_run("nl.random_seed")
    value = int(np.asarray(seed.data if isinstance(seed, Tensor) else seed).ravel()[0])
    run.random = np.random.default_rng(value)
    random.set_seed(run, "vector", value)


def gather_flattened(data, indices, *, mask=None, dtype=None, name=None):
    """``nl.gather_flattened``: per partition, ``data``'s flattened free axes at ``indices`` (uint32)."""
    api = "gather_flattened"
    if mask is not None:
        raise UnsupportedError("nki.language.gather_flattened with a mask")
    if indices.dtype != dt.uint32:
        raise KernelUsageError(f"{api}: indices must be uint32, got {indices.dtype}")
    result = instructions.gather_flattened(api, read(data, api, "data"), read(indices, api, "indices"),
                                      getattr(data, "name", "data"))
    return tile_from_values(result, dt.as_dtype(dtype) if dtype is not None else data.dtype, "nl.gather_flattened")


def shared_identity_matrix(n, dtype=uint8):
    """An ``n x n`` identity constant in HBM."""
    tensor = new_tensor((n, n), dtype, shared_hbm, api="nl.shared_identity_matrix", fill=0)
    tensor.data[...] = np.eye(n, dtype=dt.as_dtype(dtype))
    return tensor


def shared_constant(constant, dtype=None):
    """A host constant placed in HBM."""
    values = np.asarray(constant)
    tensor = new_tensor(values.shape, dtype or values.dtype, shared_hbm, api="nl.shared_constant", fill=0)
    tensor.data[...] = dt.cast(values, tensor.dtype)
    return tensor


def static_cast(array, dtype):
    """Cast host data (a NumPy array or scalar) to an NKI dtype, rounding as the device does."""
    return dt.cast(np.asarray(array), dt.as_dtype(dtype))


# ---------------------------------------------------------------------------------- indexing

def arange(start, stop=None):
    """A 1-D index expression; give it an axis with ``[:, None]`` or ``[None, :]`` before indexing."""
    first, stop = (0, start) if stop is None else (start, stop)
    return IndexExpr(np.arange(first, stop), (0, int(first), 1))


def ds(start, size):
    """``nl.ds(start, size)`` is the slice ``start:start + size``."""
    return slice(start, start + size)


class _Grid(tuple):
    """Index grids from ``nl.mgrid``: unpack them or use ``.p``, ``.x``, ``.y``, ``.z``."""

    p = property(lambda self: self[0])
    x = property(lambda self: self[1])
    y = property(lambda self: self[2])
    z = property(lambda self: self[3])


class _MGrid:
    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        # Open grids index and broadcast exactly like NumPy's dense mgrid, without the memory.
        return _Grid(IndexExpr(g, _grid_prog(axis, k)) for axis, (g, k) in enumerate(zip(np.ogrid[key], key)))


def _grid_prog(axis: int, k):
    """``IndexExpr.prog`` of an integer ``start:stop:step`` grid axis (None for other slices)."""
    if isinstance(k, slice) and builtins.all(v is None or isinstance(v, (int, np.integer)) for v in (k.start, k.step)):
        return axis, int(k.start or 0), int(1 if k.step is None else k.step)
    return None


mgrid = _MGrid()

# ------------------------------------------------------------------------------ loops and SPMD


def affine_range(start, stop=None, step=1, **_scheduling_hints):
    """Iterations without loop-carried dependencies; ``SimConfig.seed`` shuffles their order."""
    indices = list(range(start) if stop is None else range(start, stop, step))
    run = core.get_run()
    if run is not None and run.shuffle is not None:
        run.shuffle.shuffle(indices)
    return indices


def sequential_range(start, stop=None, step=1, **_scheduling_hints):
    return range(start) if stop is None else range(start, stop, step)


def static_range(start, stop=None, step=1, **_scheduling_hints):
    """Unrolled by the compiler: each iteration is traced, so a direct allocation made in it is its
    own (the run keeps the iterations of the enclosing static loops for ``nki.compiler``)."""
    return _unrolled(range(start) if stop is None else range(start, stop, step))


def _unrolled(indices):
    run = core.get_run()
    if run is None:
        yield from indices
        return
    stack = run.frontend.setdefault("unrolled", [])
    stack.append(None)
    try:
        for i in indices:
            stack[-1] = i
            yield i
    finally:
        stack.pop()


def nc(n: int) -> GridDim:
    """A launch-grid dimension of ``n`` instances, one per physical NeuronCore."""
    n = positive(n, "nl.nc")
    return GridDim(n, n)


def spmd_dim(*dims) -> GridDim:
    """A launch-grid dimension tiled into sub-dimensions (ints and ``nl.nc(n)``): their product."""
    if not dims:
        raise KernelUsageError("nl.spmd_dim needs at least one sub-dimension")
    parts = [d if isinstance(d, GridDim) else GridDim(positive(d, "nl.spmd_dim")) for d in dims]
    return GridDim(math.prod(p.size for p in parts), math.prod(p.cores for p in parts))


def program_id(axis: int) -> int:
    run = current_run("nl.program_id")
    if not 0 <= axis < len(run.program_id):
        raise KernelUsageError(f"nl.program_id({axis}): the launch grid has {len(run.grid)} dimension(s)")
    return run.program_id[axis]


def num_programs(axes=None) -> int:
    run = current_run("nl.num_programs")
    if axes is None:
        return math.prod(run.grid)
    if isinstance(axes, (tuple, list)):
        return math.prod(run.grid[a] for a in axes)
    if not 0 <= axes < len(run.grid):
        raise KernelUsageError(f"nl.num_programs({axes}): the launch grid has {len(run.grid)} dimension(s)")
    return run.grid[axes]


def program_ndim() -> int:
    return len(current_run("nl.program_ndim").grid)


def device_print(prefix, x, *, mask=None, name=None):
    """Print a tensor's values (simulation only)."""
    if alu.is_tile(x):
        values = x.read() if isinstance(x, Access) else x.data
    else:
        values = np.asarray(x)
    print(prefix, values)



def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise UnsupportedError(f"nki.language.{name}")
