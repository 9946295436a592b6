"""Current API: parameters the 2.32 API pages document that newer public kernels pass (DMA priority,
HWDGE engine, register_alloc's initial value, core_barrier's engine), PE-tiling sizes, and ``.ap()``
offsets relative to the view (as AWS's gdn_cte kernel uses ``k[batch].ap(...)``)."""

from __future__ import annotations

import numpy as np
import pytest

from nki_ops.sim.core.errors import KernelUsageError
from nki_ops.sim.frontends import current as nki

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation
RNG = np.random.default_rng(11)


@nki.jit
def dma_kernel(x, priority, engine):
    out = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(tile, x, priority)  # third positional parameter is priority, as documented
    flipped = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=flipped, src=tile, priority=priority)
    nisa.dma_copy(dst=out, src=flipped, priority=priority, engine=engine,
                  dge_mode=nisa.dge_mode.unknown if engine == nisa.engine.dma else nisa.dge_mode.hwdge)
    return out


def test_dma_priority_and_engine_move_the_same_bytes():
    x = RNG.standard_normal((16, 8)).astype(np.float16)
    for priority in (None, 0, 3):
        np.testing.assert_array_equal(dma_kernel(x, priority, nisa.engine.sync), x.T)
    np.testing.assert_array_equal(dma_kernel(x, 1, nisa.engine.scalar), x.T)
    np.testing.assert_array_equal(dma_kernel(x, 2, nisa.engine.dma), x.T)


@pytest.mark.parametrize("priority, engine, message", [
    (4, nisa.engine.sync, "priority must be an int 0-3"),
    (True, nisa.engine.sync, "priority must be an int 0-3"),
    (0, nisa.engine.vector, "engine must be nisa.engine.sync or nisa.engine.scalar"),
])
def test_dma_priority_and_engine_are_checked(priority, engine, message):
    with pytest.raises(KernelUsageError, match=message):
        dma_kernel(RNG.standard_normal((4, 4)).astype(np.float16), priority, engine)


@nki.jit
def register_kernel(x):
    out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
    total = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=total, value=0)

    def body(_):
        nisa.tensor_scalar(dst=total, data=total, op0=nl.add, operand0=1)

    nl.fori_loop(nisa.register_alloc(), nisa.register_alloc(x=x), body)
    nisa.dma_copy(dst=out, src=total)
    return out


def test_register_alloc_takes_its_initial_value_as_x():
    assert register_kernel(5)[0, 0] == 5


@nki.jit
def barrier_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    me = nl.program_id(0)
    half = x.shape[0] // 2
    nisa.core_barrier(data=out, cores=(0, 1), engine=nisa.engine.sync)
    nisa.dma_copy(dst=out[me * half:(me + 1) * half, :], src=x[me * half:(me + 1) * half, :])
    return out


def test_core_barrier_takes_an_engine():
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_array_equal(barrier_kernel[2](x), x)


@nki.jit
def tiled_matmul_kernel(a, b, position, size):
    out = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    sa = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    sb = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sa, src=a)
    nisa.dma_copy(dst=sb, src=b)
    acc = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(acc, sa, sb, tile_position=position, tile_size=size)
    res = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_pe_tile_in_the_lower_half_computes_the_product():
    a = RNG.standard_normal((64, 32)).astype(np.float32)
    b = RNG.standard_normal((64, 40)).astype(np.float32)
    np.testing.assert_allclose(tiled_matmul_kernel(a, b, (64, 0), (64, 128)), a.T @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tiled_matmul_kernel(a, b, (64, 64), (64, 64)), a.T @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k, m, position, size, message", [
    (16, 16, (0, 0), (16, 16), "a PE tile is 32 or 64 or 128"),  # 16-row tiles do not exist
    (64, 32, (0, 0), (96, 128), "a PE tile is 32 or 64 or 128"),  # 96 is not a row split
    (64, 32, (32, 0), (64, 128), "starting at a multiple of its size"),
    (128, 32, (0, 0), (64, 128), "stationary has 128 partitions, more than the PE tile's 64 rows"),
    (32, 64, (0, 0), (32, 32), "stationary free size 64 exceeds the PE tile's 32 columns"),
])
def test_pe_tiling_follows_the_documented_splits(k, m, position, size, message):
    a = RNG.standard_normal((k, m)).astype(np.float32)
    b = RNG.standard_normal((k, 8)).astype(np.float32)
    with pytest.raises(KernelUsageError, match=message):
        tiled_matmul_kernel(a, b, position, size)


