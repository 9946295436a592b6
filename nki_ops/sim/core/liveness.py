"""Liveness of on-chip memory: a logical tile is live from its first use to its last use.

Python references say nothing about what the compiler keeps in SBUF or PSUM: a tile rebound in a
loop is dead after its last use, and a dead tile still referenced by a name takes no memory. Each
logical tile (a tile, or one block of a tensor with leading block dimensions, whose blocks the
compiler places independently) has an :class:`Allocation` recording the instruction ticks of its
first and last use. Reads happen at the current tick; a write happens at the current tick and then
advances it, so an instruction's inputs and its result are live together. When an allocation
dies (no tensor references it any more) or the kernel instance ends, its interval is final; the
capacity an instance needs is the peak, over ticks, of the bytes of intervals that overlap.

Directly allocated tiles (``nki.compiler`` allocators, ``nl.ndarray(address=...)``) have fixed
addresses instead: writing one claims its address range, and reading a tile whose range another
tile has claimed since is an error naming both allocation sites.

A float allocation filled with the uninitialised-memory sentinel (a tagged NaN, see ``memory``)
carries its array as ``poison`` until its first read, which looks for the sentinel in it: found,
the read is recorded (the allocation and the reading instruction's site) for the report on kernel
outputs holding it (``memory.report_poison``). One check per allocation, and none for allocations
that instructions overwrite whole before any use (they are never filled).
"""

from __future__ import annotations

import weakref
from array import array

import numpy as np

from .errors import user_site
from .poison import holds_sentinel


class Allocation:
    """One logical tile: ``nbytes`` per partition, live from tick ``first`` to tick ``last``."""

    __slots__ = ("run", "space", "nbytes", "label", "first", "last", "poison", "__weakref__")

    def __init__(self, run, space: str, nbytes: int, name: str, site: str):
        # One per on-chip allocation: the ledger's steps are inlined (allocation is on the hot path).
        ledger = run.ledger
        self.run, self.space, self.nbytes = run, space, nbytes
        label = ledger._label_ids.get((name, site))
        self.label = ledger.label(name, site) if label is None else label
        self.first = self.last = self.poison = None
        ledger.open[id(self)] = weakref.ref(self)

    @property
    def name(self) -> str:
        return self.run.ledger.labels[self.label][0]

    @property
    def site(self) -> str:
        return self.run.ledger.labels[self.label][1]

    def read(self) -> None:
        tick = self.run.clock
        if self.first is None:
            self.first = tick
        self.last = tick
        if self.poison is not None:
            self.run.ledger.first_read_of_poison(self)

    def write(self) -> None:
        run = self.run
        tick = run.clock
        if self.first is None:
            self.first = tick
        self.last = tick
        run.clock = tick + 1

    def __del__(self):
        try:
            self.run.ledger.closed(self)
        except Exception:  # interpreter shutdown: nothing left to account
            pass


class DirectAllocation(Allocation):
    """A logical tile at a fixed address (``nki.compiler`` direct allocation).

    ``place`` is (first partition, end partition, first byte, end byte), bytes counted from the
    start of the space (PSUM: bank * 2 KiB + offset). ``clobber`` is the allocation that claimed
    an overlapping range after this one was written, and the tick it did."""

    __slots__ = ("place", "clobber")

    def __init__(self, run, space: str, nbytes: int, name: str, site: str, place: tuple[int, int, int, int]):
        super().__init__(run, space, nbytes, name, site)
        self.place, self.clobber = place, None
        run.ledger.direct.add(space)

    def read(self) -> None:
        if self.clobber is not None and self.run.clock > self.clobber[1]:
            self.run.ledger.overwritten(self)
        if self.first is None:
            self.run.ledger.claim(self)
        super().read()

    def write(self) -> None:
        if self.first is None or self.clobber is not None:
            self.run.ledger.claim(self)
        super().write()


class Blocks:
    """The allocations of a tensor's blocks (one per index of its leading block dimensions)."""

    __slots__ = ("recs",)
    poison = None  # tracked per block (``memory.mark_poison``)

    def __init__(self, recs: np.ndarray):
        self.recs = recs

    def part(self, key):
        """The allocation(s) that ``key`` (indices of the block axes: ints, slices or arrays) selects."""
        recs = self.recs[tuple(key)]
        return recs if isinstance(recs, Allocation) else Blocks(recs)

    def read(self) -> None:
        for rec in self.recs.flat:
            rec.read()

    def write(self) -> None:
        run = None
        for rec in self.recs.flat:
            run = rec.run
            tick = run.clock
            rec.write()
            run.clock = tick  # one instruction writes all of them: one tick
        if run is not None:
            run.clock += 1


def access_part(alloc, comps: list):
    """The allocation an access (``t[i, j, i_p, i_f]``) into a block tensor touches."""
    if alloc.__class__ is Blocks:
        return alloc.part(comps[:alloc.recs.ndim])
    return alloc


def view_part(alloc, key: tuple):
    """The allocation of a basic-indexing view ``t[key]``."""
    if alloc.__class__ is Blocks:
        return alloc.part(key[:alloc.recs.ndim])
    return alloc


