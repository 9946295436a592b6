"""NMS on the GpSimd C++ operator ``cpp_ops/nms`` (the CPU emulation off-device).

The operator's output shape is fixed when the graph is traced, so it returns int32
``[count, kept indices..., -1 padding]`` (``N + 1`` entries; GpSimd kernels have no int64);
this trims it to torchvision's result: the int64 kept indices in decreasing score order.
"""

from __future__ import annotations

import torch

from ...cpp import operators


def nms_cpp(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    padded = operators.load("nms").nms(boxes.float(), scores.float(), float(iou_threshold))
    count = int(padded[0])
    return padded[1:1 + count].to(torch.int64)
