"""A tiled matmul to tune on the cost model: ``nki-ops tune kernel --space examples/tune/tiled_matmul.toml``.

``build(**params)`` returns the kernel and its arguments at the shape to tune for; ``check(**params)`` runs
the same parameters at a small odd shape in the simulator and raises when the values are wrong.
"""

from __future__ import annotations

import numpy as np

from nki_ops.sim.frontends.current import isa as nisa
from nki_ops.sim.frontends.current import jit
from nki_ops.sim.frontends.current import language as nl


def _tiles(extent, tile):
    """``(start, size)`` of each tile along an axis: full tiles, then one narrower tail tile."""
    return [(start, min(tile, extent - start)) for start in range(0, extent, tile)]


@jit
def matmul_kernel(lhsT, rhs, tile_m, tile_n, tile_k):
    """``lhsT.T @ rhs`` for HBM ``lhsT [K, M]`` and ``rhs [K, N]``: output tiles of ``tile_m x tile_n``
    accumulate ``tile_k``-row slices of K in one PSUM tile; each output tile's lhsT strip is loaded once
    per row of output tiles and reused across the N tiles."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    ks = _tiles(K, tile_k)
    for m0, ms in _tiles(M, tile_m):
        strip = []
        for k0, kk in ks:
            a = nl.ndarray((kk, ms), dtype=lhsT.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=a, src=lhsT[k0:k0 + kk, m0:m0 + ms])
            strip.append(a)
        for n0, ns in _tiles(N, tile_n):
            acc = nl.ndarray((ms, ns), dtype=nl.float32, buffer=nl.psum)
            for index, (k0, kk) in enumerate(ks):
                b = nl.ndarray((kk, ns), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=b, src=rhs[k0:k0 + kk, n0:n0 + ns])
                nisa.nc_matmul(dst=acc, stationary=strip[index], moving=b, accumulate=index > 0)
            result = nl.ndarray((ms, ns), dtype=out.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=result, src=acc)
            nisa.dma_copy(dst=out[m0:m0 + ms, n0:n0 + ns], src=result)
    return out


def _inputs(k, m, n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((k, m), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)


def build(tile_m, tile_n, tile_k):
    """The kernel and its arguments at the shape to tune for: K=1024, M=512, N=2048, fp32."""
    lhsT, rhs = _inputs(1024, 512, 2048)
    return matmul_kernel, (lhsT, rhs, tile_m, tile_n, tile_k)


def check(tile_m, tile_n, tile_k):
    """Run the candidate at an odd shape (every tail tile) and compare with NumPy."""
    lhsT, rhs = _inputs(300, 130, 700, seed=1)
    out = matmul_kernel(lhsT, rhs, tile_m, tile_n, tile_k)
    np.testing.assert_allclose(out, lhsT.T.astype(np.float64) @ rhs, rtol=1e-4, atol=1e-3)
