"""Index expressions (``nl.arange``, ``nl.mgrid``, masks) and tensor subscripts.

Basic subscripts give view tensors; subscripts with index expressions, runtime index tiles or
out-of-range slices give an :class:`Access`, evaluated lazily so a mask can exclude elements.
"""

from __future__ import annotations

import numpy as np

from . import alu, liveness, memory
from .errors import KernelUsageError, OutOfBoundsError, UnsupportedError
from .run import active_config, require_values


class Access(alu.TileOperators):
    """An advanced-indexing access ``t[i_p, 4 * i_f + 1]``: evaluated when read or written,
    so a mask can exclude out-of-range elements."""

    # indirect: the axes indexed by runtime (indirect DMA) indices, which oob_mode=skip may skip.
    __slots__ = ("tensor", "comps", "shape", "strided", "indirect")

    def __init__(self, tensor: memory.Tensor, comps: list, shape: tuple[int, ...], indirect: tuple[int, ...] = (),
                 progs: list | None = None):
        self.tensor, self.comps, self.shape, self.indirect = tensor, comps, shape, indirect
        self.strided = _as_strided_slices(comps, shape, tensor.shape, progs)

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
            selected = mask_for(mask, self.shape)
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
        if self.tensor.written is not None:
            self.tensor.written[idx] = True
        if self.tensor.unset is not None:
            self.tensor.unset[idx] = False

    def __getitem__(self, key):
        if isinstance(key, Mask):
            return MaskedOperand(self, key)
        raise KernelUsageError(f"an indexed access of '{self.name}' can only be subscripted with a mask (operand "
                               f"masking); index the tensor once")

    def broadcast_to(self, shape):
        """A new tile of the accessed values with size-1 dimensions replicated to ``shape``."""
        return memory.broadcast_tile(self, shape)

    def gather(self, array: np.ndarray) -> np.ndarray:
        """The elements of ``array`` (shaped like the tensor) this access selects."""
        idx, _ = self._indices(None)
        return array[idx]

    def __iadd__(self, other):
        unset = self.gather(self.tensor.unset) if self.tensor.unset is not None else None
        return memory.inplace_result(self, "add", other, unset)

    def __isub__(self, other):
        return alu.binary("subtract", self, other, dtype=self.dtype)

    def __imul__(self, other):
        return alu.binary("multiply", self, other, dtype=self.dtype)


def _as_strided_slices(comps: list, shape: tuple[int, ...], bounds: tuple[int, ...], progs: list | None = None):
    """Basic-indexing equivalent of an advanced index, when every index array is an in-bounds
    arithmetic progression along its own result axis, in axis order; else None. ``progs`` gives
    the progressions known from the index expressions (``IndexExpr.prog``), which need no analysis."""
    key, next_axis = [], 0
    for axis, comp in enumerate(comps):
        if isinstance(comp, int):
            key.append(comp)
            continue
        varying = [a for a, n in enumerate(comp.shape) if n > 1]
        if comp.ndim != len(shape) or len(varying) > 1 or (varying and varying[0] != next_axis):
            return None
        prog = progs[axis] if progs is not None else None
        if not varying:  # one index (nl.arange(1)): a slice of one element
            if comp.size != 1:
                return None
            first = last = int(comp.reshape(-1)[0])
            step = 1
        elif prog is not None:
            _, first, step = prog
            last = first + step * (comp.shape[varying[0]] - 1)
            if step < 1:
                return None
        else:
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


def out_of_bounds(tensor: memory.Tensor, axis: int, low: int, high: int) -> OutOfBoundsError:
    return OutOfBoundsError(f"Out-of-bound access for tensor `{tensor.name}` on dimension {axis}: index range "
                            f"[{low}, {high}] exceed dimension size of {tensor.shape[axis]}")



# ------------------------------------------------------------------------------ index algebra

