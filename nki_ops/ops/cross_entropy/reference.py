"""Pure-torch cross-entropy (``torch.nn.functional.cross_entropy`` after an optional softcap) and
fused linear cross-entropy (the same loss of ``hidden @ weight.T + bias``, by composition).

Half-precision inputs are computed in fp32 and the loss rounded once to the input dtype; float64
inputs are computed in float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._common import compute_dtype


def cross_entropy_reference(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str,
                            label_smoothing: float, softcap: float | None) -> torch.Tensor:
    x = logits.to(compute_dtype(logits.dtype))
    if softcap is not None:
        x = softcap * torch.tanh(x / softcap)
    loss = F.cross_entropy(x, target.long(), ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)
    return loss.to(logits.dtype)


def fused_linear_cross_entropy_reference(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                                         bias: torch.Tensor | None, ignore_index: int, reduction: str,
                                         label_smoothing: float, softcap: float | None) -> torch.Tensor:
    dtype = compute_dtype(hidden.dtype)
    logits = hidden.to(dtype) @ weight.to(dtype).T
    if bias is not None:
        logits = logits + bias.to(dtype)
    return cross_entropy_reference(logits, target, ignore_index, reduction, label_smoothing,
                                   softcap).to(hidden.dtype)
