"""SwiGLU and GeGLU (tanh form) of a 4,096-token batch through an MLP of intermediate size 2,048 (gate and
up 4,096 x 2,048 fp32), forward and backward: every available backend against the torch eager reference,
both ops in one run (``nki-ops bench swiglu`` or ``geglu``), each op's rows in its own CSV."""

from __future__ import annotations

import torch

import nki_ops
from nki_ops.ops.glu.reference import geglu_reference, swiglu_reference

from .harness import Row, compare_backends

OPS = {"swiglu": (nki_ops.swiglu, swiglu_reference), "geglu": (nki_ops.geglu, geglu_reference)}
OPTIONS = {"swiglu": (), "geglu": ("tanh",)}
# The op is named in the note: one run prints both ops' rows in one table.
NOTES = {"swiglu": "swiglu, forward + backward", "geglu": "geglu (tanh), forward + backward"}


def _timed(op):
    call, reference = OPS[op]
    options = OPTIONS[op]

    def forward_backward(gate, up, grad, *, backend):
        gate.grad = up.grad = None
        call(gate, up, *options, backend=backend).backward(grad)

    def reference_forward_backward(gate, up, grad):
        gate.grad = up.grad = None
        reference(gate, up, *options).backward(grad)

    return forward_backward, reference_forward_backward


def run(rows: int = 4096, features: int = 2048, *, repeats: int = 20) -> list[Row]:
    g = torch.Generator().manual_seed(0)
    gate = torch.randn(rows, features, generator=g).requires_grad_()
    up = torch.randn(rows, features, generator=g).requires_grad_()
    grad = torch.randn(rows, features, generator=g)
    rows_out = []
    for op in OPS:
        call, reference = _timed(op)
        rows_out += compare_backends(op, call, reference, (gate, up, grad), repeats=repeats, include_compile=False,
                                     note=NOTES[op])
    return rows_out
