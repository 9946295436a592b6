"""LayerNorm on the NKI kernels of ``nki_kernel.py``, as torch.library ops with autograd.

On a Neuron (XLA) device the kernels run through ``nki.jit`` on the XLA tensors; anywhere else
the same kernels run in the nki-ops simulator. ``register_fake`` lets ``torch.compile`` trace
the ops without running them; the backward kernel is paired with the forward through
``register_autograd``. The bias is optional: the backward op returns ``[dx, dweight, dbias]``
with a bias and ``[dx, dweight]`` without.
"""

from __future__ import annotations

import torch

from .nki_kernel import layer_norm_backward_kernel, layer_norm_kernel


def _rows(values: torch.Tensor) -> torch.Tensor:
    """``[..., D]`` as the kernels' ``[N, D]``."""
    return values.reshape(-1, values.shape[-1]).contiguous()


def _row(values: torch.Tensor | None) -> torch.Tensor | None:
    """A ``[D]`` weight or bias as the kernels' ``[1, D]``."""
    return None if values is None else values.reshape(1, -1).contiguous()


@torch.library.custom_op("nki_ops::layer_norm_nki", mutates_args=())
def layer_norm_nki(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    if x.numel() == 0:
        return torch.empty_like(x)
    return layer_norm_kernel(_rows(x), _row(weight), _row(bias), eps).reshape(x.shape)


@layer_norm_nki.register_fake
def _(x, weight, bias, eps):
    return torch.empty_like(x)


@torch.library.custom_op("nki_ops::layer_norm_backward_nki", mutates_args=())
def layer_norm_backward_nki(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                            eps: float) -> list[torch.Tensor]:
    if x.numel() == 0:
        grads = [torch.zeros_like(x), torch.zeros_like(weight)]
        return grads if bias is None else [*grads, torch.zeros_like(bias)]
    grads = layer_norm_backward_kernel(_rows(grad.to(x.dtype)), _rows(x), _row(weight), _row(bias), eps)
    return [grads[0].reshape(x.shape), *(g.reshape(-1) for g in grads[1:])]


@layer_norm_backward_nki.register_fake
def _(grad, x, weight, bias, eps):
    grads = [torch.empty_like(x), torch.empty_like(weight)]
    return grads if bias is None else [*grads, torch.empty_like(bias)]


def _setup_context(ctx, inputs, output):
    x, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.eps = eps


def _backward(ctx, grad):
    x, weight, bias = ctx.saved_tensors
    grads = layer_norm_backward_nki(grad, x, weight, bias, ctx.eps)
    dbias = grads[2] if bias is not None else None
    return grads[0], grads[1], dbias, None


layer_norm_nki.register_autograd(_backward, setup_context=_setup_context)
