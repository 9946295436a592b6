"""Legacy-dialect NKI kernels of GIoU (forward) and of its gradient (backward), for paired xyxy boxes.

Both kernels take boxes laid out as HBM ``[rows, 4 * cols]`` (box ``j`` of a row at columns
``4j .. 4j+3``), as ``nki_ops.ops.giou.nki_kernel.launch_layout`` makes them. Rows go on
the partition axis in tiles of 128: the full tiles in an ``affine_range`` loop, then one
narrower tail tile, so any row count works without masks.
"""

from __future__ import annotations

from nki_ops.ops.giou.reference import GIOU_EPS
from nki_ops.sim import nki, nl

from ._tiling import PARTITIONS, for_each_tile


def _coords(tile, cols):
    """The x1, y1, x2, y2 planes ``[p, cols]`` of a ``[p, 4 * cols]`` box tile (strided free access)."""
    i_p = nl.arange(tile.shape[0])[:, None]
    i_f = nl.arange(cols)[None, :]
    return tuple(tile[i_p, 4 * i_f + c] for c in range(4))


def _giou_tile(boxes1, boxes2, out, start, size, cols):
    a = _coords(nl.load(boxes1[start:start + size, :], dtype=nl.float32), cols)
    b = _coords(nl.load(boxes2[start:start + size, :], dtype=nl.float32), cols)
    ax1, ay1, ax2, ay2 = a
    bx1, by1, bx2, by2 = b
    inter = nl.maximum(nl.minimum(ax2, bx2) - nl.maximum(ax1, bx1), 0.0) * \
        nl.maximum(nl.minimum(ay2, by2) - nl.maximum(ay1, by1), 0.0)
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    enclose = nl.maximum(nl.maximum(ax2, bx2) - nl.minimum(ax1, bx1), 0.0) * \
        nl.maximum(nl.maximum(ay2, by2) - nl.minimum(ay1, by1), 0.0)
    giou = nl.divide(inter, nl.maximum(union, GIOU_EPS)) - \
        nl.divide(enclose - union, nl.maximum(enclose, GIOU_EPS))
    nl.store(out[start:start + size, :], giou)


@nki.jit
def giou_kernel(boxes1, boxes2):
    """GIoU of paired xyxy boxes.

    Dimensions:
        R: rows (any count), C: boxes per row (``cols``), the free axis of the output.

    Args:
        boxes1: HBM ``[R, 4 * C]`` float32 or bfloat16, box ``j`` of a row at columns ``4j..4j+3``.
        boxes2: HBM ``[R, 4 * C]``, same dtype and layout.

    Returns:
        HBM ``[R, C]`` GIoU in the input dtype.

    Notes:
        Computed in fp32 and rounded once on the store. Union and enclosing area are clamped at
        ``GIOU_EPS`` before dividing, as in the torch reference. Rows are tiled 128 to a tile; the
        last ``R % 128`` rows form one narrower tile. 4 + 4 loads, ~30 Vector-engine ops and one
        store per tile.
    """
    rows, width = boxes1.shape
    cols = width // 4
    out = nl.ndarray((rows, cols), dtype=boxes1.dtype, buffer=nl.shared_hbm)
    for_each_tile(rows, PARTITIONS, lambda start, size: _giou_tile(boxes1, boxes2, out, start, size, cols))
    return out


def _first_wins(condition):
    """1.0 where ``condition`` holds (the gradient goes to boxes1), else 0.0."""
    return nl.copy(condition, dtype=nl.float32)


