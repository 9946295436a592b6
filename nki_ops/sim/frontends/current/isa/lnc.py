"""The two programs of an LNC2 launch: ``core_barrier`` and ``sendrecv`` (their exchange, turns and
mailboxes are the core's, ``core.collectives``)."""

from __future__ import annotations

from ....core import collectives
from ....core.outputs import Dst
from .constants import dma_engine, engine
from .instruction import instruction


@instruction
def core_barrier(data=None, cores=None, engine=engine.gpsimd, name=None):
    """Both programs of an LNC2 launch wait for each other here (``engine`` picks which engine's queue
    blocks; the simulator runs each program's instructions in order, so all of them wait)."""
    collectives.core_barrier("nisa.core_barrier")


@instruction
def sendrecv(dst, src, send_to_rank, recv_from_rank, pipe_id, dma_engine=dma_engine.dma, name=None):
    """Send ``src`` to the other program and receive its ``src`` into ``dst`` (matched by pipe_id)."""
    api = "nisa.sendrecv"
    exchange = collectives.lnc_exchange(api)
    collectives.sendrecv(api, exchange, Dst(dst, api, on_chip=False).dst, src, send_to_rank, recv_from_rank, pipe_id)
