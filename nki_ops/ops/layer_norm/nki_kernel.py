"""NKI kernels of LayerNorm over the last dimension: the forward and its gradients (dx, dweight, dbias).

The layout is RMSNorm's (``rms_norm/nki_kernel.py``, whose row loading and weight broadcast these
kernels share): x as HBM ``[N, D]`` with rows on the partition axis in tiles of 128 (``tile_range``:
full tiles, then one narrower tail tile), weight and bias as HBM ``[1, D]`` replicated over the
partitions one 512-column chunk at a time by the Tensor engine. The row statistics come from the
Vector engine's ``bn_stats`` (one per chunk of at most ``bn_stats_fmax`` columns) and ``bn_aggr``
(their mean and population variance), which keeps the variance free of the cancellation of
``mean(x**2) - mean(x)**2``. The bias is optional: None means no bias, and no bias gradient.
Written for the current ``nki`` API (NKI 0.6).
"""

from __future__ import annotations

from ...nki_api import nisa, nki, nl
from .._nki_tiling import PARTITIONS, is_float_dtype, kernel_check, tile_range
from ..rms_norm.nki_kernel import _load_rows, _weight_chunk

# Columns per chunk: one PSUM bank of fp32 (a weight or bias broadcast) and one bn_stats instruction.
CHUNK = nl.tile_size.psum_bank_fmax  # 512
STATS = 6  # the values bn_stats gives per partition: count, mean, count * variance of even and odd elements
# dweight and dbias accumulate partition-major in one PSUM bank each: one fp32 column per 128 columns of D.
MAX_D_BACKWARD = PARTITIONS * nl.tile_size.psum_bank_fmax  # 65,536


def _check_inputs(x, weight, bias, eps):
    kernel_check(len(x.shape) == 2, f"x must be HBM [N, D], got shape {x.shape}")
    kernel_check(weight.shape == (1, x.shape[1]), f"weight must be HBM [1, {x.shape[1]}], got shape {weight.shape}")
    kernel_check(bias is None or bias.shape == (1, x.shape[1]),
                 f"bias must be None or HBM [1, {x.shape[1]}], got shape {None if bias is None else bias.shape}")
    kernel_check(is_float_dtype(x.dtype) and is_float_dtype(weight.dtype),
                 f"x and weight must be float32, bfloat16 or float16, got {x.dtype} and {weight.dtype}")
    kernel_check(bias is None or is_float_dtype(bias.dtype),
                 f"bias must be float32, bfloat16 or float16, got {None if bias is None else bias.dtype}")
    kernel_check(eps >= 0.0, f"eps must be a non-negative float, got {eps}")


