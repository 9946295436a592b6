"""RoPE of a Llama-like attention layer's q and k, forward and backward (a training step's share):
B=1, Hq=32, Hkv=8, S=2048, D=128 fp32 with Llama's [S, D] tables, every available backend against the
torch eager reference, in one run."""

from __future__ import annotations

import torch

import nki_ops
from nki_ops.ops.rope.reference import rope_reference

from .harness import Row, compare_backends


def _forward_backward(q, k, cos, sin, grad_q, grad_k, *, backend):
    q.grad = k.grad = None
    torch.autograd.backward(nki_ops.rope(q, k, cos, sin, backend=backend), (grad_q, grad_k))


def _reference_forward_backward(q, k, cos, sin, grad_q, grad_k):
    q.grad = k.grad = None
    torch.autograd.backward(rope_reference(q, k, cos, sin), (grad_q, grad_k))


def run(batch: int = 1, q_heads: int = 32, kv_heads: int = 8, seq: int = 2048, dim: int = 128, *,
        repeats: int = 20) -> list[Row]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, q_heads, seq, dim, generator=g).requires_grad_()
    k = torch.randn(batch, kv_heads, seq, dim, generator=g).requires_grad_()
    freqs = torch.arange(seq)[:, None] * 10000.0 ** -(torch.arange(0, dim, 2) / dim)
    angles = torch.cat((freqs, freqs), dim=-1)
    grad_q, grad_k = torch.randn(q.shape, generator=g), torch.randn(k.shape, generator=g)
    return compare_backends("rope", _forward_backward, _reference_forward_backward,
                            (q, k, angles.cos(), angles.sin(), grad_q, grad_k), repeats=repeats,
                            include_compile=False, note=f"forward + backward, Hkv={kv_heads}")
