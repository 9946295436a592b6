"""The instruction record: what each executed instruction read and wrote, for observers (the cost model).

Nothing is recorded unless an observer listens (:func:`listen`); the hooks in ``memory`` then cost one
test of a module flag. While listening, every run created gets a :class:`Recorder`: operands read are
noted as they are read, and the write of a result closes the instruction into an :class:`Instr`.
The front ends spell one device instruction as several simulator steps (``out[...] = nl.exp(x)``
computes a new tile, then assigns it; ``psum += nc_matmul(a, b)`` adds a product into the
accumulator), so an assignment of the instruction's own result retargets that instruction to the
assigned region, and an add of a Tensor-engine result is that matmul accumulating in PSUM.

A region is ``(key, r0, r1, f0, f1)`` plus what costs need: ``key`` names the storage (one per
array, never reused while the run lasts), rows ``[r0, r1)`` are partitions on chip (first-axis rows
in HBM) and ``[f0, f1)`` the bytes touched in each row. Regions of a strided view are exact; a
gather covers its whole tensor.
"""

from __future__ import annotations

import contextlib
import enum
import math
import sys
import threading
import types
import weakref

import numpy as np

from . import liveness
from . import run as _run
from .errors import SIM_DIR
from .tensors import Access, Buffer, Tensor

listening = 0  # number of active listeners, any thread: the hooks' only cost when it is 0
_lock = threading.Lock()
_listeners: list[list] = []
_targets: list[str] = []  # the targets listeners asked for, innermost last


@contextlib.contextmanager
def listen(target: str | None = None):
    """Record every kernel run started inside the block; yields the list of their recorders.
    ``target``: the target the observer estimates for, which a current-API kernel with no target of
    its own then runs as (see :func:`requested_target`)."""
    global listening
    recorders: list[Recorder] = []
    with _lock:
        _listeners.append(recorders)
        listening += 1
        if target is not None:
            _targets.append(target)
    try:
        yield recorders
    finally:
        with _lock:
            _listeners.remove(recorders)
            listening -= 1
            if target is not None:
                _targets.remove(target)


def observed() -> bool:
    """Whether an observer listens (new runs get a recorder)."""
    return bool(_listeners)


def requested_target() -> str | None:
    """The target the innermost listener estimates for, or None."""
    return _targets[-1] if _targets else None


def attach(run) -> None:
    """Give a new run a recorder, which every listener receives; nothing when nobody listens."""
    if not listening or not _listeners:  # (the hooks may be on for race checks alone)
        return
    recorder = Recorder(run.config.target, run.frontend, run.budget("sbuf"))
    with _lock:
        for recorders in _listeners:
            recorders.append(recorder)
    run.trace = recorder


@contextlib.contextmanager
def checking_races(races):
    """Turn the hooks on for ``races`` (a ``races.Races``) while the block runs, with no recorder."""
    global listening
    if races is None:
        yield
        return
    with _lock:
        listening += 1
    try:
        yield
    finally:
        with _lock:
            listening -= 1


def _recorder():
    run = _run.get_run()
    return run.trace if run is not None else None


def read(x, mask=None) -> None:
    """Hook: an instruction reads ``x`` (a tensor or an access), where ``mask`` selects (None: all of it)."""
    run = _run.get_run()
    if run is None:
        return
    if run.trace is not None:
        run.trace.read(x)
    if run.races is not None:
        run.races.read(run.instance, x, mask)


def write(target, api: str, fresh: bool = False, mask=None) -> None:
    """Hook: an instruction ``api`` writes ``target`` (``fresh``: a new result tile) where ``mask`` selects,
    ending the instruction."""
    run = _run.get_run()
    if run is None:
        return
    if run.trace is not None:
        run.trace.write(target, api, fresh)
    if run.races is not None:
        run.races.write(run.instance, target, api, mask)


def side_effect() -> None:
    """Hook: the instruction being executed reads or changes engine state (accumulator registers,
    random-number generators), so its result is not a function of the regions it reads."""
    recorder = _recorder()
    if recorder is not None:
        recorder.side_effect()


