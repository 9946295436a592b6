"""A kernel launch, for both front ends: the run lifecycle between the host boundary (``host``) and the
kernel's instructions.

A launch runs one *rank* per call: a logical NeuronCore with its own arguments and HBM (several only
for the current API's ``simulate_ranks``). A rank is ``programs`` programs (the two of an LNC2 launch),
each with its own run state (``run.Run``), on a thread of its own when the launch has several. The
points of the launch ``grid`` (its program ids) are dealt out to a rank's programs, which run theirs one
after another, as the device runs SPMD instances: a legacy grid is one program running every point, an
LNC2 launch two programs of one point each. A front end says what differs by subclassing :class:`Launch`:
the HBM tensors it makes of host arrays, the names of its instances, and what its programs share.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
from typing import NamedTuple

from . import blas, host, replay, trace
from . import dtypes as dt
from .config import SimConfig, current_config
from .errors import Abandoned, KernelUsageError, UnsupportedError
from .memory import report_poison
from .races import Races
from .run import Run, get_run, set_run
from .tensors import Tensor

ARGUMENT_SITE = "<kernel argument>"  # the allocation site of a kernel argument's HBM tensor


class Program(NamedTuple):
    """Program ``pid`` of ``rank``: its run, and the grid points it runs in turn, the first of them the
    rank's instance number ``first`` (``run.instance``)."""
    rank: int
    pid: int
    run: Run
    points: list
    first: int


class Kernel:
    """A kernel function as a front end's decorators prepare it. Calling it launches it (the subclass's
    ``launch``), except from inside a kernel, where it is the function: a kernel calling a kernel.
    ``settings`` name the subclass's constructor keywords (its launch grid, target, ...), which
    :meth:`replace` copies; ``grid`` is the launch grid as ``kernel[...]`` spelled it."""

    settings: tuple[str, ...] = ()
    grid: tuple = ()

    def __init__(self, func):
        self.func = func
        functools.update_wrapper(self, func)

    @classmethod
    def decorate(cls, func, **settings):
        """``@decorator`` and ``@decorator(...)``: the kernel of ``func``, or (no ``func``) the decorator."""
        return (lambda f: cls(f, **settings)) if func is None else cls(func, **settings)

    @classmethod
    def of(cls, kernel, api: str, what: str = "a kernel") -> "Kernel":
        """``kernel`` itself, or the kernel of a plain function; ``api`` needs ``what`` and refuses the rest."""
        if isinstance(kernel, cls):
            return kernel
        if not callable(kernel):
            raise KernelUsageError(f"{api} needs {what}, got {type(kernel).__name__}")
        return cls(kernel)

    def replace(self, **changes) -> "Kernel":
        """This kernel with ``changes`` to its settings."""
        return type(self)(self.func, **{name: getattr(self, name) for name in self.settings} | changes)

    def __call__(self, *args, **kwargs):
        if get_run() is None:
            return self.launch(args, kwargs)
        self.check_inside()
        return self.func(*args, **kwargs)

    def launch(self, args: tuple, kwargs: dict):
        """Launch the kernel on the host's ``args`` and ``kwargs``; return its outputs."""
        return self.launches([(args, kwargs)])[0]

    def launches(self, calls: list[tuple[tuple, dict]]) -> list:
        """Launch the kernel as one rank per ``(args, kwargs)`` in ``calls``; return each rank's outputs."""
        raise NotImplementedError

    def check_inside(self) -> None:
        """Refuse a call from inside a kernel that cannot be an ordinary function call (default: none)."""

    def __repr__(self) -> str:
        grid = f"[{', '.join(map(str, self.grid))}]" if self.grid else ""
        return f"<simulated NKI kernel {self.func.__qualname__}{grid}>"


