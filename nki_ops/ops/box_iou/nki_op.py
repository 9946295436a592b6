"""Pairwise IoU on the NKI kernel of ``nki_kernel.py``, as a forward-only torch.library op.

On a Neuron (XLA) device the kernel runs through ``nki.jit`` on the XLA tensors; anywhere else
the same kernel runs in the nki-ops simulator. ``register_fake`` lets ``torch.compile`` trace
the op without running it. No autograd is registered (box_iou is not differentiated in this
project), so backward through the op raises torch's "no autograd formula" error.
"""

from __future__ import annotations

import torch

from .nki_kernel import box_iou_kernel


@torch.library.custom_op("nki_ops::box_iou_nki", mutates_args=())
def box_iou_nki(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    if boxes1.shape[0] == 0 or boxes2.shape[0] == 0:
        return boxes1.new_empty((boxes1.shape[0], boxes2.shape[0]))
    return box_iou_kernel(boxes1, boxes2)


@box_iou_nki.register_fake
def _(boxes1, boxes2):
    return boxes1.new_empty((boxes1.shape[0], boxes2.shape[0]))
