"""The simulator's values: buffers, tensors, accesses, index expressions and masks.

Plain data with the arithmetic of their own indices and nothing else: subscripting and operators are a
front end's spelling (its subclasses), allocation and reads/writes are ``memory``'s, subscripts
``indexing``'s. Every other core module may import this one.
"""

from __future__ import annotations

import math

import numpy as np

from . import dtypes as dt
from .errors import KernelUsageError, OutOfBoundsError
from .run import active_config

# ----------------------------------------------------------------------------------- buffers

class Buffer:
    __slots__ = ("name", "space", "on_chip")

    def __init__(self, name: str, space: str):
        self.name, self.space = name, space
        self.on_chip = space != "hbm"  # an attribute, not a property: every instruction asks it many times

    def __repr__(self) -> str:
        return f"nl.{self.name}"


sbuf = Buffer("sbuf", "sbuf")
psum = Buffer("psum", "psum")
private_hbm = Buffer("private_hbm", "hbm")
shared_hbm = Buffer("shared_hbm", "hbm")


class ParDim(int):
    """``nl.par_dim(n)``: marks the partition dimension inside a shape."""


# ----------------------------------------------------------------------------------- tensors

class Tensor:
    """A tensor in HBM, SBUF or PSUM. On-chip tensors are tiles: partition dimension first. A value: the
    front ends add their spelling (subscripts, operators) in subclasses."""

    # written: the elements a masked instruction wrote (None: all); assigning the tile copies only those.
    # unset: the elements of an uninitialised PSUM tensor no instruction has written yet (None: none).
    # accumulates: a Tensor-engine result, which adds into PSUM in the bank (overwriting unset elements).
    # combine: (op, values) of an nl.loop_reduce result: assigning it stores op(values, destination).
    # alloc: the liveness record(s) of the on-chip storage this tensor views (see ``liveness``), or
    # a kernel argument's write flag; None for tensors nobody accounts.
    __slots__ = ("data", "buffer", "name", "site", "pdim", "alloc", "written", "unset", "accumulates",
                 "combine")
    # The class of an advanced-indexing access into this tensor (``indexing``): a front end's subclass
    # names its own.
    access_type = None
    offsets = ()  # the tiles an indirect view reads its addresses from (see Access)
    # rules, supported: the allocation rules and dtypes of this class's tensors (``memory.new_tensor``; set there).

    def __init__(self, data: np.ndarray, buffer: Buffer, name: str, site: str, pdim: int = 0, alloc=None):
        self.data, self.buffer, self.name, self.site, self.pdim = data, buffer, name, site, pdim
        self.alloc = alloc
        self.written = self.unset = None
        self.accumulates = False
        self.combine = None

    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    itemsize = property(lambda self: self.data.dtype.itemsize)

    def __repr__(self) -> str:
        return f"<{self.buffer!r} tensor '{self.name}' {self.dtype} {list(self.shape)} from {self.site}>"

    def __bool__(self):
        raise KernelUsageError("the truth value of a tensor is ambiguous; control flow cannot depend on tensor "
                               "values (use nl.where or a mask)")

    def __len__(self):
        return self.shape[0]

    def reshape(self, *args, shape=None):
        """An HBM view of another shape: ``t.reshape((a, b))``, ``t.reshape(a, b)``, ``t.reshape(shape=(a, b))``."""
        if shape is None:
            shape = tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
        elif args:
            raise KernelUsageError(f"reshape of '{self.name}': give the shape once, positionally or as shape=")
        shape = tuple(int(s) for s in shape)
        if self.buffer.on_chip:
            raise KernelUsageError(f"reshape of on-chip tensor '{self.name}': only HBM tensors can be reshaped")
        if math.prod(shape) != self.data.size:
            raise KernelUsageError(f"cannot reshape '{self.name}' of shape {list(self.shape)} to {list(shape)}: "
                                   f"element counts differ")
        return type(self)(self.data.reshape(shape), self.buffer, self.name, self.site, alloc=self.alloc)

    def view(self, dtype):
        """The same bytes read as ``dtype`` (a bit reinterpretation; the last axis scales with the item size)."""
        dtype = dt.as_dtype(dtype)
        try:
            data = self.data.view(dtype)
        except ValueError as error:
            raise KernelUsageError(f"cannot view '{self.name}' of shape {list(self.shape)} {self.dtype} as {dtype}: "
                                   f"{error}") from None
        view = type(self)(data, self.buffer, self.name, self.site, self.pdim, alloc=self.alloc)
        if data.shape == self.shape:
            view.written, view.unset = self.written, self.unset
        return view


class Access:
    """An advanced-indexing access ``t[i_p, 4 * i_f + 1]``: evaluated when read or written,
    so a mask can exclude out-of-range elements."""

    # indirect: the axes indexed by runtime (indirect DMA) indices, which oob_mode=skip may skip;
    # offsets: the tiles holding those indices (the DMA reads its addresses from them).
    __slots__ = ("tensor", "comps", "shape", "strided", "indirect", "offsets")

    def __init__(self, tensor: Tensor, comps: list, shape: tuple[int, ...], indirect: tuple[int, ...] = (),
                 progs: list | None = None):
        self.tensor, self.comps, self.shape, self.indirect = tensor, comps, shape, indirect
        self.offsets = ()
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

    @property
    def valid(self) -> np.ndarray:
        """The elements whose indirect (runtime) indices fall inside the tensor, which a DMA with
        ``oob_mode=skip`` moves (as a current-API gather view's ``valid``)."""
        keep = np.ones(tuple(self.shape), bool)
        for axis in self.indirect:
            index = np.broadcast_to(self.comps[axis], keep.shape)
            keep &= (index >= 0) & (index < self.tensor.shape[axis])
        return keep

    def gather(self, array: np.ndarray) -> np.ndarray:
        """The elements of ``array`` (shaped like the tensor) this access selects."""
        idx, _ = self._indices(None)
        return array[idx]


Tensor.access_type = Access


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


def out_of_bounds(tensor: Tensor, axis: int, low: int, high: int) -> OutOfBoundsError:
    return OutOfBoundsError(f"Out-of-bound access for tensor `{tensor.name}` on dimension {axis}: index range "
                            f"[{low}, {high}] exceed dimension size of {tensor.shape[axis]}")


def index_rows(values: np.ndarray, refusal: str) -> np.ndarray:
    """The rows an index tile names (a gather's or scatter's runtime indices, in either generation's
    spelling), as int64; ``refusal`` says what must hold integers when ``values`` do not."""
    if values.dtype.kind not in "iu":
        raise KernelUsageError(f"{refusal}, got {values.dtype}")
    return values.astype(np.int64)


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


def broadcast_shape(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
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
