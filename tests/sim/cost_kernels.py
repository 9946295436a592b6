"""Matrix-multiplication kernels written here from the NKI matmul tutorial's description, one per
published optimisation step (trn1, M=4096, K=8192, N=8192, bf16: 51.8, 42.96, 22.07, 6.97 ms), for
the cost model's calibration test. Inputs: lhsT (K, M) and rhs (K, N); output (M, N)."""

from __future__ import annotations

from nki_ops.sim import nisa, nki, nl

TM, TK, TN = 128, 128, 512


@nki.jit
def tiled(lhsT, rhs):
    """Every (m, n, k) step loads its own lhsT and rhs tiles."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TM):
        for n in nl.affine_range(N // TN):
            acc = nl.zeros((TM, TN), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TK):
                a = nl.load(lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM])
                b = nl.load(rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN])
                acc += nl.matmul(a, b, transpose_x=True)
            nl.store(out[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], value=nl.copy(acc, dtype=out.dtype))
    return out


@nki.jit
def hoisted(lhsT, rhs):
    """The lhsT column strip is loaded once per m, outside the n loop."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TM):
        a = nl.ndarray((K // TK, nl.par_dim(TK), TM), dtype=lhsT.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(K // TK):
            a[k] = nl.load(lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM])
        for n in nl.affine_range(N // TN):
            b = nl.ndarray((K // TK, nl.par_dim(TK), TN), dtype=rhs.dtype, buffer=nl.sbuf)
            for k in nl.affine_range(K // TK):
                b[k] = nl.load(rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN])
            acc = nl.zeros((TM, TN), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TK):
                acc += nl.matmul(a[k], b[k], transpose_x=True)
            nl.store(out[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], value=nl.copy(acc, dtype=out.dtype))
    return out


@nki.jit
def blocked(lhsT, rhs, bm_tiles=2, bn_tiles=2):
    """Blocks of 2 x 2 output tiles reuse each loaded lhsT and rhs tile twice."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // (TM * bm_tiles)):
        a = nl.ndarray((bm_tiles, K // TK, nl.par_dim(TK), TM), dtype=lhsT.dtype, buffer=nl.sbuf)
        for bm in nl.affine_range(bm_tiles):
            col = (m * bm_tiles + bm) * TM
            for k in nl.affine_range(K // TK):
                a[bm, k] = nl.load(lhsT[k * TK:(k + 1) * TK, col:col + TM])
        for n in nl.affine_range(N // (TN * bn_tiles)):
            b = nl.ndarray((bn_tiles, K // TK, nl.par_dim(TK), TN), dtype=rhs.dtype, buffer=nl.sbuf)
            for bn in nl.affine_range(bn_tiles):
                col = (n * bn_tiles + bn) * TN
                for k in nl.affine_range(K // TK):
                    b[bn, k] = nl.load(rhs[k * TK:(k + 1) * TK, col:col + TN])
            for bm in nl.affine_range(bm_tiles):
                for bn in nl.affine_range(bn_tiles):
                    acc = nl.zeros((TM, TN), nl.float32, buffer=nl.psum)
                    for k in nl.affine_range(K // TK):
                        acc += nl.matmul(a[bm, k], b[bn, k], transpose_x=True)
                    row, col = (m * bm_tiles + bm) * TM, (n * bn_tiles + bn) * TN
                    nl.store(out[row:row + TM, col:col + TN], value=nl.copy(acc, dtype=out.dtype))
    return out


@nki.jit
def optimized(lhsT, rhs, bm_tiles=16, bn_tiles=2, bk_tiles=8):
    """Blocks in M, N and K, one DMA per block row of lhsT and rhs (wide contiguous rows), partial
    sums accumulated in SBUF across K blocks, each output row block stored once."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    BM, BN, BK = TM * bm_tiles, TN * bn_tiles, TK * bk_tiles
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for n in nl.affine_range(N // BN):
        res = nl.zeros((M // TM, nl.par_dim(TM), BN), nl.float32, buffer=nl.sbuf)
        for kb in nl.sequential_range(K // BK):
            b = nl.ndarray((bk_tiles, nl.par_dim(TK), BN), dtype=rhs.dtype, buffer=nl.sbuf)
            for bk in nl.affine_range(bk_tiles):
                row = (kb * bk_tiles + bk) * TK
                b[bk] = nl.load(rhs[row:row + TK, n * BN:(n + 1) * BN])
            for mb in nl.affine_range(M // BM):
                a = nl.ndarray((bk_tiles, nl.par_dim(TK), BM), dtype=lhsT.dtype, buffer=nl.sbuf)
                for bk in nl.affine_range(bk_tiles):
                    row = (kb * bk_tiles + bk) * TK
                    a[bk] = nl.load(lhsT[row:row + TK, mb * BM:(mb + 1) * BM])
                for bn in nl.affine_range(bn_tiles):
                    for bm in nl.affine_range(bm_tiles):
                        acc = nl.zeros((TM, TN), nl.float32, buffer=nl.psum)
                        for bk in nl.affine_range(bk_tiles):
                            acc += nl.matmul(a[bk, :, bm * TM:(bm + 1) * TM], b[bk, :, bn * TN:(bn + 1) * TN],
                                             transpose_x=True)
                        tile = mb * bm_tiles + bm
                        res[tile, :, bn * TN:(bn + 1) * TN] = nl.add(res[tile, :, bn * TN:(bn + 1) * TN], acc)
        for tile in nl.affine_range(M // TM):
            nl.store(out[tile * TM:(tile + 1) * TM, n * BN:(n + 1) * BN], value=nl.copy(res[tile], dtype=out.dtype))
    return out


# Layernorm, written here from the legacy layernorm tutorial's description (trn1, 4096 x 8192 fp32,
# the defaults of the tutorial script's perf mode: p50 2311 us for v1, 1969 us for v2). Rows go 128
# to a tile on the partitions; gamma and beta are loaded once on one partition and broadcast to all.
P = 128


@nki.jit
def layernorm_v1(x, eps, gamma, beta):
    """Mean and variance from nl.mean over the row; normalise with element-wise tile arithmetic."""
    rows, cols = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    g = nl.load(gamma.reshape((1, cols))).broadcast_to((P, cols))
    b = nl.load(beta.reshape((1, cols))).broadcast_to((P, cols))
    for t in nl.affine_range((rows + P - 1) // P):
        n = min(P, rows - t * P)
        xt = nl.load(x[t * P:t * P + n, :])
        mean = nl.mean(xt, axis=1)
        var = nl.mean(nl.square(xt), axis=1) - mean * mean
        y = (xt - mean) * nl.rsqrt(var + eps)
        nl.store(out[t * P:t * P + n, :], value=y * g[:n, :] + b[:n, :])
    return out


@nki.jit
def layernorm_v2(x, eps, gamma, beta):
    """Mean and variance from bn_stats over bn_stats_fmax-wide chunks and bn_aggr; normalise with
    one tensor_scalar (subtract, multiply) instead of two tile operations."""
    rows, cols = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    g = nl.load(gamma.reshape((1, cols))).broadcast_to((P, cols))
    b = nl.load(beta.reshape((1, cols))).broadcast_to((P, cols))
    fmax = nl.tile_size.bn_stats_fmax
    chunks = (cols + fmax - 1) // fmax
    for t in nl.affine_range((rows + P - 1) // P):
        n = min(P, rows - t * P)
        xt = nl.load(x[t * P:t * P + n, :])
        stats = nl.ndarray((n, 6 * chunks), dtype=nl.float32)
        for c in nl.affine_range(chunks):
            w = min(fmax, cols - c * fmax)
            stats[:, c * 6:(c + 1) * 6] = nisa.bn_stats(xt[:, c * fmax:c * fmax + w])
        mv = nisa.bn_aggr(stats)
        rstd = nl.rsqrt(mv[:, 1:2] + eps)
        y = nisa.tensor_scalar(data=xt, op0=nl.subtract, operand0=mv[:, 0:1], op1=nl.multiply, operand1=rstd)
        nl.store(out[t * P:t * P + n, :], value=y * g[:n, :] + b[:n, :])
    return out


# Adaptive average pooling, written here from the description of nki-samples' adaptive_avg_pool2d_kernel
# (reference/vision.py @0898a77), whose unit test publishes trn1 times as thresholds of "measured * 1.05":
# (N, C) on the partitions, 128 rows a tile; for each output cell, its input window (at most 128 x 128 at
# a time) is copied by DMA into one SBUF buffer shared by all cells, summed, accumulated, and divided by
# the window's size; each row tile's output is stored once.


@nki.jit
def adaptive_avg_pool(x, out_h, out_w):
    n, c, h, w = x.shape
    rows = n * c
    out = nl.ndarray((n, c, out_h, out_w), dtype=x.dtype, buffer=nl.shared_hbm)
    flat_in, flat_out = x.reshape((rows, h, w)), out.reshape((rows, out_h, out_w))
    starts_h = [i * h // out_h for i in range(out_h + 1)]
    ends_h = [-(-(i + 1) * h // out_h) for i in range(out_h)]
    starts_w = [j * w // out_w for j in range(out_w + 1)]
    ends_w = [-(-(j + 1) * w // out_w) for j in range(out_w)]
    win_h = min(P, max(e - s for s, e in zip(starts_h, ends_h)))
    win_w = min(P, max(e - s for s, e in zip(starts_w, ends_w)))
    for t in nl.affine_range((rows + P - 1) // P):
        p = min(P, rows - t * P)
        window = nl.ndarray((p, win_h, win_w), dtype=x.dtype, buffer=nl.sbuf)
        result = nl.ndarray((p, out_h, out_w), dtype=x.dtype, buffer=nl.sbuf)
        for i in nl.static_range(out_h):
            for j in nl.static_range(out_w):
                total = nl.zeros((p, 1), dtype=nl.float32, buffer=nl.sbuf)
                for h0 in range(starts_h[i], ends_h[i], P):
                    for w0 in range(starts_w[j], ends_w[j], P):
                        dh, dw = min(P, ends_h[i] - h0), min(P, ends_w[j] - w0)
                        nisa.dma_copy(src=flat_in[t * P:t * P + p, h0:h0 + dh, w0:w0 + dw],
                                      dst=window[:, 0:dh, 0:dw])
                        total[...] = total + nl.sum(window[:, 0:dh, 0:dw], axis=[1, 2])
                count = (ends_h[i] - starts_h[i]) * (ends_w[j] - starts_w[j])
                result[:, i, j] = nl.divide(total, count)
        nl.store(flat_out[t * P:t * P + p], value=result)
    return out


# Loop-invariant code motion: kernels whose loops repeat an instruction on the same tiles (written
# here for the cost model's tests; x and y are (128, F) fp32).

@nki.jit
def invariant_product(x, y, n=4):
    """The product reads tiles loaded once before the loop: the compiler computes it once."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    xt, yt = nl.load(x), nl.load(y)
    acc = nl.zeros(x.shape, dtype=x.dtype)
    for _ in nl.affine_range(n):
        prod = nisa.tensor_tensor(xt, yt, op=nl.multiply)
        acc[...] += nl.exp(prod)
    nl.store(out, value=acc)
    return out


@nki.jit
def reloaded_product(x, y, n=4):
    """The same product, but each iteration loads x again into the same tile: new contents each time."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    xt = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    yt = nl.load(y)
    acc = nl.zeros(x.shape, dtype=x.dtype)
    for _ in nl.affine_range(n):
        xt[...] = nl.load(x)
        prod = nisa.tensor_tensor(xt, yt, op=nl.multiply)
        acc[...] += nl.exp(prod)
    nl.store(out, value=acc)
    return out


@nki.jit
def accumulated(x, n=4):
    """``acc += x`` with x loaded once: the add reads what its previous execution wrote."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    xt = nl.load(x)
    acc = nl.zeros(x.shape, dtype=x.dtype)
    for _ in nl.affine_range(n):
        acc[...] += xt
    nl.store(out, value=acc)
    return out


@nki.jit
def scaled_per_iteration(x, n=4):
    """The same tile times the loop index: one argument differs in each iteration."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    xt = nl.load(x)
    acc = nl.zeros(x.shape, dtype=x.dtype)
    for i in nl.affine_range(n):
        acc[...] += nl.multiply(xt, float(i))
    nl.store(out, value=acc)
    return out


@nki.jit
def dropped_per_iteration(x, n=4):
    """Dropout of the same tile draws new random numbers in each iteration."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    xt = nl.load(x)
    acc = nl.zeros(x.shape, dtype=x.dtype)
    for _ in nl.affine_range(n):
        acc[...] += nisa.dropout(xt, 0.5)
    nl.store(out, value=acc)
    return out


@nki.jit
def column_planes(x, n=4):
    """Each iteration reads another plane of one tile (every n-th element from the iteration's
    offset): the same bounds, other elements."""
    out = nl.ndarray((1, x.shape[1] // n), dtype=x.dtype, buffer=nl.shared_hbm)
    row = nl.load(x)
    i_r, i_f = nl.arange(1)[:, None], nl.arange(x.shape[1] // n)[None, :]
    acc = nl.zeros((1, x.shape[1] // n), dtype=x.dtype)
    for c in nl.affine_range(n):
        acc[...] += nl.exp(row[i_r, n * i_f + c])
    nl.store(out, value=acc)
    return out
