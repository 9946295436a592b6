"""Pure-torch greedy non-maximum suppression with torchvision's semantics.

Boxes are visited in decreasing score order (a stable sort: equal scores keep their input
order); a box is suppressed when its IoU with an already kept box is strictly greater than
``iou_threshold``. IoU is ``box_iou_reference``'s, computed in fp32 for half inputs.
"""

from __future__ import annotations

import torch

from .._common import compute_dtype
from ..box_iou.reference import box_iou_reference


def nms_reference(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Indices (int64) of the kept boxes, in decreasing score order."""
    order = torch.sort(scores.to(compute_dtype(scores.dtype)), descending=True, stable=True).indices
    candidates = boxes.to(compute_dtype(boxes.dtype))[order]
    keep = []
    remaining = torch.arange(order.numel(), device=boxes.device)
    # One iteration per kept box: each suppresses every later candidate that overlaps it too much.
    while remaining.numel() > 0:
        best = remaining[0]
        keep.append(best)
        ious = box_iou_reference(candidates[best].unsqueeze(0), candidates[remaining[1:]])[0]
        remaining = remaining[1:][ious <= iou_threshold]
    if not keep:
        return torch.empty(0, dtype=torch.int64, device=boxes.device)
    return order[torch.stack(keep)]
