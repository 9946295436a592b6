"""NKI kernel of pairwise IoU: ``boxes1[N, 4] x boxes2[M, 4] -> [N, M]`` for any N and M.

boxes1 goes on the partition axis (128 rows to a tile, then one narrower tail tile), boxes2 along
the free axis (chunks of up to ``CHUNK`` boxes, then one narrower tail chunk): both walks are
``tile_range``, so any box counts work without masks. Each boxes2 chunk is loaded once, already
replicated over the partitions by the DMA, and reused by every row tile of boxes1. Written for the
current ``nki`` API (NKI 0.6).
"""

from __future__ import annotations

from ...nki_api import nisa, nki, nl
from .._nki_tiling import PARTITIONS, is_float_dtype, kernel_check, tile_range
from .reference import BOX_IOU_EPS

# boxes2 per chunk: the chunk's [128, 4 * 512] fp32 coordinates and its area plane take 10 KiB per
# partition and each row tile's ~10 fp32 temporaries another 20 KiB, well inside the SBUF partition.
CHUNK = 512


def _plane(size, width, dtype=nl.float32):
    """A new ``[size, width]`` SBUF tile (fp32 unless said otherwise)."""
    return nl.ndarray((size, width), dtype=dtype, buffer=nl.sbuf)


def _broadcast_chunk(boxes2, start, width, rows):
    """boxes2 ``start .. start + width`` as a ``[rows, 4 * width]`` fp32 tile holding the same boxes on
    every partition, and their areas as a ``[rows, width]`` plane."""
    # One DMA of the chunk's 4 * width contiguous values, read once per partition: the HBM view's
    # partition dimension has stride 0 (a broadcast view, legal on HBM, not on chip).
    row = boxes2.reshape((1, 4 * boxes2.shape[0]))[0:1, 4 * start:4 * (start + width)]
    chunk = _plane(rows, 4 * width)
    nisa.dma_copy(dst=chunk, src=row.broadcast(0, rows))
    bw = _plane(rows, width)
    nisa.tensor_tensor(dst=bw, data1=chunk[:, 2::4], data2=chunk[:, 0::4], op=nl.subtract)
    bh = _plane(rows, width)
    nisa.tensor_tensor(dst=bh, data1=chunk[:, 3::4], data2=chunk[:, 1::4], op=nl.subtract)
    area = _plane(rows, width)
    nisa.tensor_tensor(dst=area, data1=bw, data2=bh, op=nl.multiply)
    return chunk, area


def _overlap(lo_a, hi_a, lo_b, hi_b, size, width):
    """``min(hi_a, hi_b) - max(lo_a, lo_b)`` of ``[size, 1]`` boxes1 columns against ``[size, width]``
    boxes2 planes (the columns are the per-partition scalar operands), not yet clamped."""
    hi = _plane(size, width)
    nisa.tensor_scalar(dst=hi, data=hi_b, op0=nl.minimum, operand0=hi_a)
    extent = _plane(size, width)
    # reverse1: hi - max(lo_b, lo_a), the operand on the left of the subtraction.
    nisa.scalar_tensor_tensor(dst=extent, data=lo_b, op0=nl.maximum, operand0=lo_a, op1=nl.subtract,
                              operand1=hi, reverse1=True)
    return extent


def _iou_tile(boxes1, chunk, area_b, out, row_start, size, col_start, width):
    a = _plane(size, 4)
    nisa.dma_copy(dst=a, src=boxes1[row_start:row_start + size, :])
    # The first `size` partitions of the chunk planes (a contiguous partition range from 0).
    b = chunk[0:size, :]
    iw = _plane(size, width)
    nisa.tensor_scalar(dst=iw, data=_overlap(a[:, 0:1], a[:, 2:3], b[:, 0::4], b[:, 2::4], size, width),
                       op0=nl.maximum, operand0=0.0)
    inter = _plane(size, width)
    nisa.scalar_tensor_tensor(dst=inter, data=_overlap(a[:, 1:2], a[:, 3:4], b[:, 1::4], b[:, 3::4], size, width),
                              op0=nl.maximum, operand0=0.0, op1=nl.multiply, operand1=iw)

    # area_a: one [size, 1] column, the per-partition operand of the union.
    aw = _plane(size, 1)
    nisa.tensor_tensor(dst=aw, data1=a[:, 2:3], data2=a[:, 0:1], op=nl.subtract)
    ah = _plane(size, 1)
    nisa.tensor_tensor(dst=ah, data1=a[:, 3:4], data2=a[:, 1:2], op=nl.subtract)
    area_a = _plane(size, 1)
    nisa.tensor_tensor(dst=area_a, data1=aw, data2=ah, op=nl.multiply)
    # (area_a + area_b) - inter, the reference's order, so the fp32 unions agree; then clamp at eps.
    union = _plane(size, width)
    nisa.scalar_tensor_tensor(dst=union, data=area_b[0:size, :], op0=nl.add, operand0=area_a, op1=nl.subtract,
                              operand1=inter)
    nisa.tensor_scalar(dst=union, data=union, op0=nl.maximum, operand0=BOX_IOU_EPS)
    # No divide ALU operator: inter * (1 / union), within an fp32 ulp or so of the reference's quotient.
    inverse = _plane(size, width)
    nisa.reciprocal(dst=inverse, data=union)
    iou = _plane(size, width, out.dtype)
    nisa.tensor_tensor(dst=iou, data1=inter, data2=inverse, op=nl.multiply)
    nisa.dma_copy(dst=out[row_start:row_start + size, col_start:col_start + width], src=iou)


