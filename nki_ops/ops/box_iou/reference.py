"""Pure-torch pairwise IoU of two sets of xyxy boxes.

The union is clamped below at ``BOX_IOU_EPS`` (1e-12): identical to torchvision's
``box_iou`` for boxes with area above 1e-12, and 0 instead of NaN for zero-area pairs.
"""

from __future__ import annotations

import torch

from .._common import compute_dtype

BOX_IOU_EPS = 1e-12


def box_iou_reference(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """IoU of every pair: ``boxes1[N, 4] x boxes2[M, 4] -> [N, M]`` in the input dtype."""
    out_dtype = boxes1.dtype
    a = boxes1.to(compute_dtype(out_dtype))
    b = boxes2.to(a.dtype)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a[:, None] + area_b[None, :] - inter
    return (inter / union.clamp(min=BOX_IOU_EPS)).to(out_dtype)
