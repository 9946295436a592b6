"""Cross-entropy and fused linear cross-entropy on the NKI kernels of ``nki_kernel.py``, as torch.library
ops with autograd.

Each forward op returns the loss and its gradients with respect to the inputs, computed by the same
kernel; autograd saves the gradients, and the backward only scales them by the incoming gradient
(``scale_rows_kernel``), with no second pass over the logits. The row weights carry the reduction
(``1 / count`` under a mean, 0 on ignored rows), so the sum of the weighted rows is the loss and the
saved gradients are already its gradients. cross_entropy's op returns the weighted rows (any
reduction, ``none`` included, is their sum or themselves); the fused op returns their sum, since its
weight and bias gradients are sums over the rows and need one factor for all of them.
"""

from __future__ import annotations

import math

import torch

from .nki_kernel import cross_entropy_kernel, fused_linear_cross_entropy_kernel, scale_rows_kernel


def row_columns(target: torch.Tensor, ignore_index: int, reduction: str):
    """The kernels' ``[N, 1]`` float32 target (-1 on ignored rows) and row weight columns, and the
    number of rows that count."""
    counted = target != ignore_index
    count = counted.sum()
    target_col = torch.where(counted, target, -1).to(torch.float32).reshape(-1, 1).contiguous()
    weight = counted.to(torch.float32)
    if reduction == "mean":
        weight = weight / count.clamp(min=1)
    return target_col, weight.reshape(-1, 1).contiguous(), count


def reduce_rows(loss: torch.Tensor, count: torch.Tensor, reduction: str) -> torch.Tensor:
    """The public loss from the weighted rows. A mean over no counted row is NaN with zero gradients,
    as torch's (0 / 0 in its loss, nothing in its gradient)."""
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "mean":
        return torch.where(count > 0, total, torch.full_like(total, math.nan))
    return total


@torch.library.custom_op("nki_ops::scale_rows_nki", mutates_args=())
def scale_rows_nki(values: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``values[N, F] * grad[N, None]``, in the values' dtype."""
    if values.numel() == 0:
        return torch.zeros_like(values)
    return scale_rows_kernel(values.contiguous(), grad.to(torch.float32).reshape(-1, 1).contiguous())


@scale_rows_nki.register_fake
def _(values, grad):
    return torch.empty_like(values)


@torch.library.custom_op("nki_ops::cross_entropy_nki", mutates_args=())
def cross_entropy_forward_nki(logits: torch.Tensor, target: torch.Tensor, row_weight: torch.Tensor,
                              label_smoothing: float, softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    if logits.shape[0] == 0:
        return logits.new_zeros((0,), dtype=torch.float32), torch.zeros_like(logits)
    loss, dlogits = cross_entropy_kernel(logits.contiguous(), target, row_weight, label_smoothing, softcap)
    return loss.reshape(-1), dlogits


@cross_entropy_forward_nki.register_fake
def _(logits, target, row_weight, label_smoothing, softcap):
    return logits.new_empty((logits.shape[0],), dtype=torch.float32), logits.new_empty(logits.shape)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output[1])


def _backward(ctx, grad, _grad_dlogits):
    (dlogits,) = ctx.saved_tensors
    return scale_rows_nki(dlogits, grad), None, None, None, None


cross_entropy_forward_nki.register_autograd(_backward, setup_context=_setup_context)


def cross_entropy_nki(logits, target, ignore_index, reduction, label_smoothing, softcap):
    """The ``nki`` backend of ``nki_ops.cross_entropy``: inputs already checked."""
    target_col, row_weight, count = row_columns(target, ignore_index, reduction)
    loss, _ = cross_entropy_forward_nki(logits, target_col, row_weight, float(label_smoothing),
                                        float(softcap or 0.0))
    return reduce_rows(loss, count, reduction).to(logits.dtype)


@torch.library.custom_op("nki_ops::fused_linear_cross_entropy_nki", mutates_args=())
def fused_linear_cross_entropy_forward_nki(
        hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor,
        row_weight: torch.Tensor, label_smoothing: float,
        softcap: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The summed weighted loss (fp32 scalar) and the gradients of hidden, weight and bias (empty
    without a bias)."""
    d_bias = hidden.new_zeros((0,)) if bias is None else torch.zeros_like(bias)
    if hidden.shape[0] == 0:
        return (hidden.new_zeros((), dtype=torch.float32), torch.zeros_like(hidden), torch.zeros_like(weight),
                d_bias)
    loss, d_hidden, d_weight, d_bias_col = fused_linear_cross_entropy_kernel(
        hidden.contiguous(), weight.contiguous(), None if bias is None else bias.reshape(1, -1).contiguous(), target,
        row_weight, label_smoothing, softcap)
    if bias is not None:
        d_bias = d_bias_col.reshape(-1)
    return loss.sum(), d_hidden, d_weight, d_bias


@fused_linear_cross_entropy_forward_nki.register_fake
def _(hidden, weight, bias, target, row_weight, label_smoothing, softcap):
    d_bias = hidden.new_empty((0,)) if bias is None else bias.new_empty(bias.shape)
    return hidden.new_empty((), dtype=torch.float32), hidden.new_empty(hidden.shape), weight.new_empty(weight.shape), \
        d_bias


def _setup_fused_context(ctx, inputs, output):
    ctx.has_bias = inputs[2] is not None
    ctx.save_for_backward(*output[1:])


def _scaled(values: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``values * grad`` for a scalar ``grad``, on the backward kernel (``values`` as ``[rows, F]``)."""
    rows = values.reshape(values.shape[0], -1)
    return scale_rows_nki(rows, grad.reshape(1).expand(rows.shape[0])).reshape(values.shape)


def _fused_backward(ctx, grad, _d_hidden, _d_weight, _d_bias):
    d_hidden, d_weight, d_bias = ctx.saved_tensors
    return (_scaled(d_hidden, grad), _scaled(d_weight, grad), _scaled(d_bias, grad) if ctx.has_bias else None,
            None, None, None, None)


fused_linear_cross_entropy_forward_nki.register_autograd(_fused_backward, setup_context=_setup_fused_context)


def fused_linear_cross_entropy_nki(hidden, weight, target, bias, ignore_index, reduction, label_smoothing, softcap):
    """The ``nki`` backend of ``nki_ops.fused_linear_cross_entropy``: inputs already checked."""
    target_col, row_weight, count = row_columns(target, ignore_index, reduction)
    loss, *_ = fused_linear_cross_entropy_forward_nki(hidden, weight, bias, target_col, row_weight,
                                                      float(label_smoothing), float(softcap or 0.0))
    return reduce_rows(loss, count, reduction).to(hidden.dtype)