class IndexExpr:
    """An affine integer index expression built from ``nl.arange``/``nl.mgrid``.

    ``prog`` is ``(axis, start, step)`` when the values are known to be ``start + step * i`` along
    ``axis`` and constant along every other (size-1) axis; integer arithmetic keeps it, so an access
    ``t[i_p, 4 * i_f + 1]`` becomes a strided view without analysing the index arrays."""

    __slots__ = ("values", "prog")

    def __init__(self, values: np.ndarray, prog: tuple[int, int, int] | None = None):
        self.values = values
        self.prog = prog

    shape = property(lambda self: self.values.shape)
    ndim = property(lambda self: self.values.ndim)

    def __repr__(self) -> str:
        return f"IndexExpr(shape={list(self.shape)})"

    def __getitem__(self, key):
        return IndexExpr(self.values[key], self._moved_prog(key))

    def _moved_prog(self, key):
        """``prog`` after ``values[key]`` when ``key`` only adds axes (``[:, None]``, ``[None, :]``)."""
        key = key if isinstance(key, tuple) else (key,)
        if self.prog is None or not all(k is None or (isinstance(k, slice) and k == slice(None)) for k in key):
            return None
        full = [i for i, k in enumerate(key) if k is not None]
        if len(full) != self.values.ndim:
            return None
        axis, start, step = self.prog
        return full[axis], start, step

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

    def _affine(self, o, scale: int, offset: int):
        """``prog`` of ``scale * values + offset`` (None when ``o`` is another expression)."""
        if self.prog is None or isinstance(o, IndexExpr):
            return None
        axis, start, step = self.prog
        return axis, scale * start + offset, scale * step

    def __add__(self, o): return IndexExpr(self.values + self._v(o), self._affine(o, 1, self._v(o)))
    def __radd__(self, o): return IndexExpr(self._v(o) + self.values, self._affine(o, 1, self._v(o)))
    def __sub__(self, o): return IndexExpr(self.values - self._v(o), self._affine(o, 1, -self._v(o)))
    def __rsub__(self, o): return IndexExpr(self._v(o) - self.values, self._affine(o, -1, self._v(o)))
    def __mul__(self, o): return IndexExpr(self.values * self._v(o), self._affine(o, self._v(o), 0))
    def __rmul__(self, o): return IndexExpr(self._v(o) * self.values, self._affine(o, self._v(o), 0))
    def __floordiv__(self, o): return IndexExpr(self.values // self._v(o))
    def __mod__(self, o): return IndexExpr(self.values % self._v(o))
    def __neg__(self): return IndexExpr(-self.values, self._affine(0, -1, 0))
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


class MaskedOperand:
    """``tile[mask]``: a matmul operand restricted to the elements ``mask`` selects (operand masking,
    ``nl.matmul(lhs_T[i_lhs_f <= 64], rhs[i_rhs_f <= 256], transpose_x=True)``); only the
    Tensor-engine instructions take it."""

    __slots__ = ("operand", "mask")

    def __init__(self, operand, mask: Mask):
        self.operand, self.mask = operand, mask

    shape = property(lambda self: self.operand.shape)
    dtype = property(lambda self: self.operand.dtype)
    buffer = property(lambda self: self.operand.buffer)
    name = property(lambda self: self.operand.name)


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


def mask_for(mask: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``mask`` over an operand of ``shape``: an operand element smaller than the masked iteration space
    (a (P, 1) column of a (P, F) instruction) is selected when any position it broadcasts to is."""
    mask = np.asarray(mask)
    if mask.ndim == len(shape):
        axes = tuple(a for a, (m, s) in enumerate(zip(mask.shape, shape)) if s == 1 and m > 1)
        if axes:
            mask = np.logical_or.reduce(mask, axis=axes, keepdims=True)
    try:
        return np.broadcast_to(mask, shape)
    except ValueError:
        raise KernelUsageError(f"mask of shape {list(mask.shape)} does not fit an operand of shape "
                               f"{list(shape)}") from None


# ------------------------------------------------------------------------------------ indexing

def _slice_bounds(s: slice, size: int) -> tuple[int, int, int]:
    if s.step is None and s.start.__class__ is int and s.stop.__class__ is int:  # a[i:i + n], nl.ds
        return s.start, max(s.stop, s.start), 1
    step = 1 if s.step is None else int(s.step)
    if step <= 0:
        raise KernelUsageError(f"slice step must be positive, got {step}")
    start = 0 if s.start is None else int(s.start)
    stop = size if s.stop is None else int(s.stop)
    return start, max(stop, start), step


_ADVANCED = (IndexExpr, memory.Tensor, Access)  # index kinds that make an access instead of a view


def index(tensor: memory.Tensor, key):
    """``tensor[key]``: a view tensor for basic indexing, an :class:`Access` for advanced indexing."""
    if type(key) is not tuple:
        if isinstance(key, Mask):
            return MaskedOperand(tensor, key)
        key = (key,)
    ndim = tensor.data.ndim
    if ndim == 1 and len(key) == 2 and tensor.buffer.on_chip:
        # A (P,) vector is a (P, 1) column: sum_res[i_p, 0], t[:, 3][:, 0].
        tensor = _column_view(tensor)
        ndim = 2
    advanced = False
    for at, k in enumerate(key):
        if k is Ellipsis:
            key = key[:at] + (slice(None),) * (ndim - len(key) + 1) + key[at + 1:]
            break
    for k in key:
        if isinstance(k, _ADVANCED):
            advanced = True
            break
    if len(key) > ndim:
        raise KernelUsageError(f"too many indices for tensor '{tensor.name}' of rank {ndim}: {len(key)}")
    if len(key) < ndim:
        key = key + (slice(None),) * (ndim - len(key))
    if advanced:
        return _advanced(tensor, key)
    np_key, in_range, dropped_before_p = [], True, 0
    shape, pdim, on_chip = tensor.data.shape, tensor.pdim, tensor.buffer.on_chip
    for axis, k in enumerate(key):
        size = shape[axis]
        if k.__class__ is slice:
            start, stop, step = _slice_bounds(k, size)
            if step != 1 and axis == pdim and on_chip:
                raise _partition_stride_error(tensor)
            if start < 0 or stop > size:
                in_range = False
            np_key.append(slice(start, stop, step))
        elif isinstance(k, (int, np.integer)):
            k = int(k)
            if not -size <= k < size:
                raise out_of_bounds(tensor, axis, k, k)
            np_key.append(k)
            dropped_before_p += axis < pdim
        elif isinstance(k, Mask):
            raise UnsupportedError("operand masking (tile[mask])", "pass mask= to the instruction instead")
        else:
            raise KernelUsageError(f"unsupported index {k!r} of type {type(k).__name__} for tensor "
                                   f"'{tensor.name}': use ints, slices, nl.ds, nl.arange or nl.mgrid")
    if not in_range:
        # An out-of-range slice is legal only where a mask excludes it: evaluate lazily.
        return _advanced(tensor, tuple(np_key), from_slices=True)
    np_key.append(Ellipsis)  # a view even when every index is an int (o[0, 0] is a 0-d view)
    np_key = tuple(np_key)
    view = memory.Tensor(tensor.data[np_key], tensor.buffer, tensor.name, tensor.site,
                         pdim - dropped_before_p if pdim > dropped_before_p else 0)
    if tensor.alloc is not None:
        view.alloc = liveness.view_part(tensor.alloc, np_key)
    if tensor.written is not None:
        view.written = tensor.written[np_key]
    if tensor.unset is not None:
        view.unset = tensor.unset[np_key]
    return view


def _column_view(tensor: memory.Tensor) -> memory.Tensor:
    view = memory.Tensor(tensor.data[:, None], tensor.buffer, tensor.name, tensor.site, alloc=tensor.alloc)
    view.written = None if tensor.written is None else tensor.written[:, None]
    view.unset = None if tensor.unset is None else tensor.unset[:, None]
    return view


def _advanced(tensor: memory.Tensor, key, from_slices: bool = False) -> Access:
    comps, indirect, progs = [], [], []
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
                    _check_partition_index(tensor, k.values, k.prog)
                comps.append(k.values)
                progs.append(k.prog)
            elif isinstance(k, Mask):
                raise UnsupportedError("operand masking (tile[mask])", "pass mask= to the instruction instead")
            elif isinstance(k, (memory.Tensor, Access)):
                blocks = all(isinstance(b, (int, np.integer)) for b in key[:axis])
                comps.append(_indirect_indices(tensor, axis, k, blocks))
                indirect.append(axis)
            else:
                comps.append(int(k) + (tensor.shape[axis] if int(k) < 0 else 0))
            if len(progs) < len(comps):
                progs.append(None)
    shape = _broadcast_shape([c.shape for c in comps if not isinstance(c, int)])
    return Access(tensor, comps, shape, tuple(indirect), progs or None)


def _broadcast_shape(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """``np.broadcast_shapes(*shapes)`` without its arrays (a few microseconds for every access)."""
    ndim = max(map(len, shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for axis, n in enumerate(shape, ndim - len(shape)):
            if n != 1:
                if out[axis] == 1:
                    out[axis] = n
                elif out[axis] != n:
                    return np.broadcast_shapes(*shapes)  # raises NumPy's error
    return tuple(out)


def _partition_stride_error(tensor: memory.Tensor) -> KernelUsageError:
    return KernelUsageError(f"the partition dimension of on-chip tensor '{tensor.name}' must be accessed as one "
                            f"contiguous range along the first result axis (no partition striding or "
                            f"partition-to-free reshuffling; use nc_transpose)")


def _check_partition_index(tensor: memory.Tensor, values: np.ndarray, prog=None) -> None:
    if any(n > 1 for n in values.shape[1:]):
        raise _partition_stride_error(tensor)
    column = values.reshape(-1)
    if column.size <= 1:
        return
    consecutive = prog[2] == 1 if prog is not None else np.array_equal(np.diff(column),
                                                                       np.ones(column.size - 1, column.dtype))
    if not consecutive:
        raise _partition_stride_error(tensor)


def _indirect_indices(tensor: memory.Tensor, axis: int, index_tile, after_blocks: bool) -> np.ndarray:
    """Runtime (indirect DMA) indices: an on-chip integer tile indexing the partition axis of an HBM
    access, the first axis after any integer (block) indices: ``x[idx, j]``, ``x[b, idx, j]``."""
    if tensor.buffer.on_chip:
        raise KernelUsageError(f"indirect indexing with a tile is only supported on HBM tensors, not on "
                               f"'{tensor.name}' in {tensor.buffer!r}")
    if not after_blocks:
        raise KernelUsageError(f"indirect indices are only supported on the partition dimension of an access "
                               f"(the first one not indexed by an integer) of '{tensor.name}', got them on "
                               f"dimension {axis}")
    values = index_tile.read() if isinstance(index_tile, Access) else index_tile.data
    if values.dtype.kind not in "iu":
        raise KernelUsageError(f"indirect indices must be an integer tile, got {values.dtype}")
    require_values(f"an indirect access to '{tensor.name}' (addresses from a tile)")
    return values.astype(np.int64).reshape(values.shape[0], *([1] * max(values.ndim - 1, 1)))


