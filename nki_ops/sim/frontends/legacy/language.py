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
    IndexExpr,
    ParDim,
    Tensor,
    alu,
    current_run,
    instructions,
    mask_values,
    memory,
    new_tensor,
    read,
    tile_from_values,
)
from ...core import dtypes as dt
from ...core import language as _language
from ...core.errors import (
    KernelUsageError,
    UnsupportedError,
    refuse_unknown,
)
from ...core.replay import step
from ...core.run import unfit
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

def _place(values, dtype, api, buffer=sbuf, mask=None) -> Tensor:
    """A result as a new tile (``Rules.place``), poison outside ``mask``; a Tensor-engine result is fp32 in
    PSUM, accumulating when added into a PSUM tile, and occupies no bank of its own."""
    if buffer is not psum:
        return tile_from_values(values, dtype, api, mask=mask)
    tile = tile_from_values(values, float32, api, buffer=psum, account=False, mask=mask)
    tile.accumulates = True
    return tile


_RULES = _language.Rules(
    place=_place, as_dtype=dt.as_dtype,
    partition_hint="reduce along free axes, transpose first, or use nisa.tensor_partition_reduce",
    checks_operands=False, int_mean_dtype=float32, all_dtype=bool_, reduced_2d=False, promoting_where=True,
    copies_psum=True, lnc=False)


def _make_unary(op_name, fn):
    def op(x, *, dtype=None, mask=None, name=None):
        return instructions.unary(op_name, x, dtype=dtype, mask=mask)
    return _language.named(op, op_name, f"Element-wise {op_name} (fp32 compute).", (op_name, fn))


def _make_binary(op_name, fn):
    def op(x, y, *, dtype=None, mask=None, name=None):
        return instructions.binary(op_name, x, y, dtype=dtype, mask=mask)
    return _language.named(op, op_name, f"Element-wise {op_name} of two tiles or a tile and a scalar (NumPy "
                                       f"broadcasting).", (op_name, fn))


_language.define(globals(), _make_unary, alu.UNARY)
_language.define(globals(), _make_binary, alu.BINARY, alu.COMPARE, alu.BITWISE)


def invert(x, *, dtype=None, mask=None, name=None):
    """Bitwise NOT of an integer tile (logical NOT of a bool tile)."""
    return _language.invert(_RULES, x, dtype, mask)


def logical_not(x, *, dtype=bool_, mask=None, name=None):
    return _language.logical_not(_RULES, x, dtype, mask)


def where(condition, x, y, *, dtype=None, mask=None, name=None):
    """``x`` where ``condition`` is non-zero, else ``y``."""
    return _language.where(_RULES, condition, x, y, dtype, mask)


# ------------------------------------------------------------------------------- reductions

def _reduction(op_name):
    def spell(reduce):
        def op(x, axis, *, dtype=None, keepdims=False, mask=None, name=None):
            return reduce(x, axis, dtype, keepdims, mask)
        return op
    return _language.reduction(_RULES, op_name, spell)


sum, max, min, mean, prod, var, all = map(_reduction, ("sum", "max", "min", "mean", "prod", "var", "all"))


def loop_reduce(x, op, loop_indices, *, dtype=None, mask=None, name=None):
    """Reduce ``x`` into the tile it is assigned to across loop iterations: ``dst[...] =
    nl.loop_reduce(x, np.add, [i])`` stores ``op(x, dst)`` (the destination is the right operand).
    Read other than by assignment, the result holds poison."""
    return _language.loop_reduce(x, op, dtype, mask)


# ------------------------------------------------------------------------------- composites

def softmax(x, axis, *, dtype=None, compute_dtype=None, mask=None, name=None):
    """exp(x - max) / sum(exp(x - max)) along free axis ``axis``."""
    return _language.softmax(_RULES, x, axis, dtype, mask)


def rms_norm(x, w, axis, n, *, epsilon=1e-6, dtype=None, compute_dtype=None, mask=None, name=None):
    """x / sqrt(sum(x^2, axis) / n + epsilon) * w."""
    return _language.rms_norm(_RULES, x, w, axis, n, epsilon, dtype, compute_dtype, mask)


