"""Cross-entropy on the NKI kernels of ``nki_kernel.py``, as torch.library ops with autograd.

The forward op returns each row's weighted loss and the gradient of that loss with respect to the
logits, computed by the same kernel; autograd saves the gradient, and the backward op only scales it
by the incoming gradient (``scale_rows_kernel``), with no second pass over the logits. The row weights
carry the reduction (``1 / count`` under a mean, 0 on ignored rows), so the public function's sum of
the weighted rows is the loss and the saved gradient is already its gradient.
"""

from __future__ import annotations

import math

import torch

from .nki_kernel import cross_entropy_kernel, scale_rows_kernel


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
