"""Cross-entropy over a vocabulary, forward + backward (a language model's loss step): every available
backend against the torch eager reference, in one run."""

from __future__ import annotations

import torch

import nki_ops
from nki_ops.ops.cross_entropy.reference import cross_entropy_reference

from .harness import Row, compare_backends

OPTIONS = dict(ignore_index=-100, reduction="mean", label_smoothing=0.1, softcap=None)


def _forward_backward(logits, target, *, backend):
    logits.grad = None
    nki_ops.cross_entropy(logits, target, **OPTIONS, backend=backend).backward()


def _reference_forward_backward(logits, target):
    logits.grad = None
    cross_entropy_reference(logits, target, *OPTIONS.values()).backward()


def run(rows: int = 1024, vocab: int = 8192, *, repeats: int = 10) -> list[Row]:
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(rows, vocab, generator=g)).requires_grad_()
    target = torch.randint(0, vocab, (rows,), generator=g)
    target[::17] = -100
    return compare_backends("cross_entropy", _forward_backward, _reference_forward_backward, (logits, target),
                            repeats=repeats, include_compile=False, note="forward + backward, label smoothing 0.1")
