"""What the op backends built on this project's C++ libraries share: availability, label, dtypes."""

from __future__ import annotations

import torch

from .._backends import TensorSpec
from . import operators
from ._emulation import current_options
from .custom_op import neuron_custom_op

# The operators compute in float32; half-precision inputs are computed in float32 as the torch
# references do. float64 has no GpSimd dtype.
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def is_emulated() -> bool:
    """True off a Neuron host, where the operators run in the CPU emulation."""
    return neuron_custom_op() is None


def label() -> str:
    if not is_emulated():
        return "cpp (GpSimd)"
    return "cpp (emulated on CPU, " + ("checked)" if current_options().checks else "fast mode)")


def unavailable_reason(name: str):
    """A registry ``unavailable_reason`` for the backend built on library ``name``."""
    return lambda: operators.unavailable_reason(name)


def input_reason(op: str, *tensors: TensorSpec) -> str | None:
    """None when the C++ operator takes these tensors (dtype, and CPU tensors off-device), else why not."""
    for t in tensors:
        if is_emulated() and t.device.type != "cpu":
            return f"the C++ {op} operator runs on CPU tensors here (the CPU emulation), got a tensor on {t.device}"
        if t.dtype not in SUPPORTED_DTYPES:
            return (f"the C++ {op} operator computes in float32 and takes float32, float16 or bfloat16 "
                    f"(GpSimd kernels have no float64), got {t.dtype}")
    return None
