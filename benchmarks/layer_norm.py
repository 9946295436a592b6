"""LayerNorm (with bias) of 4,096 x 1,024 fp32 activations, forward and backward (a training step's share):
every available backend against the torch eager reference, in one run."""

from __future__ import annotations

import torch

import nki_ops
from nki_ops.ops.layer_norm.reference import layer_norm_reference

from .harness import Row, compare_backends

EPS = 1e-5


def _forward_backward(x, weight, bias, grad, *, backend):
    x.grad = weight.grad = bias.grad = None
    nki_ops.layer_norm(x, weight, bias, EPS, backend=backend).backward(grad)


def _reference_forward_backward(x, weight, bias, grad):
    x.grad = weight.grad = bias.grad = None
    layer_norm_reference(x, weight, bias, EPS).backward(grad)


def run(rows: int = 4096, features: int = 1024, *, repeats: int = 20) -> list[Row]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, features, generator=g).requires_grad_()
    weight = (1 + 0.1 * torch.randn(features, generator=g)).requires_grad_()
    bias = (0.1 * torch.randn(features, generator=g)).requires_grad_()
    grad = torch.randn(rows, features, generator=g)
    return compare_backends("layer_norm", _forward_backward, _reference_forward_backward, (x, weight, bias, grad),
                            repeats=repeats, include_compile=False, note="forward + backward")