def _giou_backward_tile(grad, boxes1, boxes2, grad1, grad2, start, size, cols):
    rows = slice(start, start + size)
    g = nl.load(grad[rows, :], dtype=nl.float32)
    ax1, ay1, ax2, ay2 = _coords(nl.load(boxes1[rows, :], dtype=nl.float32), cols)
    bx1, by1, bx2, by2 = _coords(nl.load(boxes2[rows, :], dtype=nl.float32), cols)

    # Forward again, keeping the tie selectors (1 = boxes1's coordinate was taken).
    sel_ix1 = _first_wins(nl.greater_equal(ax1, bx1))
    sel_iy1 = _first_wins(nl.greater_equal(ay1, by1))
    sel_ix2 = _first_wins(nl.less_equal(ax2, bx2))
    sel_iy2 = _first_wins(nl.less_equal(ay2, by2))
    sel_ex1 = _first_wins(nl.less_equal(ax1, bx1))
    sel_ey1 = _first_wins(nl.less_equal(ay1, by1))
    sel_ex2 = _first_wins(nl.greater_equal(ax2, bx2))
    sel_ey2 = _first_wins(nl.greater_equal(ay2, by2))
    iw_raw = nl.minimum(ax2, bx2) - nl.maximum(ax1, bx1)
    ih_raw = nl.minimum(ay2, by2) - nl.maximum(ay1, by1)
    ew_raw = nl.maximum(ax2, bx2) - nl.minimum(ax1, bx1)
    eh_raw = nl.maximum(ay2, by2) - nl.minimum(ay1, by1)
    iw, ih = nl.maximum(iw_raw, 0.0), nl.maximum(ih_raw, 0.0)
    ew, eh = nl.maximum(ew_raw, 0.0), nl.maximum(eh_raw, 0.0)
    aw, ah, bw, bh = ax2 - ax1, ay2 - ay1, bx2 - bx1, by2 - by1
    inter = iw * ih
    union = aw * ah + bw * bh - inter
    enclose = ew * eh
    union_c = nl.maximum(union, GIOU_EPS)
    enclose_c = nl.maximum(enclose, GIOU_EPS)

    # giou = inter / union_c - (enclose - union) / enclose_c; clamps pass the gradient at >= bound.
    inv_union = nl.reciprocal(union_c)
    inv_enclose = nl.reciprocal(enclose_c)
    d_union = inv_enclose - inter * inv_union * inv_union * nl.copy(nl.greater_equal(union, GIOU_EPS), dtype=nl.float32)
    d_union = g * d_union
    d_inter = g * inv_union - d_union
    d_enclose = g * ((enclose - union) * inv_enclose * inv_enclose *
                     nl.copy(nl.greater_equal(enclose, GIOU_EPS), dtype=nl.float32) - inv_enclose)
    d_iw = d_inter * ih * nl.copy(nl.greater_equal(iw_raw, 0.0), dtype=nl.float32)
    d_ih = d_inter * iw * nl.copy(nl.greater_equal(ih_raw, 0.0), dtype=nl.float32)
    d_ew = d_enclose * eh * nl.copy(nl.greater_equal(ew_raw, 0.0), dtype=nl.float32)
    d_eh = d_enclose * ew * nl.copy(nl.greater_equal(eh_raw, 0.0), dtype=nl.float32)

    # Each coordinate: its own area term, plus the share of the intersection and enclosing
    # edges that the tie selectors route to it (d ix1 = -d_iw, d ix2 = d_iw, d ex1 = -d_ew, ...).
    da_x1 = -d_union * ah - d_iw * sel_ix1 - d_ew * sel_ex1
    da_y1 = -d_union * aw - d_ih * sel_iy1 - d_eh * sel_ey1
    da_x2 = d_union * ah + d_iw * sel_ix2 + d_ew * sel_ex2
    da_y2 = d_union * aw + d_ih * sel_iy2 + d_eh * sel_ey2
    db_x1 = -d_union * bh - d_iw * (1.0 - sel_ix1) - d_ew * (1.0 - sel_ex1)
    db_y1 = -d_union * bw - d_ih * (1.0 - sel_iy1) - d_eh * (1.0 - sel_ey1)
    db_x2 = d_union * bh + d_iw * (1.0 - sel_ix2) + d_ew * (1.0 - sel_ex2)
    db_y2 = d_union * bw + d_ih * (1.0 - sel_iy2) + d_eh * (1.0 - sel_ey2)

    i_p = nl.arange(size)[:, None]
    i_f = nl.arange(cols)[None, :]
    for c, (da, db) in enumerate(((da_x1, db_x1), (da_y1, db_y1), (da_x2, db_x2), (da_y2, db_y2))):
        nl.store(grad1[start + i_p, 4 * i_f + c], da)
        nl.store(grad2[start + i_p, 4 * i_f + c], db)


@nki.jit
def giou_backward_kernel(grad, boxes1, boxes2):
    """Gradients of GIoU with respect to both box sets, given the gradient of the GIoU output.

    Dimensions:
        R: rows (any count), C: boxes per row.

    Args:
        grad: HBM ``[R, C]`` gradient of the GIoU values (for the loss ``1 - giou``, its negation).
        boxes1: HBM ``[R, 4 * C]`` float32 or bfloat16 (layout of ``giou_kernel``).
        boxes2: HBM ``[R, 4 * C]``, same dtype and layout.

    Returns:
        ``(grad1, grad2)``: HBM ``[R, 4 * C]`` each, in the boxes' dtype.

    Notes:
        Implements exactly the subgradient of ``reference.py``: at a tie of max/min the whole
        gradient goes to boxes1; the width clamps at 0 and the area clamps at ``GIOU_EPS`` pass
        the gradient when the clamped value is >= the bound. The forward is recomputed per tile
        (cheaper than saving ~10 intermediates to HBM). Same 128-row tiling as ``giou_kernel``;
        the four coordinate planes are stored with strided indices ``4 * j + c``.
    """
    rows, width = boxes1.shape
    cols = width // 4
    grad1 = nl.ndarray((rows, width), dtype=boxes1.dtype, buffer=nl.shared_hbm)
    grad2 = nl.ndarray((rows, width), dtype=boxes2.dtype, buffer=nl.shared_hbm)
    for_each_tile(rows, PARTITIONS,
                  lambda start, size: _giou_backward_tile(grad, boxes1, boxes2, grad1, grad2, start, size, cols))
    return grad1, grad2
