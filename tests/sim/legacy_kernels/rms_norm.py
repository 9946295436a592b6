"""Legacy-dialect NKI kernels of RMSNorm over the last dimension: the forward and its gradient (dx, dw), any row count.

Both kernels take x as HBM ``[N, D]`` (any leading shape flattened into N rows) and the weight as
HBM ``[1, D]``. Rows go on the partition axis in tiles of 128: the full tiles in a loop, then one
narrower tail tile, so any row count works without masks. A row tile is loaded whole; every
computation on it walks the free axis in column chunks of 512, loading the weight one chunk at a
time, so only the row tiles themselves grow with D.
"""

from __future__ import annotations

from nki_ops.sim import nisa, nki, nl

from ._tiling import PARTITIONS, for_each_tile

# Columns per chunk: wide enough to keep each engine instruction busy, narrow enough that a chunk's
# fp32 temporaries take 2 KiB of each partition.
CHUNK = 512


def _column_chunks(width, chunk=CHUNK):
    """``(start, stop)`` of the column chunks of a ``width``-wide row: ``chunk`` wide, the last narrower."""
    return [(start, min(start + chunk, width)) for start in range(0, width, chunk)]


def _inverse_rms(x_tile, eps):
    """``1 / sqrt(mean(x**2) + eps)`` of each row of ``x_tile``, as a ``[rows, 1]`` fp32 tile."""
    rows, width = x_tile.shape
    sum_sq = nl.zeros((rows, 1), dtype=nl.float32)
    for start, stop in _column_chunks(width):
        sum_sq += nl.sum(nl.square(x_tile[:, start:stop], dtype=nl.float32), axis=[1], keepdims=True)
    return nl.rsqrt(nl.add(nl.divide(sum_sq, float(width)), eps))


def _weight_chunk(weight, rows, start, stop):
    """Columns ``start:stop`` of the ``[1, D]`` weight as an fp32 ``[rows, stop - start]`` tile, one copy per row.

    Loaded per chunk rather than once per kernel: a whole broadcast weight would take ``4 * D``
    bytes of every partition, and a chunk's load is 1/128 of the row tile's traffic."""
    return nl.load(weight[0:1, start:stop], dtype=nl.float32).broadcast_to((rows, stop - start))


def _rms_norm_tile(x, weight, out, start, size, eps):
    x_tile = nl.load(x[start:start + size, :])
    inv_rms = _inverse_rms(x_tile, eps)
    for c0, c1 in _column_chunks(x.shape[1]):
        normed = nl.multiply(x_tile[:, c0:c1], inv_rms, dtype=nl.float32)
        nl.store(out[start:start + size, c0:c1],
                 nl.multiply(normed, _weight_chunk(weight, size, c0, c1), dtype=out.dtype))


@nki.jit
def rms_norm_kernel(x, weight, eps):
    """RMSNorm of each row: ``y = x / sqrt(mean(x**2) + eps) * weight``.

    Dimensions:
        N: rows (any count), on the partition axis in tiles of 128.
        D: the normalised dimension, on the free axis.

    Args:
        x: HBM ``[N, D]`` float32, bfloat16 or float16.
        weight: HBM ``[1, D]``, any of those dtypes.
        eps: python float added to the mean square before the reciprocal square root.

    Returns:
        HBM ``[N, D]`` in x's dtype.

    Notes:
        Computed in fp32 and rounded once on the last multiply, as the torch reference does. The
        last ``N % 128`` rows form one narrower tile. D is walked in 512-column chunks for the
        sum of squares and for the output. The row tile stays in SBUF: ``D * itemsize`` bytes
        per partition plus a few chunk temporaries, so D up to about 45,000 fits trn1's 192 KiB
        per partition in fp32 (twice that in bf16).
    """
    rows, width = x.shape
    out = nl.ndarray((rows, width), dtype=x.dtype, buffer=nl.shared_hbm)
    for_each_tile(rows, PARTITIONS, lambda start, size: _rms_norm_tile(x, weight, out, start, size, eps))
    return out


