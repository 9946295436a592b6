"""NKI kernels of GIoU (forward) and of its gradient (backward), for paired xyxy boxes of any count.

Both kernels take boxes laid out as HBM ``[rows, 4 * cols]`` (box ``j`` of a row at columns
``4j .. 4j+3``); ``launch_layout`` turns any ``[..., 4]`` batch into that layout, padding the
last row with zero boxes (at most ``cols - 1`` of them, whose results are dropped). Rows go on
the partition axis in tiles of 128 (``tile_range``: the full tiles, then one narrower tail tile),
so any row count works without masks. Written for the current ``nki`` API (NKI 0.6): every ISA
call writes a destination tile, and the coordinate planes are strided views (``tile[:, c::4]``).
"""

from __future__ import annotations

import math

import torch

from ...nki_api import nisa, nki, nl
from .._nki_tiling import PARTITIONS, is_float_dtype, kernel_check, tile_range
from .reference import GIOU_EPS

# Boxes per partition row: a [128, 4 * 512] fp32 tile is 8 KiB per partition, and the backward
# kernel keeps about 50 tiles of [128, 512] fp32 alive, well inside trn1's 192 KiB SBUF partition.
MAX_COLS = 512


def launch_layout(values: torch.Tensor, per_box: int = 4, max_cols: int = MAX_COLS) -> tuple[torch.Tensor, int]:
    """``[..., per_box]`` values (4 coordinates, or 1 gradient) in the kernels' ``[rows, per_box * cols]``
    layout, and the box count.

    ``cols`` depends on the box count and ``max_cols`` alone (so boxes and their gradients line up) and
    is as wide as possible, up to ``max_cols``, while filling all 128 partitions. ``max_cols`` is the
    kernels' tiling choice: boxes per partition row, so each row tile is ``[128, 4 * cols]``
    (``tuning.py`` tunes it per target).
    """
    count = values.numel() // per_box
    cols = max(1, min(max_cols, math.ceil(count / PARTITIONS)))
    rows = math.ceil(count / cols)
    flat = values.reshape(-1)
    padding = rows * cols * per_box - flat.numel()
    if padding:  # else the layout is a view: no copy of the boxes
        flat = torch.cat([flat, flat.new_zeros(padding)])
    return flat.reshape(rows, per_box * cols), count


def _check_boxes(boxes1, boxes2):
    kernel_check(len(boxes1.shape) == 2 and boxes1.shape[1] % 4 == 0,
                 f"boxes1 must be HBM [rows, 4 * cols] (launch_layout), got shape {boxes1.shape}")
    kernel_check(boxes2.shape == boxes1.shape,
                 f"boxes2 must have boxes1's shape {boxes1.shape}, got {boxes2.shape}")
    kernel_check(is_float_dtype(boxes1.dtype) and boxes2.dtype == boxes1.dtype,
                 f"boxes must both be float32, bfloat16 or float16, got {boxes1.dtype} and {boxes2.dtype}")


def _plane(size, cols, dtype=nl.float32):
    """A new ``[size, cols]`` SBUF tile (fp32 unless said otherwise)."""
    return nl.ndarray((size, cols), dtype=dtype, buffer=nl.sbuf)


def _load_rows(hbm, start, size):
    """Rows ``start .. start + size`` of an HBM tensor as an fp32 SBUF tile (the DMA casts)."""
    tile = _plane(size, hbm.shape[1])
    nisa.dma_copy(dst=tile, src=hbm[start:start + size, :])
    return tile


def _overlap(lo_a, hi_a, lo_b, hi_b, size, cols):
    """Intersection extent along one axis: ``(raw, clamped)``, raw = ``min(hi) - max(lo)``, clamped at 0."""
    raw = _plane(size, cols)
    nisa.tensor_tensor(dst=raw, data1=hi_a, data2=hi_b, op=nl.minimum)
    lo = _plane(size, cols)
    nisa.tensor_tensor(dst=lo, data1=lo_a, data2=lo_b, op=nl.maximum)
    nisa.tensor_tensor(dst=raw, data1=raw, data2=lo, op=nl.subtract)
    clamped = _plane(size, cols)
    nisa.tensor_scalar(dst=clamped, data=raw, op0=nl.maximum, operand0=0.0)
    return raw, clamped