def _constants(eps):
    """A ``[1, 128]`` ones row (stationary of the weight and bias broadcasts) and a ``[128, 1]`` eps
    column (the rsqrt bias, a vector because trn1's Scalar engine takes no scalar bias)."""
    ones_row = nl.ndarray((1, PARTITIONS), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones_row, value=1.0)
    eps_col = nl.ndarray((PARTITIONS, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=eps_col, value=eps)
    return ones_row, eps_col


def _statistics(x_tile, eps_col, size):
    """The mean and ``1 / sqrt(var + eps)`` of each row of ``x_tile``: two ``[size, 1]`` fp32 tiles.

    One ``bn_stats`` per column chunk writes its six partial statistics side by side; one ``bn_aggr``
    combines them into the row's mean and population variance."""
    chunks = tile_range(x_tile.shape[1], CHUNK)
    stats = nl.ndarray((size, STATS * len(chunks)), dtype=nl.float32, buffer=nl.sbuf)
    for index in range(len(chunks)):
        start, cols = chunks[index]
        nisa.bn_stats(dst=stats[:, STATS * index:STATS * (index + 1)], data=x_tile[:, start:start + cols])
    mean_var = nl.ndarray((size, 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.bn_aggr(dst=mean_var, data=stats)
    inv_std = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=inv_std, op=nl.rsqrt, data=mean_var[:, 1:2], bias=eps_col[0:size, :])
    return mean_var[:, 0:1], inv_std


def _layer_norm_tile(x, weight, bias, out, ones_row, eps_col, start, size):
    x_tile = _load_rows(x, start, size)
    mean, inv_std = _statistics(x_tile, eps_col, size)
    for c0, cols in tile_range(x.shape[1], CHUNK):
        # (x - mean) * w first: x - mean is exact for x near the mean, then one rounding per step.
        scaled = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=scaled, data=x_tile[:, c0:c0 + cols], op0=nl.subtract, operand0=mean,
                                  op1=nl.multiply, operand1=_weight_chunk(weight, ones_row, size, c0, cols))
        y = nl.ndarray((size, cols), dtype=out.dtype, buffer=nl.sbuf)
        if bias is None:
            nisa.tensor_scalar(dst=y, data=scaled, op0=nl.multiply, operand0=inv_std)
        else:
            nisa.scalar_tensor_tensor(dst=y, data=scaled, op0=nl.multiply, operand0=inv_std, op1=nl.add,
                                      operand1=_weight_chunk(bias, ones_row, size, c0, cols))
        nisa.dma_copy(dst=out[start:start + size, c0:c0 + cols], src=y)


@nki.jit
def layer_norm_kernel(x, weight, bias, eps):
    """LayerNorm of each row: ``y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias``.

    Dimensions:
        N: rows (any count), on the partition axis in tiles of 128.
        D: the normalised dimension, on the free axis.

    Args:
        x: HBM ``[N, D]`` float32, bfloat16 or float16.
        weight: HBM ``[1, D]``, any of those dtypes.
        bias: HBM ``[1, D]``, any of those dtypes, or None for no bias.
        eps: python float >= 0 added to the variance before the reciprocal square root.

    Returns:
        HBM ``[N, D]`` in x's dtype.

    Notes:
        Computed in fp32 and rounded once by the last instruction, as the torch reference does. var
        is the population variance (divided by D), from ``bn_stats``/``bn_aggr``. The last
        ``N % 128`` rows form one narrower tile. The row tile stays in SBUF at x's itemsize,
        ``D * itemsize`` bytes per partition plus a few chunk temporaries, so D up to about 45,000
        fits trn1's 192 KiB per partition in fp32 (twice that in bf16).

    Pseudocode:
        for each row tile (start, p):
            xt = x[start:start+p]
            mean, var = bn_aggr(bn_stats(xt[:, c]) for each 512-column chunk c)
            r = rsqrt(var + eps)                                   ([p, 1])
            for each 512-column chunk c:
                out[start:start+p, c] = ((xt[:, c] - mean) * w[c]) * r + b[c]
    """
    _check_inputs(x, weight, bias, eps)
    rows, width = x.shape
    out = nl.ndarray((rows, width), dtype=x.dtype, buffer=nl.shared_hbm)
    ones_row, eps_col = _constants(eps)
    for start, size in tile_range(rows, PARTITIONS):
        _layer_norm_tile(x, weight, bias, out, ones_row, eps_col, start, size)
    return out


def _row_sum(partial, size):
    total = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=total, op=nl.add, data=partial, axis=1, keepdims=True)
    return total


