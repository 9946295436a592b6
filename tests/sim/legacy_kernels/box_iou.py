"""Legacy-dialect NKI kernel of pairwise IoU: ``boxes1[N, 4] x boxes2[M, 4] -> [N, M]`` for any N and M.

boxes1 goes on the partition axis (128 rows to a tile, then one narrower tail tile), boxes2 along
the free axis (chunks of up to ``CHUNK`` boxes, then one narrower tail chunk), so any box counts
work without masks. Each boxes2 chunk is loaded once as a single-partition row and broadcast
over the 128 partitions, then reused by every row tile of boxes1.
"""

from __future__ import annotations

from nki_ops.ops.box_iou.reference import BOX_IOU_EPS
from nki_ops.sim import nki, nl

from ._tiling import PARTITIONS, for_each_tile

# boxes2 per chunk: the five broadcast [128, 512] fp32 planes take 10 KiB per partition and each
# row tile's ~10 fp32 temporaries another 20 KiB, well inside the 192 KiB SBUF budget.
CHUNK = 512


def _broadcast_chunk(boxes2, start, width):
    """x1, y1, x2, y2 and area of boxes2 ``start .. start + width``, each as a ``[128, width]`` fp32 tile
    holding the same row on every partition."""
    # One contiguous DMA of the chunk's 4 * width values onto a single partition.
    flat = boxes2.reshape((1, 4 * boxes2.shape[0]))
    i_row = nl.arange(1)[:, None]
    row = nl.load(flat[i_row, 4 * start + nl.arange(4 * width)[None, :]], dtype=nl.float32)
    i_f = nl.arange(width)[None, :]
    x1, y1, x2, y2 = (row[i_row, 4 * i_f + c] for c in range(4))
    # The area on the single row costs one partition's worth of work instead of one per row tile.
    area = nl.multiply(nl.subtract(x2, x1), nl.subtract(y2, y1))
    return tuple(nl.broadcast_to(plane, shape=(PARTITIONS, width)) for plane in (x1, y1, x2, y2, area))


def _iou_tile(boxes1, chunk, out, row_start, size, col_start, width):
    tile = nl.load(boxes1[row_start:row_start + size, :], dtype=nl.float32)
    i_p = nl.arange(size)[:, None]
    ax1, ay1, ax2, ay2 = (tile[i_p, c] for c in range(4))
    # The first `size` partitions of the broadcast planes (a contiguous partition range from 0).
    i_f = nl.arange(width)[None, :]
    bx1, by1, bx2, by2, area_b = (plane[i_p, i_f] for plane in chunk)

    # [size, 1] columns of boxes1 against [size, width] planes of boxes2: free-axis broadcasts only.
    inter_w = nl.maximum(nl.subtract(nl.minimum(ax2, bx2), nl.maximum(ax1, bx1)), 0.0)
    inter_h = nl.maximum(nl.subtract(nl.minimum(ay2, by2), nl.maximum(ay1, by1)), 0.0)
    inter = nl.multiply(inter_w, inter_h)
    area_a = nl.multiply(nl.subtract(ax2, ax1), nl.subtract(ay2, ay1))
    # Same operation order as the reference (area_a + area_b - inter), so fp32 results agree.
    union = nl.subtract(nl.add(area_a, area_b), inter)
    iou = nl.divide(inter, nl.maximum(union, BOX_IOU_EPS))
    nl.store(out[row_start + i_p, col_start + i_f], iou)


def _iou_columns(boxes1, boxes2, out, col_start, width):
    """IoU of every boxes1 row against the boxes2 chunk ``col_start .. col_start + width``."""
    chunk = _broadcast_chunk(boxes2, col_start, width)
    for_each_tile(boxes1.shape[0], PARTITIONS,
                  lambda start, size: _iou_tile(boxes1, chunk, out, start, size, col_start, width))


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
        Computed in fp32 and rounded once on the store; the union is clamped at ``BOX_IOU_EPS``
        before dividing, so zero-area pairs give 0, as in the torch reference. N > 0 and M > 0
        (the host wrapper returns empty results without launching).

        Layout: boxes1 rows are tiled 128 to a tile (last ``N % 128`` rows form one narrower
        tile) and each coordinate is a ``[p, 1]`` column broadcast along the free axis. boxes2
        is cut into chunks of ``CHUNK`` boxes (last ``M % CHUNK`` form one narrower chunk);
        each chunk is one contiguous DMA of ``[1, 4 * m]`` onto a single partition, split into
        coordinate rows by strided free-axis access (``4 * j + c``), and replicated over the
        partitions with ``nl.broadcast_to`` (the legacy API's documented broadcast of a
        ``(1, F)`` tile over partitions) once per chunk, so every row tile reuses the same
        five ``[128, m]`` planes (x1, y1, x2, y2, area). Per row tile: one ``[p, 4]`` load,
        about a dozen Vector-engine ops on ``[p, m]`` and one store.
    """
    out = nl.ndarray((boxes1.shape[0], boxes2.shape[0]), dtype=boxes1.dtype, buffer=nl.shared_hbm)
    for_each_tile(boxes2.shape[0], CHUNK, lambda start, width: _iou_columns(boxes1, boxes2, out, start, width))
    return out