def engine(number: int, **detail) -> None:
    """Hook: the instruction being executed runs on engine ``number``; ``detail`` flags for its cost."""
    recorder = _recorder()
    if recorder is not None:
        recorder.engine = number
        if detail:
            recorder.detail = detail


class Region(tuple):
    """(key, r0, r1, f0, f1, space, partitions, elements per partition, itemsize, contiguous bytes, dtype)."""

    __slots__ = ()
    key = property(lambda self: self[0])
    space = property(lambda self: self[5])
    partitions = property(lambda self: self[6])
    elements = property(lambda self: self[7])
    itemsize = property(lambda self: self[8])
    chunk = property(lambda self: self[9])
    dtype = property(lambda self: self[10])

    @property
    def bytes(self) -> int:
        return self[6] * self[7] * self[8]


class Instr:
    """One executed instruction: ``api`` as the kernel spelled it, an engine hint (-1: by name), the
    regions read and written, the kernel's (file, line, function) and the per-instruction ``detail`` flags.
    ``fresh``: storage keys of the new tiles that hold its result (legacy returned tiles).
    ``context``: what else decides its result besides the regions it reads: the call inside the kernel
    (each kernel frame's code, line and bytecode offset), the API call's non-tile arguments and the
    shape and strides of each view (a region is a view's bounds); None when that is not known (an
    argument of another kind, a gather) or the instruction also reads or changes engine state
    (accumulator registers, random-number generators), so that equal contexts and equal regions read
    give equal results (the cost model's loop-invariant code motion)."""

    __slots__ = ("api", "engine", "srcs", "dst", "fresh", "site", "detail", "context")

    def __init__(self, api, engine, srcs, dst, fresh, site, detail, context=None):
        self.api, self.engine, self.srcs, self.dst, self.fresh, self.site = api, engine, srcs, dst, fresh, site
        self.detail, self.context = detail, context

    def __repr__(self) -> str:
        return f"<{self.api} at {self.site[0]}:{self.site[1]}>"


TENSOR = 1  # engine numbers as in ``instructions``
BARRIER = None  # between legacy SPMD instances, which run one after another on the device
_ASSIGN = ("assignment", "(in place)")
_sim_files: dict[str, bool] = {}
_DTYPE_NAMES: dict = {}  # dtype -> name (dtype.name is slow)


def _inside(code) -> bool:
    name = code.co_filename
    inside = _sim_files.get(name)
    if inside is None:
        inside = _sim_files[name] = name.startswith(SIM_DIR)
    return inside


