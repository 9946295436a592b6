"""Input generators shared by the demo, benchmarks and tests."""

from __future__ import annotations

import torch

# The published GIoU experiment: two batches of 1024 x 256 boxes in a 256 x 256 image.
GIOU_BATCH, GIOU_BOXES, GIOU_IMAGE = 1024, 256, 256


def random_boxes(batch: int = GIOU_BATCH, n_boxes: int = GIOU_BOXES, image_size: int = GIOU_IMAGE, *,
                 seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Random integer-valued xyxy boxes ``[batch, n_boxes, 4]`` inside an ``image_size`` square.

    Sizes are uniform in ``1..image_size-1``, top-left corners uniform in ``0..image_size-2``,
    and bottom-right corners are clipped to ``image_size - 1`` (the published workload).
    """
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, image_size, (batch, n_boxes, 2), generator=g)
    top_left = torch.randint(0, image_size - 1, (batch, n_boxes, 2), generator=g)
    bottom_right = (top_left + sizes).clamp(0, image_size - 1)
    return torch.cat([top_left, bottom_right], dim=-1).to(dtype)


def giou_workload(batch: int = GIOU_BATCH, n_boxes: int = GIOU_BOXES, *, seed: int = 0,
                  dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """The two box batches of the published GIoU experiment."""
    return (random_boxes(batch, n_boxes, seed=seed, dtype=dtype),
            random_boxes(batch, n_boxes, seed=seed + 1, dtype=dtype))
