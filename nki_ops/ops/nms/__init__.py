"""Non-maximum suppression: public API and backend registration."""

from __future__ import annotations

import torch

from ..._backends import resolve
from ..._checks import check_nms_inputs, check_same_device
from ...cpp import backend as cpp_backend
from ...workloads import giou_workload
from .._define import define_op
from .cpp_op import nms_cpp
from .reference import nms_reference

__all__ = ["batched_nms", "nms"]


def _demo_inputs():
    boxes, _ = giou_workload(3, 100)
    return boxes.reshape(-1, 4)[:200], torch.rand(200, generator=torch.Generator().manual_seed(0)), 0.5


@define_op("nms", torch=nms_reference, cpp=nms_cpp,
           cpp_input_reason=lambda boxes, scores, iou_threshold: cpp_backend.input_reason("NMS", boxes, scores),
           demo=_demo_inputs)
def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float, *,
        backend: str = "auto") -> torch.Tensor:
    """Greedy NMS over ``boxes[N, 4]`` (xyxy) with ``scores[N]``.

    Returns the int64 indices of the kept boxes in decreasing score order. A box is
    suppressed when its IoU with a kept box is strictly greater than ``iou_threshold``
    (torchvision's rule); equal scores are visited in input order.
    """
    check_nms_inputs(boxes, scores, iou_threshold)
    inputs = (boxes, scores, float(iou_threshold))
    return resolve("nms", backend, boxes.device, inputs)(*inputs)


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float, *,
                backend: str = "auto") -> torch.Tensor:
    """NMS run independently per category ``idxs[N]``; kept indices in decreasing score order."""
    check_nms_inputs(boxes, scores, iou_threshold)
    if not isinstance(idxs, torch.Tensor) or idxs.dim() != 1 or idxs.shape[0] != boxes.shape[0] \
            or idxs.is_floating_point():
        raise ValueError(f"idxs must be a 1-D integer tensor with one category per box ({boxes.shape[0]}), "
                         f"got {getattr(idxs, 'dtype', type(idxs).__name__)} of shape "
                         f"{tuple(getattr(idxs, 'shape', ()))}")
    check_same_device(boxes=boxes, idxs=idxs)
    kept = [members[nms(boxes[members], scores[members], iou_threshold, backend=backend)]
            for members in (torch.nonzero(idxs == c).flatten() for c in torch.unique(idxs))]
    if not kept:
        return torch.empty(0, dtype=torch.int64, device=boxes.device)
    kept = torch.cat(kept)
    return kept[torch.sort(scores[kept], descending=True, stable=True).indices]