def _site() -> tuple[tuple[str, int, str], tuple | None, tuple | None]:
    """The kernel's (file, line, function) of the instruction being recorded, its context (see
    :class:`Instr`) and the kernel's call expression (code, bytecode offset) that executes it."""
    frame, api = sys._getframe(3), None
    while frame is not None and _inside(frame.f_code):
        frame, api = frame.f_back, frame
    if frame is None:
        return ("<unknown>", 0, "<unknown>"), None, None
    site = (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
    call = (frame.f_code, frame.f_lasti)
    params = _arguments(api) if api is not None else ()
    if params is None:
        return site, None, call
    calls = []  # the kernel's frames down to the simulator's launch: a helper called from two places differs
    while frame is not None and not _inside(frame.f_code):
        calls.append((frame.f_code, frame.f_lineno, frame.f_lasti))
        frame = frame.f_back
    return site, (tuple(calls), params), call


_TILE = "<tile>"  # an argument the regions read or written already describe
_UNKNOWN = object()
_PLAIN = (type(None), bool, int, float, complex, str, bytes, enum.Enum, np.generic, np.dtype, type, np.ufunc,
          types.BuiltinFunctionType)


def _argument(value, depth: int = 0):
    """A hashable stand-in for one argument's value, _TILE for a tile, or _UNKNOWN for a kind whose
    effect on the result is not known here (then the instruction is never taken as invariant). Only
    immutable values are kept: holding a tile alive would change the liveness accounting."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (Tensor, Access)):
        return _TILE
    if isinstance(value, Buffer):
        return value
    if depth > 4:  # deeper (or self-referring) structures are not worth following
        return _UNKNOWN
    if isinstance(value, types.FunctionType):
        if value.__closure__ is None:
            return value
        try:  # a closure's cells decide what it does (nl.multiply's operator name)
            cells = [cell.cell_contents for cell in value.__closure__]
            cells = _argument(["<self>" if c is value else c for c in cells], depth + 1)  # (nl.multiply is)
        except ValueError:  # a cell not yet filled
            return _UNKNOWN
        return _UNKNOWN if cells is _UNKNOWN else (value.__code__, cells)
    if isinstance(value, tuple | list):
        items = tuple(_argument(v, depth + 1) for v in value)
        return _UNKNOWN if any(v is _UNKNOWN for v in items) else items
    if isinstance(value, dict):  # keyword arguments passed on (the current API's instruction wrapper)
        items = _argument(list(value.items()), depth)
        return _UNKNOWN if items is _UNKNOWN else ("dict", items)
    if isinstance(value, slice):
        return ("slice", value.start, value.stop, value.step)
    return _UNKNOWN


def _arguments(frame) -> tuple | None:
    """The arguments of the API function the kernel called (their values when the result is written)."""
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 4) + bool(code.co_flags & 8)
    local = frame.f_locals
    out = []
    for name in code.co_varnames[:count]:
        kept = _argument(local.get(name))
        if kept is _UNKNOWN:
            return None
        out.append(kept)
    return tuple(out)


def _dtype_name(dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name


def _gather_run(comp, itemsize: int) -> int:
    """Contiguous bytes per step of a gather: runs of consecutive last-axis indices (an indirect row
    gather reads whole rows; a transposing access reads element by element)."""
    if isinstance(comp, int):
        return itemsize
    comp = np.asarray(comp)
    if comp.ndim == 0 or comp.shape[-1] < 2:
        return itemsize
    steps = np.diff(comp, axis=-1)
    return itemsize * comp.shape[-1] if (steps == 1).all() else itemsize


def _whole(key: int, root: np.ndarray, pitch: int, itemsize: int, dtype: str) -> Region:
    """The region of a whole on-chip storage: ``pitch`` bytes in each of its rows (a row is one partition
    of one tile or block), spread over at most 128 partitions."""
    rows = max(root.nbytes // max(pitch, 1), 1)
    partitions = min(rows, 128)
    per_partition = root.nbytes // partitions
    return Region((key, 0, rows, 0, pitch, "sbuf", partitions, max(per_partition // itemsize, 1), itemsize,
                   min(pitch, per_partition), dtype))


class Recorder:
    """The instruction record of one run (one NeuronCore's instruction streams)."""

    def __init__(self, target: str, frontend: dict, sbuf_budget: int = 0):
        self.target = target
        # SBUF bytes per partition the run may hold, each SBUF storage's whole region (what a spill moves),
        # and whether tiles sit at fixed SBUF addresses (then nothing is spilled): for the cost model's spills.
        self.sbuf_budget = sbuf_budget
        self.sbuf: dict[int, Region] = {}
        self.direct_sbuf = False
        self.instrs: list[Instr | None] = []
        self.pending: list = []
        self.views: list = []  # the shape and strides of each view read or written, None for a gather
        self.engine = -1
        self.detail: dict | None = None
        self.call = self.stateful = None  # the kernel call expression recording now, one with side effects
        self.call_first = 0  # the first instruction the current call recorded
        self.call_reads = False  # whether one of them read a region
        # The launch this run belongs to when it is one core of several (an LNC2 launch's exchange).
        self.launch = None
        self._keys: dict[int, list] = {}
        self._next_key = 0

    # ---------------------------------------------------------------------------------- regions

    def region(self, x) -> Region:
        if getattr(x, "gathers", False):
            return self._gather(x)
        if isinstance(x, Access):
            tensor = x.tensor
            strided = x.strided
            view = tensor.data[strided] if strided is not None else tensor.data
            shape = x.shape
            elements = math.prod(shape)
            partitions = shape[0] if shape else 1
        else:
            tensor, view = x, x.data
            if view.base is None:  # a whole tile or tensor: its region is fixed, computed once
                known = self._keys.get(id(view))
                if known is not None and known[0]() is view:
                    whole = known[3]
                    if whole is not None and whole[0] is tensor.buffer and whole[1] == tensor.pdim:
                        return whole[2]
            elements = view.size
            partitions = view.shape[tensor.pdim] if view.ndim > tensor.pdim else 1
        root = view
        while isinstance(root.base, np.ndarray):
            root = root.base
        ident = id(root)
        known = self._keys.get(ident)
        if known is None or known[0]() is not root:
            known = [weakref.ref(root), self._next_key, None, None]  # [root, key, address, whole region]
            self._next_key += 1
            self._keys[ident] = known
        space = tensor.buffer.space
        itemsize = view.itemsize
        if space != "hbm":
            alloc = tensor.alloc
            recs = getattr(alloc, "recs", None)
            pitch = (recs.flat[0].nbytes if recs is not None else getattr(alloc, "nbytes", 0)) or 0
            if pitch <= 0:
                pitch = root.nbytes // max(root.shape[0], 1) if root.ndim else itemsize
            if space == "sbuf" and known[1] not in self.sbuf:
                self.sbuf[known[1]] = _whole(known[1], root, pitch, itemsize, _dtype_name(view.dtype))
        else:
            pitch = abs(root.strides[0]) if root.ndim >= 2 and root.strides[0] else max(root.nbytes, 1)
            if view.ndim < 2:
                partitions = 1
        offset = 0
        if view is not root and view.size:
            if known[2] is None:
                known[2] = root.ctypes.data
            offset = view.ctypes.data - known[2]
        low = high = 0
        flow = fhigh = 0
        chunk = itemsize
        contiguous = True
        for n, s in zip(reversed(view.shape), reversed(view.strides)):
            span = (n - 1) * s
            if s < 0:
                low += span
            else:
                high += span
            if abs(s) < pitch:
                if s < 0:
                    flow += span
                else:
                    fhigh += span
            if contiguous and n > 1:
                if s == chunk and abs(s) < pitch:
                    chunk *= n
                else:
                    contiguous = False
        if tensor is not x and x.strided is None:
            chunk = _gather_run(x.comps[-1], itemsize)
            self.views.append(None)  # a gather's region bounds what it reads: not which elements
        elif view is not root:
            self.views.append((view.shape, view.strides))  # which elements of the region's bounds
        r0, r1 = (offset + low) // pitch, (offset + high) // pitch + 1
        column = offset % pitch
        f0, f1 = column + flow, column + fhigh + itemsize
        if r1 - r0 > 1 and f1 > pitch:  # a view whose rows wrap: the whole rows
            f0, f1 = 0, pitch
        per_partition = max(elements // max(partitions, 1), 1)
        region = Region((known[1], r0, r1, f0, f1, space, partitions, per_partition, itemsize,
                         min(chunk, per_partition * itemsize), _dtype_name(view.dtype)))
        if view is root and tensor is x:
            known[3] = (tensor.buffer, tensor.pdim, region)
        return region


    def _gather(self, x) -> Region:
        """A current-API gather or scatter (an indirect view): like a legacy gather, it bounds what it
        touches by its whole source storage, moving rows of the contiguous run its addresses make."""
        whole = self.region(x.root)
        self.views.append(None)  # which rows: not known from the region
        index = x.index
        itemsize = x.dtype.itemsize
        partitions = x.shape[0] if x.ndim else 1
        per_partition = max(x.size // max(partitions, 1), 1)
        steps = np.diff(index, axis=-1) if index.ndim and index.shape[-1] > 1 else None
        run = itemsize * index.shape[-1] if steps is not None and (steps == 1).all() else itemsize
        return Region((*whole[:6], partitions, per_partition, itemsize, min(run, per_partition * itemsize),
                       _dtype_name(x.dtype)))

    # ---------------------------------------------------------------------------------- hooks

    def read(self, x) -> None:
        self.pending.append(self.region(x))
        for tile in x.offsets:  # an indirect access reads its addresses from these first
            self.pending.append(self.region(tile))
        self._fixed_address(x)

    def _fixed_address(self, x) -> None:
        """A directly allocated tile shares its addresses with others under other storage keys: what
        the regions say is unchanged may have been overwritten (never loop-invariant)."""
        alloc = (x.tensor if isinstance(x, Access) else x).alloc
        if alloc.__class__ is liveness.Blocks:
            alloc = alloc.recs.flat[0]
        if isinstance(alloc, liveness.DirectAllocation):
            self.views.append(None)
            self.direct_sbuf = self.direct_sbuf or alloc.space == "sbuf"

    def write(self, target, api: str, fresh: bool = False) -> None:
        """``api`` wrote ``target``; ``fresh``: a new tile holding the result (the legacy API's
        returned tiles), which an assignment may then store elsewhere."""
        pending, self.pending = self.pending, []
        if target.offsets:  # a scatter's addresses
            pending.extend(self.region(tile) for tile in target.offsets)
        engine, self.engine = self.engine, -1
        detail, self.detail = self.detail, None
        instrs = self.instrs
        dst = self.region(target)
        self._fixed_address(target)
        views, self.views = self.views, []
        if api.endswith(_ASSIGN) and all(r == dst for r in pending):
            return  # a tile assigned onto itself (``t[...] += x`` stores the updated view back)
        last = instrs[-1] if instrs else None
        if last is not None:
            own = last.fresh
            sources = [r for r in pending if r[0] not in own]
            if len(sources) < len(pending):
                accumulates = (api == "nl.add" and last.engine == TENSOR and sources
                               and all(r[5] == "psum" for r in sources))
                if accumulates or api.endswith(_ASSIGN):
                    # The instruction's own result stored where the kernel assigns it, or a Tensor-engine
                    # result added into its PSUM accumulator: still that one instruction.
                    last.srcs.extend(sources)
                    last.dst = dst
                    if last.context is not None:
                        last.context = None if None in views else (*last.context[:2], last.context[2] + tuple(views))
                    if fresh:
                        last.fresh = own + (dst[0],)
                    return
        if api.endswith(_ASSIGN):
            api = "tensor_copy"
        if not instrs:
            exchange = getattr(_run.get_run(), "exchange", None)
            if exchange is not None and exchange.programs > 1:
                self.launch = exchange
        seen = set()
        srcs = [r for r in pending if not (r in seen or seen.add(r))]
        site, context, call = _site()
        if call != self.call:  # the kernel's next API call
            self.call, self.call_first, self.call_reads = call, len(instrs), False
            if self.stateful != call:
                self.stateful = None
        # A write reading nothing after one of the same call that read: another output of that
        # instruction (topk's indices, quantize_mx's scales), computed from inputs it does not record.
        if self.stateful == call or None in views or (self.call_reads and not srcs):
            context = None
        elif context is not None:
            context = (*context, tuple(views))
        self.call_reads = self.call_reads or bool(srcs)
        instrs.append(Instr(api, engine, srcs, dst, (dst[0],) if fresh else (), site, detail, context))

    def side_effect(self) -> None:
        """The API call being executed reads or changes engine state that no region records: none of
        the instructions it records (before or after this) is a function of what it reads."""
        call = _site()[2]
        self.stateful = call
        if call == self.call:
            for instr in self.instrs[self.call_first:]:
                if instr is not BARRIER:
                    instr.context = None

    def barrier(self) -> None:
        self.pending, self.views = [], []
        if self.instrs and self.instrs[-1] is not BARRIER:
            self.instrs.append(BARRIER)
