"""The two programs of an LNC2 launch: their exchange (turns, barrier, mailboxes), ``core_barrier``
and ``sendrecv``."""

from __future__ import annotations

import threading

import numpy as np

from ....core import instructions, memory
from ....core.errors import (
    KernelUsageError,
)
from ....core.run import current_run
from .constants import (
    dma_engine,
    engine,
)
from .instruction import instruction
from .operands import _dst, _step

# ------------------------------------------------------------------------------------- LNC2

class Exchange:
    """What the programs of an LNC2 launch share: the sendrecv mailboxes, the barrier, and the turn.

    The two NeuronCores progress together, so the programs run in lockstep, one instruction each in
    turn; a program blocked in a barrier or a receive, or finished, lets the other run on. Effects
    on shared memory then interleave as they would on the device, and in the same order every run."""

    def __init__(self, programs: int, races=None):
        self.programs = programs
        self.races = races  # the HBM race checks of these programs (``core.races``), or None
        self.lock = threading.Lock()
        self.ready = threading.Condition(self.lock)
        self.mail: dict[tuple[int, int, int], list] = {}
        self.failed = False
        self.turn = 0
        self.running = set(range(programs))
        self.blocked: set[int] = set()
        self.arrived = self.generation = 0

    def step(self, pid: int) -> None:
        """Called before each instruction of program ``pid``: wait for its turn, then pass the turn on."""
        with self.ready:
            self.ready.wait_for(lambda: self.failed or self.turn == pid or not (self.running - self.blocked - {pid}),
                                timeout=60)
            self.turn = (pid + 1) % self.programs
            self.ready.notify_all()

    def wait(self, pid: int, done, what: str) -> None:
        """Block program ``pid`` (the lock held) until ``done()``; the other program runs meanwhile."""
        self.blocked.add(pid)
        self.ready.notify_all()
        try:
            finished = self.ready.wait_for(lambda: self.failed or done(), timeout=60)
        finally:
            self.blocked.discard(pid)
        if self.failed or not finished:
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


def _exchange(api: str) -> Exchange:
    run = current_run(api)
    exchange = getattr(run, "exchange", None)
    if exchange is None or exchange.programs < 2:
        raise KernelUsageError(f"{api} needs an LNC2 launch (kernel[2](...))")
    return exchange


@instruction
def core_barrier(data=None, cores=None, engine=engine.gpsimd, name=None):
    """Both programs of an LNC2 launch wait for each other here (``engine`` picks which engine's queue
    blocks; the simulator runs each program's instructions in order, so all of them wait)."""
    exchange = _exchange("nisa.core_barrier")
    _step()
    exchange.barrier(current_run("nisa.core_barrier").program_id[0])


@instruction
def sendrecv(dst, src, send_to_rank, recv_from_rank, pipe_id, dma_engine=dma_engine.dma, name=None):
    """Send ``src`` to the other program and receive its ``src`` into ``dst`` (matched by pipe_id)."""
    api = "nisa.sendrecv"
    exchange = _exchange(api)
    me = current_run(api).program_id[0]
    _dst(dst, api, on_chip=False)
    payload = np.array(memory.read(src, api, "src") if src.buffer.on_chip else src.data)
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
