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

import dataclasses
import functools
import inspect
import os
import threading

import numpy as np

from ... import core
from ...core import host
from ...core.config import current_config
from ...core.errors import KernelUsageError, SimulatorError, UnsupportedError
from ...core.memory import report_poison
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
            if source not in _TARGETS:
                raise UnsupportedError(f"target {source!r}", f"simulated targets: {sorted(_TARGETS)}")
            return _TARGETS[source]
    return "trn3"


class Kernel:
    """A kernel function for the simulator; ``kernel[2]`` is its LNC2 launch."""

    def __init__(self, func, *, lnc: int = 1, platform_target: str | None = None, schedule: tuple = ()):
        if isinstance(func, Kernel):
            func, platform_target, schedule = func.func, func.platform_target, func.schedule
        self.func, self.lnc, self.platform_target, self.schedule = func, lnc, platform_target, schedule
        functools.update_wrapper(self, func)

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
        return Kernel(self.func, lnc=self.lnc, platform_target=self.platform_target,
                      schedule=self.schedule + tuple(pairs))

    def __getitem__(self, lnc) -> "Kernel":
        if isinstance(lnc, tuple):
            if len(lnc) != 1:
                raise KernelUsageError(f"an LNC launch takes one number (kernel[2]), got kernel{list(lnc)}")
            lnc = lnc[0]
        if lnc not in (1, 2) or isinstance(lnc, bool):
            raise KernelUsageError(f"the LNC degree must be 1 or 2, got {lnc!r}")
        return Kernel(self.func, lnc=int(lnc), platform_target=self.platform_target, schedule=self.schedule)

    def __call__(self, *args, **kwargs):
        return launch(self.func, self.lnc, args, kwargs, self.platform_target, self.schedule)

    def __repr__(self) -> str:
        return f"<simulated NKI kernel {self.func.__qualname__}{f'[{self.lnc}]' if self.lnc > 1 else ''}>"


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
    if fn is None:
        return lambda f: Kernel(f, platform_target=platform_target)
    return Kernel(fn, platform_target=platform_target)


def simulate(kernel):
    """``nki.simulate(kernel)(*args)`` (``nki.simulate(kernel[2])`` for LNC2): run it on the CPU."""
    if not callable(kernel):
        raise KernelUsageError(f"nki.simulate needs a kernel, got {type(kernel).__name__}")
    return kernel if isinstance(kernel, Kernel) else Kernel(kernel)


def cpu_simulate(kernel):
    """``nki.cpu_simulate(kernel)[lnc](**inputs)``, the entry point of the kernel library's harness."""
    return simulate(kernel)


# ------------------------------------------------------------------------------------- launch

