"""NKI kernels of RMSNorm over the last dimension: the forward and its gradient (dx, dw), any row count.

Both kernels take x as HBM ``[N, D]`` (any leading shape flattened into N rows) and the weight as
HBM ``[1, D]``. Rows go on the partition axis in tiles of 128 (``tile_range``: the full tiles,
then one narrower tail tile), so any row count works without masks. A row tile is loaded whole, in
its own dtype; every computation on it walks the free axis in column chunks of 512, and each
chunk's weight row is replicated over the partitions by the Tensor engine (ones.T @ row into
PSUM), so only the row tiles themselves grow with D. Written for the current ``nki`` API (NKI 0.6).
"""

from __future__ import annotations

from ...nki_api import nisa, nki, nl
from .._nki_tiling import PARTITIONS, is_float_dtype, kernel_check, tile_range

# Columns per chunk: one PSUM bank of fp32 (the weight broadcast of a chunk), and wide enough to
# keep each engine instruction busy while a chunk's fp32 temporaries take 2 KiB of each partition.
CHUNK = nl.tile_size.psum_bank_fmax  # 512
# dw accumulates partition-major in one PSUM bank: one fp32 column per 128 weights.
MAX_D_BACKWARD = PARTITIONS * nl.tile_size.psum_bank_fmax  # 65,536


def _check_inputs(x, weight, eps):
    kernel_check(len(x.shape) == 2, f"x must be HBM [N, D], got shape {x.shape}")
    kernel_check(weight.shape == (1, x.shape[1]), f"weight must be HBM [1, {x.shape[1]}], got shape {weight.shape}")
    kernel_check(is_float_dtype(x.dtype) and is_float_dtype(weight.dtype),
                 f"x and weight must be float32, bfloat16 or float16, got {x.dtype} and {weight.dtype}")
    kernel_check(eps >= 0.0, f"eps must be a non-negative float, got {eps}")


def _constants(eps):
    """The per-kernel constant tiles: a ``[1, 128]`` ones row (stationary of the weight broadcast), a
    ``[128, 1]`` ones column (moving of the dw column sums) and a ``[128, 1]`` eps column (the rsqrt bias,
    a vector because trn1's Scalar engine takes no scalar bias)."""
    ones_row = nl.ndarray((1, PARTITIONS), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones_row, value=1.0)
    ones_col = nl.ndarray((PARTITIONS, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones_col, value=1.0)
    eps_col = nl.ndarray((PARTITIONS, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=eps_col, value=eps)
    return ones_row, ones_col, eps_col


def _load_rows(hbm, start, size):
    """Rows ``start .. start + size`` of an HBM tensor as an SBUF tile in its own dtype (half the SBUF of
    fp32 for half types; every engine reads it as fp32 anyway)."""
    tile = nl.ndarray((size, hbm.shape[1]), dtype=hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=hbm[start:start + size, :])
    return tile


def _inverse_rms(x_tile, eps_col, size, chunk):
    """``1 / sqrt(mean(x**2) + eps)`` of each row of ``x_tile``, as a ``[size, 1]`` fp32 tile.

    Each column chunk's sum of squares is one Scalar-engine instruction (square, then add-reduce)
    into its own column of a ``[size, chunks]`` tile, which one Vector-engine reduction sums."""
    width = x_tile.shape[1]
    chunks = tile_range(width, chunk)
    partial = nl.ndarray((size, len(chunks)), dtype=nl.float32, buffer=nl.sbuf)
    for index in range(len(chunks)):
        start, cols = chunks[index]
        squares = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=squares, op=nl.square, data=x_tile[:, start:start + cols], reduce_op=nl.add,
                               reduce_res=partial[:, index:index + 1])
    sum_sq = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=sum_sq, op=nl.add, data=partial, axis=1, keepdims=True)
    inv_rms = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=inv_rms, op=nl.rsqrt, data=sum_sq, scale=1.0 / width, bias=eps_col[0:size, :])
    return inv_rms


def _weight_chunk(weight, ones_row, size, start, cols):
    """Columns ``start .. start + cols`` of the ``[1, D]`` weight on ``size`` partitions, an fp32 PSUM tile.

    ones[1, size].T @ row[1, cols] on the Tensor engine replicates the row; loading the weight per
    chunk keeps SBUF free of a ``4 * D``-byte weight copy and costs a ``cols``-element DMA."""
    row = nl.ndarray((1, cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=row, src=weight[0:1, start:start + cols])
    replicated = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=replicated, stationary=ones_row[0:1, 0:size], moving=row, is_stationary_onezero=True,
                   accumulate=False)
    return replicated


def _rms_norm_tile(x, weight, out, ones_row, eps_col, start, size, chunk):
    x_tile = _load_rows(x, start, size)
    inv_rms = _inverse_rms(x_tile, eps_col, size, chunk)
    for c0, cols in tile_range(x.shape[1], chunk):
        # (x * r) * w in fp32, the reference's order, rounded once to the output dtype.
        y = nl.ndarray((size, cols), dtype=out.dtype, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=y, data=x_tile[:, c0:c0 + cols], op0=nl.multiply, operand0=inv_rms,
                                  op1=nl.multiply, operand1=_weight_chunk(weight, ones_row, size, c0, cols))
        nisa.dma_copy(dst=out[start:start + size, c0:c0 + cols], src=y)