class Launch:
    """One launch of ``func`` on ``config``: ``Launch(...)(calls)`` runs it once per ``(args, kwargs)`` in
    ``calls`` (a rank each) and returns each rank's outputs (its program 0's, from its last point).

    The lifecycle is here: arguments bound and converted (``host.HostIO``; a rank whose host memory
    overlaps an earlier rank's gets copies), a run per program with the instruction record attached
    when an observer listens, the HBM race checks among a rank's instances, the per-thread run state
    set and restored, the on-chip capacity checked after every point, poisoned outputs reported, the
    first error re-raised at the kernel's line, written arguments copied back and results returned.
    What differs between front ends are the class attributes below and :meth:`check`."""

    tensor_type = None  # ``Run.tensor_type``: the class of the tensors the kernel makes
    argument_type = argument_buffer = None  # the class and buffer of the arguments' HBM tensors
    dtypes = dt.SUPPORTED  # the dtypes a host argument may have
    check_output = None  # ``check_output(tensor)``: refuse a returned tensor the front end's rules exclude
    label = ""  # how race reports name an instance: formatted with its point (program ids)
    # What a rank's programs synchronise through, ``exchange(programs, races)`` (``run.exchange``), and
    # what the ranks do, ``world(ranks, programs, exchanges)`` (``run.world``); both have ``abort()``
    # (a program failed: release every program waiting for another) and ``finish`` (a program ended).
    exchange = world = None

    def __init__(self, func, config: SimConfig, grid: tuple[int, ...], programs: int = 1, frontend=None):
        self.func, self.config, self.grid, self.programs = func, config, grid, programs
        self.frontend = frontend or {}  # entries every run starts with in ``Run.frontend``

    def check(self) -> None:
        """After every program ended well, before the outputs go back to the host."""

    def replay_key(self) -> tuple:
        """What else a replayed call must share with the recorded one (``replay.key``)."""
        return ()

    def __call__(self, calls: list[tuple[tuple, dict]]) -> list:
        taken, ios, bounds = [], [], []
        for args, kwargs in calls:
            io = host.HostIO(self.argument, taken, self.check_output, self.dtypes)
            bounds.append(io.bind(self.func, args, kwargs))
            taken.extend(io.mine)
            ios.append(io)
        key = self._replay_key(bounds)
        rec = replay.lookup(key) if key is not None else None
        if rec is not None:
            key = None  # recorded before: replay it, or run in full without recording again
            if rec.lock.acquire(blocking=False):
                try:
                    if rec.prepare():
                        outputs = self._replay(rec, ios[0], bounds[0])
                        if outputs is not None:
                            return outputs
                finally:
                    rec.lock.release()
        programs, exchanges = self._programs(len(calls))
        world = self.world(len(calls), self.programs, exchanges) if self.world else None
        results = [None] * len(calls)
        errors: list = []  # in the order they happened: the first is the cause, later ones its echo
        lock = threading.Lock()

        def program(rank: int, pid: int, run: Run, points: list, first: int) -> None:
            run.world = world
            bound = bounds[rank]
            previous = set_run(run)
            rec = replay.start(run) if key is not None else None
            try:
                result = None
                for run.instance, point in enumerate(points, first):
                    run.program_id = point
                    run.site_counts.clear()
                    result = self.func(*bound.args, **bound.kwargs)
                    run.end_instance()  # the on-chip capacity this instance needed at its peak
                report_poison(run, result)
                if pid == 0:
                    results[rank] = result
                if rec is not None:
                    replay.finish(rec, run, key, _arrays(bound), result)
            except BaseException as error:  # noqa: BLE001 - re-raised by the launching thread
                exchange = exchanges[rank]
                with lock:
                    errors.append((error, rank, (exchange.started[pid] if exchange else 0, pid)))
                for sync in (*exchanges, world):
                    if sync is not None:
                        sync.abort()
            finally:
                if rec is not None:
                    replay.stop(run)
                if exchanges[rank] is not None:
                    exchanges[rank].finish(pid)
                if world is not None:
                    world.finish(rank, pid)
                set_run(previous)

        with trace.checking_races(next((p.run.races for p in programs if p.run.races is not None), None)), \
                blas.one_thread():
            if len(programs) == 1:
                program(*programs[0])
            else:
                threads = [threading.Thread(target=program, args=p, name=f"nki-rank{p.rank}-lnc{p.pid}")
                           for p in programs]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
        if errors:
            host.reraise(_cause(errors))
        self.check()
        outputs = []
        for io, result in zip(ios, results):
            io.write_back()
            outputs.append(io.to_host(result))
        return outputs

    def _replay_key(self, bounds) -> tuple | None:
        """The replay key of a call that may be replayed or recorded (``replay``): one whose signature was
        called before; else None."""
        config = self.config
        if not config.replay or config.timing_only or len(bounds) != 1 or self.programs != 1 or trace.observed():
            return None
        try:
            signature = replay.signature(self, bounds[0])
            return replay.key(signature, self.func) if replay.seen(signature) else None
        except Exception:  # noqa: BLE001 - Unkeyable, or a value that cannot be hashed or compared: run in full
            return None

    def _replay(self, rec, io: host.HostIO, bound) -> list | None:
        """``[the call's outputs]``, by replaying ``rec`` on its arguments; None if the replay failed (then it runs
        in full: a replay raises only where a check depends on values, and the full run says where)."""
        run = Run(self.config, self.grid)
        run.tensor_type = self.tensor_type
        run.frontend.update(self.frontend)
        arrays = _arrays(bound)
        previous = set_run(run)
        try:
            with blas.one_thread():
                replay.run(rec, run, arrays)
            run.ledger.poison_reads[:] = rec.poison_reads
            report_poison(run, rec.result)
        except Exception as error:  # the call then runs in full, which raises what the kernel does
            rec.unfit(f"replaying it raised {type(error).__name__}: {error}")
            return None
        finally:
            set_run(previous)
        io.write_back()
        return [io.to_host(rec.result)]

    def argument(self, array, name: str):
        """The front end's HBM tensor over the host array of argument ``name``."""
        return self.argument_type(array, self.argument_buffer, name, ARGUMENT_SITE)

    def _programs(self, ranks: int) -> tuple[list[Program], list]:
        """Each rank's programs, the grid points dealt out to them (each program's shuffled with a seed),
        and each rank's exchange (or None)."""
        points = list(itertools.product(*(range(g) for g in self.grid)))
        programs, exchanges = [], []
        for rank in range(ranks):
            shared: dict = {}  # the rank's shared_hbm outputs, one tensor for all its programs
            mine: list[Program] = []  # the rank's programs; their points in order are its instances
            for pid in range(self.programs):
                run = Run(self.config, self.grid)
                run.tensor_type, run.shared, run.rank = self.tensor_type, shared, rank
                run.frontend.update(self.frontend)
                trace.attach(run)
                order = points[pid::self.programs]
                if run.shuffle is not None:
                    run.shuffle.shuffle(order)
                mine.append(Program(rank, pid, run, order, sum(len(p.points) for p in mine)))
            instances = [point for p in mine for point in p.points]
            # A rank's instances are independent programs: nothing orders one's HBM accesses against
            # another's but their synchronisation (``Races.sync``).
            races = (Races([self.label.format(point) for point in instances], self.config.races)
                     if len(instances) > 1 and self.config.races != "off" else None)
            exchanges.append(self.exchange(self.programs, races) if self.exchange else None)
            for p in mine:
                p.run.races, p.run.exchange = races, exchanges[rank]
            programs.extend(mine)
        return programs, exchanges