class _HostIO:
    """Host arguments (NumPy arrays, torch CPU tensors) as HBM tensors, and results back."""

    def __init__(self, taken: list[np.ndarray] | None = None):
        # (host argument, its contiguous copy the kernel sees, the copy's bytes before the run, name)
        self.copy_back: list[tuple[object, np.ndarray, np.ndarray, str]] = []
        self.saw_torch = False
        # Host memory earlier ranks of the launch use as their HBM, and the memory this rank uses.
        self.taken = [] if taken is None else taken
        self.mine: list[np.ndarray] = []

    def to_kernel(self, value, name: str):
        if isinstance(value, np.ndarray):
            array = value
            if self._private(value):
                array = value.copy()  # another rank holds this memory: this rank gets its own HBM copy
            elif not (value.flags.c_contiguous and value.flags.writeable):
                array = np.ascontiguousarray(value)
                self.copy_back.append((value, array, array.copy(), name))
            return self._tensor(array, name)
        if host.is_torch(value):
            self.saw_torch = True
            array, shares_memory = host.torch_to_numpy(value, name)
            if self._private(array):
                array = array.copy()
            elif not shares_memory:
                self.copy_back.append((value, array, array.copy(), name))
            return self._tensor(array, name)
        if isinstance(value, (list, tuple)) and any(isinstance(v, np.ndarray) or host.is_torch(v) for v in value):
            return type(value)(self.to_kernel(v, f"{name}[{i}]") for i, v in enumerate(value))
        return value

    def _private(self, array: np.ndarray) -> bool:
        """Whether an earlier rank uses memory ``array`` overlaps (then this rank needs a copy); else
        record it as this rank's."""
        if any(np.may_share_memory(array, other) for other in self.taken):
            return True
        self.mine.append(array)
        return False

    @staticmethod
    def _tensor(array: np.ndarray, name: str) -> NkiTensor:
        try:
            dtypes.as_dtype(array.dtype)
        except TypeError:
            raise KernelUsageError(f"Unsupported dtype {array.dtype} of kernel argument '{name}'") from None
        return NkiTensor(array, language.hbm, name, "<kernel argument>")

    def write_back(self) -> None:
        """Arguments the kernel wrote go back into the host tensors it got copies of; the others stay
        untouched (a torch tensor's version counter too)."""
        for original, array, before, name in self.copy_back:
            if np.array_equal(array.reshape(-1).view(np.uint8), before.reshape(-1).view(np.uint8)):
                continue
            if isinstance(original, np.ndarray):
                if original.flags.writeable:
                    np.copyto(original, array)
            elif any(s == 0 and n > 1 for s, n in zip(original.stride(), original.shape)):
                raise KernelUsageError(f"kernel wrote argument '{name}', an expanded torch tensor whose elements "
                                       f"share memory (stride 0); pass a tensor with memory of its own as output")
            else:
                original.detach().copy_(host.numpy_to_torch(array))

    def to_host(self, value):
        if isinstance(value, NkiTensor):
            if value.buffer.on_chip:
                raise KernelUsageError(f"kernel returned on-chip tensor '{value.name}' ({value.buffer!r}); kernel "
                                       f"outputs must be HBM tensors (nl.ndarray(..., buffer=nl.shared_hbm))",
                                       value.site)
            if value.buffer is not language.shared_hbm and value.root.site != "<kernel argument>":
                # NKI 0.3.0 migration guide: "All kernel output (return) tensors must be allocated with
                # buffer=nl.shared_hbm. Using nl.hbm for output tensors will cause compilation failures."
                # Arguments (an output passed in and returned) are the caller's tensors, not allocations.
                raise KernelUsageError(f"kernel returned '{value.name}', allocated in {value.buffer!r} (private to "
                                       f"one core; nl.hbm is nl.private_hbm); kernel outputs must be allocated "
                                       f"with buffer=nl.shared_hbm", value.site)
            return host.numpy_to_torch(np.ascontiguousarray(value.data)) if self.saw_torch else value.data
        if isinstance(value, (list, tuple)):
            return type(value)(self.to_host(v) for v in value)
        if isinstance(value, dict):
            return {k: self.to_host(v) for k, v in value.items()}
        return value


def launch(func, lnc: int, args, kwargs, platform_target: str | None = None, schedule: tuple = ()):
    """Run ``func`` as ``lnc`` programs (threads when 2) and return program 0's outputs."""
    if core.get_run() is not None:
        return func(*args, **kwargs)  # a kernel called from a kernel is an ordinary function call
    return launch_ranks(func, lnc, [(args, kwargs)], platform_target, schedule)[0]


