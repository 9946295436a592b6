"""Index expressions (``nl.arange``, ``nl.mgrid``, masks) and tensor subscripts.

Basic subscripts give view tensors; subscripts with index expressions, runtime index tiles or
out-of-range slices give an :class:`Access`, evaluated lazily so a mask can exclude elements.
"""

from __future__ import annotations

import numpy as np

from . import liveness
from .errors import KernelUsageError, UnsupportedError
from .tensors import Access, IndexExpr, Mask, MaskedOperand, Tensor, broadcast_shape, index_rows, out_of_bounds


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
    if s.step is None and s.start.__class__ is int and s.stop.__class__ is int:  # a[i:i + n], nl.ds
        return s.start, max(s.stop, s.start), 1
    step = 1 if s.step is None else int(s.step)
    if step <= 0:
        raise KernelUsageError(f"slice step must be positive, got {step}")
    start = 0 if s.start is None else int(s.start)
    stop = size if s.stop is None else int(s.stop)
    return start, max(stop, start), step


_ADVANCED = (IndexExpr, Tensor, Access)  # index kinds that make an access instead of a view


def index(tensor: Tensor, key):
    """``tensor[key]``: a view tensor for basic indexing, an :class:`Access` for advanced indexing."""
    if not isinstance(key, tuple):  # a tuple subclass too: a whole nl.mgrid grid, t[nl.mgrid[0:128, 0:512]]
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
    view = type(tensor)(tensor.data[np_key], tensor.buffer, tensor.name, tensor.site,
                         pdim - dropped_before_p if pdim > dropped_before_p else 0)
    if tensor.alloc is not None:
        view.alloc = liveness.view_part(tensor.alloc, np_key)
    if tensor.written is not None:
        view.written = tensor.written[np_key]
    if tensor.unset is not None:
        view.unset = tensor.unset[np_key]
    return view


def _column_view(tensor: Tensor) -> Tensor:
    view = type(tensor)(tensor.data[:, None], tensor.buffer, tensor.name, tensor.site, alloc=tensor.alloc)
    view.written = None if tensor.written is None else tensor.written[:, None]
    view.unset = None if tensor.unset is None else tensor.unset[:, None]
    return view


def _advanced(tensor: Tensor, key, from_slices: bool = False) -> Access:
    comps, indirect, progs, offsets = [], [], [], []
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
            elif isinstance(k, (Tensor, Access)):
                blocks = all(isinstance(b, (int, np.integer)) for b in key[:axis])
                comps.append(_indirect_indices(tensor, axis, k, blocks))
                indirect.append(axis)
                offsets.append(k)
            else:
                comps.append(int(k) + (tensor.shape[axis] if int(k) < 0 else 0))
            if len(progs) < len(comps):
                progs.append(None)
    shape = broadcast_shape([c.shape for c in comps if not isinstance(c, int)])
    access = tensor.access_type(tensor, comps, shape, tuple(indirect), progs or None)
    access.offsets = tuple(offsets)
    return access


def _partition_stride_error(tensor: Tensor) -> KernelUsageError:
    return KernelUsageError(f"the partition dimension of on-chip tensor '{tensor.name}' must be accessed as one "
                            f"contiguous range along the first result axis (no partition striding or "
                            f"partition-to-free reshuffling; use nc_transpose)")


def _check_partition_index(tensor: Tensor, values: np.ndarray, prog=None) -> None:
    if any(n > 1 for n in values.shape[1:]):
        raise _partition_stride_error(tensor)
    column = values.reshape(-1)
    if column.size <= 1:
        return
    consecutive = prog[2] == 1 if prog is not None else np.array_equal(np.diff(column),
                                                                       np.ones(column.size - 1, column.dtype))
    if not consecutive:
        raise _partition_stride_error(tensor)


def _indirect_indices(tensor: Tensor, axis: int, index_tile, after_blocks: bool) -> np.ndarray:
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
    rows = index_rows(values, "indirect indices must be an integer tile")
    return rows.reshape(values.shape[0], *([1] * max(values.ndim - 1, 1)))