@nki.jit
def rms_norm_kernel(x, weight, eps, chunk=CHUNK):
    """RMSNorm of each row: ``y = x / sqrt(mean(x**2) + eps) * weight``.

    Dimensions:
        N: rows (any count), on the partition axis in tiles of 128.
        D: the normalised dimension, on the free axis.

    Args:
        x: HBM ``[N, D]`` float32, bfloat16 or float16.
        weight: HBM ``[1, D]``, any of those dtypes.
        eps: python float >= 0 added to the mean square before the reciprocal square root.
        chunk: columns per engine instruction along D, 1 to 512 (one PSUM bank of the weight broadcast);
            a tiling choice that changes the time, not the values beyond fp32 rounding (``tuning.py``).

    Returns:
        HBM ``[N, D]`` in x's dtype.

    Notes:
        Computed in fp32 and rounded once by the last instruction, as the torch reference does;
        the mean is the sum of squares times ``1 / D`` (the Scalar engine's scale), within an fp32
        ulp of the reference's division. The last ``N % 128`` rows form one narrower tile. D is
        walked in 512-column chunks for the sum of squares and for the output. The row tile stays
        in SBUF at x's itemsize: ``D * itemsize`` bytes per partition plus a few chunk temporaries,
        so D up to about 45,000 fits trn1's 192 KiB per partition in fp32 (twice that in bf16).

    Pseudocode:
        for each row tile (start, p):
            xt = x[start:start+p]
            r = rsqrt(sum_D(xt**2) / D + eps)          ([p, 1])
            for each 512-column chunk c:
                out[start:start+p, c] = (xt[:, c] * r) * broadcast(weight[0, c])
    """
    _check_inputs(x, weight, eps)
    kernel_check(1 <= chunk <= CHUNK, f"chunk must be 1 to {CHUNK} columns (one PSUM bank), got {chunk}")
    rows, width = x.shape
    out = nl.ndarray((rows, width), dtype=x.dtype, buffer=nl.shared_hbm)
    ones_row, _, eps_col = _constants(eps)
    for start, size in tile_range(rows, PARTITIONS):
        _rms_norm_tile(x, weight, out, ones_row, eps_col, start, size, chunk)
    return out


def _rms_norm_backward_tile(grad, x, weight, dx, dw_sums, ones_row, ones_col, eps_col, start, size, chunk):
    width = x.shape[1]
    x_tile = _load_rows(x, start, size)
    grad_tile = _load_rows(grad, start, size)
    inv_rms = _inverse_rms(x_tile, eps_col, size, chunk)

    # dot = sum_D(g * w * x): one column of partial sums per chunk, then their sum.
    chunks = tile_range(width, chunk)
    partial = nl.ndarray((size, len(chunks)), dtype=nl.float32, buffer=nl.sbuf)
    for index in range(len(chunks)):
        c0, cols = chunks[index]
        weighted = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=weighted, data1=grad_tile[:, c0:c0 + cols],
                           data2=_weight_chunk(weight, ones_row, size, c0, cols), op=nl.multiply)
        products = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=products, data1=weighted, data2=x_tile[:, c0:c0 + cols], op=nl.multiply)
        nisa.tensor_reduce(dst=partial[:, index:index + 1], op=nl.add, data=products, axis=1, keepdims=True)
    dot = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=dot, op=nl.add, data=partial, axis=1, keepdims=True)
    # The projection coefficient of dx: r**3 * dot / D.
    cube = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=cube, data=inv_rms, op0=nl.multiply, operand0=inv_rms, op1=nl.multiply, operand1=inv_rms)
    projection = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=projection, data=dot, op0=nl.multiply, operand0=1.0 / width, op1=nl.multiply,
                              operand1=cube)

    for c0, cols in chunks:
        x_chunk = x_tile[:, c0:c0 + cols]
        grad_chunk = grad_tile[:, c0:c0 + cols]
        # g * w again: recomputing a chunk is cheaper in SBUF than keeping a whole-row tile.
        weighted = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=weighted, data1=grad_chunk, data2=_weight_chunk(weight, ones_row, size, c0, cols),
                           op=nl.multiply)
        projected = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=projected, data=x_chunk, op0=nl.multiply, operand0=projection)
        dx_chunk = nl.ndarray((size, cols), dtype=dx.dtype, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=dx_chunk, data=weighted, op0=nl.multiply, operand0=inv_rms, op1=nl.subtract,
                                  operand1=projected)
        nisa.dma_copy(dst=dx[start:start + size, c0:c0 + cols], src=dx_chunk)
        # dw: the column sums of (x * r) * g, a reduction over the partition axis done on the Tensor
        # engine as values.T @ ones, 128 columns at a time, so column j's sum lands on partition
        # j % 128 of PSUM column j // 128, where the row tiles accumulate.
        contribution = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=contribution, data=x_chunk, op0=nl.multiply, operand0=inv_rms,
                                  op1=nl.multiply, operand1=grad_chunk)
        for b0, block_cols in tile_range(cols, PARTITIONS):
            block = (c0 + b0) // PARTITIONS
            nisa.nc_matmul(dst=dw_sums[0:block_cols, block:block + 1],
                           stationary=contribution[:, b0:b0 + block_cols], moving=ones_col[0:size, :],
                           is_moving_onezero=True, accumulate=start > 0)


