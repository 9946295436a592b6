"""``nki.tensor``: ``NkiTensor``, a view over an allocation's storage (``core.views``), spelled as NKI 0.6 does.

Every view (indexing, ``reshape``, ``permute``, ``broadcast``, ``.ap()``...) is a NumPy view of
the allocation's array, so writes through any view are seen by all. The allocation itself is
``root``: it keeps on-chip capacity accounted while any view lives, and ``.ap()`` addresses it.
On-chip tensors are always at least 2-D (partition dimension first); HBM tensors index like NumPy.
"""

from __future__ import annotations

import math

import numpy as np

from ...core import memory, views
from ...core.errors import KernelUsageError, UnsupportedError
from . import dtypes

__all__ = ["NkiTensor", "allocate"]


def _no_arithmetic(self, *_):
    raise KernelUsageError("NkiTensor does not overload arithmetic or comparison operators; use nisa "
                           "instructions (nisa.tensor_tensor, nisa.tensor_scalar) or nl.add / nl.multiply ...")


def _sizes(args) -> tuple:
    """``f(a, b)`` or ``f((a, b))``: the sizes or dims given either way."""
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else args


class NkiTensor(views.View):
    """A tensor in HBM, SBUF or PSUM: shape, dtype, buffer, and a view of its allocation."""

    supported = dtypes.SUPPORTED

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

    # Ints and slices, bounds-checked; on chip at least 2-D (``views.subscript``).
    __getitem__ = views.subscript

    def reshape(self, *shape):
        return views.reshape(self, _sizes(shape))

    def reshape_dim(self, dim: int, shape):
        dim = views.axis(self, dim)
        return self.reshape(self.shape[:dim] + tuple(shape) + self.shape[dim + 1:])

    def flatten_dims(self, start_dim: int = 0, end_dim: int = -1):
        start, end = views.axis(self, start_dim), views.axis(self, end_dim)
        return self.reshape(self.shape[:start] + (math.prod(self.shape[start:end + 1]),) + self.shape[end + 1:])

    def permute(self, *dims):
        return views.permute(self, _sizes(dims))

    broadcast = views.broadcast  # (dim, size)
    expand_dim = views.expand_dim  # (dim)
    squeeze_dim = views.squeeze_dim  # (dim)
    select = views.select  # (dim, index): an int, or a register / 1x1 tile read now
    vector_select = views.vector_select  # (dim, vector_offset): an HBM gather, row vector_offset[p] per partition
    view = reinterpret_cast = views.reinterpret  # (dtype)
    get_pattern = views.View.pattern

    def slice(self, dim: int, start: int, end: int, step: int = 1):
        dim = views.axis(self, dim)
        return self[(slice(None),) * dim + (slice(start, end, step),)]

    def rearrange(self, src_pattern, dst_pattern, fixed_sizes=None):
        """einops-style rearrangement as a view (``views.rearrange``): ``t.rearrange(('b', ('h', 'w')),
        ('b', 'w', 'h'), {'h': 4})`` of a ``(128, 24)`` tile is ``(128, 6, 4)``."""
        return views.rearrange(self, src_pattern, dst_pattern, fixed_sizes)

    def ap(self, pattern, offset: int | None = None, scalar_offset=None, vector_offset=None, indirect_dim: int = 0,
           dtype=None):
        """An access pattern over the allocation (``views.access_pattern``): ``[[step, num], ...]`` outer to
        inner, the steps addressing the allocation (not this view's strides); element ``base + offset +
        sum(step_k * i_k)``, ``base`` being this view's storage offset (the ``NkiTensor.ap`` page: ``offset``
        "added to the view's base storage offset"; ``None`` keeps it)."""
        return views.access_pattern(self, pattern, offset, scalar_offset, vector_offset, indirect_dim, dtype)

    def is_contiguous(self) -> bool:
        return bool(self.data.flags.c_contiguous)

    def indirect(self, index, num_elem: int | None = None):
        # The NkiTensor.indirect page places offset i at index[i % G, i // G] with G 16 or 32 by engine,
        # for an index of shape (P, K) with P the tensor's partitions; those disagree for P > G, and the
        # engine (hence G) is only known at the instruction. Refused rather than guessed.
        raise UnsupportedError("NkiTensor.indirect (NeuronCore-v4 tensor indirection)",
                               "its offset layout is not pinned down by the API page; DMA gathers through "
                               ".ap(vector_offset=...) or vector_select are supported")

    def is_indirect(self) -> bool:
        return self.gathers or self.dynamic


class IndirectTensor(views.Gather, NkiTensor):
    """A gather/scatter access ``.ap(vector_offset=...)`` (``views.Gather``)."""

    __getitem__ = views.Gather.subscript

    def _refuse_view(self, *_args, **_kwargs):
        raise KernelUsageError(f"'{self.name}' is an indirect (gather/scatter) view: view(dtype) and .ap() do not "
                               f"apply to it")

    view = reinterpret_cast = ap = _refuse_view


class OutOfBoundsView(views.OutOfRange, NkiTensor):
    """An ``.ap()`` reaching outside its allocation (``views.OutOfRange``): refused when used."""


NkiTensor.view_type, NkiTensor.gather_type, NkiTensor.out_of_bounds_type = NkiTensor, IndirectTensor, OutOfBoundsView


def allocate(shape, dtype, buffer: memory.Buffer, name: str, api: str, fill="poison", address=None) -> NkiTensor:
    """A new allocation (``memory.new_tensor``). Uninitialised memory holds the documented sentinels: NaN
    (floats), 4 (integers). ``address``: ``(partition_offset, free_offset)`` of an explicitly placed on-chip
    tensor (``memory.Address``)."""
    if address is not None:
        buffer = memory.Address(buffer, address, api)
    return memory.new_tensor(shape, dtype, buffer, name, fill, api=api, kind=NkiTensor)
