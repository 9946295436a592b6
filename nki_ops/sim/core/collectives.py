"""Communication between programs: the two programs of an LNC2 launch (their lockstep turn, barrier and
``sendrecv`` mailboxes) and ``nki.collectives`` between ranks (logical NeuronCores).

A launch of several ranks (``nki.simulate_ranks``) runs every rank's programs as threads. A
collective is a rendezvous: each member of the caller's rank-list snapshots its sources when it
arrives, and once all have arrived each writes its own destinations from the snapshots. Members
meet by order of issue: the n-th collective a rank issues on a rank-list meets the n-th of every
other member, so they must agree on the operation, shapes and dtypes. Under LNC2 each program
meets the same program of the other ranks (each physical core runs its own copy of the collective).
A member that finished, or a set of ranks that all wait on each other, is an error at once; any
other state in which every program has been blocked (in collectives, or in ``nisa.core_barrier``/
``sendrecv`` for its LNC partner) for ``NKI_OPS_SIM_COLLECTIVE_TIMEOUT`` seconds (default 30) is one
too. A program that computes, however long, is never timed out.

Semantics follow the ``nki.collectives`` API reference (NKI 0.6 / Neuron 2.29+): rank-lists in
order, reductions ``nl.add``/``nl.minimum``/``nl.maximum`` (in fp32 for floats, in rank-list
order), ``collective_dim`` 0 on HBM (0 or 1 for 2-D SBUF tensors), ring successor = next in the
rank-list; ``all_gather_v``/``all_to_all_v`` on flat element buffers with their uint32 metadata.

The launcher makes one ``Exchange`` per rank and one ``World`` per launch and leaves them on each
program's run (``run.exchange``, ``run.world``, ``run.rank``). Each function here takes the API name
its front end spells (``api``, for messages) and the tensors it was given: views of them (a flat
reshape, the metadata's receive-count row) are taken with the tensors' own subscripts.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from . import dtypes as dt
from . import instructions, memory
from .errors import Abandoned, KernelUsageError, MemorySpaceError, UnsupportedError
from .run import current_run, get_run

_REDUCE_OPS = {"add": np.add, "minimum": np.minimum, "maximum": np.maximum}
_NEVER = float("inf")
MAX_CHANNELS = 4  # "4 for replica groups containing all devices inside a node and 2 for other" groups


class ReplicaGroup:
    """The ranks a collective runs on, as a list of rank-lists: the collective runs independently within
    each rank-list; a rank may be in only one of them (``ReplicaGroup([[0, 1, 2, 3], [4, 5, 6, 7]])``)."""

    def __init__(self, replica_groups):
        try:
            groups = [[int(r) for r in group] for group in replica_groups]
        except TypeError:
            raise KernelUsageError(f"ReplicaGroup takes a list of rank-lists (ReplicaGroup([[0, 1]])), got "
                                   f"{replica_groups!r}") from None
        ranks = [r for group in groups for r in group]
        if not groups or not all(groups):
            raise KernelUsageError(f"ReplicaGroup needs non-empty rank-lists, got {groups}")
        if min(ranks) < 0:
            raise KernelUsageError(f"ReplicaGroup ranks must be >= 0, got {groups}")
        if len(set(ranks)) != len(ranks):
            raise KernelUsageError(f"ReplicaGroup rank-lists must not overlap (each rank in only one), got {groups}")
        self.replica_groups = groups

    def rank_list(self, rank: int, world: int, api: str) -> tuple[int, ...]:
        """The rank-list ``rank`` belongs to, checked against the launch's ``world`` ranks."""
        top = max(r for group in self.replica_groups for r in group)
        if top >= world:
            raise KernelUsageError(f"{api}: replica_group {self.replica_groups} names rank {top}, but the launch has "
                                   f"{world} rank{'s' if world > 1 else ''}; run the kernel as several ranks with "
                                   f"nki.simulate_ranks(kernel, ranks={top + 1}, inputs=...)")
        for group in self.replica_groups:
            if rank in group:
                return tuple(group)
        raise KernelUsageError(f"{api}: rank {rank} is in no rank-list of replica_group {self.replica_groups}")

    def __eq__(self, other) -> bool:
        return isinstance(other, ReplicaGroup) and other.replica_groups == self.replica_groups

    __hash__ = None

    def __repr__(self) -> str:
        return f"ReplicaGroup({self.replica_groups})"


# ------------------------------------------------------------------------------------- LNC2

