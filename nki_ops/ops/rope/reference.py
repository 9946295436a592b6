"""Pure-torch rotary position embedding in the rotate-half convention of Hugging Face Llama:
``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])``.

Half-precision inputs are rotated in fp32 and rounded once to the input dtype at the end; float64
inputs (or tables) are rotated in float64.
"""

from __future__ import annotations

import torch

from .._common import compute_dtype


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    dtype = compute_dtype(torch.promote_types(x.dtype, cos.dtype))
    xc = x.to(dtype)
    return (xc * cos.to(dtype) + rotate_half(xc) * sin.to(dtype)).to(x.dtype)


def rope_reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # The tables are constants of the op on every backend: no gradient flows into them.
    cos, sin = cos.detach(), sin.detach()
    if cos.dim() == 3:  # [B or 1, S, D]: one table per batch row, the same for every head
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)
