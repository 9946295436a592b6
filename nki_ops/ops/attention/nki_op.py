"""Attention on the NKI kernels of ``nki_kernel.py``, as torch.library ops with autograd.

The forward op returns the output and the log-sum-exp rows the backward kernel needs; the public
function keeps the output. The kernels take q and k (and in the backward v and the output gradient)
transposed, ``[B, H, D, S]``: the transposes are made here, once per call, rather than per tile on chip.
Options travel as plain numbers: ``window`` 0 and ``softcap`` 0.0 mean none. The forward kernel's key
block is the one tuned for the target (``tuning.py``).
"""

from __future__ import annotations

import torch

from .nki_kernel import flash_attention_backward_kernel, flash_attention_kernel
from .tuning import TUNED


def _t(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(-1, -2).contiguous()


def _lengths(seq_lens: torch.Tensor | None) -> torch.Tensor | None:
    return None if seq_lens is None else seq_lens.to(torch.float32).reshape(-1, 1).contiguous()


@torch.library.custom_op("nki_ops::attention_nki", mutates_args=())
def attention_forward_nki(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor | None,
                          causal: bool, window: int, softcap: float,
                          scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    if q.numel() == 0 or k.shape[2] == 0:
        return q.new_zeros(q.shape), q.new_full((*q.shape[:3], 1), -1e30, dtype=torch.float32)
    out, lse = flash_attention_kernel(_t(q), _t(k), v.contiguous(), _lengths(seq_lens), scale, causal, window,
                                      softcap, **TUNED["forward"].params())
    return out, lse


@attention_forward_nki.register_fake
def _(q, k, v, seq_lens, causal, window, softcap, scale):
    # Contiguous, as the kernel's outputs are (empty_like would copy the strides of a permuted q).
    return q.new_empty(q.shape), q.new_empty((*q.shape[:3], 1), dtype=torch.float32)


@torch.library.custom_op("nki_ops::attention_backward_nki", mutates_args=())
def attention_backward_nki(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           out: torch.Tensor, lse: torch.Tensor, seq_lens: torch.Tensor | None, causal: bool,
                           window: int, softcap: float,
                           scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if q.numel() == 0 or k.shape[2] == 0:
        return q.new_zeros(q.shape), k.new_zeros(k.shape), v.new_zeros(v.shape)
    grad = grad.to(q.dtype)
    return flash_attention_backward_kernel(q.contiguous(), _t(q), k.contiguous(), _t(k), _t(v), out.contiguous(),
                                           lse.contiguous(), grad.contiguous(), _t(grad), _lengths(seq_lens), scale,
                                           causal, window, softcap)


@attention_backward_nki.register_fake
def _(grad, q, k, v, out, lse, seq_lens, causal, window, softcap, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, seq_lens, causal, window, softcap, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, seq_lens)
    ctx.options = (causal, window, softcap, scale)


def _backward(ctx, grad, _grad_lse):
    q, k, v, out, lse, seq_lens = ctx.saved_tensors
    dq, dk, dv = attention_backward_nki(grad, q, k, v, out, lse, seq_lens, *ctx.options)
    return dq, dk, dv, None, None, None, None, None


attention_forward_nki.register_autograd(_backward, setup_context=_setup_context)


def attention_nki(q, k, v, causal, sliding_window, softcap, scale, seq_lens):
    """The ``nki`` backend of ``nki_ops.attention``: options already checked, ``scale`` resolved."""
    out, _ = attention_forward_nki(q, k, v, seq_lens, causal, sliding_window or 0, float(softcap or 0.0),
                                   float(scale))
    return out
