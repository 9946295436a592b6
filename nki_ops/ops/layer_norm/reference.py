"""Pure-torch LayerNorm over the last dimension: ``y = (x - mean) / sqrt(var + eps) * weight + bias``.

var is the population variance (divided by D), as in ``torch.nn.functional.layer_norm``. Half-precision
inputs are normalised in fp32 and rounded once to the input dtype at the end; float64 stays float64.
"""

from __future__ import annotations

import torch

from .._common import compute_dtype


def layer_norm_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         eps: float) -> torch.Tensor:
    xc = x.to(compute_dtype(x.dtype))
    centred = xc - xc.mean(dim=-1, keepdim=True)
    inv_std = torch.rsqrt(centred.pow(2).mean(dim=-1, keepdim=True) + eps)
    y = centred * inv_std * weight.to(xc.dtype)
    if bias is not None:
        y = y + bias.to(xc.dtype)
    return y.to(x.dtype)