def test_32_wide_pe_tiles_need_neuroncore_v3(monkeypatch):
    a = RNG.standard_normal((32, 32)).astype(np.float32)
    b = RNG.standard_normal((32, 8)).astype(np.float32)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    np.testing.assert_allclose(tiled_matmul_kernel(a, b, (96, 0), (32, 128)), a.T @ b, rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    with pytest.raises(KernelUsageError, match="a PE tile is 64 or 128 rows/columns on trn1"):
        tiled_matmul_kernel(a, b, (96, 0), (32, 128))


@nki.jit
def ap_on_views_kernel(x):
    """``.ap()`` on a batch view of HBM and on a column slice of SBUF: the pattern's offset adds to
    the view's own storage offset."""
    out = nl.ndarray((x.shape[0], 4, 16), dtype=x.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(x.shape[0]):
        t = nl.ndarray((4, 32), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[b].ap(pattern=[[32, 4], [1, 32]], offset=0))
        cols = t[:, 8:24]
        picked = nl.ndarray((4, 16), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=picked, src=cols.ap(pattern=[[32, 4], [1, 16]]))
        shifted = nl.ndarray((4, 8), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=shifted, src=cols.ap(pattern=[[32, 4], [1, 8]], offset=8))
        nisa.dma_copy(dst=out[b, :, 0:16], src=picked)
        nisa.dma_copy(dst=out[b, :, 0:8], src=shifted)
    return out


def test_ap_offsets_add_to_the_views_storage_offset():
    x = RNG.standard_normal((3, 4, 32)).astype(np.float32)
    expected = x[:, :, 8:24].copy()
    expected[:, :, 0:8] = x[:, :, 16:24]
    np.testing.assert_array_equal(ap_on_views_kernel(x), expected)


def test_buffers_are_memory_regions():
    assert all(isinstance(b, nl.MemoryRegion) for b in (nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm, nl.private_hbm))
    assert nl.MemoryRegion.sbuf is nl.sbuf and nl.MemoryRegion.shared_hbm is nl.shared_hbm
    assert not isinstance("sbuf", nl.MemoryRegion)


@nki.jit
def dma_engine_without_hwdge_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=x, engine=nisa.engine.sync)
    return out


def test_dma_engine_needs_hwdge_mode():
    with pytest.raises(KernelUsageError, match="needs dge_mode=nisa.dge_mode.hwdge"):
        dma_engine_without_hwdge_kernel(np.zeros((2, 2), np.float32))


@nki.jit
def predicates_kernel(x):
    t = nl.ndarray((2, 2), dtype=nl.float32, buffer=nl.sbuf)
    assert nl.is_sbuf(t.buffer) and nl.is_hbm(x.buffer) and nl.is_on_chip(nl.psum) and nl.is_psum(nl.psum)
    assert nl.is_hbm(nl.shared_hbm) and nl.is_hbm(nl.private_hbm) and not nl.is_hbm(nl.sbuf)
    nl.is_hbm(t)
    return x


def test_buffer_predicates_take_a_buffer():
    with pytest.raises(KernelUsageError, match="nl.is_hbm takes a buffer"):
        predicates_kernel(np.zeros((2, 2), np.float32))


@nki.jit
def print_kernel(x):
    nl.device_print(print_prefix="x =", tensor=x)
    return x


def test_device_print_takes_the_documented_names(capsys):
    print_kernel(np.arange(3, dtype=np.float32).reshape(1, 3))
    assert "x = [[0. 1. 2.]]" in capsys.readouterr().out