def _span(lo_a, hi_a, lo_b, hi_b, size, cols):
    """Enclosing extent along one axis: ``(raw, clamped)``, raw = ``max(hi) - min(lo)``, clamped at 0."""
    raw = _plane(size, cols)
    nisa.tensor_tensor(dst=raw, data1=hi_a, data2=hi_b, op=nl.maximum)
    lo = _plane(size, cols)
    nisa.tensor_tensor(dst=lo, data1=lo_a, data2=lo_b, op=nl.minimum)
    nisa.tensor_tensor(dst=raw, data1=raw, data2=lo, op=nl.subtract)
    clamped = _plane(size, cols)
    nisa.tensor_scalar(dst=clamped, data=raw, op0=nl.maximum, operand0=0.0)
    return raw, clamped


def _sides(box, size, cols):
    """Width ``x2 - x1`` and height ``y2 - y1`` of the ``[size, 4 * cols]`` box tile's boxes."""
    width = _plane(size, cols)
    nisa.tensor_tensor(dst=width, data1=box[:, 2::4], data2=box[:, 0::4], op=nl.subtract)
    height = _plane(size, cols)
    nisa.tensor_tensor(dst=height, data1=box[:, 3::4], data2=box[:, 1::4], op=nl.subtract)
    return width, height


def _product(a, b, size, cols):
    out = _plane(size, cols)
    nisa.tensor_tensor(dst=out, data1=a, data2=b, op=nl.multiply)
    return out


def _clamped_reciprocal(area, size, cols):
    """``1 / max(area, GIOU_EPS)``: the clamp of the reference, then the reciprocal (no divide ALU op)."""
    inverse = _plane(size, cols)
    nisa.tensor_scalar(dst=inverse, data=area, op0=nl.maximum, operand0=GIOU_EPS)
    nisa.reciprocal(dst=inverse, data=inverse)
    return inverse


def _union(aw, ah, bw, bh, inter, size, cols):
    """``area_a + area_b - inter``, in the reference's order so the fp32 values agree."""
    both = _plane(size, cols)
    nisa.tensor_tensor(dst=both, data1=_product(aw, ah, size, cols), data2=_product(bw, bh, size, cols),
                       op=nl.add)
    union = _plane(size, cols)
    nisa.tensor_tensor(dst=union, data1=both, data2=inter, op=nl.subtract)
    return union


def _giou_tile(boxes1, boxes2, out, start, size, cols):
    a = _load_rows(boxes1, start, size)
    b = _load_rows(boxes2, start, size)
    _, iw = _overlap(a[:, 0::4], a[:, 2::4], b[:, 0::4], b[:, 2::4], size, cols)
    _, ih = _overlap(a[:, 1::4], a[:, 3::4], b[:, 1::4], b[:, 3::4], size, cols)
    _, ew = _span(a[:, 0::4], a[:, 2::4], b[:, 0::4], b[:, 2::4], size, cols)
    _, eh = _span(a[:, 1::4], a[:, 3::4], b[:, 1::4], b[:, 3::4], size, cols)
    aw, ah = _sides(a, size, cols)
    bw, bh = _sides(b, size, cols)
    inter = _product(iw, ih, size, cols)
    union = _union(aw, ah, bw, bh, inter, size, cols)
    enclose = _product(ew, eh, size, cols)

    # giou = inter / max(union, eps) - (enclose - union) / max(enclose, eps)
    iou = _product(inter, _clamped_reciprocal(union, size, cols), size, cols)
    gap = _plane(size, cols)
    nisa.tensor_tensor(dst=gap, data1=enclose, data2=union, op=nl.subtract)
    penalty = _product(gap, _clamped_reciprocal(enclose, size, cols), size, cols)
    giou = _plane(size, cols, out.dtype)
    nisa.tensor_tensor(dst=giou, data1=iou, data2=penalty, op=nl.subtract)
    nisa.dma_copy(dst=out[start:start + size, :], src=giou)


