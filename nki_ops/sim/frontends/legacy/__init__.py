"""``neuronxcc.nki`` for the simulator: ``jit``, ``trace``, ``baremetal``, ``benchmark``, ``profile``,
``simulate_kernel`` and ``compiler`` (direct allocation).

Every entry point runs the kernel eagerly on the CPU. Inputs are NumPy arrays (torch CPU
tensors are accepted and outputs come back as torch tensors); they become HBM tensors.
A kernel may return HBM tensors it created (``nl.ndarray(..., buffer=nl.shared_hbm)``) or
write outputs passed in by reference with ``nl.store``.
"""

from __future__ import annotations

from ... import core
from ...core.errors import refuse_unknown
from . import compiler, isa, language, typing
from .kernel import Kernel, baremetal, benchmark, jit, profile, simulate_kernel, trace  # noqa: F401

__all__ = ["jit", "trace", "baremetal", "benchmark", "profile", "simulate_kernel", "compiler", "language", "isa",
           "typing", "tensor"]

# ``nki.tensor``: the class of the tensors a kernel sees (its arguments are annotated with it).
tensor = core.Tensor


__getattr__ = refuse_unknown("nki")
