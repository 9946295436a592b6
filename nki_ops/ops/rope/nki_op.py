"""RoPE on the NKI kernels of ``nki_kernel.py``, as torch.library ops with autograd.

The forward op returns the rotated q and k; the backward op, paired with it through
``register_autograd``, returns dq and dk (cos and sin get no gradient). Tables of shape ``[S, D]``
reach the kernels as ``[1, S, D]``. ``register_fake`` lets ``torch.compile`` trace the ops
without running them.
"""

from __future__ import annotations

import torch

from .nki_kernel import rope_backward_kernel, rope_kernel


def _table(values: torch.Tensor) -> torch.Tensor:
    """``[S, D]`` or ``[T, S, D]`` as the kernels' ``[T, S, D]``."""
    return values.reshape(-1, *values.shape[-2:]).contiguous()


def _run(kernel, q, k, cos, sin):
    if q.numel() == 0 and k.numel() == 0:
        return q.new_empty(q.shape), k.new_empty(k.shape)
    return kernel(q.contiguous(), k.contiguous(), _table(cos), _table(sin))


@torch.library.custom_op("nki_ops::rope_nki", mutates_args=())
def rope_nki(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _run(rope_kernel, q, k, cos, sin)


@rope_nki.register_fake
def _(q, k, cos, sin):
    return q.new_empty(q.shape), k.new_empty(k.shape)


@torch.library.custom_op("nki_ops::rope_backward_nki", mutates_args=())
def rope_backward_nki(grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor,
                      sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _run(rope_backward_kernel, grad_q, grad_k, cos, sin)


@rope_backward_nki.register_fake
def _(grad_q, grad_k, cos, sin):
    return grad_q.new_empty(grad_q.shape), grad_k.new_empty(grad_k.shape)


def _setup_context(ctx, inputs, output):
    q, k, cos, sin = inputs
    ctx.save_for_backward(cos, sin)
    ctx.dtypes = (q.dtype, k.dtype)


def _backward(ctx, grad_q, grad_k):
    cos, sin = ctx.saved_tensors
    dq, dk = rope_backward_nki(grad_q.to(ctx.dtypes[0]), grad_k.to(ctx.dtypes[1]), cos, sin)
    return dq, dk, None, None


rope_nki.register_autograd(_backward, setup_context=_setup_context)
