"""Pure-torch Generalized IoU of paired xyxy boxes: the reference every backend is tested against.

GIoU(a, b) = IoU(a, b) - (area(C) - area(a U b)) / area(C), C the smallest box enclosing both.

Degenerate boxes: union and enclosing area are clamped below at ``GIOU_EPS`` (1e-12) before
dividing. That changes nothing for boxes whose areas exceed 1e-12 (the result equals
torchvision's ``generalized_box_iou``), and turns 0/0 into 0 for zero-area boxes, so the
result is always finite.

Subgradient at ties (every backend's backward kernel implements exactly this):
  * max/min of two coordinates that are equal sends the whole gradient to ``boxes1``;
  * the clamp of a width or height at 0 passes the gradient when the width is >= 0
    (torch's ``clamp`` convention), and the clamp of an area at ``GIOU_EPS`` passes it when
    the area is >= GIOU_EPS.
"""

from __future__ import annotations

import torch

from .._common import compute_dtype

GIOU_EPS = 1e-12


def _max_first(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise max; at a tie the value (and its gradient) comes from ``a``."""
    return torch.where(a >= b, a, b)


def _min_first(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise min; at a tie the value (and its gradient) comes from ``a``."""
    return torch.where(a <= b, a, b)


def giou_reference(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """GIoU of ``boxes1[..., 4]`` and ``boxes2[..., 4]`` elementwise -> ``[...]`` in the input dtype."""
    out_dtype = boxes1.dtype
    a = boxes1.to(compute_dtype(out_dtype))
    b = boxes2.to(a.dtype)
    ax1, ay1, ax2, ay2 = a.unbind(-1)
    bx1, by1, bx2, by2 = b.unbind(-1)

    area_a = (ax2 - ax1) * (ay2 - ay1)
    area_b = (bx2 - bx1) * (by2 - by1)
    inter_w = (_min_first(ax2, bx2) - _max_first(ax1, bx1)).clamp(min=0)
    inter_h = (_min_first(ay2, by2) - _max_first(ay1, by1)).clamp(min=0)
    inter = inter_w * inter_h
    union = area_a + area_b - inter

    encl_w = (_max_first(ax2, bx2) - _min_first(ax1, bx1)).clamp(min=0)
    encl_h = (_max_first(ay2, by2) - _min_first(ay1, by1)).clamp(min=0)
    enclose = encl_w * encl_h

    iou = inter / union.clamp(min=GIOU_EPS)
    giou = iou - (enclose - union) / enclose.clamp(min=GIOU_EPS)
    return giou.to(out_dtype)


def giou_loss_reference(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """Elementwise ``1 - GIoU`` (no reduction)."""
    return 1 - giou_reference(boxes1, boxes2)