@nki.jit
def rms_norm_backward_kernel(grad, x, weight, eps, chunk=CHUNK):
    """Gradients of RMSNorm with respect to x and the weight, given the gradient of the output.

    Dimensions:
        N: rows (any count), on the partition axis in tiles of 128.
        D: the normalised dimension, on the free axis (at most ``MAX_D_BACKWARD``).

    Args:
        grad: HBM ``[N, D]`` gradient of the output, float32, bfloat16 or float16.
        x: HBM ``[N, D]`` float32, bfloat16 or float16 (the forward input).
        weight: HBM ``[1, D]``, any of those dtypes.
        eps: python float >= 0, as in the forward.
        chunk: columns per engine instruction along D: 128, 256, 384 or 512 (whole 128-column blocks of
            dw; at most one PSUM bank of the weight broadcast); a tiling choice (``tuning.py``).

    Returns:
        ``(dx, dw)``: HBM ``[N, D]`` in x's dtype and HBM ``[D, 1]`` in the weight's dtype, with
        ``r = 1 / sqrt(mean(x**2) + eps)``, ``gw = grad * weight``:
        ``dx = r * gw - x * r**3 / D * sum_D(gw * x)`` and ``dw = sum_N(grad * x * r)``.

    Notes:
        Computed in fp32; r is recomputed from x per tile rather than saved by the forward. dw is
        reduced over the rows of a tile by fp32 matmuls of 128-column blocks with a ones vector,
        each giving a ``[128, 1]`` column of sums, and accumulated across row tiles in PSUM
        (``accumulate=True`` after the first row tile) in one ``[128, ceil(D / 128)]`` fp32 bank
        that holds dw partition-major (column j on partition ``j % 128``), which is why dw is
        returned as ``[D, 1]`` and why D is at most 65,536. SBUF holds x and grad row tiles at
        their itemsize, ``2 * D * itemsize`` bytes per partition, so D up to about 22,000 fits
        trn1's 192 KiB per partition in fp32 (twice that in bf16).

    Pseudocode:
        for each row tile (start, p):
            xt, gt = x[start:start+p], grad[start:start+p]
            r = rsqrt(sum_D(xt**2) / D + eps)
            dot = sum_D(gt * w * xt); proj = r**3 * dot / D
            for each 512-column chunk c:
                dx[start:start+p, c] = (gt[:, c] * w[c]) * r - xt[:, c] * proj
                dw_psum[:, blocks of c] += ((xt[:, c] * r) * gt[:, c]).T @ ones
        dw = dw_psum, partition-major
    """
    _check_inputs(x, weight, eps)
    rows, width = x.shape
    kernel_check(grad.shape == x.shape, f"grad must have x's shape {x.shape}, got {grad.shape}")
    kernel_check(is_float_dtype(grad.dtype), f"grad must be float32, bfloat16 or float16, got {grad.dtype}")
    kernel_check(width <= MAX_D_BACKWARD,
                 f"D must be at most {MAX_D_BACKWARD} (dw accumulates in one PSUM bank), got {width}")
    kernel_check(chunk in (128, 256, 384, 512),
                 f"chunk must be 128, 256, 384 or 512 columns (whole dw blocks, one PSUM bank), got {chunk}")
    dx = nl.ndarray((rows, width), dtype=x.dtype, buffer=nl.shared_hbm)
    dw = nl.ndarray((width, 1), dtype=weight.dtype, buffer=nl.shared_hbm)
    ones_row, ones_col, eps_col = _constants(eps)
    blocks = tile_range(width, PARTITIONS)
    dw_sums = nl.ndarray((PARTITIONS, len(blocks)), dtype=nl.float32, buffer=nl.psum)
    for start, size in tile_range(rows, PARTITIONS):
        _rms_norm_backward_tile(grad, x, weight, dx, dw_sums, ones_row, ones_col, eps_col, start, size, chunk)
    dw_tile = nl.ndarray((PARTITIONS, len(blocks)), dtype=weight.dtype, buffer=nl.sbuf)
    for index in range(len(blocks)):
        b0, block_cols = blocks[index]
        nisa.tensor_copy(dst=dw_tile[0:block_cols, index:index + 1], src=dw_sums[0:block_cols, index:index + 1])
        nisa.dma_copy(dst=dw[b0:b0 + block_cols, 0:1], src=dw_tile[0:block_cols, index:index + 1])
    return dx, dw