@nki.jit
def giou_kernel(boxes1, boxes2):
    """GIoU of paired xyxy boxes.

    Dimensions:
        R: rows (any count), the partition axis of the tiles.
        C: boxes per row (``cols``, at most ``MAX_COLS``), the free axis of the output.

    Args:
        boxes1: HBM ``[R, 4 * C]`` float32, bfloat16 or float16, box ``j`` of a row at columns ``4j..4j+3``.
        boxes2: HBM ``[R, 4 * C]``, same dtype and layout.

    Returns:
        HBM ``[R, C]`` GIoU in the input dtype.

    Notes:
        Computed in fp32 (the loads cast) and rounded once, by the last instruction, to the output
        dtype. Union and enclosing area are clamped at ``GIOU_EPS`` as in the torch reference;
        there is no divide ALU operator, so each quotient is a ``nisa.reciprocal`` and a multiply,
        within an fp32 ulp or so of the reference's division. Rows are tiled 128 to a tile; the
        last ``R % 128`` rows form one narrower tile. Per tile: 2 loads, ~35 Vector-engine
        instructions on ``[p, C]`` and one store.

    Pseudocode:
        for each row tile (start, p):
            a, b = boxes1[start:start+p], boxes2[start:start+p]   (fp32)
            iw = max(min(a.x2, b.x2) - max(a.x1, b.x1), 0); ih likewise on y
            ew = max(max(a.x2, b.x2) - min(a.x1, b.x1), 0); eh likewise on y
            inter = iw * ih; union = area(a) + area(b) - inter; enclose = ew * eh
            out[start:start+p] = inter * rcp(max(union, eps)) - (enclose - union) * rcp(max(enclose, eps))
    """
    _check_boxes(boxes1, boxes2)
    rows, width = boxes1.shape
    cols = width // 4
    out = nl.ndarray((rows, cols), dtype=boxes1.dtype, buffer=nl.shared_hbm)
    for start, size in tile_range(rows, PARTITIONS):
        _giou_tile(boxes1, boxes2, out, start, size, cols)
    return out


def _selectors(a, b, first_if, size, cols):
    """``[size, 4 * cols]`` uint8 predicates, per coordinate ``c``: 1 where ``first_if[c](a_c, b_c)`` holds.

    They say which box's coordinate an extreme takes (1: boxes1's) and so where its gradient goes;
    a comparison with NaN is false, as in the reference's ``torch.where``.
    """
    selector = _plane(size, 4 * cols, nl.uint8)
    for c, op in enumerate(first_if):
        nisa.tensor_tensor(dst=selector[:, c::4], data1=a[:, c::4], data2=b[:, c::4], op=op)
    return selector


def _extremes(a, boxes2, start, size, selector):
    """The box whose coordinate ``c`` is boxes1's where ``selector`` is 1, else boxes2's.

    A select, not ``nl.maximum``/``nl.minimum``: at a tie and with a NaN it takes the same box as
    the reference's ``where(a >= b, a, b)`` (boxes1's NaN loses, boxes2's wins).
    """
    box = _load_rows(boxes2, start, size)
    nisa.tensor_copy_predicated(dst=box, src=a, predicate=selector)
    return box


def _passes(raw, bound, value, size, cols):
    """``value`` where ``raw >= bound`` (the clamp passes the gradient), else 0 (also where ``value`` is NaN)."""
    passing = _plane(size, cols, nl.uint8)
    nisa.tensor_scalar(dst=passing, data=raw, op0=nl.greater_equal, operand0=bound)
    out = _plane(size, cols)
    nisa.select_reduce(dst=out, predicate=passing, on_true=value, on_false=0.0)
    return out


def _routed(value, selector, size, cols, reverse=False):
    """``value`` where ``selector`` is 1 (0 where it is 0), or the other way round with ``reverse``."""
    out = _plane(size, cols)
    nisa.select_reduce(dst=out, predicate=selector, on_true=value, on_false=0.0, reverse_pred=reverse)
    return out


def _coordinate_grads(area_a, area_b, d_inner, sel_inner, d_outer, sel_outer, lower, dst_a, dst_b, size, cols):
    """Gradients of one coordinate of both boxes, written to ``dst_a`` (boxes1) and ``dst_b`` (boxes2).

    Each is its own area term (``d_union`` times the box's other side, ``area_a``/``area_b``) plus the
    shares of the intersection and enclosing edge gradients that the selectors route to it (selected,
    not multiplied by 0/1: the box not taken gets 0 even from a NaN edge gradient, as through the
    reference's ``where``); a lower edge (x1, y1) takes them all negated.
    """
    inner_a = _routed(d_inner, sel_inner, size, cols)
    outer_a = _routed(d_outer, sel_outer, size, cols)
    inner_b = _routed(d_inner, sel_inner, size, cols, reverse=True)
    outer_b = _routed(d_outer, sel_outer, size, cols, reverse=True)
    for area, inner, outer, dst in ((area_a, inner_a, outer_a, dst_a), (area_b, inner_b, outer_b, dst_b)):
        # The sum lands in `inner`, which nothing reads afterwards.
        nisa.tensor_tensor(dst=inner, data1=area, data2=inner, op=nl.add)
        if lower:
            # -(area + inner) - outer: the reference's -area - inner - outer, exactly (negation is exact).
            nisa.scalar_tensor_tensor(dst=dst, data=inner, op0=nl.multiply, operand0=-1.0, op1=nl.subtract,
                                      operand1=outer)
        else:
            nisa.tensor_tensor(dst=dst, data1=inner, data2=outer, op=nl.add)


