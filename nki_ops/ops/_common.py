"""Small helpers shared by the ops: compute dtype, loss reduction, autograd of library ops."""

from __future__ import annotations

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision inputs are computed in fp32, as the NeuronCore engines do; fp32/fp64 stay."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def reduce_loss(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        # An empty batch gives a 0 loss that still carries a graph, not NaN (torchvision's choice).
        return loss.mean() if loss.numel() > 0 else 0.0 * loss.sum()
    return loss


def pair_with_backward(forward, backward) -> None:
    """Make ``backward(grad, *inputs)``, a custom op returning the gradient of every input, the
    autograd formula of the custom op ``forward(*inputs)``."""
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward_formula(ctx, grad):
        return backward(grad.contiguous(), *ctx.saved_tensors)

    forward.register_autograd(backward_formula, setup_context=setup_context)
