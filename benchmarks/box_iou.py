"""Pairwise IoU of 1,000 x 300 boxes (detections against ground truth): every available backend
against the torch eager reference, in one run."""

from __future__ import annotations

import nki_ops
from nki_ops.ops.box_iou.reference import box_iou_reference
from nki_ops.workloads import random_boxes

from .harness import Row, compare_backends


def run(n: int = 1000, m: int = 300, *, repeats: int = 20) -> list[Row]:
    boxes1 = random_boxes(1, n, seed=0).reshape(n, 4)
    boxes2 = random_boxes(1, m, seed=1).reshape(m, 4)
    return compare_backends("box_iou", nki_ops.box_iou, box_iou_reference, (boxes1, boxes2), repeats=repeats,
                            shape=(n, m))
