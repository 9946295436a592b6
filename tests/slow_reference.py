"""Slow, independent references: plain Python loops over boxes in float64 Python floats.

Written differently from the torch references on purpose (scalar code, torchvision's formulas,
no broadcasting), so a shared mistake is unlikely. Degenerate areas are clamped at 1e-12, the
documented eps of the ops.
"""

from __future__ import annotations

import math

import torch

EPS = 1e-12


def _giou_one(a, b) -> float:
    ax1, ay1, ax2, ay2 = a
    bx1, by1, bx2, by2 = b
    inter = max(0.0, min(ax2, bx2) - max(ax1, bx1)) * max(0.0, min(ay2, by2) - max(ay1, by1))
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    hull = max(0.0, max(ax2, bx2) - min(ax1, bx1)) * max(0.0, max(ay2, by2) - min(ay1, by1))
    return inter / max(union, EPS) - (hull - union) / max(hull, EPS)


def _iou_one(a, b) -> float:
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / max(union, EPS)


def giou_loop(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """Elementwise GIoU in float64."""
    flat1 = boxes1.double().reshape(-1, 4).tolist()
    flat2 = boxes2.double().reshape(-1, 4).tolist()
    values = [_giou_one(a, b) for a, b in zip(flat1, flat2)]
    return torch.tensor(values, dtype=torch.float64).reshape(boxes1.shape[:-1])


def box_iou_loop(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    rows1, rows2 = boxes1.double().tolist(), boxes2.double().tolist()
    return torch.tensor([[_iou_one(a, b) for b in rows2] for a in rows1], dtype=torch.float64
                        ).reshape(len(rows1), len(rows2))


def nms_loop(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> list[int]:
    """Classic greedy NMS: visit by decreasing score (ties in input order), suppress IoU > threshold."""
    rows = boxes.double().tolist()
    order = sorted(range(len(rows)), key=lambda i: -float(scores[i]))  # sorted() is stable
    suppressed = [False] * len(rows)
    keep = []
    for pos, i in enumerate(order):
        if suppressed[i]:
            continue
        keep.append(i)
        for j in order[pos + 1:]:
            if not suppressed[j] and _iou_one(rows[i], rows[j]) > iou_threshold:
                suppressed[j] = True
    return keep


def rms_norm_loop(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    rows = x.double().reshape(-1, x.shape[-1]).tolist()
    w = weight.double().tolist()
    out = []
    for row in rows:
        scale = 1.0 / math.sqrt(sum(v * v for v in row) / len(row) + eps)
        out.append([v * scale * wi for v, wi in zip(row, w)])
    return torch.tensor(out, dtype=torch.float64).reshape(x.shape)