class Exchange:
    """What the programs of an LNC2 launch share: the sendrecv mailboxes, the barrier, and their order.

    The two NeuronCores progress together, so the programs run in lockstep order: the k-th instruction
    of program 0, then the k-th of program 1, then the (k+1)-th of program 0; a program blocked in a
    barrier or a receive, or finished, lets the other run on. Only the instructions that touch what the
    programs share (HBM, the mailboxes, the barrier) wait for their place in that order: the others read
    and write the program's own SBUF and PSUM, where no order against the other program can be seen, and
    waiting at each of them would cost an OS thread switch an instruction. Effects on shared memory then
    interleave as they would on the device, and in the same order every run."""

    def __init__(self, programs: int, races=None):
        self.programs = programs
        self.races = races  # the HBM race checks of these programs (``core.races``), or None
        self.lock = threading.Lock()
        self.ready = threading.Condition(self.lock)
        self.mail: dict[tuple[int, int, int], list] = {}
        self.failed = False
        self.started = [0] * programs  # instructions each program has started: its place in lockstep order
        self.wake_at = [_NEVER] * programs  # how far a program must get for a waiting one to go on
        self.running = set(range(programs))
        self.blocked: set[int] = set()
        self.arrived = self.generation = 0

    def step(self, pid: int, shared: bool) -> None:
        """Called before each instruction of program ``pid``; one that touches shared state (``shared``)
        waits until every other running program has started the instructions before it in lockstep order."""
        k = self.started[pid] = self.started[pid] + 1
        if k >= self.wake_at[pid]:  # another program waits for this one to get this far
            with self.ready:
                self.wake_at[pid] = _NEVER
                self.ready.notify_all()
        if shared and not self.failed:
            with self.ready:
                while not (self.failed or self._due(pid, k)):
                    if not self.ready.wait(timeout=60):
                        break

    def _due(self, pid: int, k: int) -> bool:
        """Whether instruction ``k`` of program ``pid`` may start (the lock held): each other running program
        has started its k-th instruction (those before ``pid``) or its (k-1)-th (those after)."""
        for q in self.running - self.blocked - {pid}:
            need = k if q < pid else k - 1
            if self.started[q] < need:
                self.wake_at[q] = min(self.wake_at[q], need)
                if self.started[q] < need:  # read again: q may have passed ``need`` before wake_at was set
                    return False
        return True

    def wait(self, pid: int, done, what: str) -> None:
        """Block program ``pid`` (the lock held) until ``done()``; the other program runs meanwhile."""
        self.blocked.add(pid)
        self.ready.notify_all()
        try:
            finished = self.ready.wait_for(lambda: self.failed or done(), timeout=60)
        finally:
            self.blocked.discard(pid)
        if self.failed:
            raise Abandoned(what)
        if not finished:
            raise KernelUsageError(what)

    def barrier(self, pid: int) -> None:
        with self.ready:
            generation = self.generation
            self.arrived += 1
            if self.arrived == len(self.running):
                self.arrived, self.generation = 0, generation + 1
                if self.races is not None:
                    self.races.sync()
                self.ready.notify_all()
                return
            self.wait(pid, lambda: self.generation != generation,
                      "nisa.core_barrier: the other program never reached the barrier")

    def finish(self, pid: int) -> None:
        with self.ready:
            self.running.discard(pid)
            self.ready.notify_all()

    def abort(self) -> None:
        """A program failed: release the other from any barrier or receive it waits in."""
        with self.ready:
            self.failed = True
            self.ready.notify_all()


def lnc_exchange(api: str) -> Exchange:
    """The exchange of this program's LNC2 launch (an error outside one)."""
    run = current_run(api)
    exchange = getattr(run, "exchange", None)
    if exchange is None or exchange.programs < 2:
        raise KernelUsageError(f"{api} needs an LNC2 launch (kernel[2](...))")
    return exchange


def take_turn(shared: bool = True) -> None:
    """An instruction starts: in an LNC2 launch, take its place in the programs' lockstep order
    (``shared``: it touches HBM or the exchange, and waits for the other program to get that far)."""
    run = get_run()
    exchange = getattr(run, "exchange", None)
    if exchange is not None and exchange.programs > 1:
        exchange.step(run.program_id[0], shared)


def core_barrier(api: str) -> None:
    """Both programs of an LNC2 launch wait for each other here."""
    exchange = lnc_exchange(api)
    take_turn()
    exchange.barrier(current_run(api).program_id[0])


def sendrecv(api: str, exchange: Exchange, dst, src, send_to_rank, recv_from_rank, pipe_id) -> None:
    """Send ``src`` to the other program and receive its ``src`` into ``dst`` (matched by pipe_id)."""
    me = current_run(api).program_id[0]
    payload = _values(api, src)
    with exchange.ready:
        exchange.mail.setdefault((me, int(send_to_rank), int(pipe_id)), []).append(payload)
        exchange.ready.notify_all()
        key = (int(recv_from_rank), me, int(pipe_id))
        if exchange.races is not None and exchange.mail.get(key):
            # The other program sent first and waits for this send: both are past their sends.
            exchange.races.sync()
        exchange.wait(me, lambda: exchange.mail.get(key),
                      f"{api}: program {me} never received from rank {recv_from_rank} (pipe {pipe_id})")
        received = exchange.mail[key].pop(0)
    memory.write(dst, instructions.dma_values(api, received, dst.shape, dst.dtype), api)