def _rms_norm_backward_tile(grad, x, weight, ones, dx, dw_sum, start, size, eps):
    rows = slice(start, start + size)
    width = x.shape[1]
    x_tile = nl.load(x[rows, :])
    grad_tile = nl.load(grad[rows, :])
    inv_rms = _inverse_rms(x_tile, eps)

    # dot = sum_D(g * w * x); the projection coefficient of dx is r**3 / D * dot.
    dot = nl.zeros((size, 1), dtype=nl.float32)
    for c0, c1 in _column_chunks(width):
        weighted = nl.multiply(grad_tile[:, c0:c1], _weight_chunk(weight, size, c0, c1), dtype=nl.float32)
        dot += nl.sum(nl.multiply(weighted, x_tile[:, c0:c1], dtype=nl.float32), axis=[1], keepdims=True)
    projection = nl.multiply(nl.multiply(nl.multiply(inv_rms, inv_rms), inv_rms), nl.divide(dot, float(width)))

    for c0, c1 in _column_chunks(width):
        x_chunk = x_tile[:, c0:c1]
        grad_chunk = grad_tile[:, c0:c1]
        # g * w again: recomputing a chunk is cheaper in SBUF than keeping a whole-row tile.
        weighted = nl.multiply(grad_chunk, _weight_chunk(weight, size, c0, c1), dtype=nl.float32)
        dx_chunk = nl.subtract(nl.multiply(weighted, inv_rms, dtype=nl.float32),
                               nl.multiply(x_chunk, projection, dtype=nl.float32), dtype=dx.dtype)
        nl.store(dx[rows, c0:c1], dx_chunk)
        # dw: the column sums of g * x * r, a reduction over the partition axis done on the Tensor
        # engine as values.T @ ones, 128 columns at a time, so column j's sum lands on partition j % 128.
        contribution = nl.multiply(grad_chunk, nl.multiply(x_chunk, inv_rms, dtype=nl.float32),
                                   dtype=nl.float32)
        for b0, b1 in _column_chunks(c1 - c0, PARTITIONS):
            block = (c0 + b0) // PARTITIONS
            column_sums = nisa.nc_matmul(contribution[:, b0:b1], ones[0:size, :])
            dw_sum[0:b1 - b0, block:block + 1] = nl.add(dw_sum[0:b1 - b0, block:block + 1], column_sums)


@nki.jit
def rms_norm_backward_kernel(grad, x, weight, eps):
    """Gradients of RMSNorm with respect to x and the weight, given the gradient of the output.

    Dimensions:
        N: rows (any count), on the partition axis in tiles of 128.
        D: the normalised dimension, on the free axis.

    Args:
        grad: HBM ``[N, D]`` gradient of the output, in x's dtype.
        x: HBM ``[N, D]`` float32, bfloat16 or float16 (the forward input).
        weight: HBM ``[1, D]``, any of those dtypes.
        eps: python float, as in the forward.

    Returns:
        ``(dx, dw)``: HBM ``[N, D]`` in x's dtype and HBM ``[D, 1]`` in the weight's dtype, with
        ``r = 1 / sqrt(mean(x**2) + eps)``, ``gw = grad * weight``:
        ``dx = r * gw - x * r**3 / D * sum_D(gw * x)`` and ``dw = sum_N(grad * x * r)``.

    Notes:
        Computed in fp32; r is recomputed from x per tile rather than saved by the forward. dw is
        reduced over the rows of a tile by fp32 matmuls of 128-column blocks with a ones vector,
        each giving a ``[128, 1]`` column of sums, and accumulated across row tiles in an fp32
        SBUF tile ``[128, ceil(D / 128)]`` that holds dw partition-major (column j on partition
        ``j % 128``): ``4 * ceil(D / 128)`` bytes per partition, which is why dw is returned as
        ``[D, 1]``. The running sum makes the row-tile loop a ``sequential_range``. SBUF holds x
        and grad row tiles at their itemsize, ``2 * D * itemsize`` bytes per partition, so D up
        to about 22,000 fits trn1's 192 KiB per partition in fp32 (twice that in bf16).
    """
    rows, width = x.shape
    dx = nl.ndarray((rows, width), dtype=x.dtype, buffer=nl.shared_hbm)
    dw = nl.ndarray((width, 1), dtype=weight.dtype, buffer=nl.shared_hbm)
    ones = nl.ones((PARTITIONS, 1), dtype=nl.float32)
    blocks = _column_chunks(width, PARTITIONS)
    dw_sum = nl.zeros((PARTITIONS, len(blocks)), dtype=nl.float32)
    for_each_tile(rows, PARTITIONS,
                  lambda start, size: _rms_norm_backward_tile(grad, x, weight, ones, dx, dw_sum, start, size, eps),
                  loop=nl.sequential_range)
    for block, (b0, b1) in enumerate(blocks):
        nl.store(dw[b0:b1, 0:1], nl.copy(dw_sum[0:b1 - b0, block:block + 1], dtype=weight.dtype))
    return dx, dw