def _layer_norm_backward_tile(grad, x, weight, dx, dw_sums, db_sums, ones_row, ones_col, eps_col, start, size):
    width = x.shape[1]
    x_tile = _load_rows(x, start, size)
    grad_tile = _load_rows(grad, start, size)
    mean, inv_std = _statistics(x_tile, eps_col, size)

    # With gw = g * w and xhat = (x - mean) * r: sum_D(gw), and sum_D((x - mean) * gw) = sum_D(gw * xhat) / r.
    chunks = tile_range(width, CHUNK)
    partial_gw = nl.ndarray((size, len(chunks)), dtype=nl.float32, buffer=nl.sbuf)
    partial_dot = nl.ndarray((size, len(chunks)), dtype=nl.float32, buffer=nl.sbuf)
    for index in range(len(chunks)):
        c0, cols = chunks[index]
        weighted = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=weighted, data1=grad_tile[:, c0:c0 + cols],
                           data2=_weight_chunk(weight, ones_row, size, c0, cols), op=nl.multiply)
        nisa.tensor_reduce(dst=partial_gw[:, index:index + 1], op=nl.add, data=weighted, axis=1, keepdims=True)
        centred = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=centred, data=x_tile[:, c0:c0 + cols], op0=nl.subtract, operand0=mean,
                                  op1=nl.multiply, operand1=weighted)
        nisa.tensor_reduce(dst=partial_dot[:, index:index + 1], op=nl.add, data=centred, axis=1, keepdims=True)
    sum_gw = _row_sum(partial_gw, size)
    dot = _row_sum(partial_dot, size)
    # dx = r * (gw - mean(gw) - xhat * mean(gw * xhat)) = r * gw - r * mean(gw) - (x - mean) * r**3 * dot / D.
    shift = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=shift, data=sum_gw, op0=nl.multiply, operand0=1.0 / width, op1=nl.multiply,
                       operand1=inv_std)
    cube = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=cube, data=inv_std, op0=nl.multiply, operand0=inv_std, op1=nl.multiply, operand1=inv_std)
    projection = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=projection, data=dot, op0=nl.multiply, operand0=1.0 / width, op1=nl.multiply,
                              operand1=cube)

    for c0, cols in chunks:
        x_chunk = x_tile[:, c0:c0 + cols]
        grad_chunk = grad_tile[:, c0:c0 + cols]
        # g * r * w again: recomputing a chunk is cheaper in SBUF than keeping a whole-row tile.
        weighted = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=weighted, data=grad_chunk, op0=nl.multiply, operand0=inv_std,
                                  op1=nl.multiply, operand1=_weight_chunk(weight, ones_row, size, c0, cols))
        projected = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=projected, data=x_chunk, op0=nl.subtract, operand0=mean, op1=nl.multiply,
                           operand1=projection)
        dx_chunk = nl.ndarray((size, cols), dtype=dx.dtype, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=dx_chunk, data=weighted, op0=nl.subtract, operand0=shift, op1=nl.subtract,
                                  operand1=projected)
        nisa.dma_copy(dst=dx[start:start + size, c0:c0 + cols], src=dx_chunk)
        # dweight: the column sums of g * xhat = ((x - mean) * g) * r, a reduction over the partition axis on
        # the Tensor engine as values.T @ r (r, per row, is the moving column), 128 columns at a time, so
        # column j's sum lands on partition j % 128 of PSUM column j // 128, where the row tiles accumulate.
        # dbias: the column sums of g, as values.T @ ones.
        contribution = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=contribution, data=x_chunk, op0=nl.subtract, operand0=mean,
                                  op1=nl.multiply, operand1=grad_chunk)
        for b0, block_cols in tile_range(cols, PARTITIONS):
            block = (c0 + b0) // PARTITIONS
            nisa.nc_matmul(dst=dw_sums[0:block_cols, block:block + 1],
                           stationary=contribution[:, b0:b0 + block_cols], moving=inv_std,
                           accumulate=start > 0)
            if db_sums is not None:
                nisa.nc_matmul(dst=db_sums[0:block_cols, block:block + 1],
                               stationary=grad_chunk[:, b0:b0 + block_cols], moving=ones_col[0:size, :],
                               is_moving_onezero=True, accumulate=start > 0)


def _store_partition_major(sums, out):
    """The ``[128, ceil(D / 128)]`` PSUM column sums (column j on partition ``j % 128``) into HBM ``[D, 1]``."""
    blocks = tile_range(out.shape[0], PARTITIONS)
    staged = nl.ndarray((PARTITIONS, len(blocks)), dtype=out.dtype, buffer=nl.sbuf)
    for index in range(len(blocks)):
        b0, block_cols = blocks[index]
        nisa.tensor_copy(dst=staged[0:block_cols, index:index + 1], src=sums[0:block_cols, index:index + 1])
        nisa.dma_copy(dst=out[b0:b0 + block_cols, 0:1], src=staged[0:block_cols, index:index + 1])