def _clamped(raw, size, cols):
    clamped = _plane(size, cols)
    nisa.tensor_scalar(dst=clamped, data=raw, op0=nl.maximum, operand0=0.0)
    return clamped


def _giou_backward_tile(grad, boxes1, boxes2, grad1, grad2, start, size, cols):
    g = _load_rows(grad, start, size)
    a = _load_rows(boxes1, start, size)
    b = _load_rows(boxes2, start, size)

    # Forward again, keeping the raw extents and the selectors (1 = boxes1's coordinate was taken):
    # the intersection box takes the larger low and the smaller high edges, the enclosing box the
    # opposite, each boxes1's at a tie.
    sel_inner = _selectors(a, b, (nl.greater_equal, nl.greater_equal, nl.less_equal, nl.less_equal), size, cols)
    sel_outer = _selectors(a, b, (nl.less_equal, nl.less_equal, nl.greater_equal, nl.greater_equal), size, cols)
    iw_raw, ih_raw = _sides(_extremes(a, boxes2, start, size, sel_inner), size, cols)
    ew_raw, eh_raw = _sides(_extremes(a, boxes2, start, size, sel_outer), size, cols)
    iw, ih, ew, eh = (_clamped(raw, size, cols) for raw in (iw_raw, ih_raw, ew_raw, eh_raw))
    aw, ah = _sides(a, size, cols)
    bw, bh = _sides(b, size, cols)
    inter = _product(iw, ih, size, cols)
    union = _union(aw, ah, bw, bh, inter, size, cols)
    enclose = _product(ew, eh, size, cols)
    inv_union = _clamped_reciprocal(union, size, cols)
    inv_enclose = _clamped_reciprocal(enclose, size, cols)

    # giou = inter / union_c - (enclose - union) / enclose_c; the area clamps pass the gradient at >= eps.
    # d_union = g * (inv_enclose - inter * inv_union**2 * [union >= eps])
    falloff = _product(_product(inter, inv_union, size, cols), inv_union, size, cols)
    slope = _plane(size, cols)
    nisa.tensor_tensor(dst=slope, data1=inv_enclose, data2=_passes(union, GIOU_EPS, falloff, size, cols),
                       op=nl.subtract)
    d_union = _product(g, slope, size, cols)
    # d_inter = g * inv_union - d_union
    d_inter = _plane(size, cols)
    nisa.tensor_tensor(dst=d_inter, data1=_product(g, inv_union, size, cols), data2=d_union, op=nl.subtract)
    # d_enclose = g * ((enclose - union) * inv_enclose**2 * [enclose >= eps] - inv_enclose)
    gap = _plane(size, cols)
    nisa.tensor_tensor(dst=gap, data1=enclose, data2=union, op=nl.subtract)
    growth = _product(_product(gap, inv_enclose, size, cols), inv_enclose, size, cols)
    slope = _plane(size, cols)
    nisa.tensor_tensor(dst=slope, data1=_passes(enclose, GIOU_EPS, growth, size, cols), data2=inv_enclose,
                       op=nl.subtract)
    d_enclose = _product(g, slope, size, cols)
    # Edge gradients: the width clamps at 0 pass the gradient where the raw width is >= 0.
    d_iw = _passes(iw_raw, 0.0, _product(d_inter, ih, size, cols), size, cols)
    d_ih = _passes(ih_raw, 0.0, _product(d_inter, iw, size, cols), size, cols)
    d_ew = _passes(ew_raw, 0.0, _product(d_enclose, eh, size, cols), size, cols)
    d_eh = _passes(eh_raw, 0.0, _product(d_enclose, ew, size, cols), size, cols)

    # d ix1 = -d_iw, d ix2 = d_iw, d ex1 = -d_ew, ...; each goes to the box whose coordinate was taken.
    g1 = _plane(size, 4 * cols, grad1.dtype)
    g2 = _plane(size, 4 * cols, grad2.dtype)
    # The area terms d_union * side: x1 and x2 share the height's, y1 and y2 the width's.
    du_ah, du_aw = _product(d_union, ah, size, cols), _product(d_union, aw, size, cols)
    du_bh, du_bw = _product(d_union, bh, size, cols), _product(d_union, bw, size, cols)
    for c, (du_a, du_b, d_inner, d_outer) in enumerate(((du_ah, du_bh, d_iw, d_ew), (du_aw, du_bw, d_ih, d_eh)) * 2):
        _coordinate_grads(du_a, du_b, d_inner, sel_inner[:, c::4], d_outer, sel_outer[:, c::4], c < 2,
                          g1[:, c::4], g2[:, c::4], size, cols)
    nisa.dma_copy(dst=grad1[start:start + size, :], src=g1)
    nisa.dma_copy(dst=grad2[start:start + size, :], src=g2)


