"""The current ``nki`` API: semantics the public kernel library relies on, each in a small kernel
written here and checked against NumPy (or the error it must raise)."""

from __future__ import annotations

import numpy as np
import pytest

from nki_ops.sim.frontends import current as nki

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation
RNG = np.random.default_rng(12)


def load(src):
    tile = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=src)
    return tile


@nki.jit
def matmul_into_ap_view_kernel(a_t, b):
    """Two matmuls into halves of one PSUM tile, each through an .ap() view that names the
    allocation's own dtype: the first write to fresh PSUM overwrites its (NaN) contents."""
    k, m = a_t.shape
    n = b.shape[1]
    acc = nl.ndarray((m, 2 * n), dtype=nl.float32, buffer=nl.psum)
    for half in range(2):
        view = acc.ap(pattern=[[2 * n, m], [1, n]], offset=half * n, dtype=nl.float32)
        nisa.nc_matmul(dst=view, stationary=load(a_t), moving=load(b))
    result = nl.ndarray((m, 2 * n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=result, src=acc)
    out = nl.ndarray((m, 2 * n), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=result)
    return out


def test_matmul_into_ap_view_with_explicit_dtype_overwrites_fresh_psum():
    a_t = RNG.standard_normal((64, 32)).astype(np.float32)
    b = RNG.standard_normal((64, 16)).astype(np.float32)
    out = matmul_into_ap_view_kernel(a_t, b)
    expected = a_t.T @ b
    np.testing.assert_allclose(out, np.concatenate([expected, expected], axis=1), rtol=1e-5, atol=1e-5)
