"""LayerNorm over the last dimension: public API and backend registration."""

from __future__ import annotations

import torch

from ..._backends import resolve
from ..._checks import check_number, check_same_device, check_tensor
from .._define import define_op
from .nki_op import layer_norm_nki
from .reference import layer_norm_reference

__all__ = ["layer_norm"]


def _demo_inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(130, 96, generator=g), 1 + 0.1 * torch.randn(96, generator=g),
            0.1 * torch.randn(96, generator=g))


@define_op("layer_norm", torch=layer_norm_reference, nki=layer_norm_nki, demo=_demo_inputs, differentiable=True,
           benchmark="layer_norm")
def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5, *,
               backend: str = "auto") -> torch.Tensor:
    """``(x - mean(x, -1)) / sqrt(var(x, -1) + eps) * weight + bias`` with ``x[..., D]``, ``weight[D]`` and
    ``bias[D]`` or None (no bias); var is the population variance, as in ``torch.nn.functional.layer_norm``."""
    check_tensor("x", x)
    check_tensor("weight", weight)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (the normalised one), got a 0-D tensor")
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight must have shape [{x.shape[-1]}] (x's last dimension), got {tuple(weight.shape)}")
    if bias is not None:
        check_tensor("bias", bias)
        if bias.dim() != 1 or bias.shape[0] != x.shape[-1]:
            raise ValueError(f"bias must be None or have shape [{x.shape[-1]}] (x's last dimension), got "
                             f"{tuple(bias.shape)}")
        check_same_device(x=x, weight=weight, bias=bias)
    else:
        check_same_device(x=x, weight=weight)
    check_number("eps", eps, low=0.0)
    return resolve("layer_norm", backend, x.device, (x, weight, bias))(x, weight, bias, float(eps))