# ------------------------------------------------------------------------------- rendezvous

class World:
    """What the ranks of a launch share: the collectives under way, who has finished, who waits."""

    def __init__(self, ranks: int, programs: int, exchanges=()):
        self.ranks, self.programs = ranks, programs
        self.exchanges = list(exchanges)  # each rank's LNC exchange, whose ``blocked`` programs wait there
        self.changed = threading.Condition(threading.Lock())
        self.slots: dict[tuple, dict[int, tuple]] = {}  # (core, rank-list, n) -> {rank: (signature, payload)}
        self.readers: dict[tuple, int] = {}
        self.issued: dict[tuple, int] = {}  # (rank, core, rank-list) -> collectives issued so far
        self.waiting: dict[tuple[int, int], str] = {}  # (rank, core) -> what it waits for
        self.finished: set[tuple[int, int]] = set()
        self.failed = False
        self.timeout = float(os.environ.get("NKI_OPS_SIM_COLLECTIVE_TIMEOUT", "30"))

    def meet(self, rank: int, core: int, members: tuple[int, ...], what: str, signature, payload) -> dict:
        """Arrive at this participant's next collective on ``members``; wait for the others; return
        ``{rank: payload}`` of every member."""
        with self.changed:
            count_key = (rank, core, members)
            n = self.issued.get(count_key, 0)
            self.issued[count_key] = n + 1
            key = (core, members, n)
            slot = self.slots.setdefault(key, {})
            for other, (theirs, _) in slot.items():
                if theirs != signature:
                    raise KernelUsageError(f"{what}: ranks disagree on collective #{n} of rank-list {list(members)}"
                                           f"{self._core(core)}: rank {other} called {theirs}, rank {rank} "
                                           f"called {signature}")
            slot[rank] = (signature, payload)
            self.changed.notify_all()
            me = (rank, core)
            self.waiting[me] = f"rank {rank}{self._core(core)} waits in {what} #{n} on rank-list {list(members)}"
            deadline = None  # set while every program is blocked somewhere
            try:
                while not (self.failed or len(slot) == len(members)):
                    self._check_progress(key, members, what)
                    now = time.monotonic()
                    deadline = (deadline or now + self.timeout) if self._all_blocked() else None
                    if deadline is not None and now >= deadline:
                        missing = sorted(set(members) - set(slot))
                        raise KernelUsageError(
                            f"{what}: rank {rank}{self._core(core)} waits for rank(s) {missing} to join collective "
                            f"#{n} of rank-list {list(members)}, and every program has been blocked for "
                            f"{self.timeout:g} s (in collectives or waiting for its LNC partner in "
                            f"nisa.core_barrier/sendrecv): {self._blocked_listing()} "
                            f"(NKI_OPS_SIM_COLLECTIVE_TIMEOUT sets the limit)")
                    self.changed.wait(0.25)
            finally:
                del self.waiting[me]
            if self.failed:
                raise Abandoned(f"{what}: abandoned, another rank failed")
            self.readers[key] = self.readers.get(key, 0) + 1
            if self.readers[key] == len(members):  # the last reader frees the slot
                del self.slots[key], self.readers[key]
            return {r: p for r, (_, p) in slot.items()}

    def _check_progress(self, key, members, what: str) -> None:
        """Raise when the collective at ``key`` can never complete: a member finished, or every
        unfinished participant waits in a collective that is not complete either."""
        core, _, n = key
        slot = self.slots[key]
        gone = sorted(r for r in members if r not in slot and (r, core) in self.finished)
        if gone:
            raise KernelUsageError(f"{what}: rank(s) {gone}{self._core(core)} finished without joining collective "
                                   f"#{n} of rank-list {list(members)}")
        alive = self.ranks * self.programs - len(self.finished)
        if len(self.waiting) == alive and not any(len(s) == len(k[1]) for k, s in self.slots.items()):
            raise KernelUsageError(f"{what}: deadlock, every rank waits for another: "
                                   + "; ".join(self.waiting[p] for p in sorted(self.waiting)))

    def _all_blocked(self) -> bool:
        """Whether no unfinished program runs: each waits in a collective or for its LNC partner (a
        program the exchange just released may still count as blocked for a moment, hence the timeout)."""
        return all(p in self.waiting or p in self.finished
                   or (self.exchanges and p[1] in self.exchanges[p[0]].blocked) for p in self._programs())

    def _programs(self):
        return ((r, c) for r in range(self.ranks) for c in range(self.programs))

    def _blocked_listing(self) -> str:
        return "; ".join(self.waiting.get(p, f"rank {p[0]}{self._core(p[1])} waits for its LNC partner")
                         for p in self._programs() if p not in self.finished)

    def _core(self, core: int) -> str:
        return f" (program {core})" if self.programs > 1 else ""

    def finish(self, rank: int, core: int) -> None:
        with self.changed:
            self.finished.add((rank, core))
            self.changed.notify_all()

    def abort(self) -> None:
        with self.changed:
            self.failed = True
            self.changed.notify_all()


