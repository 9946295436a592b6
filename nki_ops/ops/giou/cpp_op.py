"""GIoU and GIoU loss on the GpSimd C++ operators ``cpp_ops/giou`` (the CPU emulation off-device).

The operators take float32 ``[B, N, 4]``: any ``[..., 4]`` input is flattened to ``[1, M, 4]``,
float16/bfloat16 are computed in float32 (as the torch reference does) and the result is cast
back. Gradients come from the ``giou_backward`` operator through ``register_autograd``.
"""

from __future__ import annotations

import torch

from ...cpp import operators
from .._common import pair_with_backward


@torch.library.custom_op("nki_ops::giou_cpp", mutates_args=())
def giou_fp32(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    flat1, flat2 = boxes1.reshape(1, -1, 4), boxes2.reshape(1, -1, 4)
    return operators.load("giou").giou(flat1, flat2).reshape(boxes1.shape[:-1])


@giou_fp32.register_fake
def _(boxes1, boxes2):
    return boxes1.new_empty(boxes1.shape[:-1])


@torch.library.custom_op("nki_ops::giou_backward_cpp", mutates_args=())
def giou_backward_fp32(grad: torch.Tensor, boxes1: torch.Tensor,
                       boxes2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    both = operators.load("giou").giou_backward(grad.reshape(1, -1), boxes1.reshape(1, -1, 4), boxes2.reshape(1, -1, 4))
    # Outputs of a custom op may not alias each other: copy the halves apart.
    return both[..., :4].reshape(boxes1.shape).clone(), both[..., 4:].reshape(boxes2.shape).clone()


@giou_backward_fp32.register_fake
def _(grad, boxes1, boxes2):
    return torch.empty_like(boxes1), torch.empty_like(boxes2)


pair_with_backward(giou_fp32, giou_backward_fp32)


def giou_cpp(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    return giou_fp32(boxes1.float(), boxes2.float()).to(boxes1.dtype)


def giou_loss_cpp(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    return 1 - giou_cpp(boxes1, boxes2)
