"""RMSNorm of 4,096 x 1,024 fp32 activations, forward and backward (a training step's share):
every available backend against the torch eager reference, in one run."""

from __future__ import annotations

import torch

import nki_ops
from nki_ops.ops.rms_norm.reference import rms_norm_reference

from .harness import Row, TunedRow, compare_backends, tuned_estimates

EPS = 1e-6


def _forward_backward(x, weight, grad, *, backend):
    x.grad = weight.grad = None
    nki_ops.rms_norm(x, weight, EPS, backend=backend).backward(grad)


def _reference_forward_backward(x, weight, grad):
    x.grad = weight.grad = None
    rms_norm_reference(x, weight, EPS).backward(grad)


def run(rows: int = 4096, features: int = 1024, *, repeats: int = 20) -> list[Row]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, features, generator=g).requires_grad_()
    weight = (1 + 0.1 * torch.randn(features, generator=g)).requires_grad_()
    grad = torch.randn(rows, features, generator=g)
    return compare_backends("rms_norm", _forward_backward, _reference_forward_backward, (x, weight, grad),
                            repeats=repeats, include_compile=False, note="forward + backward")


def tuned() -> list[TunedRow]:
    """The kernels' estimated device time with their default and their tuned chunk, per target."""
    from nki_ops.ops.rms_norm import tuning

    return tuned_estimates(tuning)
