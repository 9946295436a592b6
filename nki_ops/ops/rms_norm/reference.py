"""Pure-torch RMSNorm over the last dimension: ``y = x / sqrt(mean(x**2) + eps) * weight``.

Half-precision inputs are normalised in fp32 and rounded once to the input dtype at the end.
"""

from __future__ import annotations

import torch

from .._common import compute_dtype


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xc = x.to(compute_dtype(x.dtype))
    inv_rms = torch.rsqrt(xc.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xc * inv_rms * weight.to(xc.dtype)).to(x.dtype)