def _world(api: str) -> tuple[World, int, int]:
    run = current_run(api)
    world = getattr(run, "world", None)
    if world is None:  # a kernel run outside a launch (a plain call): one rank
        world = run.world = World(1, 1)
    return world, getattr(run, "rank", 0), run.program_id[0] if run.program_id else 0


def _meet(api: str, members: tuple[int, ...], signature, payload) -> dict:
    """Meet the other members, with this program marked blocked for its LNC partner meanwhile."""
    world, rank, core = _world(api)
    exchange = getattr(get_run(), "exchange", None)
    lockstep = exchange is not None and exchange.programs > 1
    if lockstep:
        with exchange.ready:
            exchange.blocked.add(core)
            exchange.ready.notify_all()
    try:
        return world.meet(rank, core, members, api, signature, payload)
    finally:
        if lockstep:
            with exchange.ready:
                exchange.blocked.discard(core)
                exchange.ready.notify_all()


# ------------------------------------------------------------------------------- operands

def _tensors(api: str, arg: str, value, count: int | None = None) -> list:
    if not isinstance(value, (list, tuple)):
        raise KernelUsageError(f"{api}: {arg} must be a list of tensors, got {type(value).__name__}")
    tensors = list(value)
    if not tensors or (count is not None and len(tensors) != count):
        raise KernelUsageError(f"{api}: {arg} must hold {count or 'at least one'} tensor{'s' if count != 1 else ''}, "
                               f"got {len(tensors)}")
    for i, t in enumerate(tensors):
        if not isinstance(t, memory.Tensor):
            raise KernelUsageError(f"{api}: {arg}[{i}] must be a tensor, got {type(t).__name__}")
        if t.buffer.space == "psum":
            raise MemorySpaceError(f"{api}: {arg}[{i}] '{t.name}' is in PSUM; collectives read and write HBM or "
                                   f"SBUF")
        if t.gathers:
            raise UnsupportedError(f"{api} on an indirect access ('{t.name}')")
        if not t.buffer.on_chip and getattr(t, "root", t).site == "<kernel argument>":
            raise KernelUsageError(f"{api}: {arg}[{i}] '{t.name}' is a kernel argument; a collective instruction "
                                   f"cannot read or write the kernel's I/O tensors: copy it to an "
                                   f"nl.ndarray(..., buffer=nl.shared_hbm) first")
    return tensors


def _operands(api: str, srcs, dsts, sbuf_ok: bool = True, count: int | None = None) -> tuple[list, list, bool]:
    """The source and destination lists, checked: one memory space (HBM, or SBUF when allowed), several
    tensors only on HBM; returns (srcs, dsts, on_sbuf)."""
    srcs, dsts = _tensors(api, "srcs", srcs, count), _tensors(api, "dsts", dsts, count)
    if len(srcs) != len(dsts):
        raise KernelUsageError(f"{api}: {len(srcs)} srcs but {len(dsts)} dsts")
    spaces = {t.buffer.on_chip for t in srcs + dsts}
    if len(spaces) > 1:
        raise MemorySpaceError(f"{api}: tensors must all be on HBM or all on SBUF, not mixed")
    on_sbuf = spaces == {True}
    if on_sbuf and not sbuf_ok:
        raise MemorySpaceError(f"{api}: tensors must be on HBM (SBUF is not supported for this collective)")
    if on_sbuf:
        if len(srcs) > 1:
            raise KernelUsageError(f"{api}: several tensors in one collective (coalesced) need HBM tensors, got "
                                   f"{len(srcs)} SBUF tensors")
        for t in srcs + dsts:
            if t.ndim != 2:
                raise KernelUsageError(f"{api}: SBUF collectives operate on 2-D tensors (partition, one free dim); "
                                       f"'{t.name}' has shape {list(t.shape)}")
    for i, t in enumerate(dsts):
        if not t.writeable:
            raise KernelUsageError(f"{api}: dsts[{i}] is a read-only view of '{t.name}'")
    _not_in_place_on_lnc2(api, srcs, dsts)
    return srcs, dsts, on_sbuf


def _not_in_place_on_lnc2(api: str, srcs, dsts) -> None:
    """Under LNC2 each program runs its own copy of a collective, so on HBM both programs of a rank
    would read a src the other's copy may already have overwritten: an in-place HBM collective is
    not modelled there rather than given an order-dependent answer."""
    if current_run(api).grid[0] < 2:
        return
    for d in dsts:
        for s in srcs:
            if not d.buffer.on_chip and np.shares_memory(d.data, s.data):
                raise UnsupportedError(f"{api} in place (dst '{d.name}' overlaps src '{s.name}') on HBM under LNC2",
                                       "each program runs its own copy of the collective")


