"""Rotary position embedding (RoPE, rotate-half convention): public API and backend registration."""

from __future__ import annotations

import torch

from ..._backends import resolve
from ..._checks import check_same_device, check_tensor
from .._define import define_op
from .nki_op import rope_nki
from .reference import rope_reference

__all__ = ["rope"]


def _demo_inputs():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 150, 32, generator=g), torch.randn(2, 2, 150, 32, generator=g)
    angles = torch.arange(150.0)[:, None] * 10000.0 ** -(torch.arange(0, 32, 2) / 32)
    angles = torch.cat((angles, angles), dim=-1)
    return q, k, angles.cos(), angles.sin()


@define_op("rope", torch=rope_reference, nki=rope_nki, demo=_demo_inputs, differentiable=True, benchmark="rope")
def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
         backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of queries and keys -> ``(q_rot, k_rot)`` in q's and k's shapes and dtype.

    ``x_rot = x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])``,
    the Hugging Face Llama convention (``apply_rotary_pos_emb``). ``q[B, Hq, S, D]`` and
    ``k[B, Hkv, S, D]`` (any head counts, D even) share the tables ``cos`` and ``sin``, ``[S, D]`` or
    ``[B, S, D]`` (``[1, S, D]`` for every batch row), the same for every head. Half-precision inputs
    are rotated in fp32 and rounded once. Differentiable in q and k; cos and sin are constants of the
    op (position tables): they are not differentiated, and their gradients stay None.
    """
    _check_inputs(q, k, cos, sin)
    return resolve("rope", backend, q.device, (q, k, cos, sin))(q, k, cos, sin)


def _check_inputs(q, k, cos, sin) -> None:
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        check_tensor(name, t)
    for name, t in (("q", q), ("k", k)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor [B, H, S, D], got shape {tuple(t.shape)}")
    batch, _, seq, dim = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (batch, seq, dim):
        raise ValueError(f"k must be [{batch}, Hkv, {seq}, {dim}] (q's batch, positions and head size), "
                         f"got {tuple(k.shape)}")
    if dim == 0 or dim % 2:
        raise ValueError(f"the head size D must be a positive even number (rotate-half splits it in two), "
                         f"got {dim}")
    if q.dtype != k.dtype:
        raise ValueError(f"q and k must have the same dtype, got {q.dtype} and {k.dtype}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if not (cos.dim() == 2 or (cos.dim() == 3 and cos.shape[0] in (1, batch))) or cos.shape[-2:] != (seq, dim):
        raise ValueError(f"cos and sin must be [S, D] = [{seq}, {dim}] or [B, S, D] = [{batch}, {seq}, {dim}] "
                         f"(B may be 1), got {tuple(cos.shape)}")
    if cos.dtype != sin.dtype:
        raise ValueError(f"cos and sin must have the same dtype, got {cos.dtype} and {sin.dtype}")
    check_same_device(q=q, k=k, cos=cos, sin=sin)
