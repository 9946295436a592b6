"""``nki`` (NKI 0.6, the standalone package) for the simulator: ``jit``, ``simulate``, ``cpu_simulate``.

A kernel runs eagerly on the CPU, one instruction after another. NumPy arrays and torch CPU tensors
go in as HBM tensors (sharing memory, so inputs the kernel writes are updated in place); results
come back in the same format. ``kernel[2](...)`` is an LNC2 launch: two programs on two threads,
each with its own run state and ``nl.program_id(0)``, synchronised by ``nisa.core_barrier`` and
``nisa.sendrecv``. ``simulate_ranks(kernel, ranks, inputs)`` runs several ranks (logical
NeuronCores, each of its LNC's programs) for ``nki.collectives``. The target comes from
``NEURON_PLATFORM_TARGET_OVERRIDE`` (or ``NKI_NC_VERSION``),
else ``jit(platform_target=...)``, else the target a listening cost model estimates for
(``nki_ops.sim.profile(kernel, target=...)``), else ``NKI_OPS_SIM_TARGET``, else trn3 (the real
simulator's default without a chip).
"""

from __future__ import annotations

import os

from ... import core
from ...core import launch
from ...core.collectives import Exchange, World
from ...core.errors import KernelUsageError, UnsupportedError, refuse_unknown
from . import builtin, collectives, compiler, dtypes, isa, language, tensor, typing
from .tensor import NkiTensor

dtype = dtypes
__nki_ops_simulator__ = True
__all__ = ["jit", "simulate", "cpu_simulate", "simulate_ranks", "language", "isa", "typing", "tensor", "compiler",
           "collectives", "builtin", "dtype", "MODULES"]

_TARGETS = {"trn1": "trn1", "inf2": "inf2", "gen2": "trn1", "trn2": "trn2", "gen3": "trn2", "trn3": "trn3",
            "gen4": "trn3"}
_MODES = ("auto", "trace", "simulation", "baremetal", "torchxla", "jax")


def _target(platform_target: str | None) -> str:
    """The target a launch runs as: the Neuron environment overrides, the kernel's ``platform_target``,
    the target a listening cost model estimates for, ``NKI_OPS_SIM_TARGET``, else trn3."""
    for source in (os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE"), os.environ.get("NKI_NC_VERSION"),
                   platform_target, core.trace.requested_target(), os.environ.get("NKI_OPS_SIM_TARGET")):
        if source:
            return launch.simulated_target(source, _TARGETS, f"target {source!r}")
    return "trn3"


class Kernel(launch.Kernel):
    """A kernel function for the simulator; ``kernel[2]`` is its LNC2 launch."""

    settings = ("lnc", "platform_target", "schedule")

    def __init__(self, func, *, lnc: int = 1, platform_target: str | None = None, schedule: tuple = ()):
        if isinstance(func, Kernel):
            func, platform_target, schedule = func.func, func.platform_target, func.schedule
        self.lnc, self.platform_target, self.schedule = lnc, platform_target, schedule
        self.grid = (lnc,) if lnc > 1 else ()  # as kernel[...] spelled it (an LNC1 launch: kernel)
        super().__init__(func)

    def with_schedule(self, edges) -> "Kernel":
        """This kernel with extra dependency edges ``[(consumer, producer or [producers]), ...]`` between
        instructions named with ``name=`` (the scheduling guide). Instructions run in program order
        here, so the edges change nothing computed; a launch checks that every name was issued and
        that the edges have no cycle."""
        pairs = []
        for edge in edges:
            if not isinstance(edge, (tuple, list)) or len(edge) != 2 or not isinstance(edge[0], str):
                raise KernelUsageError(f"with_schedule takes (name, name or list of names) pairs, got {edge!r}")
            producers = [edge[1]] if isinstance(edge[1], str) else list(edge[1])
            if not all(isinstance(p, str) for p in producers):
                raise KernelUsageError(f"with_schedule: producers of {edge[0]!r} must be names, got {edge[1]!r}")
            pairs.extend((edge[0], p) for p in producers)
        _check_acyclic(pairs)
        return self.replace(schedule=self.schedule + tuple(pairs))

    def __getitem__(self, lnc) -> "Kernel":
        if isinstance(lnc, tuple):
            if len(lnc) != 1:
                raise KernelUsageError(f"an LNC launch takes one number (kernel[2]), got kernel{list(lnc)}")
            lnc = lnc[0]
        if lnc not in (1, 2) or isinstance(lnc, bool):
            raise KernelUsageError(f"the LNC degree must be 1 or 2, got {lnc!r}")
        return self.replace(lnc=int(lnc))

    def launches(self, calls: list[tuple[tuple, dict]]) -> list:
        """One rank per call, each a logical NeuronCore of ``lnc`` programs, every program a thread (unless
        there is just one); each rank's outputs are its program 0's. Ranks have their own HBM and meet only
        in ``nki.collectives``. The programs must issue the names of the ``with_schedule`` edges."""
        if os.environ.get("NKI_PRECISE_FP", "1") != "1":
            # The real simulator then stores bfloat16/fp8 tensors as float32 (guides/nki_simulator.rst,
            # "Precise Floating-Point Mode"); here they are always stored in their own dtype.
            raise UnsupportedError(f"NKI_PRECISE_FP={os.environ['NKI_PRECISE_FP']}",
                                   "low-precision tensors are always stored in their dtype, as with NKI_PRECISE_FP=1")
        return _LncLaunch(self.func, launch.config_for(_target(self.platform_target)), self.lnc, self.schedule)(calls)