def _values(api: str, t) -> np.ndarray:
    """A snapshot of ``t``'s values, taken when this rank arrives."""
    return np.array(memory.read(t, api, "src") if t.buffer.on_chip else t.data)


def _write(api: str, dst, values: np.ndarray) -> None:
    if values.shape != tuple(dst.shape):
        raise KernelUsageError(f"{api}: result of shape {list(values.shape)} does not match dst '{dst.name}' of "
                               f"shape {list(dst.shape)}")
    memory.write(dst, dt.cast(values, dst.dtype), api)


def _describe(tensors) -> str:
    return "[" + ", ".join(f"{list(t.shape)} {t.dtype}" for t in tensors) + "]"


def _reduce_op(api: str, op):
    name = instructions.op_name(op)
    if name not in _REDUCE_OPS:
        raise KernelUsageError(f"{api}: op must be nl.add, nl.minimum or nl.maximum, got "
                               f"{getattr(op, '__name__', op)!r}")
    return name, _REDUCE_OPS[name]


def _reduce(fn, parts: list[np.ndarray]) -> np.ndarray:
    """Reduce in rank-list order, floats in fp32."""
    parts = [dt.to_f32(p) if dt.is_float(p.dtype) else p for p in parts]
    total = parts[0]
    for p in parts[1:]:
        total = fn(total, p)
    return total


def _common(api: str, priority) -> None:
    take_turn()
    if priority is not None and (isinstance(priority, bool) or priority not in (0, 1, 2, 3)):
        raise KernelUsageError(f"{api}: priority must be 0-3 (lower is higher priority), got {priority!r}")


def _same_dtype(api: str, srcs, dsts) -> None:
    for s, d in zip(srcs, dsts):
        if s.dtype != d.dtype:
            raise KernelUsageError(f"{api}: src '{s.name}' is {s.dtype} but dst '{d.name}' is {d.dtype}; a collective "
                                   f"moves data without a cast")


def _dim(api: str, collective_dim, on_sbuf: bool, allowed_sbuf=(0, 1)) -> int:
    allowed = allowed_sbuf if on_sbuf else (0,)
    if isinstance(collective_dim, bool) or collective_dim not in allowed:
        raise KernelUsageError(f"{api}: collective_dim must be {' or '.join(map(str, allowed))} for "
                               f"{'SBUF' if on_sbuf else 'HBM'} tensors, got {collective_dim!r}")
    return int(collective_dim)


def _members(api: str, replica_group) -> tuple[int, ...]:
    if not isinstance(replica_group, ReplicaGroup):
        raise KernelUsageError(f"{api}: replica_group must be a nki.collectives.ReplicaGroup, got "
                               f"{type(replica_group).__name__}")
    world, rank, _ = _world(api)
    return replica_group.rank_list(rank, world.ranks, api)


# ------------------------------------------------------------------------------- collectives

def all_reduce(api: str, srcs, dsts, replica_group, op, priority=None):
    """Every member's dsts[i] = op over the members' srcs[i]."""
    _common(api, priority)
    srcs, dsts, _ = _operands(api, srcs, dsts)
    _same_dtype(api, srcs, dsts)
    op_name, fn = _reduce_op(api, op)
    for s, d in zip(srcs, dsts):
        if tuple(s.shape) != tuple(d.shape):
            raise KernelUsageError(f"{api}: src '{s.name}' {list(s.shape)} and dst '{d.name}' {list(d.shape)} differ "
                                   f"in shape")
    members = _members(api, replica_group)
    got = _meet(api, members, f"all_reduce(op={op_name}, srcs={_describe(srcs)})", [_values(api, s) for s in srcs])
    for i, d in enumerate(dsts):
        _write(api, d, _reduce(fn, [got[r][i] for r in members]))


def all_gather(api: str, srcs, dsts, replica_group, collective_dim, priority=None):
    """Every member's dsts[i] = the members' srcs[i] concatenated along ``collective_dim`` in rank-list order."""
    _common(api, priority)
    srcs, dsts, on_sbuf = _operands(api, srcs, dsts)
    _same_dtype(api, srcs, dsts)
    dim = _dim(api, collective_dim, on_sbuf)
    members = _members(api, replica_group)
    _check_split(api, dsts, srcs, dim, len(members), "dst", "src")
    got = _meet(api, members, f"all_gather(collective_dim={dim}, srcs={_describe(srcs)})",
                [_values(api, s) for s in srcs])
    for i, d in enumerate(dsts):
        _write(api, d, np.concatenate([got[r][i] for r in members], axis=dim))


