"""Small numeric helpers shared by the torch references."""

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
