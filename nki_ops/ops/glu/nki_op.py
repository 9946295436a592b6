"""SwiGLU and GeGLU on the NKI kernels of ``nki_kernel.py``, as torch.library ops with autograd.

One forward op and one backward op serve both, told the activation by name (``"silu"``, ``"gelu"``,
``"gelu_tanh"``). The kernels take ``[N, F]``: any tensor is viewed as ``[128, numel / 128]`` when its
size allows, so every partition works even for a few wide rows, else as ``[numel / last, last]``. On
a Neuron (XLA) device the kernels run through ``nki.jit``; anywhere else in the nki-ops simulator.
The backward saves only the inputs: the activation is recomputed from gate.
"""

from __future__ import annotations

import torch

from .._nki_tiling import PARTITIONS
from .nki_kernel import glu_backward_kernel, glu_kernel


def _tiles(values: torch.Tensor) -> torch.Tensor:
    """``values`` as the kernels' contiguous ``[N, F]``."""
    count = values.numel()
    if count % PARTITIONS == 0:
        return values.reshape(PARTITIONS, count // PARTITIONS).contiguous()
    last = values.shape[-1] if values.dim() else 1
    return values.reshape(count // last, last).contiguous()


@torch.library.custom_op("nki_ops::glu_nki", mutates_args=())
def glu_nki(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    if gate.numel() == 0:
        return torch.empty_like(gate)
    return glu_kernel(_tiles(gate), _tiles(up), activation).reshape(gate.shape)


@glu_nki.register_fake
def _(gate, up, activation):
    return torch.empty_like(gate)


@torch.library.custom_op("nki_ops::glu_backward_nki", mutates_args=())
def glu_backward_nki(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                     activation: str) -> tuple[torch.Tensor, torch.Tensor]:
    if gate.numel() == 0:
        return torch.zeros_like(gate), torch.zeros_like(up)
    dgate, dup = glu_backward_kernel(_tiles(grad.to(gate.dtype)), _tiles(gate), _tiles(up), activation)
    return dgate.reshape(gate.shape), dup.reshape(up.shape)


@glu_backward_nki.register_fake
def _(grad, gate, up, activation):
    return torch.empty_like(gate), torch.empty_like(up)


def _setup_context(ctx, inputs, output):
    gate, up, activation = inputs
    ctx.save_for_backward(gate, up)
    ctx.activation = activation


def _backward(ctx, grad):
    gate, up = ctx.saved_tensors
    dgate, dup = glu_backward_nki(grad, gate, up, ctx.activation)
    return dgate, dup, None


glu_nki.register_autograd(_backward, setup_context=_setup_context)


def swiglu_nki(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The ``nki`` backend of ``nki_ops.swiglu``."""
    return glu_nki(gate, up, "silu")


def geglu_nki(gate: torch.Tensor, up: torch.Tensor, approximate: str) -> torch.Tensor:
    """The ``nki`` backend of ``nki_ops.geglu``: ``approximate`` already checked."""
    return glu_nki(gate, up, "gelu_tanh" if approximate == "tanh" else "gelu")