class Detached:
    """Where an allocation still referenced after its kernel instance ended points: no accounting."""

    clock = 0

    class ledger:
        labels = [("<finished>", "<finished>")]

        @staticmethod
        def closed(rec):
            pass

        @staticmethod
        def claim(rec):
            pass

        @staticmethod
        def overwritten(rec):
            pass

        @staticmethod
        def first_read_of_poison(rec):
            rec.poison = None


class Ledger:
    """The allocations of one kernel instance: open ones (weakly), finished intervals per space
    (``first, last, nbytes, label`` quadruples), and directly allocated tiles holding data."""

    def __init__(self):
        self.labels: list[tuple[str, str]] = []
        self._label_ids: dict[tuple[str, str], int] = {}
        # (name, allocation site, reading site) of reads that found never-written memory, for the launch.
        self.poison_reads: list[tuple[str, str, str]] = []
        self.reset()

    def reset(self) -> None:
        self.open: dict[int, weakref.ref] = {}
        self.done = {"sbuf": array("q"), "psum": array("q")}
        self.resident: dict[str, dict[int, DirectAllocation]] = {"sbuf": {}, "psum": {}}
        self.direct: set[str] = set()

    def label(self, name: str, site: str) -> int:
        key = (name, site)
        index = self._label_ids.get(key)
        if index is None:
            index = self._label_ids[key] = len(self.labels)
            self.labels.append(key)
        return index

    def closed(self, rec: Allocation) -> None:
        if self.open.pop(id(rec), None) is None:
            return
        if self.direct:
            self.resident[rec.space].pop(id(rec), None)
        if rec.first is not None:
            self.done[rec.space].extend((rec.first, rec.last, rec.nbytes, rec.label))

    def finish(self) -> None:
        """Close every allocation still referenced at the end of the instance."""
        for ref in list(self.open.values()):
            rec = ref()
            if rec is not None:
                self.closed(rec)
                rec.run = Detached

    # ------------------------------------------------------------------------ direct allocation

    def claim(self, rec: DirectAllocation) -> None:
        """``rec`` now holds data at its address range: tiles there that still hold data lose it."""
        p0, p1, b0, b1 = rec.place
        tick = rec.run.clock
        resident = self.resident[rec.space]
        for other in resident.values():
            q0, q1, c0, c1 = other.place
            if other is not rec and p0 < q1 and q0 < p1 and b0 < c1 and c0 < b1:
                other.clobber = (rec, tick)
        for key in [k for k, other in resident.items() if other.clobber is not None and other.clobber[0] is rec]:
            del resident[key]
        rec.clobber = None
        resident[id(rec)] = rec

    def overwritten(self, rec: DirectAllocation) -> None:
        from .errors import CapacityError
        other = rec.clobber[0]
        raise CapacityError(
            f"{rec.space.upper()} tile '{rec.name}' (allocated at {rec.site}, {_describe(rec)}) is used after "
            f"'{other.name}' (allocated at {other.site}, {_describe(other)}) overwrote its addresses: two tiles "
            f"on overlapping addresses are live at the same time (give them distinct addresses or more "
            f"physical tiles)")

    # ------------------------------------------------------------------------------ poison
    MAX_POISON_READS = 8  # the report names the first few

    def first_read_of_poison(self, rec: Allocation) -> None:
        values, rec.poison = rec.poison, None
        if len(self.poison_reads) >= self.MAX_POISON_READS or not holds_sentinel(values):
            return
        entry = (rec.name, rec.site, user_site())
        if entry not in self.poison_reads:
            self.poison_reads.append(entry)

    # -------------------------------------------------------------------------------- capacity

    def peak(self, space: str, above: int = -1):
        """(peak bytes per partition, [(bytes, name, site), ...] live then, largest first); the listing only
        when the peak is above ``above`` (the budget: the report's, which most runs do not need)."""
        done = self.done[space]
        if not done:
            return 0, []
        quads = np.frombuffer(done, dtype=np.int64).reshape(-1, 4)
        first, last, nbytes = quads[:, 0], quads[:, 1], quads[:, 2]
        if len(quads) == 1 and nbytes[0] <= above:
            return int(nbytes[0]), []
        times = np.concatenate([first, last + 1])
        deltas = np.concatenate([nbytes, -nbytes])
        order = np.lexsort((deltas, times))  # at one tick, frees before allocations
        running = np.cumsum(deltas[order])
        at = int(np.argmax(running))
        peak, tick = int(running[at]), int(times[order][at])
        if peak <= above:
            return peak, []
        live = quads[(first <= tick) & (last >= tick)]
        by_label: dict[int, int] = {}
        for _, _, size, label in live.tolist():
            by_label[label] = by_label.get(label, 0) + size
        listing = sorted(((size, *self.labels[label]) for label, size in by_label.items()), reverse=True)
        return peak, listing


def _describe(rec: DirectAllocation) -> str:
    p0, p1, b0, b1 = rec.place
    if rec.space == "psum":
        return f"bank {b0 // 2048} bytes [{b0 % 2048}, {b0 % 2048 + b1 - b0}) partitions [{p0}, {p1})"
    return f"bytes [{b0}, {b1}) partitions [{p0}, {p1})"
