"""Fused linear cross-entropy in torch, chunked over the tokens: the ``torch`` backend of
``nki_ops.fused_linear_cross_entropy``, which never holds more logits than a chunk's.

Per chunk of rows it computes the logits, the loss and their gradient, and adds the gradient's share
to d_hidden, d_weight and d_bias at once; autograd saves those, and the backward only scales them by
the incoming gradient, as the nki backend does. A chunk has ``ceil(N * H / V)`` rows, so its logits are
no larger than hidden itself. Computed in fp32 for half inputs, float64 for float64.
"""

from __future__ import annotations

import math

import torch

from .._common import compute_dtype


def chunk_rows(rows: int, hidden_size: int, vocab: int) -> int:
    """Rows per chunk: the chunk's ``[rows, V]`` logits hold no more elements than hidden's ``[N, H]``."""
    return max(1, min(rows, math.ceil(rows * hidden_size / vocab)))


@torch.library.custom_op("nki_ops::fused_linear_cross_entropy_chunked", mutates_args=())
def fused_linear_cross_entropy_chunked(
        hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor,
        ignore_index: int, reduction: str, label_smoothing: float,
        softcap: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The loss (in the compute dtype) and the gradients of hidden, weight and bias (empty without a
    bias) in their own dtypes; ``softcap`` 0.0 means none."""
    dtype = compute_dtype(hidden.dtype)
    h, w = hidden.to(dtype), weight.to(dtype)
    b = None if bias is None else bias.to(dtype)
    rows, vocab = h.shape[0], w.shape[0]
    counted = target != ignore_index
    count = counted.sum()
    scale = 1.0 / count.clamp(min=1).to(dtype) if reduction == "mean" else torch.ones((), dtype=dtype)
    total = torch.zeros((), dtype=dtype)
    d_hidden = torch.empty_like(h)
    d_weight = torch.zeros_like(w)
    d_bias = None if b is None else torch.zeros_like(b)
    step = chunk_rows(rows, h.shape[1], vocab)
    for start in range(0, rows, step):
        h_chunk, valid = h[start:start + step], counted[start:start + step]
        classes = torch.where(valid, target[start:start + step], 0).long()[:, None]
        logits = h_chunk @ w.T if b is None else torch.addmm(b, h_chunk, w.T)
        squashed = None
        if softcap:
            squashed = torch.tanh(logits / softcap)
            logits = softcap * squashed
        lse = logits.logsumexp(1, keepdim=True)
        picked = logits.gather(1, classes)
        loss = (1 - label_smoothing) * (lse - picked)
        if label_smoothing:
            loss = loss + label_smoothing * (lse - logits.mean(1, keepdim=True))
        total = total + torch.where(valid[:, None], loss, 0).sum()
        # d loss / d logits = softmax - (1 - s) * onehot - s / V, per counted row, times the reduction's scale.
        grad = torch.exp(logits - lse)
        grad.scatter_add_(1, classes, torch.full_like(picked, label_smoothing - 1))
        if label_smoothing:
            grad -= label_smoothing / vocab
        if squashed is not None:
            grad *= 1 - squashed.square()
        grad *= torch.where(valid, scale, 0)[:, None]
        d_hidden[start:start + step] = grad @ w
        d_weight.addmm_(grad.T, h_chunk)
        if d_bias is not None:
            d_bias += grad.sum(0)
    loss = total * scale
    if reduction == "mean":  # no counted row: NaN, as torch's 0 / 0
        loss = torch.where(count > 0, loss, torch.full_like(loss, math.nan))
    d_bias = hidden.new_zeros((0,)) if d_bias is None else d_bias.to(bias.dtype)
    return loss, d_hidden.to(hidden.dtype), d_weight.to(weight.dtype), d_bias


@fused_linear_cross_entropy_chunked.register_fake
def _(hidden, weight, bias, target, ignore_index, reduction, label_smoothing, softcap):
    d_bias = hidden.new_empty((0,)) if bias is None else bias.new_empty(bias.shape)
    return hidden.new_empty((), dtype=compute_dtype(hidden.dtype)), hidden.new_empty(hidden.shape), \
        weight.new_empty(weight.shape), d_bias


def _setup_context(ctx, inputs, output):
    ctx.has_bias = inputs[2] is not None
    ctx.save_for_backward(*output[1:])


def _backward(ctx, grad, _d_hidden, _d_weight, _d_bias):
    d_hidden, d_weight, d_bias = ctx.saved_tensors
    return (d_hidden * grad.to(d_hidden.dtype), d_weight * grad.to(d_weight.dtype),
            d_bias * grad.to(d_bias.dtype) if ctx.has_bias else None, None, None, None, None, None)


fused_linear_cross_entropy_chunked.register_autograd(_backward, setup_context=_setup_context)


def fused_linear_cross_entropy_torch(hidden, weight, target, bias, ignore_index, reduction, label_smoothing,
                                     softcap):
    """The ``torch`` backend of ``nki_ops.fused_linear_cross_entropy``: inputs already checked."""
    loss, *_ = fused_linear_cross_entropy_chunked(hidden, weight, bias, target, ignore_index, reduction,
                                                  float(label_smoothing), float(softcap or 0.0))
    return loss.to(hidden.dtype)
