"""GIoU and GIoU loss on the NKI kernels of ``nki_kernel.py``, as torch.library ops with autograd.

On a Neuron (XLA) device the kernels run through ``nki.jit`` on the XLA tensors; anywhere else
the same kernels run in the nki-ops simulator. ``register_fake`` lets ``torch.compile`` trace
the ops without running them; the backward kernel is paired with the forward through
``register_autograd``.
"""

from __future__ import annotations

import torch

from .._common import pair_with_backward
from .nki_kernel import giou_backward_kernel, giou_kernel, launch_layout
from .tuning import TUNED


@torch.library.custom_op("nki_ops::giou_nki", mutates_args=())
def giou_nki(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    if boxes1.numel() == 0:
        return boxes1.new_empty(boxes1.shape[:-1])
    max_cols = TUNED["forward"].params()["max_cols"]
    layout1, count = launch_layout(boxes1, max_cols=max_cols)
    layout2, _ = launch_layout(boxes2, max_cols=max_cols)
    return giou_kernel(layout1, layout2).reshape(-1)[:count].reshape(boxes1.shape[:-1])


@giou_nki.register_fake
def _(boxes1, boxes2):
    return boxes1.new_empty(boxes1.shape[:-1])


@torch.library.custom_op("nki_ops::giou_backward_nki", mutates_args=())
def giou_backward_nki(grad: torch.Tensor, boxes1: torch.Tensor,
                      boxes2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if boxes1.numel() == 0:
        return torch.zeros_like(boxes1), torch.zeros_like(boxes2)
    max_cols = TUNED["backward"].params()["max_cols"]
    layout1, count = launch_layout(boxes1, max_cols=max_cols)
    layout2, _ = launch_layout(boxes2, max_cols=max_cols)
    grad_layout, _ = launch_layout(grad.to(boxes1.dtype), per_box=1, max_cols=max_cols)
    grad1, grad2 = giou_backward_kernel(grad_layout, layout1, layout2)
    return (grad1.reshape(-1)[:count * 4].reshape(boxes1.shape),
            grad2.reshape(-1)[:count * 4].reshape(boxes2.shape))


@giou_backward_nki.register_fake
def _(grad, boxes1, boxes2):
    return torch.empty_like(boxes1), torch.empty_like(boxes2)


pair_with_backward(giou_nki, giou_backward_nki)


def giou_loss_nki(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    return 1 - giou_nki(boxes1, boxes2)