@nki.jit
def giou_backward_kernel(grad, boxes1, boxes2):
    """Gradients of GIoU with respect to both box sets, given the gradient of the GIoU output.

    Dimensions:
        R: rows (any count), the partition axis of the tiles.
        C: boxes per row (at most ``MAX_COLS``).

    Args:
        grad: HBM ``[R, C]`` gradient of the GIoU values (for the loss ``1 - giou``, its negation),
            any of the float dtypes.
        boxes1: HBM ``[R, 4 * C]`` float32, bfloat16 or float16 (layout of ``giou_kernel``).
        boxes2: HBM ``[R, 4 * C]``, same dtype and layout.

    Returns:
        ``(grad1, grad2)``: HBM ``[R, 4 * C]`` each, in the boxes' dtype.

    Notes:
        Implements exactly the subgradient of ``reference.py``, NaN included: at a tie of max/min
        the whole gradient goes to boxes1; the width clamps at 0 and the area clamps at ``GIOU_EPS``
        pass the gradient when the clamped value is >= the bound. Every such choice is a uint8
        comparison (false with a NaN) feeding a select (``select_reduce``, ``tensor_copy_predicated``),
        never a multiplication by 0/1, so as through the reference's ``torch.where`` the side not
        chosen gets 0 even from a NaN, and the recomputed intersection and enclosing boxes take
        boxes2's coordinate where boxes1's is NaN (a boxes2 NaN wins). The forward is recomputed per
        tile (cheaper than saving ~10 intermediates to HBM).
        Quotients are reciprocals times products, as in ``giou_kernel``. Same 128-row tiling; each
        tile's four coordinate gradients are written into strided views (``g[:, c::4]``) of one
        ``[p, 4 * C]`` tile, stored with one DMA per box set.

    Pseudocode:
        for each row tile (start, p):
            sel_inner = [a.x1 >= b.x1, a.y1 >= b.y1, a.x2 <= b.x2, a.y2 <= b.y2]; sel_outer the opposite
            inner box = where(sel_inner, a, b); outer box = where(sel_outer, a, b)
            iw, ih, ew, eh (raw and clamped) from those boxes; inter, union, enclose as in giou_kernel
            d_union = g * (rcp(enclose_c) - inter * rcp(union_c)**2 * [union >= eps])
            d_inter = g * rcp(union_c) - d_union
            d_enclose = g * ((enclose - union) * rcp(enclose_c)**2 * [enclose >= eps] - rcp(enclose_c))
            d_iw = where(iw_raw >= 0, d_inter * ih, 0); d_ih, d_ew, d_eh likewise
            grad1.x1 = -d_union * a.h - where(sel_inner.x1, d_iw, 0) - where(sel_outer.x1, d_ew, 0)
            grad2.x1 = -d_union * b.h - where(sel_inner.x1, 0, d_iw) - where(sel_outer.x1, 0, d_ew)
            ... y1, x2, y2 likewise
    """
    _check_boxes(boxes1, boxes2)
    rows, width = boxes1.shape
    cols = width // 4
    kernel_check(grad.shape == (rows, cols), f"grad must be HBM [{rows}, {cols}] (one value per box), "
                                             f"got shape {grad.shape}")
    kernel_check(is_float_dtype(grad.dtype), f"grad must be float32, bfloat16 or float16, got {grad.dtype}")
    grad1 = nl.ndarray((rows, width), dtype=boxes1.dtype, buffer=nl.shared_hbm)
    grad2 = nl.ndarray((rows, width), dtype=boxes2.dtype, buffer=nl.shared_hbm)
    for start, size in tile_range(rows, PARTITIONS):
        _giou_backward_tile(grad, boxes1, boxes2, grad1, grad2, start, size, cols)
    return grad1, grad2
