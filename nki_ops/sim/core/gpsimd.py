"""GpSimd engine instructions on values (NumPy in, NumPy out): ``local_gather``, ``sequence_bounds``
and ``topk``. The GpSimd engine is eight cores, each wired to 16 consecutive partitions; the
instructions that work across partitions do so within those 16 (SDK ``nki.isa`` API pages)."""

from __future__ import annotations

import numpy as np

from .errors import KernelUsageError, OutOfBoundsError, UnsupportedError

CORE_PARTITIONS = 16
GATHER_ELEMENTS = (1, 2, 4, 8, 16, 32)
GATHER_MAX_INDICES = 4096


def local_gather(api: str, values: np.ndarray, index: np.ndarray, num_elem_per_idx: int,
                 num_valid_indices: int | None) -> np.ndarray:
    """Per GpSimd core: its 16 partitions' indices, flattened partition-first, are element offsets
    into each of its partitions; each takes ``num_elem_per_idx`` consecutive elements from there.
    ``values [P, F]``, ``index [P, C]`` -> ``[P, num_valid_indices * num_elem_per_idx]``. The docs
    call an index past the partition undefined: here it is an error."""
    partitions = values.shape[0]
    if partitions != index.shape[0] or partitions % CORE_PARTITIONS:
        raise KernelUsageError(f"{api}: src_buffer and index must have the same partition size, a multiple of 16; "
                               f"got {partitions} and {index.shape[0]}")
    if num_elem_per_idx not in GATHER_ELEMENTS:
        raise KernelUsageError(f"{api}: num_elem_per_idx must be one of {list(GATHER_ELEMENTS)}, got "
                               f"{num_elem_per_idx}")
    per_core = CORE_PARTITIONS * index.shape[1]
    valid = per_core if num_valid_indices is None else int(num_valid_indices)
    if not 0 < valid <= per_core:
        raise KernelUsageError(f"{api}: num_valid_indices must be in [1, {per_core}] (the indices of 16 partitions "
                               f"of index), got {num_valid_indices}")
    if valid > GATHER_MAX_INDICES:
        raise KernelUsageError(f"{api}: {valid} indices per GpSimd core, at most {GATHER_MAX_INDICES}")
    result = np.empty((partitions, valid * num_elem_per_idx), values.dtype)
    lanes = np.arange(num_elem_per_idx)
    for start in range(0, partitions, CORE_PARTITIONS):
        offsets = index[start:start + CORE_PARTITIONS].astype(np.int64).flatten(order="F")[:valid]
        where = (offsets[:, None] + lanes).reshape(-1)
        if where.max() >= values.shape[1]:
            raise OutOfBoundsError(f"{api}: GpSimd core {start // CORE_PARTITIONS} gathers element {where.max()} "
                                   f"of partitions with {values.shape[1]} elements")
        result[start:start + CORE_PARTITIONS] = values[start:start + CORE_PARTITIONS][:, where]
    return result


def sequence_bounds(api: str, ids: np.ndarray) -> np.ndarray:
    """For segment ids ``[n]``: ``[2, n]``, each element's segment start (its run of equal ids) and
    end (one past it); padding (id 0) gets start n and end -1."""
    if np.any(ids < 0):
        raise KernelUsageError(f"{api}: segment ids must be non-negative, got {ids[ids < 0][0]}")
    n = ids.size
    position = np.arange(n)
    changes = ids[1:] != ids[:-1]
    first = np.concatenate([[True], changes])
    last = np.concatenate([changes, [True]])
    start = np.maximum.accumulate(np.where(first, position, 0))
    end = np.minimum.accumulate(np.where(last, position + 1, n)[::-1])[::-1]
    padding = ids == 0
    return np.stack([np.where(padding, n, start), np.where(padding, -1, end)])


def topk(api: str, values: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group of 16 partitions of ``values [P, X]``, the snake ``s[i] = values[i % 16, i // 16]``
    for ``i < n``; its ``k`` largest values in ascending order with their snake positions, written
    as a snake again: result ``j`` at partition ``j % 16``, column ``j // 16`` of the group. Among
    equal values the lower position ranks higher. Returns (values, positions, written) as
    ``[P, k]`` arrays, ``written`` marking the slots the instruction writes."""
    partitions, columns = values.shape
    if partitions % CORE_PARTITIONS:
        raise KernelUsageError(f"{api}: the partition size must be a multiple of 16, got {partitions}")
    if not 8 <= n < 65536:
        raise KernelUsageError(f"{api}: n must satisfy 8 <= n < 65536, got {n}")
    if not 1 <= k < 32768 or k > n:
        raise KernelUsageError(f"{api}: K (the free size of val_dst) must satisfy 1 <= K < 32768 and K <= n={n}, "
                               f"got {k}")
    if columns * CORE_PARTITIONS < n:
        raise KernelUsageError(f"{api}: src has {columns} elements per partition, the snake of n={n} needs "
                               f"{-(-n // CORE_PARTITIONS)}")
    out_values = np.zeros((partitions, k), np.float32)
    out_positions = np.zeros((partitions, k), np.int64)
    written = np.zeros((partitions, k), bool)
    rank = np.arange(k)
    slot = (rank % CORE_PARTITIONS, rank // CORE_PARTITIONS)
    for start in range(0, partitions, CORE_PARTITIONS):
        snake = values[start:start + CORE_PARTITIONS].T.reshape(-1)[:n]
        if np.isnan(snake).any():
            raise UnsupportedError(f"{api} over NaN values", "the docs do not say how NaN ranks")
        best = np.lexsort((np.arange(n), -snake))[:k][::-1]  # descending by value, then reversed
        rows = start + slot[0]
        out_values[rows, slot[1]] = snake[best]
        out_positions[rows, slot[1]] = best
        written[rows, slot[1]] = True
    return out_values, out_positions, written
