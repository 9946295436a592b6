"""Tensors, buffers, index expressions, masks and the per-launch runtime state.

A tensor is a NumPy array plus metadata: its buffer (HBM, SBUF, PSUM), nominal dtype, name,
allocation site and partition dimension. Basic indexing (ints, slices, ``nl.ds``) returns a
view tensor sharing storage; advanced indexing with ``nl.arange``/``nl.mgrid`` expressions
returns an :class:`Access`, evaluated lazily so a mask can exclude out-of-range elements.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from . import dtypes as dt
from .config import SimConfig, current_config
from .errors import (CapacityError, KernelUsageError, MemorySpaceError, OutOfBoundsError, SimulatorWarning,
                     TileLimitError, UnsupportedError, user_site)

PMAX = 128
PSUM_BANK_BYTES = 2048

# Filled in by the language module: name -> function used by the tile operators (+, -, <, ...).
OPERATORS: dict = {}


# ----------------------------------------------------------------------------------- buffers

class Buffer:
    __slots__ = ("name", "space")

    def __init__(self, name: str, space: str):
        self.name, self.space = name, space

    @property
    def on_chip(self) -> bool:
        return self.space != "hbm"

    def __repr__(self) -> str:
        return f"nl.{self.name}"


sbuf = Buffer("sbuf", "sbuf")
psum = Buffer("psum", "psum")
private_hbm = Buffer("private_hbm", "hbm")
shared_hbm = Buffer("shared_hbm", "hbm")


class ParDim(int):
    """``nl.par_dim(n)``: marks the partition dimension inside a shape."""


# ----------------------------------------------------------------------------------- runtime

class Run:
    """State of one kernel launch: config, grid position, live on-chip bytes, shared outputs."""

    def __init__(self, config: SimConfig, grid: tuple[int, ...]):
        self.config = config
        self.grid = grid
        self.program_id: tuple[int, ...] = (0,) * len(grid)
        self.shuffle = np.random.default_rng(config.seed) if config.seed is not None else None
        self.random = np.random.default_rng(0 if config.seed is None else config.seed)
        self.used = {"sbuf": 0, "psum": 0}
        self.live: dict[str, dict[int, tuple[int, str, str]]] = {"sbuf": {}, "psum": {}}
        self.shared: dict[tuple[str, int], Tensor] = {}
        self.site_counts: dict[str, int] = {}

    def budget(self, space: str) -> int:
        return self.config.sbuf_budget if space == "sbuf" else self.config.psum_budget

    def acquire(self, tensor: "Tensor", nbytes: int) -> None:
        space = tensor.buffer.space
        if self.used[space] + nbytes > self.budget(space):
            live = sorted(self.live[space].values(), reverse=True)[:5]
            listing = "; ".join(f"'{n}' {b} B at {s}" for b, n, s in live)
            others = f"; largest live allocations: {listing}" if listing else "; nothing else is live"
            violation(CapacityError(
                f"{space.upper()} capacity exceeded: allocating '{tensor.name}' ({nbytes} bytes per partition) "
                f"brings live {space.upper()} to {self.used[space] + nbytes} bytes per partition, above the "
                f"{self.config.target} budget of {self.budget(space)}{others}",
                tensor.site))
        self.used[space] += nbytes
        self.live[space][id(tensor)] = (nbytes, tensor.name, tensor.site)

    def release(self, tensor: "Tensor", nbytes: int) -> None:
        space = tensor.buffer.space
        self.used[space] -= nbytes
        self.live[space].pop(id(tensor), None)


_RUN: Run | None = None


def current_run(api: str) -> Run:
    if _RUN is None:
        raise KernelUsageError(f"{api} can only be called inside a kernel run by the simulator "
                               f"(nki.jit / nki.simulate_kernel)")
    return _RUN


def set_run(run: Run | None) -> Run | None:
    global _RUN
    previous, _RUN = _RUN, run
    return previous


def active_config() -> SimConfig:
    return _RUN.config if _RUN is not None else current_config()


def violation(error: Exception) -> None:
    """Raise a hardware-limit violation, or warn about it when the config is not strict."""
    if active_config().strict:
        raise error
    warnings.warn(str(error), SimulatorWarning, stacklevel=3)


# ----------------------------------------------------------------------------------- tensors

class Tensor:
    """A tensor in HBM, SBUF or PSUM. On-chip tensors are tiles: partition dimension first."""

    __slots__ = ("data", "buffer", "name", "site", "pdim", "_run", "_bytes")

    def __init__(self, data: np.ndarray, buffer: Buffer, name: str, site: str, pdim: int = 0):
        self.data, self.buffer, self.name, self.site, self.pdim = data, buffer, name, site, pdim
        self._run = None
        self._bytes = 0

    def __del__(self):
        if self._run is not None:
            self._run.release(self, self._bytes)

    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    itemsize = property(lambda self: self.data.dtype.itemsize)

    def __repr__(self) -> str:
        return f"<{self.buffer!r} tensor '{self.name}' {self.dtype} {list(self.shape)} from {self.site}>"

    def __getitem__(self, key):
        return index(self, key)

    def __setitem__(self, key, value):
        assign(index(self, key), value, "assignment")

    def __bool__(self):
        raise KernelUsageError("the truth value of a tensor is ambiguous; control flow cannot depend on tensor "
                               "values (use nl.where or a mask)")

    def __len__(self):
        return self.shape[0]

    def reshape(self, *shape):
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if self.buffer.on_chip:
            raise KernelUsageError(f"reshape of on-chip tensor '{self.name}': only HBM tensors can be reshaped")
        if math.prod(shape) != self.data.size:
            raise KernelUsageError(f"cannot reshape '{self.name}' of shape {list(self.shape)} to {list(shape)}: "
                                   f"element counts differ")
        return Tensor(self.data.reshape(shape), self.buffer, self.name, self.site)

    def broadcast_to(self, shape):
        """A (1, F) tile replicated over partitions (a new tile); on HBM, a read-only view."""
        if self.buffer.on_chip:
            return OPERATORS["broadcast_to"](self, shape=shape)
        try:
            return Tensor(np.broadcast_to(self.data, tuple(shape)), self.buffer, self.name, self.site)
        except ValueError:
            raise KernelUsageError(f"cannot broadcast '{self.name}' of shape {list(self.shape)} to "
                                   f"{list(shape)}") from None

    # In-place operators update the tensor itself (PSUM accumulation: psum += nisa.nc_matmul(...)).
    def _inplace(self, op: str, other):
        assign(self, OPERATORS[op](self, other, dtype=self.dtype), f"{op} (in place)")
        return self

    def __iadd__(self, other):
        return self._inplace("add", other)

    def __isub__(self, other):
        return self._inplace("subtract", other)

    def __imul__(self, other):
        return self._inplace("multiply", other)

    def __itruediv__(self, other):
        return self._inplace("divide", other)


class Access:
    """An advanced-indexing access ``t[i_p, 4 * i_f + 1]``: evaluated when read or written,
    so a mask can exclude out-of-range elements."""

    __slots__ = ("tensor", "comps", "shape", "strided")

    def __init__(self, tensor: Tensor, comps: list, shape: tuple[int, ...]):
        self.tensor, self.comps, self.shape = tensor, comps, shape
        self.strided = _as_strided_slices(comps, shape, tensor.shape)

    dtype = property(lambda self: self.tensor.dtype)
    buffer = property(lambda self: self.tensor.buffer)
    name = property(lambda self: self.tensor.name)
    ndim = property(lambda self: len(self.shape))
    pdim = 0

    def __repr__(self) -> str:
        return f"<access {list(self.shape)} into {self.tensor!r}>"

    def __bool__(self):
        raise KernelUsageError("the truth value of a tensor is ambiguous; control flow cannot depend on tensor "
                               "values (use nl.where or a mask)")

    def _indices(self, mask):
        """Index arrays for NumPy (restricted to the mask's true elements when masked), bounds-checked.

        An in-bounds unmasked access of arithmetic progressions (``t[i_p, 4 * i_f + 1]``) becomes
        a strided slice: a NumPy view instead of a gather."""
        selected = None
        if mask is not None:
            selected = np.broadcast_to(mask, self.shape)
            if selected.all():
                selected = None
        if selected is None and self.strided is not None:
            return self.strided, None
        comps = self.comps
        if selected is not None:
            comps = [c if isinstance(c, int) else np.broadcast_to(c, self.shape)[selected] for c in comps]
        for axis, comp in enumerate(comps):
            if isinstance(comp, int) or comp.size == 0:
                continue
            low, high = int(comp.min()), int(comp.max())
            if low < 0 or high >= self.tensor.shape[axis]:
                raise out_of_bounds(self.tensor, axis, low, high)
        return tuple(comps), selected

    def read(self, mask=None) -> np.ndarray:
        idx, selected = self._indices(mask)
        if selected is None:
            return self.tensor.data[idx]
        out = np.full(self.shape, active_config().fill_value(self.dtype), self.dtype)
        out[selected] = self.tensor.data[idx]
        return out

    def write(self, values: np.ndarray, mask=None) -> None:
        idx, selected = self._indices(mask)
        if selected is None:
            self.tensor.data[idx] = values
        else:
            self.tensor.data[idx] = np.broadcast_to(values, self.shape)[selected]

    def __iadd__(self, other):
        return OPERATORS["add"](self, other, dtype=self.dtype)

    def __isub__(self, other):
        return OPERATORS["subtract"](self, other, dtype=self.dtype)

    def __imul__(self, other):
        return OPERATORS["multiply"](self, other, dtype=self.dtype)


def _as_strided_slices(comps: list, shape: tuple[int, ...], bounds: tuple[int, ...]):
    """Basic-indexing equivalent of an advanced index, when every index array is an in-bounds
    arithmetic progression along its own result axis, in axis order; else None."""
    key, next_axis = [], 0
    for axis, comp in enumerate(comps):
        if isinstance(comp, int):
            key.append(comp)
            continue
        varying = [a for a, n in enumerate(comp.shape) if n > 1]
        if len(varying) != 1 or comp.ndim != len(shape) or varying[0] != next_axis:
            return None
        values = comp.reshape(-1)
        step = int(values[1] - values[0])
        if step < 1 or not np.array_equal(np.diff(values), np.full(values.size - 1, step)):
            return None
        first, last = int(values[0]), int(values[-1])
        if first < 0 or last >= bounds[axis]:
            return None
        key.append(slice(first, last + 1, step))
        next_axis += 1
    return tuple(key) if next_axis == len(shape) else None


def out_of_bounds(tensor: Tensor, axis: int, low: int, high: int) -> OutOfBoundsError:
    return OutOfBoundsError(f"Out-of-bound access for tensor `{tensor.name}` on dimension {axis}: index range "
                            f"[{low}, {high}] exceed dimension size of {tensor.shape[axis]}")


def _binary_operator(name: str, reflected: bool = False):
    def operator(self, other):
        if isinstance(other, (Tensor, Access)) and self.shape[:1] != other.shape[:1] and self.ndim > 1 \
                and other.ndim > 1:
            raise KernelUsageError(
                f"operator on tiles with {self.shape[0]} and {other.shape[0]} partitions: tile operators do not "
                f"broadcast along the partition dimension; use nl.{name} or broadcast_to")
        return OPERATORS[name](other, self) if reflected else OPERATORS[name](self, other)
    return operator


for _cls in (Tensor, Access):
    for _dunder, _name in (("add", "add"), ("sub", "subtract"), ("mul", "multiply"), ("truediv", "divide"),
                           ("pow", "power"), ("mod", "mod"), ("and", "bitwise_and"), ("or", "bitwise_or"),
                           ("xor", "bitwise_xor"), ("lshift", "left_shift"), ("rshift", "right_shift")):
        setattr(_cls, f"__{_dunder}__", _binary_operator(_name))
        setattr(_cls, f"__r{_dunder}__", _binary_operator(_name, reflected=True))
    for _dunder, _name in (("lt", "less"), ("le", "less_equal"), ("gt", "greater"), ("ge", "greater_equal"),
                           ("eq", "equal"), ("ne", "not_equal")):
        setattr(_cls, f"__{_dunder}__", _binary_operator(_name))
    _cls.__neg__ = lambda self: OPERATORS["negative"](self)
    _cls.__invert__ = lambda self: OPERATORS["invert"](self)
    _cls.__hash__ = object.__hash__


def new_tensor(shape, dtype, buffer: Buffer, name: str = "", fill="poison", site: str | None = None,
               api: str = "nl.ndarray", min_rank: int = 2, account: bool = True,
               data: np.ndarray | None = None) -> Tensor:
    """Allocate a tensor: checks the tile rules and on-chip capacity, fills it (poison, 0 or a value),
    or adopts ``data``, an array of that shape and dtype that nothing else references."""
    run = current_run(api)
    site = site or user_site()
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    pdims = [i for i, s in enumerate(shape) if isinstance(s, ParDim)]
    pdim = pdims[0] if pdims else 0
    shape = tuple(int(s) for s in shape)
    dtype = dt.as_dtype(dtype)
    if any(s < 0 for s in shape):
        raise KernelUsageError(f"{api}: negative dimension in shape {list(shape)}")
    if fill == "poison":
        fill = run.config.fill_value(dtype)
    name = name or f"{api.split('.')[-1]}@{site.rsplit('/', 1)[-1]}"
    if buffer is shared_hbm:
        # Shared outputs are created once per launch and seen by every grid instance.
        count = run.site_counts.get(site, 0)
        run.site_counts[site] = count + 1
        key = (site, count)
        if key in run.shared:
            return run.shared[key]
        tensor = Tensor(np.full(shape, fill, dtype), buffer, name, site)
        run.shared[key] = tensor
        return tensor
    if data is None:
        data = np.empty(shape, dtype) if fill is None else np.full(shape, fill, dtype)
    tensor = Tensor(data, buffer, name, site, pdim)
    if buffer.on_chip:
        check_tile_shape(shape, pdim, dtype, buffer, name, api, site, min_rank)
        if account:
            tensor._bytes = (math.prod(shape) // max(shape[pdim], 1)) * dtype.itemsize
            run.acquire(tensor, tensor._bytes)
            tensor._run = run
    return tensor


def check_tile_shape(shape, pdim, dtype, buffer, name, api, site=None, min_rank: int = 2) -> None:
    if len(shape) < min_rank:
        raise KernelUsageError(f"{api}: Insufficient rank for on-chip tensor '{name}' of shape {list(shape)}: "
                               f"SBUF/PSUM tiles need a partition and a free dimension, e.g. (128, 1)", site)
    if shape[pdim] > PMAX:
        violation(TileLimitError(f"{api}: Size of partition dimension {shape[pdim]} exceeds architecture "
                                 f"limitation of {PMAX} (tensor '{name}', shape {list(shape)})", site))
    if buffer is psum:
        free_bytes = math.prod(shape[pdim + 1:]) * dtype.itemsize
        if free_bytes > PSUM_BANK_BYTES:
            violation(TileLimitError(
                f"{api}: PSUM tile '{name}' of shape {list(shape)} {dtype} needs {free_bytes} bytes per "
                f"partition, above one PSUM bank ({PSUM_BANK_BYTES} bytes = 512 fp32)", site))


def tile_from_values(values: np.ndarray, dtype, api: str, buffer: Buffer = sbuf, mask=None,
                     account: bool = True, min_rank: int = 1, fresh: bool = False) -> Tensor:
    """A new on-chip tile holding ``values`` rounded to ``dtype`` (outside ``mask``: poison).

    ``account=False`` is for Tensor-engine results, which on the device accumulate straight
    into the PSUM bank they are added to rather than occupying one of their own. ``fresh`` says
    that nothing else references ``values``, so the tile may take the array over uncopied."""
    if mask is None and fresh and values.flags.c_contiguous and values.flags.writeable:
        return new_tensor(values.shape, dtype, buffer, api=api, fill=None, min_rank=min_rank, account=account,
                          data=dt.cast(values, dt.as_dtype(dtype)))
    tensor = new_tensor(values.shape, dtype, buffer, api=api, fill=None, min_rank=min_rank, account=account)
    if mask is None:
        tensor.data[...] = dt.cast(values, tensor.dtype)
    else:
        tensor.data[...] = active_config().fill_value(tensor.dtype)
        np.copyto(tensor.data, dt.cast(values, tensor.dtype), where=np.broadcast_to(mask, values.shape))
    return tensor


# ------------------------------------------------------------------------------ index algebra

class IndexExpr:
    """An affine integer index expression built from ``nl.arange``/``nl.mgrid``."""

    __slots__ = ("values",)

    def __init__(self, values: np.ndarray):
        self.values = values

    shape = property(lambda self: self.values.shape)
    ndim = property(lambda self: self.values.ndim)

    def __repr__(self) -> str:
        return f"IndexExpr(shape={list(self.shape)})"

    def __getitem__(self, key):
        return IndexExpr(self.values[key])

    def __setitem__(self, key, value):
        raise KernelUsageError("cannot assign to an index expression (nl.arange/nl.mgrid are read-only; "
                               "materialise indices with nisa.iota)")

    def __bool__(self):
        raise KernelUsageError("control flow cannot depend on an nl.arange/nl.mgrid index expression")

    @staticmethod
    def _v(other):
        if isinstance(other, IndexExpr):
            return other.values
        if isinstance(other, (int, np.integer)) and not isinstance(other, bool):
            return int(other)
        raise KernelUsageError(f"index expressions combine only with ints and other index expressions "
                               f"(affine arithmetic), got {type(other).__name__}")

    def __add__(self, o): return IndexExpr(self.values + self._v(o))
    def __radd__(self, o): return IndexExpr(self._v(o) + self.values)
    def __sub__(self, o): return IndexExpr(self.values - self._v(o))
    def __rsub__(self, o): return IndexExpr(self._v(o) - self.values)
    def __mul__(self, o): return IndexExpr(self.values * self._v(o))
    def __rmul__(self, o): return IndexExpr(self._v(o) * self.values)
    def __floordiv__(self, o): return IndexExpr(self.values // self._v(o))
    def __mod__(self, o): return IndexExpr(self.values % self._v(o))
    def __neg__(self): return IndexExpr(-self.values)
    def __lt__(self, o): return Mask(self.values < self._v(o))
    def __le__(self, o): return Mask(self.values <= self._v(o))
    def __gt__(self, o): return Mask(self.values > self._v(o))
    def __ge__(self, o): return Mask(self.values >= self._v(o))
    def __eq__(self, o): return Mask(self.values == self._v(o))
    def __ne__(self, o): return Mask(self.values != self._v(o))
    __hash__ = object.__hash__


class Mask:
    """A predicate over index expressions, combined with ``&``, ``|`` and ``~``."""

    __slots__ = ("values",)

    def __init__(self, values: np.ndarray):
        self.values = values

    def _v(self, other):
        if isinstance(other, Mask):
            return other.values
        if isinstance(other, (bool, np.bool_)):
            return bool(other)
        raise KernelUsageError(f"masks combine with other masks, got {type(other).__name__}")

    def __and__(self, o): return Mask(self.values & self._v(o))
    __rand__ = __and__
    def __or__(self, o): return Mask(self.values | self._v(o))
    __ror__ = __or__
    def __invert__(self): return Mask(~self.values)

    def __bool__(self):
        raise KernelUsageError("use '&', '|' and '~' to combine masks, not 'and', 'or' and 'not'")


def mask_values(mask):
    """The mask as a boolean array (or None for no mask)."""
    if mask is None:
        return None
    if isinstance(mask, Mask):
        return mask.values
    if isinstance(mask, (bool, np.bool_)):
        return None if mask else np.zeros((1, 1), bool)
    raise KernelUsageError(f"mask must be a comparison of nl.arange/nl.mgrid/loop indices combined with '&', "
                           f"got {type(mask).__name__}")


# ------------------------------------------------------------------------------------ indexing

def _slice_bounds(s: slice, size: int) -> tuple[int, int, int]:
    step = 1 if s.step is None else int(s.step)
    if step <= 0:
        raise KernelUsageError(f"slice step must be positive, got {step}")
    start = 0 if s.start is None else int(s.start)
    stop = size if s.stop is None else int(s.stop)
    return start, max(stop, start), step


def index(tensor: Tensor, key):
    """``tensor[key]``: a view tensor for basic indexing, an :class:`Access` for advanced indexing."""
    key = key if isinstance(key, tuple) else (key,)
    if any(k is Ellipsis for k in key):
        at = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:at] + (slice(None),) * (tensor.ndim - len(key) + 1) + key[at + 1:]
    if len(key) > tensor.ndim:
        raise KernelUsageError(f"too many indices for tensor '{tensor.name}' of rank {tensor.ndim}: {len(key)}")
    key = key + (slice(None),) * (tensor.ndim - len(key))
    advanced = [k for k in key if isinstance(k, (IndexExpr, Tensor, Access))]
    if advanced:
        return _advanced(tensor, key)
    np_key, in_range, dropped_before_p = [], True, 0
    for axis, k in enumerate(key):
        size = tensor.shape[axis]
        if isinstance(k, slice):
            start, stop, step = _slice_bounds(k, size)
            if step != 1 and axis == tensor.pdim and tensor.buffer.on_chip:
                raise _partition_stride_error(tensor)
            if start < 0 or stop > size:
                in_range = False
            np_key.append(slice(start, stop, step))
        elif isinstance(k, (int, np.integer)):
            k = int(k)
            if not -size <= k < size:
                raise out_of_bounds(tensor, axis, k, k)
            np_key.append(k)
            dropped_before_p += axis < tensor.pdim
        elif isinstance(k, Mask):
            raise UnsupportedError("operand masking (tile[mask])", "pass mask= to the instruction instead")
        else:
            raise KernelUsageError(f"unsupported index {k!r} of type {type(k).__name__} for tensor "
                                   f"'{tensor.name}': use ints, slices, nl.ds, nl.arange or nl.mgrid")
    if not in_range:
        # An out-of-range slice is legal only where a mask excludes it: evaluate lazily.
        return _advanced(tensor, tuple(np_key), from_slices=True)
    view = Tensor(tensor.data[tuple(np_key)], tensor.buffer, tensor.name, tensor.site,
                  max(tensor.pdim - dropped_before_p, 0))
    return view


def _advanced(tensor: Tensor, key, from_slices: bool = False) -> Access:
    comps = []
    if from_slices:
        # Open-mesh index arrays, one result axis per slice, as NumPy basic indexing would give.
        n_axes = sum(isinstance(k, slice) for k in key)
        axis_out = 0
        for k in key:
            if isinstance(k, slice):
                shape = [1] * n_axes
                rng = np.arange(k.start, k.stop, k.step)
                shape[axis_out] = rng.size
                comps.append(rng.reshape(shape))
                axis_out += 1
            else:
                comps.append(k % tensor.shape[len(comps)] if k < 0 else k)
    else:
        for axis, k in enumerate(key):
            if isinstance(k, slice):
                raise KernelUsageError(
                    f"mixing basic (slice) and advanced (nl.arange) indexing in one subscript of "
                    f"'{tensor.name}' is not supported: index every dimension with nl.arange/nl.mgrid "
                    f"expressions or ints")
            if isinstance(k, IndexExpr):
                if k.ndim == 1:
                    raise KernelUsageError(
                        f"1-D nl.arange index on '{tensor.name}' is not supported: give it a partition or free "
                        f"axis, e.g. nl.arange(n)[:, None] or nl.arange(n)[None, :]")
                if axis == tensor.pdim and tensor.buffer.on_chip:
                    _check_partition_index(tensor, k.values)
                comps.append(k.values)
            elif isinstance(k, (Tensor, Access)):
                comps.append(_indirect_indices(tensor, axis, k))
            else:
                comps.append(int(k) + (tensor.shape[axis] if int(k) < 0 else 0))
    arrays = [c for c in comps if not isinstance(c, int)]
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    return Access(tensor, comps, tuple(shape))


def _partition_stride_error(tensor: Tensor) -> KernelUsageError:
    return KernelUsageError(f"the partition dimension of on-chip tensor '{tensor.name}' must be accessed as one "
                            f"contiguous range along the first result axis (no partition striding or "
                            f"partition-to-free reshuffling; use nc_transpose)")


def _check_partition_index(tensor: Tensor, values: np.ndarray) -> None:
    if any(n > 1 for n in values.shape[1:]):
        raise _partition_stride_error(tensor)
    column = values.reshape(-1)
    if column.size > 1 and not np.array_equal(np.diff(column), np.ones(column.size - 1, column.dtype)):
        raise _partition_stride_error(tensor)


def _indirect_indices(tensor: Tensor, axis: int, index_tile) -> np.ndarray:
    """Runtime (indirect DMA) indices: an on-chip integer tile indexing the partition axis of HBM."""
    if tensor.buffer.on_chip:
        raise KernelUsageError(f"indirect indexing with a tile is only supported on HBM tensors, not on "
                               f"'{tensor.name}' in {tensor.buffer!r}")
    if axis != 0:
        raise KernelUsageError(f"indirect indices are only supported on the partition (first) dimension of "
                               f"'{tensor.name}', got them on dimension {axis}")
    values = index_tile.read() if isinstance(index_tile, Access) else index_tile.data
    if values.dtype.kind not in "iu":
        raise KernelUsageError(f"indirect indices must be an integer tile, got {values.dtype}")
    return values.astype(np.int64).reshape(values.shape[0], *([1] * max(values.ndim - 1, 1)))


# --------------------------------------------------------------------------- reads and writes

def require_on_chip(x, api: str, arg: str) -> None:
    if not x.buffer.on_chip:
        raise MemorySpaceError(f"Expected operand '{arg}' of '{api}' to be in address space 'psum|sbuf', but got "
                               f"a tile in 'hbm' instead (tensor '{x.name}'; move data on chip with nl.load)")


def require_tile(x: Tensor, api: str, arg: str) -> None:
    if x.pdim != 0:
        raise KernelUsageError(f"operand '{arg}' of '{api}': tensor '{x.name}' of shape {list(x.shape)} has "
                               f"leading block dimension(s) before its partition dimension; index them first")


def read(x, api: str, arg: str, mask=None) -> np.ndarray:
    """The values of an on-chip operand (storage dtype), restricted to ``mask``."""
    if isinstance(x, Access):
        require_on_chip(x, api, arg)
        return x.read(mask)
    if isinstance(x, Tensor):
        require_on_chip(x, api, arg)
        require_tile(x, api, arg)
        if mask is None:
            return x.data
        selected = np.broadcast_to(mask, x.shape)
        return np.where(selected, x.data, np.array(active_config().fill_value(x.dtype), x.dtype))
    raise KernelUsageError(f"operand '{arg}' of '{api}' must be a tile, got {type(x).__name__}")


def fit(values: np.ndarray, shape: tuple[int, ...], target_name: str, api: str) -> np.ndarray:
    """Broadcast ``values`` to ``shape``; a (P,) per-partition vector counts as (P, 1)."""
    if values.shape == shape:
        return values
    if values.ndim == 1 and len(shape) >= 2 and values.shape[0] == shape[0]:
        values = values.reshape((shape[0],) + (1,) * (len(shape) - 1))
    elif values.size == math.prod(shape) and values.ndim > 0:
        return values.reshape(shape)
    try:
        return np.broadcast_to(values, shape)
    except ValueError:
        raise KernelUsageError(f"{api}: value of shape {list(values.shape)} does not fit destination "
                               f"'{target_name}' of shape {list(shape)} (the source must not be larger than "
                               f"the destination)") from None


def write(target, values: np.ndarray, api: str, mask=None) -> None:
    """Round ``values`` into ``target`` (a view tensor or an access), only where ``mask`` holds."""
    shape = tuple(target.shape)
    values = dt.cast(fit(values, shape, target.name, api), target.dtype)
    if isinstance(target, Access):
        target.write(values, mask)
    elif mask is None:
        target.data[...] = values
    else:
        np.copyto(target.data, values, where=np.broadcast_to(mask, shape))


def value_of(x, api: str, arg: str, mask=None) -> np.ndarray:
    if isinstance(x, (Tensor, Access)):
        return read(x, api, arg, mask)
    if isinstance(x, (int, float, bool, np.number, np.bool_)):
        return np.asarray(x, dtype=dt.scalar_dtype(x))
    raise KernelUsageError(f"operand '{arg}' of '{api}' must be a tile or a scalar, got {type(x).__name__}")


def assign(target, value, api: str, mask=None) -> None:
    """``target[...] = value`` on chip (a copy by an engine)."""
    if not target.buffer.on_chip:
        raise MemorySpaceError(f"cannot assign into HBM tensor '{target.name}' with '='; write HBM with nl.store "
                               f"(or nisa.dma_copy)")
    write(target, value_of(value, api, "value", mask), api, mask)
