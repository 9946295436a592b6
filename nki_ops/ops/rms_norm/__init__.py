"""RMSNorm over the last dimension: public API and backend registration."""

from __future__ import annotations

import torch

from ..._backends import resolve
from ..._checks import check_number, check_same_device, check_tensor
from .._define import define_op
from .nki_op import rms_norm_nki
from .reference import rms_norm_reference

__all__ = ["rms_norm"]


def _demo_inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(130, 96, generator=g), 1 + 0.1 * torch.randn(96, generator=g)


@define_op("rms_norm", torch=rms_norm_reference, nki=rms_norm_nki, demo=_demo_inputs, differentiable=True,
           benchmark="rms_norm")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, backend: str = "auto") -> torch.Tensor:
    """``x / sqrt(mean(x**2, -1) + eps) * weight`` with ``x[..., D]`` and ``weight[D]``."""
    check_tensor("x", x)
    check_tensor("weight", weight)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (the normalised one), got a 0-D tensor")
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight must have shape [{x.shape[-1]}] (x's last dimension), got {tuple(weight.shape)}")
    check_same_device(x=x, weight=weight)
    check_number("eps", eps, low=0.0)
    return resolve("rms_norm", backend, x.device, (x, weight))(x, weight, float(eps))
