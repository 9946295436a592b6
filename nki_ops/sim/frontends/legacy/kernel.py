"""Simulated ``neuronxcc.nki`` kernels: the ``jit``/``trace``/``baremetal``/``benchmark``/``profile``
decorators, SPMD grids (launched by ``core.launch``) and the cost model's ``benchmark_result``."""

from __future__ import annotations

import numpy as np

from ... import core
from ...core import launch
from ...core.errors import KernelUsageError
from ...observers.profile import Profile, listen
from . import tiles
from .grid import GridDim

_TARGET_ALIASES = {"trn1": "trn1", "inf2": "inf2", "trn2": "trn2", "trn1n": "trn1"}
_MULTI_CORE_TARGETS = ("trn2",)

# Keyword arguments each entry point takes. Those about compilation, artifacts and device runs are
# accepted and have no effect here (there is no compiler run, NEFF or device).
_COMPILE_OPTIONS = frozenset({"platform_target", "additional_compile_opt", "artifacts_dir", "save_neff_name",
                              "save_trace_name", "experimental_flags", "kernel_return", "show_compiler_tb",
                              "debug_kernel"})
_OPTIONS = {
    "jit": _COMPILE_OPTIONS, "trace": _COMPILE_OPTIONS, "baremetal": _COMPILE_OPTIONS,
    "benchmark": _COMPILE_OPTIONS | {"warmup", "iters", "device_count"},
    "profile": _COMPILE_OPTIONS | {"working_directory", "overwrite", "profile_nth", "num_execs"},
}


class Kernel(launch.Kernel):
    """A kernel function prepared for the simulator; ``kernel[g0, g1](...)`` launches an SPMD grid, one
    instance after another (as the device does), each instance's on-chip capacity checked after it.

    ``directives`` are the ``nki.compiler`` kernel decorators applied to it (``force_auto_alloc``
    and the like). ``cores`` > 1 (an ``nl.nc`` grid dimension) spreads the instances over physical
    NeuronCores, which only multi-core targets have. A ``benchmark`` kernel keeps its last run's
    :class:`BenchmarkResult`."""

    settings = ("mode", "grid", "target", "directives", "cores")

    def __init__(self, func, *, mode: str = "auto", grid: tuple[int, ...] = (), target: str | None = None,
                 directives: frozenset = frozenset(), cores: int = 1):
        if isinstance(func, Kernel):
            # Re-decorating a kernel (baremetal(jit(platform_target='trn2')(f))) keeps what it set.
            directives = directives | func.directives
            target = target if target is not None else func.target
            func = func.func
        self.mode, self.grid, self.target, self.directives, self.cores = mode, grid, target, directives, cores
        self.benchmark_result = BenchmarkResult(self, None) if mode == "benchmark" else None
        super().__init__(func)

    def __getitem__(self, grid) -> "Kernel":
        grid = grid if isinstance(grid, tuple) else (grid,)
        sizes, cores = [], 1
        for size in grid:
            if isinstance(size, GridDim):
                sizes.append(size.size)
                cores *= size.cores
            elif isinstance(size, (int, np.integer)) and not isinstance(size, bool) and size >= 0:
                # A dimension of 0 launches one instance along it: the public pipelined-attention
                # kernel runs flash_fwd[0] with program_id(0) as its batch index and checks the output.
                sizes.append(max(int(size), 1))
            else:
                raise KernelUsageError(f"SPMD grid dimensions must be non-negative ints, nl.nc(n) or "
                                       f"nl.spmd_dim(...), got {size!r}")
        return self.replace(grid=tuple(sizes), cores=cores)

    def __call__(self, *args, **kwargs):
        if self.benchmark_result is None:
            return super().__call__(*args, **kwargs)
        with listen() as launches:
            outputs = super().__call__(*args, **kwargs)
        self.benchmark_result = BenchmarkResult(self, Profile(launches()))
        return outputs

    def launches(self, calls):
        config = launch.config_for(self.target)
        if self.cores > 1 and config.target not in _MULTI_CORE_TARGETS:
            raise KernelUsageError(f"SPMD grid with multi neuron cores is not supported on {config.target} (nl.nc "
                                   f"grids need {', '.join(_MULTI_CORE_TARGETS)})")
        return _GridLaunch(self.func, config, self.grid, frontend={"directives": self.directives})(calls)

    def check_inside(self) -> None:
        if self.grid:
            raise KernelUsageError(f"kernel {self.func.__qualname__} with an SPMD grid cannot be called from inside "
                                   f"another kernel")


