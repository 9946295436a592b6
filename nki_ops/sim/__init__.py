"""A NumPy simulator of the NKI (``neuronxcc.nki``) API: run NKI kernels on any CPU.

``from nki_ops.sim import nki, nl, nisa`` gives the simulated modules directly;
``install()`` makes ``import neuronxcc.nki`` resolve to them when the Neuron SDK is absent.
"""

from __future__ import annotations

from .config import SimConfig, configure, current_config
from .errors import (CapacityError, KernelUsageError, MemorySpaceError, OutOfBoundsError, SimulatorError,
                     SimulatorWarning, TileLimitError, UnsupportedError)
from . import nki
from .install import install
from .nki import isa as nisa
from .nki import language as nl
from .nki import typing as nt

__all__ = [
    "nki", "nl", "nisa", "nt", "install", "SimConfig", "configure", "current_config", "simulate",
    "SimulatorError", "OutOfBoundsError", "MemorySpaceError", "TileLimitError", "CapacityError",
    "UnsupportedError", "KernelUsageError", "SimulatorWarning",
]


def simulate(kernel, *args, config: SimConfig | None = None, **kwargs):
    """Run ``kernel`` in the simulator with ``config`` (default: the current configuration)."""
    if config is None:
        return nki.simulate_kernel(kernel, *args, **kwargs)
    with configure(config):
        return nki.simulate_kernel(kernel, *args, **kwargs)