@nki.jit
def layer_norm_backward_kernel(grad, x, weight, bias, eps):
    """Gradients of LayerNorm with respect to x, the weight and the bias, given the output's gradient.

    Dimensions:
        N: rows (any count), on the partition axis in tiles of 128.
        D: the normalised dimension, on the free axis (at most ``MAX_D_BACKWARD``).

    Args:
        grad: HBM ``[N, D]`` gradient of the output, float32, bfloat16 or float16.
        x: HBM ``[N, D]`` float32, bfloat16 or float16 (the forward input).
        weight: HBM ``[1, D]``, any of those dtypes.
        bias: HBM ``[1, D]`` or None, as in the forward: only whether it is given matters (its dtype is
            dbias's), as the bias does not enter the other gradients.
        eps: python float >= 0, as in the forward.

    Returns:
        ``(dx, dweight, dbias)``, or ``(dx, dweight)`` without a bias: HBM ``[N, D]`` in x's dtype and
        HBM ``[D, 1]`` in the weight's and the bias's dtypes, with ``r = 1 / sqrt(var(x) + eps)``,
        ``xhat = (x - mean(x)) * r`` and ``gw = grad * weight``:
        ``dx = r * (gw - mean_D(gw) - xhat * mean_D(gw * xhat))``, ``dweight = sum_N(grad * xhat)``,
        ``dbias = sum_N(grad)``.

    Notes:
        Computed in fp32; the mean and r are recomputed from x per tile rather than saved by the
        forward. dweight and dbias are reduced over the rows of a tile by matmuls of 128-column
        blocks with a column vector (r for dweight, ones for dbias), each giving a ``[128, 1]``
        column of sums, and accumulated across row tiles in PSUM (``accumulate=True`` after the
        first row tile), each in one ``[128, ceil(D / 128)]`` fp32 bank holding the sums
        partition-major (column j on partition ``j % 128``): hence the ``[D, 1]`` results and D at
        most 65,536. SBUF holds x and grad row tiles at their itemsize, ``2 * D * itemsize`` bytes
        per partition, so D up to about 22,000 fits trn1's 192 KiB per partition in fp32 (twice
        that in bf16).

    Pseudocode:
        for each row tile (start, p):
            xt, gt = x[start:start+p], grad[start:start+p]
            mean, r = statistics of xt, as in the forward
            s = sum_D(gt * w); dot = sum_D((xt - mean) * gt * w)
            for each 512-column chunk c:
                dx[start:start+p, c] = gt[:, c] * r * w[c] - r * s / D - (xt[:, c] - mean) * r**3 * dot / D
                dw_psum[:, blocks of c] += ((xt[:, c] - mean) * gt[:, c]).T @ r
                db_psum[:, blocks of c] += gt[:, c].T @ ones
        dweight, dbias = dw_psum, db_psum, partition-major
    """
    _check_inputs(x, weight, bias, eps)
    rows, width = x.shape
    kernel_check(grad.shape == x.shape, f"grad must have x's shape {x.shape}, got {grad.shape}")
    kernel_check(is_float_dtype(grad.dtype), f"grad must be float32, bfloat16 or float16, got {grad.dtype}")
    kernel_check(width <= MAX_D_BACKWARD,
                 f"D must be at most {MAX_D_BACKWARD} (dweight accumulates in one PSUM bank), got {width}")
    dx = nl.ndarray((rows, width), dtype=x.dtype, buffer=nl.shared_hbm)
    dw = nl.ndarray((width, 1), dtype=weight.dtype, buffer=nl.shared_hbm)
    ones_row, eps_col = _constants(eps)
    blocks = len(tile_range(width, PARTITIONS))
    dw_sums = nl.ndarray((PARTITIONS, blocks), dtype=nl.float32, buffer=nl.psum)
    db_sums = None
    ones_col = None
    if bias is not None:
        db_sums = nl.ndarray((PARTITIONS, blocks), dtype=nl.float32, buffer=nl.psum)
        # In grad's dtype: an fp32 matmul operand needs an fp32 partner (nc_matmul page), and g * 1 is exact.
        ones_col = nl.ndarray((PARTITIONS, 1), dtype=grad.dtype, buffer=nl.sbuf)
        nisa.memset(dst=ones_col, value=1.0)
    for start, size in tile_range(rows, PARTITIONS):
        _layer_norm_backward_tile(grad, x, weight, dx, dw_sums, db_sums, ones_row, ones_col, eps_col, start, size)
    _store_partition_major(dw_sums, dw)
    if bias is None:
        return dx, dw
    db = nl.ndarray((width, 1), dtype=bias.dtype, buffer=nl.shared_hbm)
    _store_partition_major(db_sums, db)
    return dx, dw, db
