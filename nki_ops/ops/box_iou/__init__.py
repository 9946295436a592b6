"""Pairwise IoU of two box sets: public API and backend registration."""

from __future__ import annotations

import torch

from ..._backends import resolve
from ..._checks import check_boxes, check_same_device
from ...workloads import giou_workload
from .._define import define_op
from .nki_op import box_iou_nki
from .reference import BOX_IOU_EPS, box_iou_reference

__all__ = ["BOX_IOU_EPS", "box_iou"]


def _demo_inputs():
    boxes1, boxes2 = giou_workload(3, 100)
    return boxes1.reshape(-1, 4)[:200], boxes2.reshape(-1, 4)[:60]


@define_op("box_iou", torch=box_iou_reference, nki=box_iou_nki, demo=_demo_inputs, benchmark="box_iou")
def box_iou(boxes1: torch.Tensor, boxes2: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """IoU of every pair of xyxy boxes: ``boxes1[N, 4] x boxes2[M, 4] -> [N, M]``."""
    check_boxes("boxes1", boxes1, rank=2)
    check_boxes("boxes2", boxes2, rank=2)
    if boxes1.dtype != boxes2.dtype:
        raise ValueError(f"boxes1 and boxes2 must have the same dtype, got {boxes1.dtype} and {boxes2.dtype}")
    check_same_device(boxes1=boxes1, boxes2=boxes2)
    return resolve("box_iou", backend, boxes1.device, (boxes1, boxes2))(boxes1, boxes2)
