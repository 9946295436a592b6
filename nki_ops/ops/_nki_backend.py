"""What the ``nki`` backend of every op tells the registry: availability, label, inputs it takes."""

from __future__ import annotations

import torch

from .. import nki_api
from .._backends import TensorSpec, is_neuron_device, register

NKI_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def is_simulated() -> bool:
    """True when the NKI kernels run in the nki-ops simulator on this CPU, not on a NeuronCore."""
    return nki_api.SIMULATED


def unavailable_reason() -> str | None:
    # The simulator runs everywhere and a current SDK runs the kernels on XLA tensors (see
    # input_reason); a legacy-only SDK cannot run kernels written for the current API.
    return nki_api.UNAVAILABLE


def label() -> str:
    return "nki (simulated on CPU)" if is_simulated() else "nki"


def input_reason(*tensors: TensorSpec) -> str | None:
    for tensor in tensors:
        if tensor.dtype not in NKI_DTYPES:
            return f"the NKI kernels take float32, bfloat16 or float16 tensors, got {tensor.dtype}"
        if not is_simulated() and not is_neuron_device(tensor.device):
            return (f"with the Neuron SDK the NKI kernels need tensors on the Neuron (XLA) device, got "
                    f"{tensor.device}; set NKI_OPS_BACKEND=sim to simulate them on the CPU")
    return None


def register_nki(op: str, fn) -> None:
    """Register ``fn`` as ``op``'s nki implementation, checking every tensor argument."""
    register(op, "nki", fn, unavailable_reason, label,
             input_reason=lambda *inputs: input_reason(*(t for t in inputs if isinstance(t, TensorSpec))))
