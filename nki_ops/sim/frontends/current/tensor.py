"""``nki.tensor``: ``NkiTensor``, a view over an allocation's storage.

Every view (indexing, ``reshape``, ``permute``, ``broadcast``, ``.ap()``...) is a NumPy view of
the allocation's array, so writes through any view are seen by all. The allocation itself is
``root``: it keeps on-chip capacity accounted while any view lives, and ``.ap()`` addresses it.
On-chip tensors are always at least 2-D (partition dimension first); HBM tensors index like NumPy.
"""

from __future__ import annotations

import math
import operator

import numpy as np

from ...core import dtypes as dt
from ...core import liveness, memory, poison
from ...core.errors import (
    CapacityError,
    KernelUsageError,
    OutOfBoundsError,
    TileLimitError,
    UnsupportedError,
    user_site,
)
from ...core.run import current_run, violation
from . import dtypes

__all__ = ["NkiTensor", "allocate"]


def _no_arithmetic(self, *_):
    raise KernelUsageError("NkiTensor does not overload arithmetic or comparison operators; use nisa "
                           "instructions (nisa.tensor_tensor, nisa.tensor_scalar) or nl.add / nl.multiply ...")


class NkiTensor(memory.Tensor):
    """A tensor in HBM, SBUF or PSUM: shape, dtype, buffer, and a view of its allocation."""

    def __init__(self, data: np.ndarray, buffer: memory.Buffer, name: str, site: str, root: NkiTensor | None = None,
                 unset: np.ndarray | None = None):
        # memory.Tensor's fields, set here directly: a view is made for nearly every operand.
        # Views share their allocation's liveness record (None in HBM): a use of any view is a use of it.
        self.data, self.buffer, self.name, self.site, self.pdim = data, buffer, name, site, 0
        self.alloc = None if root is None else root.alloc
        self.written = None
        self.accumulates = False
        self.combine = None
        self._root = root
        self._array = data  # ``data``, filled or not: shape and dtype are read without filling it
        # (storage, fill value, whether it is the sentinel) of an allocation not filled yet, whose ``data``
        # is unset until then (__getattr__).
        self._unfilled = None
        # PSUM elements no instruction wrote yet: the first matmul into them overwrites, later ones add.
        self.unset = unset

    # Operators: the current API has none on tensors (a + b is a TypeError, as in NKI 0.6).
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _no_arithmetic
    __pow__ = __rpow__ = __mod__ = __rmod__ = __and__ = __rand__ = __or__ = __ror__ = _no_arithmetic
    __xor__ = __rxor__ = __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = _no_arithmetic
    __lt__ = __le__ = __gt__ = __ge__ = __neg__ = __invert__ = _no_arithmetic
    __iadd__ = __isub__ = __imul__ = __itruediv__ = _no_arithmetic
    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        # A tensor is a compile-time object: `if t:` tests that there is one, never its values.
        return True

    def __repr__(self) -> str:
        return f"NkiTensor('{self.name}', shape={list(self.shape)}, dtype={self.dtype}, buffer={self.buffer!r})"

    @property
    def root(self) -> NkiTensor:
        """The allocation this tensor views. An allocation holds no reference to itself: a cycle would
        keep its array alive until the next garbage collection instead of freeing it with its last view."""
        return self if self._root is None else self._root

    def __getattr__(self, name: str):
        """Reached only when ``name`` is not set: the ``data`` of a new allocation, filled with its poison
        on this first use (unless an instruction overwrote all of it first, ``overwrite_all``), so
        uninitialised memory reads as the sentinel. Set ``data`` is a plain slot read."""
        unfilled = self.__dict__.get("_unfilled") if name == "data" else None
        if unfilled is None:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        storage, poison, sentinel = unfilled
        storage[...] = poison
        self._unfilled = None
        self.data = storage
        if sentinel and self.alloc is not None:
            memory.mark_poison(self.alloc, storage)  # its first read looks for the never-written elements
        return storage

    def overwrite_all(self) -> None:
        """An instruction is about to write every element of this tensor: if it is an allocation not yet
        filled, the fill is skipped (nothing could read it). Making a view fills its allocation; a view
        as large as it leaves no never-written element for its first read to look for."""
        if self._unfilled is not None:
            self.data = self._unfilled[0]
            self._unfilled = None
        elif self.alloc is not None and self.alloc.poison is not None and self._array.size == self.alloc.poison.size:
            self.alloc.poison = None

    def _storage(self) -> np.ndarray:
        """The array, filled or not."""
        return self._array

    def result_buffer(self) -> np.ndarray | None:
        """The fp32 storage an instruction may compute its result into (unfilled: the instruction reads
        its operands first, and then writes all of it), or None for other dtypes."""
        data = self._array
        return data if data.dtype is _FLOAT32 else None

    # Shape and type come from the storage without filling it (attrgetter: no Python frame per use).
    shape = property(operator.attrgetter("_array.shape"))
    dtype = property(operator.attrgetter("_array.dtype"))
    ndim = property(operator.attrgetter("_array.ndim"))
    size = property(operator.attrgetter("_array.size"))
    itemsize = property(operator.attrgetter("_array.dtype.itemsize"))
    writeable = property(lambda self: self._array.flags.writeable)  # a broadcast view is not
    strides = property(lambda self: tuple(s // self.itemsize for s in self.data.strides))

    @property
    def offset(self) -> int:
        """Element offset of this view's first element in its allocation."""
        base = self.root.data.__array_interface__["data"][0]
        return (self.data.__array_interface__["data"][0] - base) // self.itemsize

    def _view(self, data: np.ndarray, unset=None) -> NkiTensor:
        return NkiTensor(data, self.buffer, self.name, self.site, self.root, unset)

    def _derived(self, fn) -> NkiTensor:
        """A view made by applying the same NumPy view operation to the data and the unset flags."""
        return self._view(fn(self.data), None if self.unset is None else fn(self.unset))

    def __setitem__(self, key, value):
        """``t[key] = value``: a copy into the view ``t[key]`` (NkiTensor defines ``__setitem__``; kernels
        validated on trn1/trn2 store tiles into HBM outputs this way): a DMA when either side is in HBM,
        else an engine copy, both casting to the destination's dtype; a number fills an on-chip view."""
        from . import isa

        dst = self[key]
        if isinstance(value, memory.Tensor):
            if dst.buffer.on_chip and value.buffer.on_chip:
                isa.tensor_copy(dst=dst, src=value)
            else:
                isa.dma_copy(dst=dst, src=value)
        elif isinstance(value, (int, float, np.number)) and not isinstance(value, bool) and dst.buffer.on_chip:
            isa.memset(dst=dst, value=value)
        else:
            raise KernelUsageError(f"cannot assign {type(value).__name__} into '{self.name}': assign a tensor, or a "
                                   f"number into an on-chip tensor")

    # ------------------------------------------------------------------------------- indexing
    def __getitem__(self, key):
        data = self.data
        shape = data.shape
        key = key if type(key) is tuple else (key,)
        for at, k in enumerate(key):
            if k is Ellipsis:
                key = key[:at] + (slice(None),) * (len(shape) - len(key) + 1) + key[at + 1:]
                break
        if len(key) > len(shape):
            raise KernelUsageError(f"too many indices for tensor '{self.name}' of rank {len(shape)}: {len(key)}")
        np_key = []
        ints = 0
        for axis, size in enumerate(shape):
            k = key[axis] if axis < len(key) else _ALL
            if type(k) is slice:
                np_key.append(k if k == _ALL else _check_slice(self, axis, k, size))
            elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
                k = int(k)
                if not -size <= k < size:
                    raise _oob(self, axis, k, k)
                np_key.append(k % size)
                ints += 1
            else:
                raise KernelUsageError(f"unsupported index {k!r} of type {type(k).__name__} for tensor "
                                       f"'{self.name}': use ints, slices or nl.ds; irregular access patterns "
                                       f"go through .ap()")
        if ints and self.buffer.on_chip:
            # On-chip tensors stay >= 2-D: an int on the partition dim keeps it (size 1); ints on free dims
            # drop them unless fewer than 2 dims would remain, then the last one stays with size 1.
            if type(np_key[0]) is int:
                np_key[0] = slice(np_key[0], np_key[0] + 1)
                ints -= 1
            if len(np_key) - ints < 2:
                last = max(i for i, k in enumerate(np_key) if type(k) is int)
                np_key[last] = slice(np_key[last], np_key[last] + 1)
        np_key = tuple(np_key)
        unset = self.unset
        return NkiTensor(data[np_key], self.buffer, self.name, self.site,
                         self if self._root is None else self._root,
                         None if unset is None else unset[np_key])

    # ------------------------------------------------------------------------------- views
    def reshape(self, *shape):
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        shape = tuple(int(s) for s in shape)
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape = tuple(self.size // known if s == -1 else s for s in shape)
        if math.prod(shape) != self.size:
            raise KernelUsageError(f"cannot reshape '{self.name}' of shape {list(self.shape)} to {list(shape)}: "
                                   f"element counts differ ({self.size} vs {math.prod(shape)})")
        if self.buffer.on_chip and shape[0] != self.shape[0]:
            raise KernelUsageError(f"reshape of on-chip tensor '{self.name}' from {list(self.shape)} to "
                                   f"{list(shape)} changes the partition dimension; only free dims can be reshaped")

        def fn(a):
            view = a.view()
            try:
                view.shape = shape
            except AttributeError:
                raise KernelUsageError(f"cannot reshape the non-contiguous view '{self.name}' of shape "
                                       f"{list(self.shape)} to {list(shape)} without a copy") from None
            return view
        return self._derived(fn)

    def reshape_dim(self, dim: int, shape):
        dim = _dim(self, dim)
        return self.reshape(self.shape[:dim] + tuple(shape) + self.shape[dim + 1:])

    def flatten_dims(self, start_dim: int = 0, end_dim: int = -1):
        start, end = _dim(self, start_dim), _dim(self, end_dim)
        return self.reshape(self.shape[:start] + (math.prod(self.shape[start:end + 1]),) + self.shape[end + 1:])

    def permute(self, *dims):
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        dims = tuple(_dim(self, d) for d in dims)
        if sorted(dims) != list(range(self.ndim)):
            raise KernelUsageError(f"permute of '{self.name}' (rank {self.ndim}) needs a permutation of all dims, "
                                   f"got {list(dims)}")
        if self.buffer.on_chip and dims[0] != 0:
            raise KernelUsageError(f"permute of on-chip tensor '{self.name}' cannot move the partition dimension "
                                   f"(dims[0] must be 0, got {list(dims)}); use nc_transpose")
        return self._derived(lambda a: a.transpose(dims))

    def broadcast(self, dim: int, size: int):
        dim = _dim(self, dim)
        if self.shape[dim] != 1:
            raise KernelUsageError(f"broadcast of '{self.name}': dim {dim} has size {self.shape[dim]}, only size-1 "
                                   f"dims can be broadcast")
        if self.buffer.on_chip and dim == 0:
            raise KernelUsageError(f"broadcast of on-chip tensor '{self.name}' along the partition dimension is not "
                                   f"possible with a view; copy the data to each partition")
        shape = self.shape[:dim] + (int(size),) + self.shape[dim + 1:]
        return self._derived(lambda a: np.broadcast_to(a, shape))

    def expand_dim(self, dim: int):
        dim = dim + self.ndim + 1 if dim < 0 else dim
        if self.buffer.on_chip and dim == 0:
            raise KernelUsageError(f"expand_dim(0) of on-chip tensor '{self.name}': the partition dim stays first")
        return self._derived(lambda a: np.expand_dims(a, dim))

    def squeeze_dim(self, dim: int):
        dim = _dim(self, dim)
        if self.shape[dim] != 1:
            raise KernelUsageError(f"squeeze_dim({dim}) of '{self.name}': dim has size {self.shape[dim]}, not 1")
        if self.buffer.on_chip and (dim == 0 or self.ndim <= 2):
            raise KernelUsageError(f"squeeze_dim({dim}) of on-chip tensor '{self.name}' of shape "
                                   f"{list(self.shape)}: on-chip tensors keep the partition dim and at least 2 dims")
        return self._derived(lambda a: np.squeeze(a, dim))

    def slice(self, dim: int, start: int, end: int, step: int = 1):
        dim = _dim(self, dim)
        return self[(slice(None),) * dim + (slice(start, end, step),)]

    def select(self, dim: int, index):
        """``index`` an int: the static ``t[:, index]`` (``dim=1``). A 1x1 tile or a register: a dynamic
        select, its index read now (the kernel runs eagerly). In HBM an index out of range is the DMA's
        to handle (``oob_mode``); on chip it is refused, as is a dynamic select of the partition dim."""
        dim = _dim(self, dim)
        if isinstance(index, (int, np.integer)):
            return self[(slice(None),) * dim + (int(index),)]
        self._one_dynamic_select("select")
        row = _scalar(index, self.name, "select")
        if self.buffer.on_chip:
            if dim == 0:
                raise KernelUsageError(f"dynamic select of on-chip tensor '{self.name}' along dim 0: the partition "
                                       f"dim cannot be selected at runtime")
            if not 0 <= row < self.shape[dim]:
                raise _oob(self, dim, row, row)
            view = self[(slice(None),) * dim + (row,)]
            view._dynamic = True
            return view
        rest = _addresses(self, dim)
        valid = np.full(rest.shape, 0 <= row < self.shape[dim])
        offsets = (index,) if isinstance(index, memory.Tensor) else ()
        return IndirectTensor(self.root, self.root.data.reshape(-1), rest + row * self.strides[dim], valid, offsets)

    def vector_select(self, dim: int, vector_offset):
        """Partition ``p`` of the result reads row ``vector_offset[p]`` of this HBM tensor (a gather or,
        written by a DMA, a scatter); rows out of range are the DMA's to handle (``oob_mode``)."""
        if dim != 0:
            raise KernelUsageError(f"vector_select of '{self.name}': dim must be 0, got {dim}")
        if self.buffer.on_chip:
            raise KernelUsageError(f"vector_select of on-chip tensor '{self.name}': only HBM tensors can be "
                                   f"selected per partition")
        self._one_dynamic_select("vector_select")
        if not isinstance(vector_offset, memory.Tensor) or vector_offset.buffer is not memory.sbuf or \
                vector_offset.ndim != 2 or vector_offset.shape[1] != 1:
            raise KernelUsageError(f"vector_select of '{self.name}': vector_offset must be an SBUF tensor of shape "
                                   f"(partitions, 1), got {vector_offset!r}")
        if vector_offset.dtype.kind not in "iu":
            raise KernelUsageError(f"vector_select of '{self.name}': vector_offset must hold integers, got "
                                   f"{vector_offset.dtype}")
        rows = vector_offset.data.astype(np.int64)  # (P, 1)
        rest = _addresses(self, 0)
        rows = rows.reshape(rows.shape + (1,) * (rest.ndim - 1))
        index = rows * self.strides[0] + rest
        valid = np.broadcast_to((rows >= 0) & (rows < self.shape[0]), index.shape)
        return IndirectTensor(self.root, self.root.data.reshape(-1), index, valid, (vector_offset,))

    def _one_dynamic_select(self, api: str) -> None:
        if self.is_indirect():
            raise KernelUsageError(f"{api} of '{self.name}': it is already a dynamic (indirect) view, and a tensor "
                                   f"takes one dynamic select only (check is_indirect())")

    def rearrange(self, src_pattern, dst_pattern, fixed_sizes=None):
        """einops-style rearrangement as a view: ``src_pattern`` names each dim (a string) or the dims a dim
        splits into (a tuple of strings), ``dst_pattern`` the same names in the new order, grouped where dims
        merge; ``fixed_sizes`` gives split sizes, at most one name per group being inferred
        (``t.rearrange(('b', ('h', 'w')), ('b', 'w', 'h'), {'h': 4})`` of a ``(128, 24)`` tile: ``(128, 6, 4)``)."""
        src_groups, dst_groups = _pattern_groups(src_pattern), _pattern_groups(dst_pattern)
        shown = f"rearrange({src_pattern!r}, {dst_pattern!r})"
        names = [n for g in src_groups for n in g]
        if sorted(names) != sorted(n for g in dst_groups for n in g) or len(set(names)) != len(names):
            raise KernelUsageError(f"{shown}: both patterns must name the same dims, each once")
        if len(src_groups) != self.ndim:
            raise KernelUsageError(f"{shown}: the source pattern has {len(src_groups)} dims, tensor "
                                   f"'{self.name}' has {self.ndim} {self.shape}")
        fixed = dict(fixed_sizes or {})
        unknown = sorted(set(fixed) - set(names))
        if unknown:
            raise KernelUsageError(f"{shown}: fixed_sizes names {unknown}, which the patterns do not")
        known = {k: int(v) for k, v in fixed.items()}
        for group, size in zip(src_groups, self.shape):
            missing = [n for n in group if n not in known]
            rest = math.prod(known[n] for n in group if n in known)
            if len(missing) > 1:
                raise KernelUsageError(f"{shown}: give the sizes of all but one of {missing} in fixed_sizes")
            if missing and rest and size % rest == 0:
                known[missing[0]] = size // rest
            if any(n not in known for n in group) or math.prod(known[n] for n in group) != size:
                sizes = {n: known.get(n, "?") for n in group}
                raise KernelUsageError(f"{shown}: dims {sizes} do not split size {size}")
        split = self.reshape(tuple(known[n] for n in names))
        order = [names.index(n) for g in dst_groups for n in g]
        permuted = split.permute(order) if order != sorted(order) else split
        return permuted.reshape(tuple(math.prod(known[n] for n in g) for g in dst_groups))

    def view(self, dtype):
        """The same bytes as another dtype; the last dim scales by the itemsize ratio."""
        dtype = dtypes.as_dtype(dtype)
        if self.data.strides[-1] != self.itemsize and self.shape[-1] != 1:
            raise KernelUsageError(f"view({dtype}) of '{self.name}' needs a contiguous last dim")
        if (self.shape[-1] * self.itemsize) % dtype.itemsize:
            raise KernelUsageError(f"view({dtype}) of '{self.name}': last dim of {self.shape[-1]} x "
                                   f"{self.itemsize} bytes is not a multiple of {dtype.itemsize} bytes")
        return self._view(self.data.view(dtype))

    def ap(self, pattern, offset: int | None = None, scalar_offset=None, vector_offset=None, indirect_dim: int = 0,
           dtype=None):
        """An access pattern over the allocation: ``[[step, num], ...]`` outer to inner, the steps
        addressing the allocation (not this view's strides); element ``base + offset + sum(step_k *
        i_k)``, ``base`` being this view's storage offset (the ``NkiTensor.ap`` page: ``offset`` "added
        to the view's base storage offset"; ``None`` keeps it). On chip the first pair walks partitions
        and its step is the allocation's elements per partition. ``indirect_dim`` counts dims of this
        view: a ``scalar_offset`` (or a ``vector_offset`` entry) moves by that dim's stride."""
        unit = dtypes.as_dtype(dtype).itemsize if dtype is not None else self.root.itemsize
        base_bytes = self.offset * self.itemsize
        if base_bytes % unit:
            raise KernelUsageError(f".ap(dtype={dtype}) of '{self.name}': the view starts {base_bytes} bytes into "
                                   f"its allocation, not a whole number of {unit}-byte elements")
        offset = base_bytes // unit + (0 if offset is None else int(offset))
        return access_pattern(self.root, pattern, offset, scalar_offset, vector_offset, indirect_dim, dtype,
                              self.shape)

    def get_pattern(self):
        return [[s, n] for s, n in zip(self.strides, self.shape)]

    def is_contiguous(self) -> bool:
        return bool(self.data.flags.c_contiguous)

    reinterpret_cast = view

    def indirect(self, index, num_elem: int | None = None):
        # The NkiTensor.indirect page places offset i at index[i % G, i // G] with G 16 or 32 by engine,
        # for an index of shape (P, K) with P the tensor's partitions; those disagree for P > G, and the
        # engine (hence G) is only known at the instruction. Refused rather than guessed.
        raise UnsupportedError("NkiTensor.indirect (NeuronCore-v4 tensor indirection)",
                               "its offset layout is not pinned down by the API page; DMA gathers through "
                               ".ap(vector_offset=...) or vector_select are supported")

    def is_indirect(self) -> bool:
        return self._dynamic

    _dynamic = False  # a dynamic select made this view (it takes no second one)
    runtime_offset = False  # .ap(scalar_offset=...) made this view: its start address is read at run time
    gathers = False  # an IndirectTensor: per-element addresses that only a DMA moves through


def _addresses(t: NkiTensor, skip: int) -> np.ndarray:
    """The allocation offsets of ``t``'s elements over every dim but ``skip``."""
    index = np.full((), t.offset, np.int64)
    for k, (step, num) in enumerate(t.get_pattern()):
        if k != skip:
            index = np.add.outer(index, np.arange(num, dtype=np.int64) * step)
    return index


def _dim(t: NkiTensor, dim: int) -> int:
    if not -t.ndim <= dim < t.ndim:
        raise KernelUsageError(f"dim {dim} out of range for tensor '{t.name}' of rank {t.ndim}")
    return dim % t.ndim


def _oob(t: NkiTensor, axis: int, low: int, high: int) -> OutOfBoundsError:
    return OutOfBoundsError(f"Out-of-bound access for tensor `{t.name}` on dimension {axis}: index range "
                            f"[{low}, {high}] exceed dimension size of {t.shape[axis]}")


_ALL = slice(None)  # ``:``, the usual partition index
_FLOAT32 = np.dtype(np.float32)


def _check_slice(t: NkiTensor, axis: int, s: slice, size: int) -> slice:
    step = 1 if s.step is None else int(s.step)
    if step == 0:
        raise KernelUsageError(f"slice step of tensor '{t.name}' cannot be 0")
    if step != 1 and axis == 0 and t.buffer.on_chip:
        raise KernelUsageError(f"the partition dimension of on-chip tensor '{t.name}' must be accessed as one "
                               f"contiguous range (no partition step); got step {step}")
    start = (0 if step > 0 else size - 1) if s.start is None else int(s.start)
    stop = (size if step > 0 else -size - 1) if s.stop is None else int(s.stop)
    start = start + size if start < 0 else start
    stop = stop + size if stop < 0 and s.stop is not None else stop
    if step > 0:
        if start < 0 or start > size or stop > size:
            raise _oob(t, axis, start, stop - 1)
        return slice(start, max(stop, start), step)
    if start >= size or start < 0 or stop < -1:
        raise _oob(t, axis, stop + 1, start)
    return slice(start, None if stop < 0 else stop, step)


def _pattern_groups(pattern) -> list[tuple[str, ...]]:
    """A rearrange pattern's dims, each as the tuple of names it splits into or merges from."""
    if not isinstance(pattern, (tuple, list)):
        raise KernelUsageError(f"rearrange patterns are tuples of dim names and tuples of names, got {pattern!r}")
    groups = []
    for item in pattern:
        group = (item,) if isinstance(item, str) else tuple(item) if isinstance(item, (tuple, list)) else None
        if group is None or not all(isinstance(n, str) for n in group):
            raise KernelUsageError(f"rearrange patterns are tuples of dim names and tuples of names, got {pattern!r}")
        groups.append(group)
    return groups


class IndirectTensor(NkiTensor):
    """A gather/scatter access ``.ap(vector_offset=...)`` (or a ``scalar_offset`` one that leaves the
    tensor): each element's address in the allocation, resolved when the access is made (the kernel
    runs eagerly). ``valid`` marks addresses inside the allocation; DMA skips the others with
    ``oob_mode.skip`` and refuses them otherwise."""

    def __init__(self, root: NkiTensor, base: np.ndarray, index: np.ndarray, valid: np.ndarray, offsets=()):
        super().__init__(base[np.where(valid, index, 0)], root.buffer, root.name, root.site, root)
        self.base, self.index, self.valid = base, index, valid
        self.offsets = offsets  # the tiles the addresses come from, which the DMA reads

    gathers = True

    # Gathered when read, so a DMA sees what the addresses hold then, not when the view was made.
    data = property(lambda self: self.base[np.where(self.valid, self.index, 0)], lambda self, _value: None)

    def is_indirect(self) -> bool:
        return True

    def scatter(self, values: np.ndarray, where: np.ndarray) -> None:
        self.base[self.index[where]] = values[where]

    # Views of the access index the same addresses (the data here is a gathered copy, not storage).
    def _derived(self, fn) -> IndirectTensor:
        return IndirectTensor(self.root, self.base, fn(self.index), fn(self.valid), self.offsets)

    def __getitem__(self, key) -> IndirectTensor:
        return self._derived(lambda a: NkiTensor(a, self.buffer, self.name, self.site)[key].data)

    def _refuse_view(self, *_args, **_kwargs):
        raise KernelUsageError(f"'{self.name}' is an indirect (gather/scatter) view: view(dtype) and .ap() do not "
                               f"apply to it")

    view = reinterpret_cast = ap = _refuse_view


def _indirect(root: NkiTensor, base: np.ndarray, pairs, offset: int, vector_offset, indirect_dim,
              shape) -> IndirectTensor:
    if indirect_dim != 0:
        raise UnsupportedError(f".ap(vector_offset=..., indirect_dim={indirect_dim})", "only indirect_dim=0")
    if root.buffer.on_chip:
        raise UnsupportedError(".ap(vector_offset=...) on an on-chip tensor", "gathers address HBM")
    rows = np.asarray(vector_offset.data if isinstance(vector_offset, memory.Tensor) else vector_offset)
    if rows.dtype.kind not in "iu":
        raise KernelUsageError(f".ap() of '{root.name}': vector_offset must hold integers, got {rows.dtype}")
    rows = rows.reshape(-1).astype(np.int64)
    if rows.size != pairs[0][1]:
        raise KernelUsageError(f".ap() of '{root.name}': vector_offset has {rows.size} indices for a first "
                               f"pattern dim of {pairs[0][1]}")
    row_elems = math.prod(shape[1:]) * base.size // root.size
    index = offset + rows.reshape((-1,) + (1,) * (len(pairs) - 1)) * row_elems
    for k, (step, num) in enumerate(pairs[1:], start=1):
        axis = [1] * len(pairs)
        axis[k] = num
        index = index + np.arange(num, dtype=np.int64).reshape(axis) * step
    index = np.broadcast_to(index, tuple(n for _, n in pairs))
    row_ok = ((rows >= 0) & (rows < shape[0])).reshape((-1,) + (1,) * (len(pairs) - 1))
    valid = np.broadcast_to(row_ok, index.shape) & (index >= 0) & (index < base.size)
    offsets = (vector_offset,) if isinstance(vector_offset, memory.Tensor) else ()
    return IndirectTensor(root, base, index, valid, offsets)


class OutOfBoundsView(NkiTensor):
    """An ``.ap()`` reaching outside its allocation. Making one is not an error (an access pattern is
    only a description; kernels build views they then skip, e.g. past the last tile); any instruction
    that uses it is refused with the bounds it reaches and where the view was made."""

    def __init__(self, root: NkiTensor, pairs, dtype, problem: str):
        super().__init__(None, root.buffer, root.name, root.site, root)
        del self.data  # every use of the data goes to __getattr__, which refuses it
        self._shape, self._dtype = tuple(n for _, n in pairs), np.dtype(dtype)
        self.problem = f"{problem} (view made at {user_site()})"

    def __getattr__(self, name: str):
        if name == "data":
            raise OutOfBoundsError(self.problem)
        return super().__getattr__(name)

    def _refuse(self, _value=None):
        raise OutOfBoundsError(self.problem)

    _array = property(_refuse, lambda self, value: None)  # the storage behind writeable, itemsize...
    shape = property(lambda self: self._shape)
    dtype = property(lambda self: self._dtype)
    ndim = property(lambda self: len(self._shape))
    size = property(lambda self: math.prod(self._shape))


def _dynamic_out_of_bounds(root: NkiTensor, base: np.ndarray, pairs, offset: int) -> IndirectTensor:
    """An HBM access whose runtime start address (``scalar_offset``) leaves the tensor. The DMA checks
    dynamic addresses when it runs: ``oob_mode.error`` refuses the transfer, ``oob_mode.skip`` skips
    it, all of it (the transfer has one dynamic address), so no element is valid."""
    index = np.full((), offset, np.int64)
    for step, num in pairs:
        index = np.add.outer(index, np.arange(num, dtype=np.int64) * step)
    return IndirectTensor(root, base, index, np.zeros(index.shape, bool))


def access_pattern(root: NkiTensor, pattern, offset, scalar_offset, vector_offset, indirect_dim, dtype, shape):
    pairs = [(int(step), int(num)) for step, num in pattern]
    if not pairs or any(num < 0 for _, num in pairs):
        raise KernelUsageError(f".ap() of '{root.name}': pattern must be a non-empty list of [step, num] pairs, "
                               f"got {pattern!r}")
    base = root.data.reshape(-1)
    if dtype is not None:
        base = base.view(dtypes.as_dtype(dtype))
    offset = int(offset)
    if vector_offset is not None:
        return _indirect(root, base, pairs, offset, vector_offset, indirect_dim, shape)
    if scalar_offset is not None:
        if not 0 <= indirect_dim < len(shape):
            raise KernelUsageError(f".ap() of '{root.name}': indirect_dim {indirect_dim} out of range for shape "
                                   f"{list(shape)}")
        offset += _scalar(scalar_offset, root.name) * math.prod(shape[indirect_dim + 1:]) * base.size // root.size
    row = base.size // root.shape[0] if root.buffer.on_chip else None
    if root.buffer.on_chip:
        step0, num0 = pairs[0]
        if step0 != row and num0 > 1:
            raise KernelUsageError(f".ap() of on-chip tensor '{root.name}': the first pair walks partitions and its "
                                   f"step must be the elements per partition ({row}), got {step0}")
        free_lo = offset % row + sum(min(0, s * (n - 1)) for s, n in pairs[1:])
        free_hi = offset % row + sum(max(0, s * (n - 1)) for s, n in pairs[1:])
        if free_lo < 0 or free_hi >= row:
            return OutOfBoundsView(root, pairs, base.dtype, f".ap() of on-chip tensor '{root.name}' reaches free "
                                   f"offsets [{free_lo}, {free_hi}] outside its {row} elements per partition")
    lo = offset + sum(min(0, s * (n - 1)) for s, n in pairs)
    hi = offset + sum(max(0, s * (n - 1)) for s, n in pairs)
    if any(n == 0 for _, n in pairs):
        lo = hi = offset
    if (lo < 0 or hi >= base.size) and scalar_offset is not None and not root.buffer.on_chip:
        return _dynamic_out_of_bounds(root, base, pairs, offset)
    if lo < 0 or hi >= base.size:
        return OutOfBoundsView(root, pairs, base.dtype, f".ap() of '{root.name}' reaches elements [{lo}, {hi}] "
                               f"outside its {base.size} elements (shape {list(root.shape)})")
    shape = tuple(n for _, n in pairs)
    strides = tuple(s * base.itemsize for s, _ in pairs)
    data = np.lib.stride_tricks.as_strided(base[offset:], shape=shape, strides=strides)
    unset = None
    # The unwritten-PSUM flags map element for element while the view keeps the allocation's dtype
    # (passing that dtype explicitly, as kernels' view helpers do, changes nothing).
    if root.unset is not None and base.dtype == root.data.dtype:
        unset = np.lib.stride_tricks.as_strided(root.unset.reshape(-1)[offset:], shape=shape,
                                                strides=tuple(s * root.unset.itemsize for s, _ in pairs))
    view = NkiTensor(data, root.buffer, root.name, root.site, root, unset)
    view.runtime_offset = scalar_offset is not None
    return view


def _scalar(value, name: str, api: str = ".ap(scalar_offset=...)") -> int:
    """The integer held by a register or a 1x1 tile, read now (the kernel runs eagerly)."""
    if hasattr(value, "value") and not isinstance(value, memory.Tensor):
        return int(value.value)
    if isinstance(value, memory.Tensor):
        if value.data.size != 1:
            raise KernelUsageError(f"{api} of '{name}' needs a register or a 1x1 tile, got shape "
                                   f"{list(value.shape)}")
        return int(value.data.reshape(-1)[0])
    return int(value)


def allocate(shape, dtype, buffer: memory.Buffer, name: str, api: str, fill="poison", address=None) -> NkiTensor:
    """A new allocation. Uninitialised memory holds the documented sentinels: NaN (floats), 4 (integers).
    ``address``: ``(partition_offset, free_offset)`` of an explicitly placed on-chip tensor (see ``_placed``)."""
    run = current_run(api)
    site = user_site()
    shape = tuple(map(int, shape)) if isinstance(shape, (tuple, list)) else (int(shape),)
    if shape and min(shape) < 0:
        raise KernelUsageError(f"{api}: negative dimension in shape {list(shape)}")
    dtype = _as_dtype(dtype)
    sentinel = fill == "poison"
    if sentinel:
        fill = 0 if run.config.uninitialized == "zeros" else (np.nan if dt.is_float(dtype) else 4)
    name = name or _default_name(api, site)
    exchange = getattr(run, "exchange", None)
    if buffer is memory.shared_hbm and exchange is not None and exchange.programs > 1:
        # The programs of an LNC2 launch see one shared_hbm tensor per allocation site and occurrence.
        with exchange.lock:
            return run.shared_output(site, lambda: NkiTensor(np.full(shape, fill, dtype) if fill is not None else
                                                             np.empty(shape, dtype), buffer, name, site))
    if buffer.on_chip:
        tile_bytes = _check_on_chip(run, shape, dtype, buffer, name, api, site)
    tensor = NkiTensor(np.empty(shape, dtype), buffer, name, site)
    if fill is not None:  # filled on first use (NkiTensor.data)
        tensor._unfilled = ((tensor.data, _sentinel(fill, dtype, buffer.on_chip), sentinel) if sentinel else
                            (tensor.data, np.full((), fill, dtype), False))
        del tensor.data
    if buffer.on_chip:
        tensor.alloc = (liveness.Allocation(run, buffer.space, tile_bytes, name, site) if address is None else
                        _placed(run, buffer, shape, tile_bytes, name, site, api, address))
        if buffer is memory.psum:
            tensor.unset = np.ones(shape, bool)
    return tensor


_DTYPES: dict = {}  # dtype argument -> np.dtype, checked once


def _as_dtype(dtype) -> np.dtype:
    try:
        result = _DTYPES.get(dtype)
    except TypeError:  # an unhashable argument: checked every time
        return dtypes.as_dtype(dtype)
    if result is None:
        result = _DTYPES[dtype] = dtypes.as_dtype(dtype)
    return result


_NAMES: dict = {}  # (api, site) -> the name of an unnamed allocation


def _default_name(api: str, site: str) -> str:
    name = _NAMES.get((api, site))
    if name is None:
        name = _NAMES[(api, site)] = f"{api.split('.')[-1]}@{site.rsplit('/', 1)[-1]}"
    return name


def _placed(run, buffer, shape, tile_bytes: int, name: str, site: str, api: str, address):
    """The liveness record of a tensor at ``address`` = (partition_offset, free_offset): the first
    partition, and the byte offset in each partition (the SDK's examples count bytes: ``bank * 2048``
    in PSUM, ``offset + i * n * 2`` for bfloat16 tiles in SBUF). The range must lie in the target's
    partition; two tensors on overlapping addresses may not hold data at once (``liveness``)."""
    p0, b0 = (int(a) for a in address)
    p1, b1 = p0 + shape[0], b0 + tile_bytes
    if p0 < 0 or p1 > memory.PMAX:
        raise CapacityError(f"{api}: tensor '{name}' of shape {list(shape)} at address {tuple(address)} needs "
                            f"partitions [{p0}, {p1}); there are {memory.PMAX} (0-{memory.PMAX - 1})", site)
    capacity = run.budget(buffer.space)
    if b0 < 0 or b1 > capacity:
        raise CapacityError(f"{api}: tensor '{name}' of shape {list(shape)} at address {tuple(address)} needs "
                            f"bytes [{b0}, {b1}) of each partition; {buffer.space.upper()} partitions have "
                            f"{capacity} bytes on {run.config.target}", site)
    return liveness.DirectAllocation(run, buffer.space, tile_bytes, name, site, (p0, p1, b0, b1))


_SENTINELS: dict = {}  # (value, dtype, on chip) -> read-only 0-d array


def _sentinel(value, dtype: np.dtype, on_chip: bool) -> np.ndarray:
    """The uninitialised-memory sentinel ``value`` (NaN, 4 or 0) as a 0-d array of ``dtype``, made once;
    on chip, NaN carries the tag that traces reads of never-written memory (``poison.on_chip_fill``)."""
    key = (value, dtype, on_chip)
    array = _SENTINELS.get(key)
    if array is None:
        array = np.full((), poison.on_chip_fill(value, dtype) if on_chip else value, dtype)
        array.flags.writeable = False
        _SENTINELS[key] = array
    return array


def _check_on_chip(run, shape, dtype, buffer, name, api, site) -> int:
    """Check an on-chip allocation's shape; returns its bytes per partition."""
    if len(shape) < 2:
        raise KernelUsageError(f"{api}: on-chip tensor '{name}' of shape {list(shape)} needs a partition and a free "
                               f"dimension, e.g. (128, 1)", site)
    if shape[0] > memory.PMAX:
        violation(TileLimitError(f"{api}: tensor '{name}' partition dimension {shape[0]} exceeds maximum "
                                 f"{memory.PMAX}", site))
    free_bytes = math.prod(shape[1:]) * dtype.itemsize
    if buffer is memory.psum:
        if free_bytes > 8 * memory.PSUM_BANK_BYTES:
            violation(TileLimitError(f"{api}: PSUM tensor '{name}' of shape {list(shape)} {dtype} needs "
                                     f"{free_bytes} bytes per partition, above the 16 KiB of PSUM", site))
    elif free_bytes > run.config.sbuf_budget:
        # Spilling cannot help: no instruction could access it (the compiler's GCA035, "couldn't be
        # allocated in SB"). Checked before its memory is taken.
        violation(CapacityError(f"{api}: SBUF capacity exceeded by one tensor: '{name}' (allocated at {site}) of "
                                f"shape {list(shape)} {dtype} needs {free_bytes} bytes per partition, above the "
                                f"{run.config.target} SBUF budget of {run.config.sbuf_budget}", site))
    return free_bytes
