"""Input validation shared by the public ops: each message says what was expected and what came."""

from __future__ import annotations

import math

import torch


def check_tensor(name: str, t, *, floating: bool = True) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if floating and not t.is_floating_point():
        raise ValueError(f"{name} must have a floating dtype (float16, bfloat16, float32, float64), got {t.dtype}")


def check_same_device(**tensors) -> None:
    """Every tensor on one device: the kernels read raw memory, so a mismatch would give garbage, not an error."""
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"{' and '.join(devices)} must be on the same device, got "
                         f"{' and '.join(str(d) for d in devices.values())}")


def check_number(name: str, value, *, low: float, high: float = math.inf) -> None:
    """A finite real number in [low, high]; not a bool (True is an int to Python, never a threshold)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not (math.isfinite(value) and low <= value <= high):
        where = f"in [{low:g}, {high:g}]" if math.isfinite(high) else f">= {low:g}"
        raise ValueError(f"{name} must be a finite number {where}, got {value!r}")


def check_boxes(name: str, boxes, *, rank: int | None = None) -> None:
    """xyxy boxes: a floating tensor whose last dimension is 4 (and of exactly ``rank`` dims if given)."""
    check_tensor(name, boxes)
    if rank is not None and boxes.dim() != rank:
        raise ValueError(f"{name} must be a {rank}-D tensor of shape [N, 4], got shape {tuple(boxes.shape)}")
    if boxes.dim() == 0 or boxes.shape[-1] != 4:
        raise ValueError(f"{name} must have shape (..., 4) with xyxy boxes in the last dimension, "
                         f"got shape {tuple(boxes.shape)}")


def check_box_pair(boxes1, boxes2) -> None:
    """Two elementwise-paired box tensors of the same shape and dtype."""
    check_boxes("boxes1", boxes1)
    check_boxes("boxes2", boxes2)
    if boxes1.shape != boxes2.shape:
        raise ValueError(f"boxes1 and boxes2 must have the same shape, got {tuple(boxes1.shape)} "
                         f"and {tuple(boxes2.shape)}")
    if boxes1.dtype != boxes2.dtype:
        raise ValueError(f"boxes1 and boxes2 must have the same dtype, got {boxes1.dtype} and {boxes2.dtype}")
    check_same_device(boxes1=boxes1, boxes2=boxes2)


def check_reduction(reduction: str) -> None:
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"reduction must be 'none', 'mean' or 'sum', got {reduction!r}")


def check_nms_inputs(boxes, scores, iou_threshold) -> None:
    check_boxes("boxes", boxes, rank=2)
    check_tensor("scores", scores)
    if scores.dim() != 1 or scores.shape[0] != boxes.shape[0]:
        raise ValueError(f"scores must be a 1-D tensor with one score per box ({boxes.shape[0]}), "
                         f"got shape {tuple(scores.shape)}")
    check_same_device(boxes=boxes, scores=scores)
    check_number("iou_threshold", iou_threshold, low=0.0, high=1.0)
