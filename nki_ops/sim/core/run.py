"""Per-launch runtime state, one per thread: the config, grid position, on-chip accounting.

Each thread has its own current run, so kernels launched from several threads at once (and the
two instances of an LNC2 launch) never see each other's state.
"""

from __future__ import annotations

import threading
import warnings
from typing import TYPE_CHECKING

import numpy as np

from .config import SimConfig, current_config
from .errors import CapacityError, KernelUsageError, SimulatorWarning

if TYPE_CHECKING:
    from .memory import Tensor

class Run:
    """State of one kernel launch: config, grid position, live on-chip bytes, shared outputs."""

    def __init__(self, config: SimConfig, grid: tuple[int, ...]):
        self.config = config
        self.grid = grid
        self.program_id: tuple[int, ...] = (0,) * len(grid)
        self.shuffle = np.random.default_rng(config.seed) if config.seed is not None else None
        self.random = np.random.default_rng(0 if config.seed is None else config.seed)
        self.used = {"sbuf": 0, "psum": 0}
        self.live: dict[str, dict[int, tuple[int, str, str]]] = {"sbuf": {}, "psum": {}}
        self.shared: dict[tuple[str, int], Tensor] = {}
        self.site_counts: dict[str, int] = {}

    def budget(self, space: str) -> int:
        return self.config.sbuf_budget if space == "sbuf" else self.config.psum_budget

    def acquire(self, tensor: Tensor, nbytes: int) -> None:
        space = tensor.buffer.space
        if self.used[space] + nbytes > self.budget(space):
            live = sorted(self.live[space].values(), reverse=True)[:5]
            listing = "; ".join(f"'{n}' {b} B at {s}" for b, n, s in live)
            others = f"; largest live allocations: {listing}" if listing else "; nothing else is live"
            violation(CapacityError(
                f"{space.upper()} capacity exceeded: allocating '{tensor.name}' ({nbytes} bytes per partition) "
                f"brings live {space.upper()} to {self.used[space] + nbytes} bytes per partition, above the "
                f"{self.config.target} budget of {self.budget(space)}{others}",
                tensor.site))
        self.used[space] += nbytes
        self.live[space][id(tensor)] = (nbytes, tensor.name, tensor.site)

    def release(self, tensor: Tensor, nbytes: int) -> None:
        space = tensor.buffer.space
        self.used[space] -= nbytes
        self.live[space].pop(id(tensor), None)



_local = threading.local()


def get_run() -> Run | None:
    """The run of this thread, or None outside a kernel."""
    return getattr(_local, "run", None)


def current_run(api: str) -> Run:
    run = getattr(_local, "run", None)
    if run is None:
        raise KernelUsageError(f"{api} can only be called inside a kernel run by the simulator "
                               f"(nki.jit / nki.simulate_kernel)")
    return run


def set_run(run: Run | None) -> Run | None:
    previous = getattr(_local, "run", None)
    _local.run = run
    return previous


def active_config() -> SimConfig:
    run = getattr(_local, "run", None)
    return run.config if run is not None else current_config()


def violation(error: Exception) -> None:
    """Raise a hardware-limit violation, or warn about it when the config is not strict."""
    if active_config().strict:
        raise error
    warnings.warn(str(error), SimulatorWarning, stacklevel=3)

