"""RMSNorm on the NKI kernels of ``nki_kernel.py``, as torch.library ops with autograd.

On a Neuron (XLA) device the kernels run through ``nki.jit`` on the XLA tensors; anywhere else
the same kernels run in the nki-ops simulator. ``register_fake`` lets ``torch.compile`` trace
the ops without running them; the backward kernel is paired with the forward through
``register_autograd``. The kernels' tiling parameters are the ones tuned for the target
(``tuning.py``).
"""

from __future__ import annotations

import torch

from .nki_kernel import rms_norm_backward_kernel, rms_norm_kernel
from .tuning import TUNED


def _rows(values: torch.Tensor) -> torch.Tensor:
    """``[..., D]`` as the kernels' ``[N, D]``."""
    return values.reshape(-1, values.shape[-1]).contiguous()


@torch.library.custom_op("nki_ops::rms_norm_nki", mutates_args=())
def rms_norm_nki(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.numel() == 0:
        return torch.empty_like(x)
    return rms_norm_kernel(_rows(x), weight.reshape(1, -1).contiguous(), eps,
                           **TUNED["forward"].params()).reshape(x.shape)


@rms_norm_nki.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)


@torch.library.custom_op("nki_ops::rms_norm_backward_nki", mutates_args=())
def rms_norm_backward_nki(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                          eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    if x.numel() == 0:
        return torch.zeros_like(x), torch.zeros_like(weight)
    dx, dw = rms_norm_backward_kernel(_rows(grad.to(x.dtype)), _rows(x), weight.reshape(1, -1).contiguous(), eps,
                                      **TUNED["backward"].params())
    return dx.reshape(x.shape), dw.reshape(weight.shape)


@rms_norm_backward_nki.register_fake
def _(grad, x, weight, eps):
    return torch.empty_like(x), torch.empty_like(weight)


def _setup_context(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _backward(ctx, grad):
    x, weight = ctx.saved_tensors
    dx, dw = rms_norm_backward_nki(grad, x, weight, ctx.eps)
    return dx, dw, None


rms_norm_nki.register_autograd(_backward, setup_context=_setup_context)