def _check_acyclic(pairs) -> None:
    after: dict[str, set[str]] = {}
    for consumer, producer in pairs:
        after.setdefault(producer, set()).add(consumer)
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            cycle = " -> ".join(path[path.index(name):] + (name,))
            raise KernelUsageError(f"with_schedule: the edges form a cycle ({cycle}), no order satisfies them")
        if name not in done:
            for consumer in after.get(name, ()):
                visit(consumer, path + (name,))
            done.add(name)

    for name in list(after):
        visit(name, ())


def jit(fn=None, mode: str = "auto", platform_target: str | None = None, **compiler_options):
    """``@nki.jit`` / ``@nki.jit(mode=...)``: every mode runs the kernel in the simulator. Like the real
    ``nki.jit(fn=None, **kwargs)`` it takes compiler options (``debug_kernel``, ``compile_config``,
    ``experimental_flags``, ...): they change how a kernel is compiled, not what it computes."""
    if mode not in _MODES:
        raise KernelUsageError(f"nki.jit mode must be one of {_MODES}, got {mode!r}")
    return Kernel.decorate(fn, platform_target=platform_target)


def simulate(kernel):
    """``nki.simulate(kernel)(*args)`` (``nki.simulate(kernel[2])`` for LNC2): run it on the CPU."""
    return Kernel.of(kernel, "nki.simulate")


def cpu_simulate(kernel):
    """``nki.cpu_simulate(kernel)[lnc](**inputs)``, the entry point of the kernel library's harness."""
    return simulate(kernel)


# ------------------------------------------------------------------------------------- launch

class _LncLaunch(launch.Launch):
    """An LNC launch: ``lnc`` programs per rank, in lockstep through their ``Exchange``; the ranks meet in a
    ``World`` (both ``core.collectives``). Every program records the instruction names it issues
    (``name=``), all ranks together (one compiled kernel)."""

    dtypes, argument_type, argument_buffer = dtypes.SUPPORTED, NkiTensor, language.hbm
    exchange, world, label = Exchange, World, "program {0[0]} of the LNC2 launch"

    def __init__(self, func, config, lnc: int, schedule: tuple):
        self.issued: set[str] = set()
        super().__init__(func, config, (lnc,), programs=lnc, frontend={"issued names": self.issued})
        self.schedule = schedule

    @staticmethod
    def check_output(value: NkiTensor) -> None:
        if value.buffer is not language.shared_hbm and value.root.site != launch.ARGUMENT_SITE:
            # NKI 0.3.0 migration guide: "All kernel output (return) tensors must be allocated with
            # buffer=nl.shared_hbm. Using nl.hbm for output tensors will cause compilation failures."
            # Arguments (an output passed in and returned) are the caller's tensors, not allocations.
            raise KernelUsageError(f"kernel returned '{value.name}', allocated in {value.buffer!r} (private to "
                                   f"one core; nl.hbm is nl.private_hbm); kernel outputs must be allocated "
                                   f"with buffer=nl.shared_hbm", value.site)

    def replay_key(self) -> tuple:
        return self.schedule

    def check(self) -> None:
        unknown = sorted({name for edge in self.schedule for name in edge} - self.issued)
        if unknown:
            raise KernelUsageError(f"with_schedule names instructions the kernel {self.func.__qualname__} never "
                                   f"issued: {unknown} (issued: {sorted(self.issued) or 'none with name='})")


def simulate_ranks(kernel, ranks: int, inputs, lnc: int | None = None, platform_target: str | None = None) -> list:
    """Run ``kernel`` as ``ranks`` collective ranks (an nki-ops extension; the real simulator has no
    collectives). ``inputs``: the keyword arguments, one dict for every rank (each rank gets its own
    copy of the arrays; rank 0 the originals) or a list of one dict per rank. ``lnc`` defaults to the
    kernel's (``kernel[2]``). Returns the list of each rank's outputs."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise KernelUsageError(f"simulate_ranks: ranks must be a positive int, got {ranks!r}")
    if isinstance(inputs, dict):
        inputs = [inputs] * ranks
    if not isinstance(inputs, (list, tuple)) or len(inputs) != ranks or not all(isinstance(i, dict) for i in inputs):
        raise KernelUsageError(f"simulate_ranks: inputs must be a dict of keyword arguments or a list of {ranks} "
                               f"such dicts (one per rank)")
    kernel = simulate(kernel) if lnc is None else simulate(kernel)[lnc]
    if core.get_run() is not None:
        raise KernelUsageError("simulate_ranks: a multi-rank launch cannot start inside a kernel")
    if platform_target:
        kernel = kernel.replace(platform_target=platform_target)
    return kernel.launches([((), dict(i)) for i in inputs])


# Every ``nki.*`` module, registered up front by install() and the nki_cpu_simulator alias.
MODULES = {
    "nki.language": language, "nki.language.dtypes": dtypes, "nki.isa": isa, "nki.isa.constants": isa.constants,
    "nki.typing": typing, "nki.tensor": tensor, "nki.dtype": dtypes, "nki.compiler": compiler,
    "nki.collectives": collectives, "nki.builtin": builtin,
}
language.dtypes = dtypes


__getattr__ = refuse_unknown("nki")