class _GridLaunch(launch.Launch):
    """An SPMD grid: one program running every grid point in turn, on tiles."""

    tensor_type = argument_type = tiles.Tile
    argument_buffer, label = core.shared_hbm, "grid instance {}"


class BenchmarkResult:
    """``kernel.benchmark_result`` of an ``nki.benchmark`` kernel. The simulator runs on a CPU: its
    ``nc_latency`` is the cost model's estimate of the kernel's last run (its :class:`Profile`: SPMD
    instances one after another, as on the device) for the run's target."""

    def __init__(self, kernel: Kernel, profile: Profile | None):
        self.kernel, self.profile = kernel, profile

    @property
    def nc_latency(self) -> EstimatedLatency:
        if self.profile is None or not self.profile.launches:
            raise KernelUsageError(f"benchmark_result.nc_latency of {self.kernel.func.__qualname__}: call the "
                                   f"kernel first (the latency is of its last run)")
        return EstimatedLatency(self.profile.seconds * 1e6, self.profile.estimate.label)


class EstimatedLatency:
    """``nc_latency`` from the cost model: every percentile is the one estimate, in microseconds
    (as the device reports). ``label`` names the target: an estimate, not a measurement."""

    def __init__(self, microseconds: float, label: str):
        self.microseconds, self.label = microseconds, label

    def get_latency_percentile(self, percentile) -> float:
        if not 0 <= percentile <= 100:
            raise KernelUsageError(f"get_latency_percentile: percentile must be within [0, 100], got {percentile}")
        return self.microseconds

    def __repr__(self) -> str:
        return f"<nc_latency {self.microseconds:.2f} us, {self.label}>"


def _decorator(mode: str):
    allowed = _OPTIONS[mode]

    def make(func=None, **options):
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise KernelUsageError(f"nki.{mode}() got unexpected keyword argument(s) {', '.join(unknown)} "
                                   f"(accepted: {', '.join(sorted(allowed))})")
        if mode == "profile" and "working_directory" not in options:
            raise KernelUsageError("nki.profile needs working_directory= (an absolute path)")
        platform = options.get("platform_target")
        target = None if platform is None else launch.simulated_target(platform, _TARGET_ALIASES,
                                                                        f"platform_target={platform!r}")
        return Kernel.decorate(func, mode=mode, target=target)
    return make


def jit(func=None, mode: str = "auto", **options):
    """``@nki.jit`` / ``@nki.jit(mode=...)``: every mode runs in the simulator."""
    if mode not in ("auto", "jax", "torchxla", "baremetal", "benchmark", "simulation", "trace"):
        raise KernelUsageError(f"nki.jit: unknown mode {mode!r}")
    return _decorator("benchmark" if mode == "benchmark" else "jit")(func, **options)


trace = _decorator("trace")
baremetal = _decorator("baremetal")
benchmark = _decorator("benchmark")
benchmark.__doc__ = """``nki.benchmark(warmup=, iters=, ...)(kernel)``: calling it runs the kernel in the simulator and
returns its outputs; ``benchmark_result.nc_latency.get_latency_percentile(p)`` is the cost model's estimate
of the device latency in microseconds (an estimate for the target, not a measurement)."""
profile = _decorator("profile")
profile.__doc__ = """``nki.profile(working_directory=, ...)(kernel)``: calling it runs the kernel in the simulator and
returns its outputs; no NEFF, trace or profile files are written."""


def simulate_kernel(kernel, *args, **kwargs):
    """Run ``kernel`` (a jit/trace/baremetal kernel, possibly with a grid, or a plain function)."""
    return Kernel.of(kernel, "simulate_kernel", "a kernel function")(*args, **kwargs)
