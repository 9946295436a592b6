"""GpSimd instructions of the current API (``nisa.local_gather``, ``nisa.sequence_bounds``,
``nisa.topk``) in small kernels, checked against NumPy references written here from the API pages,
and the errors they must raise."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nki_ops.sim.core.errors import KernelUsageError, MemorySpaceError, OutOfBoundsError
from nki_ops.sim.frontends import current as nki

from .current_tiles import load, store

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation
RNG = np.random.default_rng(5)


# ------------------------------------------------------------------------------ local_gather

@nki.jit
def local_gather_kernel(src, index, num_elem_per_idx, num_valid_indices, out_shape):
    dst = nl.ndarray(out_shape, dtype=src.dtype, buffer=nl.sbuf)
    nisa.local_gather(dst=dst, src_buffer=load(src), index=load(index), num_elem_per_idx=num_elem_per_idx,
                      num_valid_indices=num_valid_indices)
    return store(dst)


def gather_reference(src, index, num_elem_per_idx, num_valid):
    """The API page's example: per 16-partition core, its indices flattened partition-first (column-major)
    are offsets into each of its partitions' flattened elements; num_elem_per_idx elements per index."""
    flat = src.reshape(src.shape[0], -1)
    out = np.empty((src.shape[0], num_valid, num_elem_per_idx), src.dtype)
    for core in range(src.shape[0] // 16):
        rows = slice(16 * core, 16 * core + 16)
        offsets = index[rows].T.reshape(-1)[:num_valid]
        for i, offset in enumerate(offsets):
            out[rows, i] = flat[rows, offset:offset + num_elem_per_idx]
    return out


@pytest.mark.parametrize("num_valid", [None, 40])
def test_local_gather_takes_each_cores_indices_in_its_16_partitions(num_valid):
    src = (RNG.random((64, 128, 4)) * 100).astype(np.float32)
    index = (RNG.integers(0, 128, (64, 4)) * 4).astype(np.uint16)
    valid = 64 if num_valid is None else num_valid
    out = local_gather_kernel(src, index, 4, num_valid, (64, valid, 4))
    np.testing.assert_array_equal(out, gather_reference(src, index, 4, valid))


def test_local_gather_rules():
    src = np.ones((32, 64), ml_dtypes.bfloat16)
    index = np.zeros((32, 2), np.uint16)
    with pytest.raises(KernelUsageError, match=r"num_elem_per_idx must be one of \[1, 2, 4, 8, 16, 32\], got 3"):
        local_gather_kernel(src, index, 3, None, (32, 96))
    with pytest.raises(KernelUsageError, match="index must be uint16, got int32"):
        local_gather_kernel(src, index.astype(np.int32), 1, None, (32, 32))
    with pytest.raises(KernelUsageError, match="num_valid_indices must be in"):
        local_gather_kernel(src, index, 1, 33, (32, 33))
    index[17, 1] = 62
    with pytest.raises(OutOfBoundsError, match="GpSimd core 1 gathers element 65 of partitions with 64 elements"):
        local_gather_kernel(src, index, 4, None, (32, 128))


# ------------------------------------------------------------------------------ sequence_bounds

@nki.jit
def sequence_bounds_kernel(ids):
    dst = nl.ndarray((1, 2, ids.shape[1]), dtype=ids.dtype, buffer=nl.sbuf)
    nisa.sequence_bounds(dst=dst, segment_ids=load(ids))
    return store(dst)


def bounds_reference(ids):
    """The API page's example, element by element: the start of each element's run of equal ids and one
    past its end; padding (id 0) gets start n, end -1."""
    n = len(ids)
    start, end = np.zeros(n), np.zeros(n)
    for i in range(n):
        if ids[i] == 0:
            start[i], end[i] = n, -1
            continue
        lo, hi = i, i + 1
        while lo > 0 and ids[lo - 1] == ids[i]:
            lo -= 1
        while hi < n and ids[hi] == ids[i]:
            hi += 1
        start[i], end[i] = lo, hi
    return np.stack([start, end])[None]


def test_sequence_bounds_documented_example():
    ids = np.array([[0, 1, 1, 2, 2, 2, 0, 3, 3]], np.int32)
    out = sequence_bounds_kernel(ids)
    np.testing.assert_array_equal(out, [[[9, 1, 1, 3, 3, 3, 9, 7, 7], [-1, 3, 3, 6, 6, 6, -1, 9, 9]]])


def test_sequence_bounds_random_segments_in_fp32():
    ids = np.sort(RNG.integers(0, 12, 64)).astype(np.float32)[None]
    ids[0, 40:44] = 0
    np.testing.assert_array_equal(sequence_bounds_kernel(ids), bounds_reference(ids[0]))


def test_sequence_bounds_rules():
    with pytest.raises(KernelUsageError, match="segment_ids must be float32 or int32, got int16"):
        sequence_bounds_kernel(np.ones((1, 8), np.int16))
    with pytest.raises(KernelUsageError, match=r"the partition size must be 1, got segment_ids \[2, 8\]"):
        sequence_bounds_kernel(np.ones((2, 8), np.int32))
    with pytest.raises(KernelUsageError, match="segment ids must be non-negative, got -2"):
        sequence_bounds_kernel(np.array([[1, -2, 3, 3]], np.int32))


# ------------------------------------------------------------------------------ topk

@nki.jit
def topk_kernel(src, n, k):
    val = nl.ndarray((src.shape[0], k), dtype=nl.bfloat16, buffer=nl.sbuf)
    idx = nl.ndarray((src.shape[0], k), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.memset(dst=val, value=-1.0)
    nisa.memset(dst=idx, value=7777)
    nisa.topk(val_dst=val, idx_dst=idx, src=load(src), n=n)
    return store(val), store(idx)


def topk_reference(src, n, k):
    """Per 16-partition group: snake position i is element (i % 16, i // 16); the K largest of the first n,
    ascending, written back as a snake (rank j at (j % 16, j // 16)); untouched slots keep -1 / 7777."""
    val = np.full((src.shape[0], k), -1.0, np.float32)
    idx = np.full((src.shape[0], k), 7777, np.uint32)
    for g in range(src.shape[0] // 16):
        snake = [float(src[16 * g + i % 16, i // 16]) for i in range(n)]
        top = sorted(range(n), key=lambda i: (-snake[i], i))[:k][::-1]
        for j, i in enumerate(top):
            val[16 * g + j % 16, j // 16] = snake[i]
            idx[16 * g + j % 16, j // 16] = i
    return val, idx


@pytest.mark.parametrize("n, k", [(42, 8), (100, 37)])
def test_topk_selects_the_k_largest_of_each_16_partition_snake(n, k):
    src = RNG.permutation(32 * 8).reshape(32, 8).astype(ml_dtypes.bfloat16)
    val, idx = topk_kernel(src, n, k)
    ref_val, ref_idx = topk_reference(src.astype(np.float32), n, k)
    np.testing.assert_array_equal(val.astype(np.float32), ref_val)
    np.testing.assert_array_equal(idx, ref_idx)


def test_topk_rules():
    src = np.ones((16, 4), ml_dtypes.bfloat16)
    with pytest.raises(KernelUsageError, match="n must satisfy 8 <= n < 65536, got 4"):
        topk_kernel(src, 4, 2)
    with pytest.raises(KernelUsageError, match="src has 4 elements per partition, the snake of n=80 needs 5"):
        topk_kernel(src, 80, 8)
    with pytest.raises(KernelUsageError, match="src must be bfloat16, got float32"):
        topk_kernel(src.astype(np.float32), 16, 8)
    with pytest.raises(KernelUsageError, match="the partition size must be a multiple of 16, got 8"):
        topk_kernel(src[:8], 16, 4)


@nki.jit
def topk_from_psum_kernel(src):
    tile = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.psum)
    nisa.tensor_copy(dst=tile, src=load(src))
    val = nl.ndarray((16, 8), dtype=nl.bfloat16, buffer=nl.sbuf)
    idx = nl.ndarray((16, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.topk(val_dst=val, idx_dst=idx, src=tile, n=16)
    return store(val)


def test_topk_reads_sbuf_only():
    with pytest.raises(MemorySpaceError, match="Expected operand 'src' of 'nisa.topk' to be in address space "
                                               "'sbuf'"):
        topk_from_psum_kernel(np.ones((16, 4), ml_dtypes.bfloat16))