def reduce_scatter(api: str, srcs, dsts, replica_group, collective_dim, op, priority=None):
    """Member j's dsts[i] = op over the members' srcs[i], chunk j of ``collective_dim`` (split evenly)."""
    _common(api, priority)
    srcs, dsts, on_sbuf = _operands(api, srcs, dsts)
    _same_dtype(api, srcs, dsts)
    dim = _dim(api, collective_dim, on_sbuf, allowed_sbuf=(0,))
    op_name, fn = _reduce_op(api, op)
    members = _members(api, replica_group)
    _check_split(api, srcs, dsts, dim, len(members), "src", "dst")
    got = _meet(api, members, f"reduce_scatter(op={op_name}, collective_dim={dim}, srcs={_describe(srcs)})",
                [_values(api, s) for s in srcs])
    me = members.index(_world(api)[1])
    for i, d in enumerate(dsts):
        chunks = [np.split(got[r][i], len(members), axis=dim)[me] for r in members]
        _write(api, d, _reduce(fn, chunks))


def all_to_all(api: str, srcs, dsts, replica_group, collective_dim, priority=None):
    """Member j's dsts[i] = chunk j of every member's srcs[i] (split along ``collective_dim``),
    concatenated in rank-list order."""
    _common(api, priority)
    srcs, dsts, _ = _operands(api, srcs, dsts, sbuf_ok=False)
    _same_dtype(api, srcs, dsts)
    dim = _dim(api, collective_dim, False)
    members = _members(api, replica_group)
    for s, d in zip(srcs, dsts):
        if tuple(s.shape) != tuple(d.shape) or s.shape[dim] % len(members):
            raise KernelUsageError(f"{api}: src '{s.name}' {list(s.shape)} and dst '{d.name}' {list(d.shape)} must "
                                   f"have one shape whose dim {dim} splits into {len(members)} equal chunks")
    got = _meet(api, members, f"all_to_all(collective_dim={dim}, srcs={_describe(srcs)})",
                [_values(api, s) for s in srcs])
    me = members.index(_world(api)[1])
    for i, d in enumerate(dsts):
        _write(api, d, np.concatenate([np.split(got[r][i], len(members), axis=dim)[me] for r in members], axis=dim))


def _check_split(api: str, whole, parts, dim: int, n: int, whole_name: str, part_name: str) -> None:
    """``whole`` tensors are ``n`` ``parts`` along ``dim``."""
    for w, p in zip(whole, parts):
        expected = list(p.shape)
        expected[dim] *= n
        if list(w.shape) != expected:
            raise KernelUsageError(f"{api}: {whole_name} '{w.name}' has shape {list(w.shape)}; with {n} ranks and "
                                   f"{part_name} '{p.name}' of shape {list(p.shape)} it must be {expected} "
                                   f"(collective_dim={dim})")


def _metadata(api: str, metadata_tensor, n: int, has_rdispls: bool) -> tuple[np.ndarray, object]:
    """The ``uint32`` metadata rows (send counts, send displacements, receive counts, receive
    displacements) as ints, and the view of row 2 (the receive counts it reports)."""
    t = metadata_tensor
    if not isinstance(t, memory.Tensor) or t.buffer.space == "psum":
        raise KernelUsageError(f"{api}: metadata_tensor must be an HBM or SBUF tensor, got {t!r}")
    if t.dtype != dt.uint32:
        raise KernelUsageError(f"{api}: metadata_tensor '{t.name}' must be uint32, got {t.dtype}")
    rows = t.shape[1] if t.buffer.on_chip and t.ndim == 3 else t.shape[0]
    expected = [(1, r, n) if t.buffer.on_chip else (r, n) for r in ((4,) if has_rdispls else (3, 4))]
    if tuple(t.shape) not in expected:
        raise KernelUsageError(f"{api}: metadata_tensor '{t.name}' has shape {list(t.shape)}; with a rank-list of {n} "
                               f"and has_rdispls={has_rdispls} it must be {' or '.join(map(str, map(list, expected)))}")
    values = _values(api, t).reshape(rows, n).astype(np.int64)
    return values, (t[:, 2, :] if t.buffer.on_chip else t[2:3, :])


def _flat_dst(api: str, dst, chunks: list[tuple[int, np.ndarray]]) -> None:
    """Write each ``(offset, values)`` chunk into the flat element buffer of ``dst``."""
    flat = dst.reshape((dst.size,))
    ends = []
    for offset, values in chunks:
        if offset < 0 or offset + values.size > dst.size:
            raise KernelUsageError(f"{api}: a chunk of {values.size} elements at offset {offset} leaves dst "
                                   f"'{dst.name}' ({dst.size} elements)")
        ends.append((offset, offset + values.size))
    ends.sort()
    for (_, end), (start, _) in zip(ends, ends[1:]):
        if start < end:
            raise KernelUsageError(f"{api}: received chunks overlap in dst '{dst.name}' (at element {start})")
    for offset, values in chunks:
        if values.size:
            memory.write(flat[offset:offset + values.size], dt.cast(values, dst.dtype), api)


