"""Matrix-multiplication kernels written here from the NKI matmul tutorial's description, one per
published optimisation step (trn1, M=4096, K=8192, N=8192, bf16: 51.8, 42.96, 22.07, 6.97 ms), for
the cost model's calibration test. Inputs: lhsT (K, M) and rhs (K, N); output (M, N)."""

from __future__ import annotations

from nki_ops.sim import nki, nl

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