@nki.jit
def box_iou_kernel(boxes1, boxes2):
    """IoU of every pair of xyxy boxes.

    Dimensions:
        N: boxes1 count (any), the partition axis of the tiles.
        M: boxes2 count (any), the free axis of the tiles.

    Args:
        boxes1: HBM ``[N, 4]`` float32, bfloat16 or float16, xyxy.
        boxes2: HBM ``[M, 4]``, same dtype.

    Returns:
        HBM ``[N, M]`` IoU in the input dtype.

    Notes:
        Computed in fp32 (the loads cast) and rounded once, by the last instruction, to the output
        dtype. The union is clamped at ``BOX_IOU_EPS``, so zero-area pairs give 0, as in the torch
        reference; there is no divide ALU operator, so the quotient is ``nisa.reciprocal`` and a
        multiply, within an fp32 ulp or so of the reference's division. N > 0 and M > 0 (the host
        wrapper returns empty results without launching).

        Layout: boxes1 rows are tiled 128 to a tile (last ``N % 128`` rows form one narrower
        tile); each coordinate is a ``[p, 1]`` column, the per-partition scalar operand of
        ``tensor_scalar``/``scalar_tensor_tensor``. boxes2 is cut into chunks of ``CHUNK`` boxes
        (last ``M % CHUNK`` form one narrower chunk); each chunk is one DMA of its ``4 * m``
        contiguous values through a stride-0 partition view of HBM, so it arrives replicated on
        ``min(N, 128)`` partitions, and its coordinate planes are strided views (``c::4``). Its
        area plane is computed once per chunk. Per row tile: one ``[p, 4]`` load, 8 Vector-engine
        instructions on ``[p, m]`` and one store.

    Pseudocode:
        for each boxes2 chunk (c0, m):
            b = boxes2[c0:c0+m] on every partition; area_b = (b.x2 - b.x1) * (b.y2 - b.y1)
            for each boxes1 row tile (r0, p):
                a = boxes1[r0:r0+p]   ([p, 4] columns)
                inter = max(min(b.x2, a.x2) - max(b.x1, a.x1), 0) * max(min(b.y2, a.y2) - max(b.y1, a.y1), 0)
                union = max(area(a) + area_b - inter, eps)
                out[r0:r0+p, c0:c0+m] = inter * rcp(union)
    """
    kernel_check(len(boxes1.shape) == 2 and boxes1.shape[1] == 4 and boxes1.shape[0] > 0,
                 f"boxes1 must be HBM [N, 4] with N > 0, got shape {boxes1.shape}")
    kernel_check(len(boxes2.shape) == 2 and boxes2.shape[1] == 4 and boxes2.shape[0] > 0,
                 f"boxes2 must be HBM [M, 4] with M > 0, got shape {boxes2.shape}")
    kernel_check(is_float_dtype(boxes1.dtype) and boxes2.dtype == boxes1.dtype,
                 f"boxes must both be float32, bfloat16 or float16, got {boxes1.dtype} and {boxes2.dtype}")
    rows = boxes1.shape[0]
    out = nl.ndarray((rows, boxes2.shape[0]), dtype=boxes1.dtype, buffer=nl.shared_hbm)
    for col_start, width in tile_range(boxes2.shape[0], CHUNK):
        chunk, area_b = _broadcast_chunk(boxes2, col_start, width, min(rows, PARTITIONS))
        for row_start, size in tile_range(rows, PARTITIONS):
            _iou_tile(boxes1, chunk, area_b, out, row_start, size, col_start, width)
    return out
