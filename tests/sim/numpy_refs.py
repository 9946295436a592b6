"""NumPy references for the simulator tests."""

from __future__ import annotations

import numpy as np


def giou(boxes1: np.ndarray, boxes2: np.ndarray, eps: float) -> np.ndarray:
    """GIoU of paired xyxy boxes (..., 4), in float64."""
    b1, b2 = boxes1.astype(np.float64), boxes2.astype(np.float64)
    area1 = (b1[..., 2] - b1[..., 0]) * (b1[..., 3] - b1[..., 1])
    area2 = (b2[..., 2] - b2[..., 0]) * (b2[..., 3] - b2[..., 1])
    inter = np.clip(np.minimum(b1[..., 2], b2[..., 2]) - np.maximum(b1[..., 0], b2[..., 0]), 0, None) * \
        np.clip(np.minimum(b1[..., 3], b2[..., 3]) - np.maximum(b1[..., 1], b2[..., 1]), 0, None)
    union = area1 + area2 - inter
    hull = (np.maximum(b1[..., 2], b2[..., 2]) - np.minimum(b1[..., 0], b2[..., 0])) * \
        (np.maximum(b1[..., 3], b2[..., 3]) - np.minimum(b1[..., 1], b2[..., 1]))
    return inter / np.maximum(union, eps) - (hull - union) / np.maximum(hull, eps)


def random_boxes(rng: np.random.Generator, shape: tuple[int, ...], size: float = 256.0) -> np.ndarray:
    top_left = rng.uniform(0, size, shape + (2,))
    extent = rng.uniform(1, size / 2, shape + (2,))
    return np.concatenate([top_left, top_left + extent], axis=-1).astype(np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)
