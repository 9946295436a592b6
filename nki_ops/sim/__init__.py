"""A NumPy simulator of the NKI (``neuronxcc.nki``) API: run NKI kernels on any CPU.

``from nki_ops.sim import nki, nl, nisa`` gives the simulated modules directly;
``install()`` makes ``import neuronxcc.nki`` resolve to them when the Neuron SDK is absent.
"""

from __future__ import annotations

from .core.config import SimConfig, configure, current_config
from .core.errors import (
    CapacityError,
    KernelUsageError,
    MemorySpaceError,
    OutOfBoundsError,
    RaceError,
    SimulatorError,
    SimulatorWarning,
    TileLimitError,
    UnsupportedError,
)
from .frontends import legacy as nki
from .frontends.legacy import isa as nisa
from .frontends.legacy import language as nl
from .frontends.legacy import typing as nt
from .install import install
from .observers import profile as _profile

__all__ = [
    "nki", "nl", "nisa", "nt", "install", "profile", "SimConfig", "configure", "current_config", "simulate",
    "SimulatorError", "OutOfBoundsError", "MemorySpaceError", "TileLimitError", "CapacityError",
    "UnsupportedError", "KernelUsageError", "RaceError", "SimulatorWarning",
]


def simulate(kernel, *args, config: SimConfig | None = None, **kwargs):
    """Run ``kernel`` in the simulator with ``config`` (default: the current configuration)."""
    if config is None:
        return nki.simulate_kernel(kernel, *args, **kwargs)
    with configure(config):
        return nki.simulate_kernel(kernel, *args, **kwargs)


def profile(kernel, *, target: str | None = None, timing_only: bool | None = None):
    """``profile(kernel)(*args, **kwargs)``: run ``kernel`` (a simulated kernel of either front end, or a plain
    legacy kernel function) and return its :class:`~nki_ops.sim.observers.profile.Profile`."""
    if not (callable(getattr(kernel, "func", None)) or hasattr(kernel, "__getitem__")):
        kernel = nki.jit(kernel)
    return _profile.profile(kernel, target=target, timing_only=timing_only)
