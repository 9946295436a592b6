"""Views over an allocation's storage, and the access patterns that address it (the current API's tensors).

Every view (a subscript, a reshape, a permutation, a broadcast, an access pattern...) is a NumPy view
of the allocation's array, so writes through any view are seen by all. The allocation itself is
``root``: it keeps on-chip capacity accounted while any view lives, and access patterns address it.
On-chip tensors are always at least 2-D (partition dimension first); HBM tensors index like NumPy.
A front end spells these as methods of its subclass of :class:`View` and names its classes of
plain, gather and out-of-bounds views (``view_type``, ``gather_type``, ``out_of_bounds_type``).
"""

from __future__ import annotations

import math
import operator

import numpy as np

from . import dtypes as dt
from . import memory
from .errors import KernelUsageError, OutOfBoundsError, UnsupportedError, user_site
from .run import filled
from .tensors import Tensor, index_rows, out_of_bounds

_ALL = slice(None)  # ``:``, the usual partition index
_FLOAT32 = np.dtype(np.float32)


class View(Tensor):
    """A tensor in HBM, SBUF or PSUM: shape, dtype, buffer, and a view of its allocation (``root``)."""

    # The allocation rules of the current API's page (``memory.new_tensor``): PSUM tensors up to its 16 KiB,
    # only SBUF's budget per tensor, the documented sentinels NaN (floats) and 4 (integers), filled lazily.
    rules = memory.Rules(8 * memory.PSUM_BANK_BYTES, ("sbuf",), {
        "rank": "{api}: on-chip tensor '{name}' of shape {shape} needs a partition and a free dimension, e.g. "
                "(128, 1)",
        "partitions": "{api}: tensor '{name}' partition dimension {partitions} exceeds maximum {pmax}",
        "psum": "{api}: PSUM tensor '{name}' of shape {shape} {dtype} needs {nbytes} bytes per partition, above the "
                "16 KiB of PSUM",
        "capacity": "{api}: SBUF capacity exceeded by one tensor: '{name}' (allocated at {site}) of shape {shape} "
                    "{dtype} needs {nbytes} bytes per partition, above the {target} SBUF budget of {budget}",
    }, sentinels=(np.nan, 4), lazy=True)
    supported = dt.CURRENT_SUPPORTED  # the dtypes of allocations and reinterpretations (a front end's may add)
    # The front end's classes of a view, a gather view and an out-of-bounds view (set by its subclass).
    view_type = gather_type = out_of_bounds_type = None
    dynamic = False  # a dynamic select made this view (it takes no second one)
    runtime_offset = False  # an access pattern with a scalar_offset: its start address is read at run time
    gathers = False  # a Gather: per-element addresses that only a DMA moves through

    def __init__(self, data: np.ndarray, buffer: memory.Buffer, name: str, site: str, root: View | None = None,
                 unset: np.ndarray | None = None):
        # Tensor's fields, set here directly: a view is made for nearly every operand.
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

    @property
    def root(self) -> View:
        """The allocation this tensor views. An allocation holds no reference to itself: a cycle would
        keep its array alive until the next garbage collection instead of freeing it with its last view."""
        return self if self._root is None else self._root

    def defer_fill(self, fill: np.ndarray, sentinel: bool) -> None:
        """Fill a new allocation with ``fill`` (a 0-d array) on its first use; ``sentinel``: the poison."""
        self._unfilled = (self.data, fill, sentinel)
        del self.data

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
        filled(self)
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
        its operands first, and then writes all of it), or None for other dtypes and for an access pattern
        whose elements share memory (a zero step): its values, which the instruction may use after the
        write (an activation's row sums), would be the last written."""
        data = self._array
        if data.dtype is not _FLOAT32:
            return None
        return data if data.flags.c_contiguous or distinct_elements(data) else None

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

    def pattern(self) -> list[list[int]]:
        """``[[step, num], ...]``: this view's strides (in elements) and sizes, outer to inner."""
        return [[s, n] for s, n in zip(self.strides, self.shape)]

    def _view(self, data: np.ndarray, unset=None) -> View:
        return self.view_type(data, self.buffer, self.name, self.site, self.root, unset)

    def _derived(self, fn) -> View:
        """A view made by applying the same NumPy view operation to the data and the unset flags."""
        return self._view(fn(self.data), None if self.unset is None else fn(self.unset))


def distinct_elements(array: np.ndarray) -> bool:
    """Whether no two elements of ``array`` share memory, by its strides (each dimension, from the smallest
    step, stepping past all the dimensions before it)."""
    extent = array.itemsize
    for step, size in sorted((abs(s), n) for s, n in zip(array.strides, array.shape) if n > 1):
        if step < extent:
            return False
        extent = step * (size - 1) + extent
    return True


# ----------------------------------------------------------------------------------- subscripts

def subscript(t: View, key) -> View:
    """``t[key]`` with ints and slices (bounds-checked, negative indices counting from the end). On-chip
    tensors stay at least 2-D: an int on the partition dim keeps it (size 1); ints on free dims drop them
    unless fewer than 2 dims would remain, then the last one stays with size 1."""
    data = t.data
    shape = data.shape
    key = key if type(key) is tuple else (key,)
    for at, k in enumerate(key):
        if k is Ellipsis:
            key = key[:at] + (slice(None),) * (len(shape) - len(key) + 1) + key[at + 1:]
            break
    if len(key) > len(shape):
        raise KernelUsageError(f"too many indices for tensor '{t.name}' of rank {len(shape)}: {len(key)}")
    np_key = []
    ints = 0
    for axis, size in enumerate(shape):
        k = key[axis] if axis < len(key) else _ALL
        if type(k) is slice:
            np_key.append(k if k == _ALL else _check_slice(t, axis, k, size))
        elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            k = int(k)
            if not -size <= k < size:
                raise out_of_bounds(t, axis, k, k)
            np_key.append(k % size)
            ints += 1
        else:
            raise KernelUsageError(f"unsupported index {k!r} of type {type(k).__name__} for tensor "
                                   f"'{t.name}': use ints, slices or nl.ds; irregular access patterns "
                                   f"go through .ap()")
    if ints and t.buffer.on_chip:
        if type(np_key[0]) is int:
            np_key[0] = slice(np_key[0], np_key[0] + 1)
            ints -= 1
        if len(np_key) - ints < 2:
            last = max(i for i, k in enumerate(np_key) if type(k) is int)
            np_key[last] = slice(np_key[last], np_key[last] + 1)
    np_key = tuple(np_key)
    unset = t.unset
    return t.view_type(data[np_key], t.buffer, t.name, t.site, t if t._root is None else t._root,
                       None if unset is None else unset[np_key])


def _check_slice(t: View, axis: int, s: slice, size: int) -> slice:
    start, stop = s.start, s.stop
    if s.step is None and type(start) is int and type(stop) is int and 0 <= start <= stop <= size:
        return s  # the common case, already in bounds and in the form NumPy takes
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
            raise out_of_bounds(t, axis, start, stop - 1)
        return slice(start, max(stop, start), step)
    if start >= size or start < 0 or stop < -1:
        raise out_of_bounds(t, axis, stop + 1, start)
    return slice(start, None if stop < 0 else stop, step)


def axis(t: View, dim: int) -> int:
    """Dim ``dim`` of ``t`` (negative: from the end), checked."""
    if not -t.ndim <= dim < t.ndim:
        raise KernelUsageError(f"dim {dim} out of range for tensor '{t.name}' of rank {t.ndim}")
    return dim % t.ndim


# ----------------------------------------------------------------------------------- view operations

def reshape(t: View, shape) -> View:
    shape = tuple(int(s) for s in shape)
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape = tuple(t.size // known if s == -1 else s for s in shape)
    if math.prod(shape) != t.size:
        raise KernelUsageError(f"cannot reshape '{t.name}' of shape {list(t.shape)} to {list(shape)}: "
                               f"element counts differ ({t.size} vs {math.prod(shape)})")
    if t.buffer.on_chip and shape[0] != t.shape[0]:
        raise KernelUsageError(f"reshape of on-chip tensor '{t.name}' from {list(t.shape)} to "
                               f"{list(shape)} changes the partition dimension; only free dims can be reshaped")

    def fn(a):
        view = a.view()
        try:
            view.shape = shape
        except AttributeError:
            raise KernelUsageError(f"cannot reshape the non-contiguous view '{t.name}' of shape "
                                   f"{list(t.shape)} to {list(shape)} without a copy") from None
        return view
    return t._derived(fn)


def permute(t: View, dims) -> View:
    dims = tuple(axis(t, d) for d in dims)
    if sorted(dims) != list(range(t.ndim)):
        raise KernelUsageError(f"permute of '{t.name}' (rank {t.ndim}) needs a permutation of all dims, "
                               f"got {list(dims)}")
    if t.buffer.on_chip and dims[0] != 0:
        raise KernelUsageError(f"permute of on-chip tensor '{t.name}' cannot move the partition dimension "
                               f"(dims[0] must be 0, got {list(dims)}); use nc_transpose")
    return t._derived(lambda a: a.transpose(dims))


def broadcast(t: View, dim: int, size: int) -> View:
    dim = axis(t, dim)
    if t.shape[dim] != 1:
        raise KernelUsageError(f"broadcast of '{t.name}': dim {dim} has size {t.shape[dim]}, only size-1 "
                               f"dims can be broadcast")
    if t.buffer.on_chip and dim == 0:
        raise KernelUsageError(f"broadcast of on-chip tensor '{t.name}' along the partition dimension is not "
                               f"possible with a view; copy the data to each partition")
    shape = t.shape[:dim] + (int(size),) + t.shape[dim + 1:]
    return t._derived(lambda a: np.broadcast_to(a, shape))


def expand_dim(t: View, dim: int) -> View:
    dim = dim + t.ndim + 1 if dim < 0 else dim
    if t.buffer.on_chip and dim == 0:
        raise KernelUsageError(f"expand_dim(0) of on-chip tensor '{t.name}': the partition dim stays first")
    return t._derived(lambda a: np.expand_dims(a, dim))


def squeeze_dim(t: View, dim: int) -> View:
    dim = axis(t, dim)
    if t.shape[dim] != 1:
        raise KernelUsageError(f"squeeze_dim({dim}) of '{t.name}': dim has size {t.shape[dim]}, not 1")
    if t.buffer.on_chip and (dim == 0 or t.ndim <= 2):
        raise KernelUsageError(f"squeeze_dim({dim}) of on-chip tensor '{t.name}' of shape "
                               f"{list(t.shape)}: on-chip tensors keep the partition dim and at least 2 dims")
    return t._derived(lambda a: np.squeeze(a, dim))


def reinterpret(t: View, dtype) -> View:
    """The same bytes as another dtype; the last dim scales by the itemsize ratio."""
    dtype = dt.as_dtype(dtype, t.supported)
    if t.data.strides[-1] != t.itemsize and t.shape[-1] != 1:
        raise KernelUsageError(f"view({dtype}) of '{t.name}' needs a contiguous last dim")
    if (t.shape[-1] * t.itemsize) % dtype.itemsize:
        raise KernelUsageError(f"view({dtype}) of '{t.name}': last dim of {t.shape[-1]} x "
                               f"{t.itemsize} bytes is not a multiple of {dtype.itemsize} bytes")
    return t._view(t.data.view(dtype))


def rearrange(t: View, src_pattern, dst_pattern, fixed_sizes=None) -> View:
    """einops-style rearrangement as a view: ``src_pattern`` names each dim (a string) or the dims a dim
    splits into (a tuple of strings), ``dst_pattern`` the same names in the new order, grouped where dims
    merge; ``fixed_sizes`` gives split sizes, at most one name per group being inferred."""
    src_groups, dst_groups = _pattern_groups(src_pattern), _pattern_groups(dst_pattern)
    shown = f"rearrange({src_pattern!r}, {dst_pattern!r})"
    names = [n for g in src_groups for n in g]
    if sorted(names) != sorted(n for g in dst_groups for n in g) or len(set(names)) != len(names):
        raise KernelUsageError(f"{shown}: both patterns must name the same dims, each once")
    if len(src_groups) != t.ndim:
        raise KernelUsageError(f"{shown}: the source pattern has {len(src_groups)} dims, tensor "
                               f"'{t.name}' has {t.ndim} {t.shape}")
    fixed = dict(fixed_sizes or {})
    unknown = sorted(set(fixed) - set(names))
    if unknown:
        raise KernelUsageError(f"{shown}: fixed_sizes names {unknown}, which the patterns do not")
    known = {k: int(v) for k, v in fixed.items()}
    for group, size in zip(src_groups, t.shape):
        missing = [n for n in group if n not in known]
        rest = math.prod(known[n] for n in group if n in known)
        if len(missing) > 1:
            raise KernelUsageError(f"{shown}: give the sizes of all but one of {missing} in fixed_sizes")
        if missing and rest and size % rest == 0:
            known[missing[0]] = size // rest
        if any(n not in known for n in group) or math.prod(known[n] for n in group) != size:
            sizes = {n: known.get(n, "?") for n in group}
            raise KernelUsageError(f"{shown}: dims {sizes} do not split size {size}")
    split = reshape(t, tuple(known[n] for n in names))
    order = [names.index(n) for g in dst_groups for n in g]
    permuted = permute(split, order) if order != sorted(order) else split
    return reshape(permuted, tuple(math.prod(known[n] for n in g) for g in dst_groups))


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


# ----------------------------------------------------------------------------------- dynamic selects

def select(t: View, dim: int, index) -> View:
    """``index`` an int: the static ``t[:, index]`` (``dim=1``). A 1x1 tile or a register: a dynamic
    select, its index read now (the kernel runs eagerly). In HBM an index out of range is the DMA's
    to handle (``oob_mode``); on chip it is refused, as is a dynamic select of the partition dim."""
    dim = axis(t, dim)
    if isinstance(index, (int, np.integer)):
        return subscript(t, (slice(None),) * dim + (int(index),))
    _one_dynamic_select(t, "select")
    row = scalar(index, t.name, "select")
    if t.buffer.on_chip:
        if dim == 0:
            raise KernelUsageError(f"dynamic select of on-chip tensor '{t.name}' along dim 0: the partition "
                                   f"dim cannot be selected at runtime")
        if not 0 <= row < t.shape[dim]:
            raise out_of_bounds(t, dim, row, row)
        view = subscript(t, (slice(None),) * dim + (row,))
        view.dynamic = True
        return view
    return _gather(t.root, t.root.data.reshape(-1), np.int64(row), t.shape[dim], t.strides[dim], _addresses(t, dim),
                   (index,) if isinstance(index, Tensor) else ())


def vector_select(t: View, dim: int, vector_offset) -> View:
    """Partition ``p`` of the result reads row ``vector_offset[p]`` of this HBM tensor (a gather or,
    written by a DMA, a scatter); rows out of range are the DMA's to handle (``oob_mode``)."""
    if dim != 0:
        raise KernelUsageError(f"vector_select of '{t.name}': dim must be 0, got {dim}")
    if t.buffer.on_chip:
        raise KernelUsageError(f"vector_select of on-chip tensor '{t.name}': only HBM tensors can be "
                               f"selected per partition")
    _one_dynamic_select(t, "vector_select")
    if not isinstance(vector_offset, Tensor) or vector_offset.buffer is not memory.sbuf or \
            vector_offset.ndim != 2 or vector_offset.shape[1] != 1:
        raise KernelUsageError(f"vector_select of '{t.name}': vector_offset must be an SBUF tensor of shape "
                               f"(partitions, 1), got {vector_offset!r}")
    rows = index_rows(vector_offset.data, f"vector_select of '{t.name}': vector_offset must hold integers")
    rest = _addresses(t, 0)
    rows = rows.reshape((-1,) + (1,) * rest.ndim)  # (P, 1, ...)
    return _gather(t.root, t.root.data.reshape(-1), rows, t.shape[0], t.strides[0], rest, (vector_offset,))


def _one_dynamic_select(t: View, api: str) -> None:
    if t.gathers or t.dynamic:
        raise KernelUsageError(f"{api} of '{t.name}': it is already a dynamic (indirect) view, and a tensor "
                               f"takes one dynamic select only (check is_indirect())")


def _addresses(t: View, skip: int) -> np.ndarray:
    """The allocation offsets of ``t``'s elements over every dim but ``skip``."""
    index = np.full((), t.offset, np.int64)
    for k, (step, num) in enumerate(t.pattern()):
        if k != skip:
            index = np.add.outer(index, np.arange(num, dtype=np.int64) * step)
    return index


def scalar(value, name: str, api: str = ".ap(scalar_offset=...)") -> int:
    """The integer held by a register or a 1x1 tile, read now (the kernel runs eagerly)."""
    if hasattr(value, "value") and not isinstance(value, Tensor):
        return int(value.value)
    if isinstance(value, Tensor):
        if value.data.size != 1:
            raise KernelUsageError(f"{api} of '{name}' needs a register or a 1x1 tile, got shape "
                                   f"{list(value.shape)}")
        return int(value.data.reshape(-1)[0])
    return int(value)


# ----------------------------------------------------------------------------------- gathers

class Gather(View):
    """A gather/scatter access (``.ap(vector_offset=...)``, a dynamic select of an HBM tensor, or a
    ``scalar_offset`` one that leaves the tensor): each element's address in the allocation, resolved
    when the access is made (the kernel runs eagerly). ``valid`` marks addresses inside the allocation;
    DMA skips the others with ``oob_mode.skip`` and refuses them otherwise."""

    def __init__(self, root: View, base: np.ndarray, index: np.ndarray, valid: np.ndarray, offsets=()):
        # Its storage stands for shape and dtype only: ``data`` gathers when read.
        super().__init__(np.empty(index.shape, base.dtype), root.buffer, root.name, root.site, root)
        self.base, self.index, self.valid = base, index, valid
        self.all_valid = bool(valid.all())
        self.offsets = offsets  # the tiles the addresses come from, which the DMA reads

    gathers = True

    @property
    def data(self) -> np.ndarray:
        """Gathered when read, so a DMA sees what the addresses hold then, not when the view was made."""
        return self.base[self.index if self.all_valid else np.where(self.valid, self.index, 0)]

    @data.setter
    def data(self, _value) -> None:
        pass

    def scatter(self, values: np.ndarray, where: np.ndarray) -> None:
        if where.all():
            self.base[self.index] = values
        else:
            self.base[self.index[where]] = values[where]

    # Views of the access index the same addresses (the data here is a gathered copy, not storage).
    def _derived(self, fn) -> Gather:
        return self.gather_type(self.root, self.base, fn(self.index), fn(self.valid), self.offsets)

    def subscript(self, key) -> Gather:
        return self._derived(lambda a: subscript(self.view_type(a, self.buffer, self.name, self.site), key).data)


def _gather(root: View, base: np.ndarray, rows: np.ndarray, nrows: int, row_step: int, rest: np.ndarray,
            offsets=()) -> Gather:
    """The gather reading, of ``nrows`` rows ``row_step`` elements of ``base`` apart, row ``rows`` (shaped to
    broadcast against ``rest``) at offsets ``rest`` in it; valid where the row exists and the address lies in
    ``base``. A dynamic select, a ``vector_select`` and ``.ap(vector_offset=...)`` all make one."""
    index = rows * row_step + rest
    valid = np.broadcast_to((rows >= 0) & (rows < nrows), index.shape) & (index >= 0) & (index < base.size)
    return root.gather_type(root, base, index, valid, offsets)


class OutOfRange(View):
    """An access pattern reaching outside its allocation. Making one is not an error (an access pattern is
    only a description; kernels build views they then skip, e.g. past the last tile); any instruction
    that uses it is refused with the bounds it reaches and where the view was made."""

    def __init__(self, root: View, pairs, dtype, problem: str):
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


# ----------------------------------------------------------------------------------- access patterns

def access_pattern(t: View, pattern, offset, scalar_offset, vector_offset, indirect_dim: int, dtype) -> View:
    """An access pattern over ``t``'s allocation: ``[[step, num], ...]`` outer to inner, the steps
    addressing the allocation (not this view's strides); element ``base + offset + sum(step_k * i_k)``,
    ``base`` being ``t``'s storage offset (``offset`` None keeps it). On chip the first pair walks
    partitions and its step is the allocation's elements per partition. ``indirect_dim`` counts dims of
    ``t``: a ``scalar_offset`` (or a ``vector_offset`` entry) moves by that dim's stride. ``dtype``
    reads the allocation's bytes as another type."""
    root, shape = t.root, t.shape
    unit = dt.as_dtype(dtype, t.supported).itemsize if dtype is not None else root.itemsize
    base_bytes = 0 if t is root else t.offset * t.itemsize
    if base_bytes % unit:
        raise KernelUsageError(f".ap(dtype={dtype}) of '{t.name}': the view starts {base_bytes} bytes into "
                               f"its allocation, not a whole number of {unit}-byte elements")
    offset = base_bytes // unit + (0 if offset is None else int(offset))
    pairs = [(int(step), int(num)) for step, num in pattern]
    if not pairs or any(num < 0 for _, num in pairs):
        raise KernelUsageError(f".ap() of '{root.name}': pattern must be a non-empty list of [step, num] pairs, "
                               f"got {pattern!r}")
    base = root.data.reshape(-1)
    if dtype is not None:
        base = base.view(dt.as_dtype(dtype, t.supported))
    if vector_offset is not None:
        return _indirect(root, base, pairs, offset, vector_offset, indirect_dim, shape)
    if scalar_offset is not None:
        if not 0 <= indirect_dim < len(shape):
            raise KernelUsageError(f".ap() of '{root.name}': indirect_dim {indirect_dim} out of range for shape "
                                   f"{list(shape)}")
        offset += scalar(scalar_offset, root.name) * math.prod(shape[indirect_dim + 1:]) * base.size // root.size
    low = high = 0  # the pattern's reach below and above its first element, in elements
    for step, num in pairs[1:]:
        if step < 0:
            low += step * (num - 1)
        else:
            high += step * (num - 1)
    step0, num0 = pairs[0]
    if root.buffer.on_chip:
        row = base.size // root.shape[0]
        if step0 != row and num0 > 1:
            raise KernelUsageError(f".ap() of on-chip tensor '{root.name}': the first pair walks partitions and its "
                                   f"step must be the elements per partition ({row}), got {step0}")
        free_lo, free_hi = offset % row + low, offset % row + high
        if free_lo < 0 or free_hi >= row:
            return root.out_of_bounds_type(root, pairs, base.dtype, f".ap() of on-chip tensor '{root.name}' reaches "
                                           f"free offsets [{free_lo}, {free_hi}] outside its {row} elements per "
                                           f"partition")
    lo = offset + low + min(0, step0 * (num0 - 1))
    hi = offset + high + max(0, step0 * (num0 - 1))
    if any(n == 0 for _, n in pairs):
        lo = hi = offset
    if lo < 0 or hi >= base.size:
        if scalar_offset is not None and not root.buffer.on_chip:
            # A runtime start address leaving the tensor: the DMA checks dynamic addresses when it runs
            # (oob_mode.error refuses the transfer, oob_mode.skip skips all of it), so no element is valid.
            index = offset + _pattern_offsets(pairs)
            return root.gather_type(root, base, index, np.zeros(index.shape, bool))
        return root.out_of_bounds_type(root, pairs, base.dtype, f".ap() of '{root.name}' reaches elements "
                                       f"[{lo}, {hi}] outside its {base.size} elements (shape {list(root.shape)})")
    shape = tuple(n for _, n in pairs)
    # An ndarray on the allocation's buffer (a fifth of as_strided's cost; the pattern lies within it), whose
    # base is the allocation: where the cost model, the race checker and replay find a view's storage.
    data = np.ndarray(shape, base.dtype, buffer=base, offset=offset * base.itemsize,
                      strides=tuple(s * base.itemsize for s, _ in pairs))
    unset = None
    # The unwritten-PSUM flags map element for element while the view keeps the allocation's dtype
    # (passing that dtype explicitly, as kernels' view helpers do, changes nothing).
    if root.unset is not None and base.dtype == root.data.dtype:
        flags = root.unset.reshape(-1)
        unset = np.ndarray(shape, flags.dtype, buffer=flags, offset=offset * flags.itemsize,
                           strides=tuple(s * flags.itemsize for s, _ in pairs))
    view = root.view_type(data, root.buffer, root.name, root.site, root, unset)
    view.runtime_offset = scalar_offset is not None
    return view


def _pattern_offsets(pairs) -> np.ndarray:
    """The element offsets an access pattern's ``[(step, num), ...]`` walks, one axis per pair."""
    index = np.zeros((), np.int64)
    for step, num in pairs:
        index = np.add.outer(index, np.arange(num, dtype=np.int64) * step)
    return index


def _indirect(root: View, base: np.ndarray, pairs, offset: int, vector_offset, indirect_dim, shape) -> Gather:
    if indirect_dim != 0:
        raise UnsupportedError(f".ap(vector_offset=..., indirect_dim={indirect_dim})", "only indirect_dim=0")
    if root.buffer.on_chip:
        raise UnsupportedError(".ap(vector_offset=...) on an on-chip tensor", "gathers address HBM")
    rows = np.asarray(vector_offset.data if isinstance(vector_offset, Tensor) else vector_offset)
    rows = index_rows(rows, f".ap() of '{root.name}': vector_offset must hold integers").reshape(-1)
    if rows.size != pairs[0][1]:
        raise KernelUsageError(f".ap() of '{root.name}': vector_offset has {rows.size} indices for a first "
                               f"pattern dim of {pairs[0][1]}")
    row_elems = math.prod(shape[1:]) * base.size // root.size
    rows = rows.reshape((-1,) + (1,) * (len(pairs) - 1))
    return _gather(root, base, rows, shape[0], row_elems, offset + _pattern_offsets(pairs[1:]),
                   (vector_offset,) if isinstance(vector_offset, Tensor) else ())
