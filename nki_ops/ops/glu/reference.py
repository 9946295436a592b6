"""Pure-torch gated linear units: ``swiglu = silu(gate) * up`` and ``geglu = gelu(gate) * up``.

Half-precision inputs are computed in fp32 and rounded once to the input dtype at the end; float64
stays float64. ``approximate`` is ``torch.nn.functional.gelu``'s: ``"tanh"`` or ``"none"`` (erf form).
The erf form is written out, ``0.5 * x * (1 + erf(x / sqrt(2)))``: torch's vectorised CPU kernel of it
overflows near the top of the float range (inf at 3e38, NaN at +inf, where a single element gives
3e38 and inf), and the formula is the same function without that dependence on the tensor's length.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._common import compute_dtype


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    dtype = compute_dtype(gate.dtype)
    return (F.silu(gate.to(dtype)) * up.to(dtype)).to(gate.dtype)


def gelu(x: torch.Tensor, approximate: str) -> torch.Tensor:
    if approximate == "tanh":
        return F.gelu(x, approximate="tanh")
    return 0.5 * x * (1.0 + torch.erf(x * math.sqrt(0.5)))


def geglu_reference(gate: torch.Tensor, up: torch.Tensor, approximate: str) -> torch.Tensor:
    dtype = compute_dtype(gate.dtype)
    return (gelu(gate.to(dtype), approximate) * up.to(dtype)).to(gate.dtype)
