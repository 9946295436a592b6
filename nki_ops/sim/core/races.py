"""Races between the program instances of one launch that share HBM.

The two programs of an LNC2 launch run on two NeuronCores at once, and the instances of a legacy SPMD
grid are independent programs the kernel may not order (``nl.nc`` grids put them on two cores): when
two instances touch the same HBM bytes, at least one writing, and nothing orders the two accesses, the
device gives either result. A sequential simulator gives one of them every time, so a kernel can pass
here and fail on the device. This module reports such pairs, with both sites, as JAX Pallas' interpret
mode does for its grid.

Order comes only from synchronisation that joins every instance: ``nisa.core_barrier``, and a
``nisa.sendrecv`` pair (both programs of an LNC2 launch have sent before either goes on). Each is the
start of a new *generation*; accesses of older generations are ordered before everything after it.
Within a generation, each element of an HBM tensor some instance writes keeps in shadow arrays the last
access that wrote it and the last two readers from different instances (enough to know whether any reader
other than a given one exists), so one access is checked against all earlier ones in time proportional to
its own size; reads of a tensor nobody has written wait in a list until a write comes (a read-only input,
often the largest tensor, never gets shadow cells).
Atomic accumulations (``nl.atomic_rmw``) do not race with each other; they are kept with the reads,
so with three or more instances a plain read can miss an accumulation that two later readers of
other instances pushed out of the shadow (a race not reported; never one invented). Identical writes are reported
too: the device does not promise their order. Only HBM is shared: SBUF and PSUM belong to one core.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np

from .errors import RaceError, SimulatorWarning, user_site
from .run import unfit
from .tensors import Access, mask_for

NONE = -1  # a shadow cell no access of the current generation has touched
ATOMIC_APIS = frozenset({"nl.atomic_rmw"})
_CELL = np.dtype(np.int32)


class _Shadow:
    """Per HBM allocation: the last writer and the last two distinct readers of each element (access ids)."""

    __slots__ = ("root", "low", "grain", "cells")

    def __init__(self, root: np.ndarray, low: int, high: int):
        self.root, self.low, self.grain = root, low, root.itemsize
        size = max((high - low) // self.grain, 1)
        self.cells = np.full((3, size), NONE, _CELL)  # writer, last reader, another reader

    def select(self, view: np.ndarray, index):
        """What selects ``view[index]`` in ``cells[k]``: a (strided view maker, index) pair."""
        offset = view.__array_interface__["data"][0] - self.low
        g = self.grain
        if view.itemsize == g and offset % g == 0 and all(s % g == 0 for s in view.strides):
            strides = tuple(s // g * _CELL.itemsize for s in view.strides)
            start = offset // g
            return lambda row: np.lib.stride_tricks.as_strided(row[start:], view.shape, strides), index
        # A reinterpreting view (.view(dtype)): the cells its bytes fall in.
        addresses = np.full((), offset, np.int64)
        for n, s in zip(view.shape, view.strides):
            addresses = np.add.outer(addresses, np.arange(n, dtype=np.int64) * s)
        if index is not Ellipsis:
            addresses = addresses[index]
        covered = np.add.outer(addresses.reshape(-1), np.arange(0, view.itemsize, g)) // g
        return (lambda row: row), covered.reshape(-1)


def _storage(x, mask) -> tuple[np.ndarray | None, object]:
    """The array an access addresses and its index in it (Ellipsis: all of it): only the elements ``mask``
    selects, and of a gather only the indices inside its tensor (the instruction itself refuses others, or
    skips them under ``oob_mode=skip``)."""
    if isinstance(x, Access):
        if x.strided is not None and mask is None:
            return x.tensor.data[x.strided], Ellipsis
        keep = None if mask is None else mask_for(mask, x.shape)
        for axis, comp in enumerate(x.comps):
            extent = x.tensor.shape[axis]
            if isinstance(comp, int):
                if not 0 <= comp < extent:
                    return None, Ellipsis
            elif comp.size and (comp.min() < 0 or comp.max() >= extent):
                inside = np.broadcast_to((comp >= 0) & (comp < extent), x.shape)
                keep = inside if keep is None else keep & inside
        if keep is None or keep.all():  # indexing broadcasts the components: the same elements, unexpanded
            return x.tensor.data, tuple(x.comps)
        return x.tensor.data, tuple(c if isinstance(c, int) else np.broadcast_to(c, x.shape)[keep] for c in x.comps)
    if getattr(x, "gathers", False):  # the current API's indirect view: flat addresses into its allocation
        return x.base, x.index if x.all_valid else x.index[x.valid]
    view = getattr(x, "_array", None) if hasattr(x, "_array") else x.data
    return view, Ellipsis if mask is None else mask_for(mask, view.shape)


def _empty(index) -> bool:
    if index is Ellipsis:
        return False
    if isinstance(index, tuple):
        return any(np.size(c) == 0 for c in index if not isinstance(c, int))
    return not np.any(index) if index.dtype == bool else index.size == 0  # a mask, or a gather's addresses


def _root(view: np.ndarray) -> np.ndarray:
    root = view
    while isinstance(root.base, np.ndarray):
        root = root.base
    return root


class Races:
    """The HBM accesses of one launch's program instances (one rank's HBM), checked as they happen.

    The instruction hooks (``trace.read``/``trace.write``) call :meth:`read` for each operand and
    :meth:`write` for the result; reads wait for their instruction's write, which names the instruction."""

    def __init__(self, labels: list[str], mode: str):
        self.labels = labels  # each instance's name in reports
        self.error = mode == "error"
        self.lock = threading.Lock()
        self.shadows: dict[int, _Shadow] = {}
        self.unwritten: dict[int, tuple] = {}  # id(root) -> (root, its reads while no instance wrote it)
        self.instances = np.zeros(64, np.int32)  # access id -> instance
        self.atomic = np.zeros(64, bool)  # access id -> an atomic accumulation
        self.accumulated = False  # whether any access was one
        self.records: list[tuple[str, str, str]] = []  # access id -> (site, api, "reads"/"writes")
        self.start = 0  # the first access id of the current generation
        self.pending: dict[int, dict] = {}  # instance -> {id: (HBM operand, mask)} its current instruction read
        self.reported: set[tuple[str, str]] = set()

    def sync(self) -> None:
        """Every instance has reached a synchronisation point: earlier accesses are ordered before later ones."""
        with self.lock:
            self.start = len(self.records)

    def read(self, instance: int, x, mask=None) -> None:
        if not x.buffer.on_chip:
            # An operand read again with the instruction's mask (a legacy DMA) is the masked read.
            reads = self.pending.setdefault(instance, {})
            if mask is not None or id(x) not in reads:
                reads[id(x)] = (x, mask)

    def write(self, instance: int, target, api: str, mask=None) -> None:
        reads = self.pending.pop(instance, {})
        for x, read_mask in reads.values():
            self._access(instance, x, read_mask, False, api)
        if not target.buffer.on_chip:
            self._access(instance, target, mask, True, api)

    def _access(self, instance: int, x, mask, write: bool, api: str) -> None:
        view, index = _storage(x, mask)
        if view is None or view.size == 0 or _empty(index):
            return
        root = _root(view)
        site = user_site()
        atomic = write and api in ATOMIC_APIS
        with self.lock:
            shadow = self.shadows.get(id(root))
            if shadow is None or shadow.root is not root:
                if not write:
                    # A read of memory nobody has written races with nothing yet: it waits, without shadow
                    # cells, for a write (read-only inputs, often the largest tensors, never get any).
                    kept = self.unwritten.get(id(root))
                    if kept is None or kept[0] is not root:
                        kept = self.unwritten[id(root)] = (root, [])
                    kept[1].append((instance, self._record(instance, site, api, False, False), view, index))
                    return
                shadow = self.shadows[id(root)] = _Shadow(root, *np.lib.array_utils.byte_bounds(root))
                kept = self.unwritten.pop(id(root), None)
                for r_instance, r_ident, r_view, r_index in kept[1] if kept and kept[0] is root else ():
                    if r_ident >= self.start:
                        self._update(shadow, r_instance, r_ident, r_view, r_index, False)
            self._check(shadow, instance, x, view, index, write, atomic, api, site)
            self._update(shadow, instance, self._record(instance, site, api, write, atomic), view, index,
                         write and not atomic)

    def _record(self, instance: int, site: str, api: str, write: bool, atomic: bool) -> int:
        ident = len(self.records)
        if ident == self.instances.size:
            self.instances = np.concatenate([self.instances, np.zeros_like(self.instances)])
            self.atomic = np.concatenate([self.atomic, np.zeros_like(self.atomic)])
        self.instances[ident], self.atomic[ident] = instance, atomic
        self.accumulated |= atomic
        self.records.append((site, api, "writes" if write else "reads"))
        return ident

    def _check(self, shadow: _Shadow, instance: int, x, view, index, write: bool, atomic: bool, api: str,
               site: str) -> None:
        rows, index = shadow.select(view, index)
        writer, reader, other = (rows(row) for row in shadow.cells)
        # Atomic accumulations are kept with the reads: they clash with plain reads and writes of other
        # instances, and with no other accumulation.
        readers = None if write and not atomic else ~self.atomic if atomic else self.atomic
        # A plain read clashes with no reader but an accumulation: with none recorded, only the writers.
        checked = (writer,) if readers is self.atomic and not self.accumulated else (writer, reader, other)
        for cells, kinds in zip(checked, (None, readers, readers)):
            ids = cells[index]
            seen = np.maximum(ids, 0)
            clash = (ids >= self.start) & (self.instances[seen] != instance)
            if kinds is not None:
                clash &= kinds[seen]
            if clash.any():
                self._report(instance, x, write, api, site, int(ids[clash].reshape(-1)[0]))
                return

    def _update(self, shadow: _Shadow, instance: int, ident: int, view, index, write: bool) -> None:
        """Access ``ident`` becomes the last writer of its cells, or (a read, an accumulation) their last reader."""
        rows, index = shadow.select(view, index)
        writer, reader, other = (rows(row) for row in shadow.cells)
        if write:
            writer[index] = ident
            return
        last = reader[index]
        moved = (last >= self.start) & (self.instances[np.maximum(last, 0)] != instance)
        if moved.any():
            other[index] = np.where(moved, last, other[index])
        reader[index] = ident

    def _report(self, instance: int, x, write: bool, api: str, site: str, earlier: int) -> None:
        other_site, other_api, other_verb = self.records[earlier]
        key = (site, other_site) if site <= other_site else (other_site, site)
        if key in self.reported:
            return
        self.reported.add(key)
        message = (f"HBM race on '{getattr(x, 'name', '?')}': {self.labels[instance]} {'writes' if write else 'reads'} "
                   f"it here ({api}) and {self.labels[int(self.instances[earlier])]} {other_verb} the same bytes at "
                   f"{other_site} ({other_api}) with nothing ordering the two (core_barrier, sendrecv): the device "
                   f"may run them in either order")
        if self.error:
            raise RaceError(message, site)
        unfit("a simulator warning")
        warnings.warn(f"{site}: {message}", SimulatorWarning, stacklevel=5)