def _cause(errors: list) -> BaseException:
    """The error a failed launch raises, of ``errors`` (error, rank, place in the rank's lockstep order) in the
    order they happened: the first rank to fail, and of its programs' errors the one first in lockstep order
    (a program runs ahead of the other between shared accesses, so a later one can fail sooner), not counting
    the echoes of a failure (``Abandoned``)."""
    rank = errors[0][1]
    causes = [e for e in errors if e[1] == rank and not isinstance(e[0], Abandoned)]
    return min(causes, key=lambda e: e[2])[0] if causes else errors[0][0]


def simulated_target(name: str, aliases: dict[str, str], what: str) -> str:
    """The simulated target a front end's platform ``name`` runs as (``aliases``); ``what`` names it in the error."""
    if name not in aliases:
        raise UnsupportedError(what, f"simulated targets: {sorted(aliases)}")
    return aliases[name]


def config_for(target: str | None) -> SimConfig:
    """The current config, running as ``target`` (None: its own)."""
    config = current_config()
    return config if target is None or target == config.target else _on_target(config, target)


@functools.lru_cache(maxsize=64)
def _on_target(config: SimConfig, target: str) -> SimConfig:
    return dataclasses.replace(config, target=target)


def _arrays(bound) -> list:
    """The HBM arrays of a call's arguments, in order (lists of arrays flattened)."""
    arrays = []
    for value in bound.arguments.values():
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, Tensor):
                arrays.append(item.data)
    return arrays