def dropout(x, rate, *, dtype=None, mask=None, name=None):
    """Zero each element with probability ``rate`` (a statistical model, not the device RNG stream)."""
    selected = mask_values(mask)
    values = instructions.dropout("nl.dropout", read(x, "nl.dropout", "x", selected), rate,
                                  current_run("nl.dropout"))
    return tile_from_values(values, dt.as_dtype(dtype) if dtype else x.dtype, "nl.dropout", mask=selected)




def _matmul_result(values: np.ndarray, api: str, mask=None) -> Tensor:
    return _place(values, float32, api, psum, mask)


def _matmul_values(api: str, stationary, moving):
    """``stationary.T @ moving`` in fp32 (PSUM operands are accepted: the legacy compiler copies them to SBUF)."""
    return instructions.matmul(api, stationary, moving, copies_psum=True)


def matmul(x, y, *, transpose_x=False, mask=None, name=None):
    """``x @ y`` (``x.T @ y`` with ``transpose_x=True``) into a new fp32 PSUM tile; masked operands
    (``x[mask]``, ``y[mask]``) restrict the result elements computed."""
    return _language.matmul(_RULES, x, y, transpose_x, mask)


def transpose(x, *, dtype=None, mask=None, name=None):
    """2-D transpose of a tile whose dimensions are both at most 128, on the Tensor engine."""
    return _language.transpose(_RULES, x, dtype, mask)


# ------------------------------------------------------------------------------------ memory



def load(src, *, mask=None, name=None, dtype=None):
    """Copy an HBM region into a new SBUF tile (DMA); ``dtype`` casts on the way."""
    return _language.load(_RULES, src, dtype, mask)


def store(dst, value, *, mask=None, name=None):
    """Copy an on-chip tile (SBUF or PSUM) into an HBM region (DMA), only where ``mask`` holds."""
    _language.store(_RULES, dst, value, mask)


def atomic_rmw(dst, value, op, *, mask=None, name=None):
    """``dst = op(dst, value)`` on an indexed HBM tensor, atomically for every repeated index (``np.add``)."""
    _language.atomic_rmw(dst, value, op, mask)


def load_transpose2d(src, *, mask=None, name=None, dtype=None):
    """Load a 2-D HBM region transposed (DMA transpose)."""
    return _language.load_transpose2d(_RULES, src, dtype, mask)


def copy(src, *, mask=None, name=None, dtype=None):
    """Copy a tile (optionally casting) into a new SBUF tile."""
    return _language.copy(_RULES, src, dtype, mask, arg="src")


def broadcast_to(src, *, shape):
    """Replicate a tile with size-1 dimensions (e.g. (1, F) over partitions) to ``shape``."""
    return core.memory.broadcast_tile(src, shape)


def expand_dims(data, axis):
    """Add a size-1 axis after the last axis of a tile."""
    return _language.expand_dims(_RULES, data, axis)


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
    return new_tensor(shape, dtype, _buffer(buffer), name=name, api="nl.ndarray", unset=True)


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
    unfit("random numbers")
    return _filled("nl.rand", shape, dtype, buffer, name, run.random.random(tuple(shape)).astype(np.float32))


def random_seed(seed):
    """Seeds ``rand`` (a NumPy generator) and ``dropout`` (the Vector engine's XORWOW generators)."""
    _language.random_seed(seed)


def gather_flattened(data, indices, *, mask=None, dtype=None, name=None):
    """``nl.gather_flattened``: per partition, ``data``'s flattened free axes at ``indices`` (uint32)."""
    if mask is not None:
        raise UnsupportedError("nki.language.gather_flattened with a mask")
    return _language.gather_flattened(_RULES, "gather_flattened", data, indices, dtype)


@step
def shared_identity_matrix(n, dtype=uint8):
    """An ``n x n`` identity constant in HBM."""
    tensor = new_tensor((n, n), dtype, shared_hbm, api="nl.shared_identity_matrix", fill=0)
    tensor.data[...] = np.eye(n, dtype=dt.as_dtype(dtype))
    return tensor


@step
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
    return _language.program_id(_RULES, axis)


def num_programs(axes=None) -> int:
    return _language.num_programs(_RULES, axes)


def program_ndim() -> int:
    return _language.program_ndim(_RULES)


def device_print(prefix, x, *, mask=None, name=None):
    """Print a tensor's values (simulation only)."""
    _language.device_print(prefix, x, np.asarray)


_language.operator_constants(globals())
__getattr__ = refuse_unknown("nki.language")
