"""Gated linear units, SwiGLU and GeGLU, elementwise over gate and up of one shape: public API and
backend registration."""

from __future__ import annotations

import torch

from ..._backends import resolve
from ..._checks import check_same_device, check_tensor
from .._define import define_op
from .nki_op import geglu_nki, swiglu_nki
from .reference import geglu_reference, swiglu_reference

__all__ = ["swiglu", "geglu"]

APPROXIMATIONS = ("tanh", "none")


def _demo_inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(130, 96, generator=g), torch.randn(130, 96, generator=g)


def _check_inputs(gate, up) -> None:
    check_tensor("gate", gate)
    check_tensor("up", up)
    if gate.shape != up.shape:
        raise ValueError(f"gate and up must have the same shape, got {tuple(gate.shape)} and {tuple(up.shape)}")
    if gate.dtype != up.dtype:
        raise ValueError(f"gate and up must have the same dtype, got {gate.dtype} and {up.dtype}")
    check_same_device(gate=gate, up=up)


@define_op("swiglu", torch=swiglu_reference, nki=swiglu_nki, demo=_demo_inputs, differentiable=True,
           benchmark="glu")
def swiglu(gate: torch.Tensor, up: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """``silu(gate) * up`` elementwise, with ``silu(x) = x * sigmoid(x)``; gate and up of one shape and dtype."""
    _check_inputs(gate, up)
    return resolve("swiglu", backend, gate.device, (gate, up))(gate, up)


@define_op("geglu", torch=geglu_reference, nki=geglu_nki, demo=_demo_inputs, differentiable=True,
           benchmark="glu")
def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "tanh", *, backend: str = "auto") -> torch.Tensor:
    """``gelu(gate, approximate) * up`` elementwise, gelu as ``torch.nn.functional.gelu``: ``approximate="tanh"``
    is ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))``, ``"none"`` the erf form
    ``0.5 * x * (1 + erf(x / sqrt(2)))``; gate and up of one shape and dtype."""
    _check_inputs(gate, up)
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"approximate must be 'tanh' or 'none', got {approximate!r}")
    return resolve("geglu", backend, gate.device, (gate, up))(gate, up, approximate)
