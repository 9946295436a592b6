"""Per-launch runtime state, one per thread: the config, grid position, instruction clock, on-chip liveness.

Each thread has its own current run, so kernels launched from several threads at once (and the
two instances of an LNC2 launch) never see each other's state.
"""

from __future__ import annotations

import functools
import threading
import warnings

import numpy as np

from .config import SimConfig, current_config
from .errors import KernelUsageError, SimulatorWarning
from .liveness import Ledger


class Run:
    """State of one kernel launch: config, grid position, instruction clock, on-chip liveness, shared outputs."""

    def __init__(self, config: SimConfig, grid: tuple[int, ...]):
        self.config = config
        self.grid = grid
        self.program_id: tuple[int, ...] = (0,) * len(grid)
        self.shuffle = np.random.default_rng(config.seed) if config.seed is not None else None
        self.clock = 0
        self.ledger = Ledger()
        self.shared: dict[tuple[str, int], object] = {}  # shared_hbm outputs by allocation site and count
        self.site_counts: dict[str, int] = {}
        self.budgets = {"sbuf": config.sbuf_budget, "psum": config.psum_budget}  # bytes per partition
        self.fills: dict[tuple, object] = {}  # (dtype, on chip, rules) -> the fill of new memory (``memory._poison``)
        # The class of the tensors ``memory.new_tensor`` makes: the front end's (None: ``tensors.Tensor``).
        self.tensor_type = None
        # Front-end state keyed by the front end (e.g. the legacy direct allocator's placements).
        self.frontend: dict[str, object] = {}
        # The instruction record, attached by ``trace.attach`` when an observer listens.
        self.trace = None
        # The HBM race checks shared by the launch's instances (``races.Races``), and this run's instance.
        self.races = None
        self.instance = 0
        # The replay record this run writes (``replay.Recording``), or the replay it runs (``replay.Replaying``).
        self.recording = self.replaying = None

    @functools.cached_property
    def random(self) -> np.random.Generator:
        """The legacy ``nl.rand`` generator (made on first use: most launches draw nothing)."""
        return np.random.default_rng(0 if self.config.seed is None else self.config.seed)

    def budget(self, space: str) -> int:
        return self.budgets[space]

    def shared_output(self, site: str, make):
        """The launch's shared_hbm tensor of this instance's next allocation at ``site``: made once per launch
        (``make()``), the same tensor for every grid instance and program of a rank (``shared``)."""
        count = self.site_counts.get(site, 0)
        self.site_counts[site] = count + 1
        key = (site, count)
        if key not in self.shared:
            self.shared[key] = make()
        return self.shared[key]

    def end_instance(self) -> None:
        """Check the on-chip capacity one kernel instance needed at its peak, then start afresh.

        Beyond the budget (PSUM's 8 banks, SBUF's partition) is a warning: "when the cumulative size
        of live data overflows the capacity of any on-chip memory, the Neuron compiler inserts the
        necessary spills or refills between that memory and the next-tier memory" (legacy NKI
        programming model), which costs time, not correctness. A space that holds directly
        allocated tensors is checked by address instead (nki.compiler allocators)."""
        ledger = self.ledger
        ledger.finish()
        if self.trace is not None:
            self.trace.barrier()
        try:
            for space in ("psum", "sbuf"):
                if space in ledger.direct:
                    continue
                budget = self.budget(space)
                peak, live = ledger.peak(space, budget)
                if peak <= budget:
                    continue
                listing = "; ".join(f"'{name}' {size} B at {site}" for size, name, site in live[:6])
                message = (f"{space.upper()} capacity exceeded: {peak} bytes per partition are live at once, above "
                           f"the {self.config.target} budget of {budget} (live tiles, first use to last use: "
                           f"{listing})")
                site = live[0][2] if live else None
                tier = "SBUF" if space == "psum" else "HBM"
                unfit("a simulator warning")
                warnings.warn(f"{site}: {message}; the compiler spills the excess to {tier}", SimulatorWarning,
                              stacklevel=2)
        finally:
            ledger.reset()



_local = threading.local()
recordings = 0  # replay recordings in progress, any thread (``replay.start``): the hooks' only cost when 0


def recording():
    """This thread's replay recording in progress (``replay.Recording``), or None."""
    return getattr(getattr(_local, "run", None), "recording", None)


def unfit(reason: str) -> None:
    """Hook: what the kernel does now cannot be replayed (``reason``; see ``replay.Recording``)."""
    if recordings:
        rec = recording()
        if rec is not None:
            rec.unfit(reason)


def outside(what: str) -> None:
    """Hook: tile values are read or written (``what``); outside an instruction's step that is not replayable."""
    if recordings:
        rec = recording()
        if rec is not None and not rec.depth:
            rec.unfit(f"{what} outside an instruction")


def filled(tensor) -> None:
    """Hook: a lazily filled allocation was filled (its first use read or viewed it)."""
    if recordings:
        rec = recording()
        if rec is not None:
            rec.filled.add(id(tensor))


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
    """Make ``run`` this thread's current run (None: none); returns the previous one. While a run is
    current, NumPy's floating-point error state is "ignore" (the engines make inf and NaN silently):
    set once per launch, not around every instruction."""
    previous = getattr(_local, "run", None)
    if run is not None and previous is None:
        _local.errors = np.seterr(all="ignore")
    elif run is None and previous is not None:
        np.seterr(**_local.errors)
    _local.run = run
    return previous


def active_config() -> SimConfig:
    run = getattr(_local, "run", None)
    return run.config if run is not None else current_config()


def timing_only() -> bool:
    """The cost model's timing-only mode: instructions keep their checks, shapes and dependencies but
    compute no values (see ``SimConfig.timing_only``)."""
    return active_config().timing_only


def require_values(what: str) -> None:
    """In timing-only mode, refuse ``what``: it depends on tensor values, which the mode does not compute."""
    unfit(what)
    if active_config().timing_only:
        raise KernelUsageError(f"timing-only mode cannot run {what}: it depends on tensor values, which the mode "
                               f"does not compute; run the kernel without timing_only (configure(timing_only=False) "
                               f"or NKI_OPS_SIM_TIMING_ONLY=0)")


def violation(error: Exception) -> None:
    """Raise a hardware-limit violation, or warn about it when the config is not strict."""
    if active_config().strict:
        raise error
    unfit("a simulator warning")
    warnings.warn(str(error), SimulatorWarning, stacklevel=3)

