"""Pure-torch attention: the reference every backend is tested against.

``softmax(mask(softcap(scale * q @ k.T))) @ v`` per head, with grouped-query heads (query head ``h``
reads key/value head ``h // (Hq // Hkv)``). Which key ``j`` a query row ``i`` sees:

* ``causal``: ``j <= i`` (top-left aligned, as ``scaled_dot_product_attention(is_causal=True)``);
* ``sliding_window=W``: ``|i - j| < W`` (with ``causal``, the last ``W`` keys up to ``i``);
* ``seq_lens[b] = L``: ``j < L``, and rows ``i >= L`` see no key.

A row that sees no key gives zeros (and zero gradients), not NaN, so a padded batch needs no extra
mask. Half-precision inputs are computed in fp32 and rounded once at the end; float64 stays float64
(the tests' reference path).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._common import compute_dtype


def visible(rows: int, cols: int, causal: bool, sliding_window: int | None,
            device: torch.device | None = None) -> torch.Tensor:
    """``[rows, cols]`` bool: may query ``i`` see key ``j`` under the causal and sliding-window masks."""
    i = torch.arange(rows, device=device).unsqueeze(1)
    j = torch.arange(cols, device=device).unsqueeze(0)
    keep = torch.ones(rows, cols, dtype=torch.bool, device=device)
    if causal:
        keep &= j <= i
    if sliding_window is not None:
        keep &= (i - j).abs() < sliding_window
    return keep


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                        sliding_window: int | None = None, softcap: float | None = None,
                        scale: float | None = None, seq_lens: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of ``q[B, Hq, S, D]`` over ``k, v[B, Hkv, S_kv, D]`` -> ``[B, Hq, S, D]`` in q's dtype."""
    out_dtype = q.dtype
    q, k, v = (t.to(compute_dtype(out_dtype)) for t in (q, k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    rows, cols = q.shape[-2], k.shape[-2]
    if cols == 0:  # no key at all: every row gives zeros
        return torch.zeros_like(q).to(out_dtype)
    keep = visible(rows, cols, causal, sliding_window, q.device)
    # Every row sees a key (key 0, or the window reaches back to the last key) unless a window is
    # narrower than the rows' overhang past the keys; decided from the sizes, so it compiles.
    every_row_sees_a_key = sliding_window is None or rows <= cols + sliding_window - 1
    if softcap is None and seq_lens is None and every_row_sees_a_key:
        # SDPA covers it: the softmax of every row is defined.
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale,
                                             enable_gqa=q.shape[1] != k.shape[1])
        return out.to(out_dtype)
    return _explicit(q, k, v, keep, softcap, scale, seq_lens).to(out_dtype)


def _explicit(q, k, v, keep, softcap, scale, seq_lens):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = scale * q @ k.transpose(-1, -2)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    keep = keep.expand(q.shape[0], 1, *keep.shape)
    if seq_lens is not None:
        lengths = seq_lens.to(q.device).reshape(-1, 1, 1, 1)
        positions = torch.arange(max(keep.shape[-2:]), device=q.device)
        keep = keep & (positions[:keep.shape[-1]] < lengths) & (positions[:keep.shape[-2], None] < lengths)
    scores = scores.masked_fill(~keep, float("-inf"))
    # A softmax that gives 0, not NaN, on a row with no visible key.
    row_max = scores.amax(dim=-1, keepdim=True).clamp(min=torch.finfo(scores.dtype).min).detach()
    weights = torch.exp(scores - row_max)
    weights = weights / weights.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(scores.dtype).tiny)
    return weights @ v
