"""Legacy-API NKI kernels used by the simulator tests (written for this suite)."""

from __future__ import annotations

from nki_ops.sim import nisa, nki, nl


@nki.jit
def add_kernel(a, b):
    """One (128, F) row tile per grid instance: out = a + b."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    rows = nl.ds(nl.program_id(0) * 128, 128)
    nl.store(out[rows, :], nl.add(nl.load(a[rows, :]), nl.load(b[rows, :])))
    return out


@nki.jit
def matmul_isa_kernel(a_t, b):
    """a_t: [K, M] (K a multiple of 128, M <= 128), b: [K, N] (N <= 512) -> a_t.T @ b, with nc_matmul."""
    k, m = a_t.shape
    n = b.shape[1]
    out = nl.ndarray((m, n), nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((m, n), nl.float32, buffer=nl.psum)
    for kt in nl.affine_range(k // 128):
        stationary = nl.load(a_t[kt * 128:(kt + 1) * 128, :])
        moving = nl.load(b[kt * 128:(kt + 1) * 128, :])
        acc += nisa.nc_matmul(stationary, moving)
    nl.store(out, nl.copy(acc))
    return out


@nki.jit
def matmul_nl_kernel(a_t, b):
    """Same contract as matmul_isa_kernel, accumulating with psum[...] += nl.matmul(transpose_x=True)."""
    k, m = a_t.shape
    n = b.shape[1]
    out = nl.ndarray((m, n), nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((nl.par_dim(m), n), nl.float32, buffer=nl.psum)
    for kt in nl.affine_range(k // 128):
        acc[...] += nl.matmul(nl.load(a_t[kt * 128:(kt + 1) * 128, :]), nl.load(b[kt * 128:(kt + 1) * 128, :]),
                              transpose_x=True)
    nl.store(out, acc)
    return out


@nki.jit
def softmax_kernel(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for t in nl.affine_range(x.shape[0] // 128):
        rows = nl.ds(t * 128, 128)
        nl.store(out[rows, :], nl.softmax(nl.load(x[rows, :]), axis=1))
    return out


@nki.jit
def rms_norm_kernel(x, weight, eps):
    """x / sqrt(mean(x^2) + eps) * weight along the free axis, from primitive ops."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    w = nl.load(weight.reshape((1, weight.shape[0])))
    w_all = nl.broadcast_to(w, shape=(128, weight.shape[0]))
    for t in nl.affine_range(x.shape[0] // 128):
        tile = nl.load(x[t * 128:(t + 1) * 128, :], dtype=nl.float32)
        mean_sq = nl.mean(nl.square(tile), axis=1)           # (128,) per-partition vector
        inv_rms = nl.rsqrt(mean_sq + eps)
        nl.store(out[t * 128:(t + 1) * 128, :], nl.multiply(nl.multiply(tile, inv_rms), w_all))
    return out


@nki.jit
def transpose_kernel(x):
    out = nl.ndarray((x.shape[1], x.shape[0]), x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.transpose(nl.load(x)))
    return out


@nki.jit
def ragged_scale_kernel(x, out):
    """out = 2 * x for any number of rows: the last tile is masked (by-reference output)."""
    rows, cols = x.shape
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(cols)[None, :]
    for t in nl.affine_range((rows + 127) // 128):
        valid = t * 128 + i_p < rows
        tile = nl.load(x[t * 128 + i_p, i_f], mask=valid)
        nl.store(out[t * 128 + i_p, i_f], value=nl.multiply(tile, 2.0, mask=valid), mask=valid)


@nki.jit
def bf16_store_kernel(x):
    out = nl.ndarray(x.shape, nl.bfloat16, buffer=nl.shared_hbm)
    nl.store(out, nl.load(x))
    return out