def _send_chunk(api: str, flat: np.ndarray, count: int, displ: int, name: str) -> np.ndarray:
    if count < 0 or displ < 0 or displ + count > flat.size:
        raise KernelUsageError(f"{api}: sending {count} elements at offset {displ} leaves src '{name}' "
                               f"({flat.size} elements)")
    return flat[displ:displ + count]


def _write_counts(api: str, view, counts: list[int]) -> None:
    memory.write(view, np.array(counts, dtype=np.uint32).reshape(view.shape), api)


def all_to_all_v(api: str, srcs, dsts, replica_group, metadata_tensor, recv_counts_known=False, has_rdispls=False,
                 priority=None):
    """Each member sends ``src[send_displs[r] : + send_counts[r]]`` (flat elements) to rank-list position
    r; the chunk from position s lands at ``recv_displs[s]`` (row 3), else at ``dst.size / n * s``."""
    _common(api, priority)
    srcs, dsts, _ = _operands(api, srcs, dsts, sbuf_ok=False, count=1)
    _same_dtype(api, srcs, dsts)
    if has_rdispls and current_run(api).config.nc_version < 4:
        raise KernelUsageError(f"{api}: has_rdispls=True needs a NeuronSwitch instance (trn3), not "
                               f"{current_run(api).config.target}")
    members = _members(api, replica_group)
    n, me = len(members), members.index(_world(api)[1])
    meta, counts_view = _metadata(api, metadata_tensor, n, bool(has_rdispls))
    flat = _values(api, srcs[0]).reshape(-1)
    chunks = [_send_chunk(api, flat, int(meta[0, r]), int(meta[1, r]), srcs[0].name) for r in range(n)]
    got = _meet(api, members, f"all_to_all_v(src dtype={srcs[0].dtype})", chunks)
    received = [got[members[s]][me] for s in range(n)]
    slot = dsts[0].size // n
    _flat_dst(api, dsts[0], [(int(meta[3, s]) if has_rdispls else slot * s, c) for s, c in enumerate(received)])
    if not recv_counts_known:
        _write_counts(api, counts_view, [c.size for c in received])


def all_gather_v(api: str, srcs, dsts, replica_group, metadata_tensor, recv_counts_known=False, has_rdispls=False,
                 priority=None):
    """Each member broadcasts ``src[send_displ : + send_count]`` (row 0/1, first column; flat elements);
    the chunk from rank-list position s lands at ``dst.size / n * s``."""
    _common(api, priority)
    srcs, dsts, _ = _operands(api, srcs, dsts, sbuf_ok=False, count=1)
    _same_dtype(api, srcs, dsts)
    if has_rdispls:
        raise KernelUsageError(f"{api}: has_rdispls=True is not supported (documented limitation)")
    if current_run(api).grid != (2,):
        raise KernelUsageError(f"{api}: only LNC=2 is supported (launch the kernel as kernel[2])")
    members = _members(api, replica_group)
    n = len(members)
    if n != 4:
        raise KernelUsageError(f"{api}: each rank-list must have exactly 4 ranks (intra-chip), got {list(members)}")
    meta, counts_view = _metadata(api, metadata_tensor, n, False)
    flat = _values(api, srcs[0]).reshape(-1)
    chunk = _send_chunk(api, flat, int(meta[0, 0]), int(meta[1, 0]), srcs[0].name)
    got = _meet(api, members, f"all_gather_v(src dtype={srcs[0].dtype})", chunk)
    received = [got[members[s]] for s in range(n)]
    slot = dsts[0].size // n
    _flat_dst(api, dsts[0], [(slot * s, c) for s, c in enumerate(received)])
    if not recv_counts_known:
        _write_counts(api, counts_view, [c.size for c in received])


def collective_permute(api: str, srcs, dsts, source_target_pairs, priority=None):
    """For each (source, target) pair, the source rank's src lands in the target rank's dst."""
    _common(api, priority)
    srcs, dsts, _ = _operands(api, srcs, dsts, sbuf_ok=False, count=1)
    _same_dtype(api, srcs, dsts)
    try:
        pairs = tuple((int(s), int(t)) for s, t in source_target_pairs)
    except (TypeError, ValueError):
        raise KernelUsageError(f"{api}: source_target_pairs must be (source, target) rank pairs, got "
                               f"{source_target_pairs!r}") from None
    world, rank, _ = _world(api)
    members = tuple(sorted({r for pair in pairs for r in pair}))
    if not pairs or members[0] < 0 or members[-1] >= world.ranks:
        raise KernelUsageError(f"{api}: source_target_pairs {list(pairs)} must name ranks 0..{world.ranks - 1} of "
                               f"this launch")
    targets = [t for _, t in pairs]
    if len(set(targets)) != len(targets):
        raise KernelUsageError(f"{api}: a rank receives from several sources in {list(pairs)}")
    if rank not in members:
        return  # this rank neither sends nor receives
    got = _meet(api, members, f"collective_permute(pairs={list(pairs)}, srcs={_describe(srcs)})",
                [_values(api, srcs[0])])
    for source, target in pairs:
        if target == rank:
            _write(api, dsts[0], got[source][0])