def launch_ranks(func, lnc: int, calls: list[tuple[tuple, dict]], platform_target: str | None = None,
                 schedule: tuple = ()) -> list:
    """Run ``func`` as one rank per ``(args, kwargs)`` in ``calls``, each rank a logical NeuronCore of
    ``lnc`` programs, every program a thread (unless there is just one); return each rank's outputs
    (program 0's). Ranks have their own HBM and meet only in ``nki.collectives``. ``schedule``: the
    ``with_schedule`` edges, whose names the programs must issue."""
    if os.environ.get("NKI_PRECISE_FP", "1") != "1":
        # The real simulator then stores bfloat16/fp8 tensors as float32 (guides/nki_simulator.rst,
        # "Precise Floating-Point Mode"); here they are always stored in their own dtype.
        raise UnsupportedError(f"NKI_PRECISE_FP={os.environ['NKI_PRECISE_FP']}",
                               "low-precision tensors are always stored in their dtype, as with NKI_PRECISE_FP=1")
    config = _config(current_config(), _target(platform_target))
    ranks = len(calls)
    taken: list[np.ndarray] = []
    ios, bounds, exchanges, shareds = [], [], [], []
    for args, kwargs in calls:
        io = _HostIO(taken)
        try:
            bound = _signature(func).bind(*args, **kwargs)
        except TypeError as error:
            raise KernelUsageError(f"cannot call kernel {func.__qualname__}: {error}") from None
        for name, value in bound.arguments.items():
            bound.arguments[name] = io.to_kernel(value, name)
        taken.extend(io.mine)
        ios.append(io)
        bounds.append(bound)
        races = core.races.Races([f"program {pid} of the LNC2 launch" for pid in range(lnc)], config.races) \
            if lnc > 1 and config.races != "off" else None
        exchanges.append(isa.Exchange(lnc, races))
        shareds.append({})
    world = collectives.World(ranks, lnc, exchanges)
    results: list = [[None] * lnc for _ in range(ranks)]
    errors: list = []  # in the order they happened: the first is the cause, later ones its echo
    errors_lock = threading.Lock()
    issued: set[str] = set()  # instruction names, all programs of all ranks (one compiled kernel)

    def program(rank: int, pid: int) -> None:
        run = core.Run(config, (lnc,))
        core.trace.attach(run)
        run.frontend["issued names"] = issued
        run.program_id = (pid,)
        run.rank, run.world = rank, world
        run.exchange, run.shared = exchanges[rank], shareds[rank]
        run.races, run.instance = exchanges[rank].races, pid
        previous = core.set_run(run)
        try:
            results[rank][pid] = func(*bounds[rank].args, **bounds[rank].kwargs)
            run.end_instance()  # the on-chip capacity this program needed at its peak
            report_poison(run, results[rank][pid])
        except BaseException as error:  # noqa: BLE001 - handed to the launching thread
            with errors_lock:
                errors.append(error)
            for exchange in exchanges:  # release every program waiting for another: the launch has failed
                exchange.abort()
            world.abort()
        finally:
            exchanges[rank].finish(pid)
            world.finish(rank, pid)
            core.set_run(previous)

    if ranks * lnc == 1:
        program(0, 0)
    else:
        threads = [threading.Thread(target=program, args=(rank, pid), name=f"nki-rank{rank}-lnc{pid}")
                   for rank in range(ranks) for pid in range(lnc)]
        with core.trace.checking_races(exchanges[0].races):
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    if errors:
        _reraise(errors[0])
    unknown = sorted({name for edge in schedule for name in edge} - issued)
    if unknown:
        raise KernelUsageError(f"with_schedule names instructions the kernel {func.__qualname__} never issued: "
                               f"{unknown} (issued: {sorted(issued) or 'none with name='})")
    outputs = []
    for io, result in zip(ios, results):
        io.write_back()
        outputs.append(io.to_host(result[0]))
    return outputs


# A launch's fixed costs, made once: what is left of them is the kernel's own work.
_signature = functools.lru_cache(maxsize=256)(inspect.signature)


@functools.lru_cache(maxsize=64)
def _config(config, target: str):
    return dataclasses.replace(config, target=target)


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
    kernel = simulate(kernel)
    lnc = kernel.lnc if lnc is None else kernel[lnc].lnc
    if core.get_run() is not None:
        raise KernelUsageError("simulate_ranks: a multi-rank launch cannot start inside a kernel")
    return launch_ranks(kernel.func, lnc, [((), dict(i)) for i in inputs], platform_target or kernel.platform_target,
                        kernel.schedule)


def _reraise(error: BaseException):
    if isinstance(error, SimulatorError) or not isinstance(error, (ValueError, TypeError, IndexError,
                                                                   ArithmeticError)):
        raise error
    if not host.raised_inside_simulator(error):
        raise error
    raise SimulatorError(f"{type(error).__name__}: {error}", host.user_traceback_site(error)) from error


# Every ``nki.*`` module, registered up front by install() and the nki_cpu_simulator alias.
MODULES = {
    "nki.language": language, "nki.language.dtypes": dtypes, "nki.isa": isa, "nki.isa.constants": isa.constants,
    "nki.typing": typing, "nki.tensor": tensor, "nki.dtype": dtypes, "nki.compiler": compiler,
    "nki.collectives": collectives, "nki.builtin": builtin,
}
language.dtypes = dtypes


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise UnsupportedError(f"nki.{name}")