def _ring(api: str, replica_group, channel_ids, *by_channel):
    """The checked per-channel tensors of an implicit (ring) permute and the caller's rank-list."""
    lists = []
    for arg, value in by_channel:
        if not isinstance(value, (list, tuple)) or not value:
            raise KernelUsageError(f"{api}: {arg} must be a list with one list of tensors per channel")
        lists.append([_tensors(api, f"{arg}[{c}]", inner, count=1)[0] for c, inner in enumerate(value)])
    channels = len(lists[0])
    if any(len(x) != channels for x in lists):
        raise KernelUsageError(f"{api}: every *_by_channel list needs one entry per channel ({channels})")
    if list(channel_ids) != list(range(channels)):
        raise KernelUsageError(f"{api}: channel_ids must be consecutive integers from 0, one per channel "
                               f"({list(range(channels))}), got {list(channel_ids)}")
    if channels > MAX_CHANNELS:
        raise KernelUsageError(f"{api}: at most {MAX_CHANNELS} channels, got {channels}")
    tensors = [t for x in lists for t in x]
    if len({t.buffer.on_chip for t in tensors}) > 1:
        raise MemorySpaceError(f"{api}: tensors must all be on HBM or all on SBUF, not mixed")
    return lists, _members(api, replica_group)


def _pass_on(api: str, members, dsts, signature, payloads) -> None:
    """Send ``payloads`` (one per channel) to the ring successor; receive the predecessor's into ``dsts``."""
    got = _meet(api, members, signature, payloads)
    me = members.index(_world(api)[1])
    previous = got[members[me - 1]]
    for c, d in enumerate(dsts):
        if previous[c].size != d.size:
            raise KernelUsageError(f"{api}: channel {c}: the predecessor sends {previous[c].size} elements, dst "
                                   f"'{d.name}' holds {d.size}")
        _write(api, d, previous[c].reshape(d.shape))


def collective_permute_implicit(api: str, srcs_by_channel, dsts_by_channel, replica_group, channel_ids=(0,),
                                priority=None):
    """Each member sends its sources to the next in its rank-list (a ring) and receives the previous one's."""
    _common(api, priority)
    (srcs, dsts), members = _ring(api, replica_group, channel_ids, ("srcs_by_channel", srcs_by_channel),
                                  ("dsts_by_channel", dsts_by_channel))
    _same_dtype(api, srcs, dsts)
    _not_in_place_on_lnc2(api, srcs, dsts)
    _pass_on(api, members, dsts, f"collective_permute_implicit(srcs={_describe(srcs)})",
             [_values(api, s) for s in srcs])


def collective_permute_implicit_reduce(api: str, srcs0_by_channel, srcs1_by_channel, dsts_by_channel, replica_group,
                                       op, channel_ids=(0,), priority=None):
    """Each member sends op(srcs0, srcs1) to the next in its rank-list and receives the previous one's."""
    _common(api, priority)
    (srcs0, srcs1, dsts), members = _ring(api, replica_group, channel_ids, ("srcs0_by_channel", srcs0_by_channel),
                                          ("srcs1_by_channel", srcs1_by_channel), ("dsts_by_channel", dsts_by_channel))
    _same_dtype(api, srcs0, dsts)
    _same_dtype(api, srcs1, dsts)
    _not_in_place_on_lnc2(api, srcs0 + srcs1, dsts)
    op_name, fn = _reduce_op(api, op)
    for a, b in zip(srcs0, srcs1):
        if tuple(a.shape) != tuple(b.shape):
            raise KernelUsageError(f"{api}: srcs0 '{a.name}' {list(a.shape)} and srcs1 '{b.name}' {list(b.shape)} "
                                   f"differ in shape")
    payloads = [dt.cast(_reduce(fn, [_values(api, a), _values(api, b)]), d.dtype)
                for a, b, d in zip(srcs0, srcs1, dsts)]
    _pass_on(api, members, dsts, f"collective_permute_implicit_reduce(op={op_name}, srcs0={_describe(srcs0)})",
             payloads)


def processing_rank(api: str, iteration_id, replica_group, channel_id, value) -> int:
    """The rank whose data a ring step ``iteration_id`` holds: this rank at 0, then its predecessors
    (``value`` reads the iteration from the front end's register or int)."""
    if isinstance(channel_id, bool) or channel_id not in range(MAX_CHANNELS):
        raise KernelUsageError(f"{api}: channel_id must be 0-{MAX_CHANNELS - 1}, got {channel_id!r}")
    members = _members(api, replica_group)
    me = members.index(_world(api)[1])
    return members[(me - value(iteration_id)) % len(members)]


def this_rank(api: str) -> int:
    """This rank's id in the launch."""
    return _world(api)[1]
