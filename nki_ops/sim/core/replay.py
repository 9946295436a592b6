"""Replay: a kernel called again with arguments of the same shapes runs the instructions it ran before.

The ``RECORD_AT``-th call of a kernel with one signature (:func:`signature`) runs it in full and records
its *steps*: the calls the kernel made into the simulator's instructions (the outermost call of a function
decorated with :func:`step`, its arguments as they were: the tiles, views, output specs and static values)
and its allocations, in order. A later call with the same key (:func:`key`: the signature, and the values
of the globals, module attributes and closure variables the kernel's code names) skips the kernel's
Python, its front end, its allocations and its views: it resets the recorded on-chip tensors to their
state at allocation, points the recorded HBM views at the new call's arrays (and at new arrays for the
kernel's own HBM tensors), and calls the recorded steps again. Every step computes its values with the
same code as the recorded call, so the results are bit-identical (an instruction that registered a
*tail*, :func:`tail`, replays only that part of its code: what follows its checks).

A recording is kept only when the recorded call proved that replaying it is the same as running it again
(:meth:`Recording.unfit` names what breaks that, and the kernel then always runs in full):

- the call gave no simulator warning (capacity, tile limits, races; the report of outputs holding the NaN
  of never-written memory is made again by every replay whose outputs hold it);
- no value reached Python: register loads and dynamic loop bounds, ``device_print``, random numbers;
- no instruction took an address from a tile (indirect DMA, dynamic offsets);
- every value the kernel read or wrote went through a step (a read or write of tile values outside one
  means that the front end computed something the steps do not redo);
- every step's arguments are of kinds whose meaning is known here (tensors, views, output specs, static
  Python and NumPy values), and the kernel's HBM views are views of its arguments or its own tensors.

Calls run in full when replay is off (``SimConfig.replay``), an observer listens (the cost model, the
profile), the launch has several programs or ranks, in timing-only mode, or another thread is replaying
the same recording. What a recording cannot see: Python state the kernel reaches other than by name (a
mutable object changed in place, ``np.random`` or the clock read in the kernel's body); such a kernel
needs ``configure(replay=False)``.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import enum
import gc
import heapq
import threading
import types

import numpy as np
from numpy.lib.array_utils import byte_bounds

from . import dtypes as dt
from . import run as _run
from .tensors import Access, Mask, MaskedOperand, Tensor

_lock = threading.Lock()
CACHE_SIZE = 64  # recordings kept, least recently used dropped first
# A recording keeps every tile and tensor its call allocated (not only the live ones): kernels that allocate
# more than this in all are not recorded, and the recordings kept hold at most CACHE_BYTES together.
MAX_BYTES = 64 << 20
CACHE_BYTES = 256 << 20
_cache: collections.OrderedDict = collections.OrderedDict()
_bytes = 0
_seen: collections.OrderedDict = collections.OrderedDict()  # signature -> calls so far (False: not replayable)
RECORD_AT = 3  # the call with one signature that is recorded: the later ones are replayed
replayed = 0  # calls answered by a replay, in this process (what tests and benchmarks look at)
compiled_replays = 0  # of those, the replays of a compiled recording (``Compiled``)


class Unkeyable(Exception):
    """An argument or global whose value the key cannot hold: the call runs in full."""


# ----------------------------------------------------------------------------------------- recording

class Recording:
    """What the recorded call did: ``events`` in order, each an allocation ``(None, state)`` the kernel made
    (``state``: the tensor, its fill, whether filled lazily, its flags as made) or a step
    ``(fn, args, kwargs, allocations)`` with the states of the tensors it allocated."""

    def __init__(self):
        self.events: list = []
        self.allocations: list | None = None  # the running step's allocations (None: outside any step)
        self.signature = None  # the signature it is kept under (``finish``)
        self.depth = 0
        self.tail = None  # the running step's tail (``tail``)
        self.form = None  # the running step's array form (``form``)
        self.forms: dict[int, tuple] = {}  # id of a step event -> its array form
        self.filled: set[int] = set()  # ids of lazily filled allocations whose fill happened
        self.reason: str | None = None  # why it cannot be replayed (None: it can)
        self.hbm: list = []  # (tensor, root index, byte offset) of every HBM view the steps use
        self.hbm_allocations: list = []  # kernel-made HBM tensors, as roots after the arguments
        self.result = None
        self.roots: list | None = None  # the recorded call's argument arrays, until ``prepare``
        self.nbytes = 0
        self.program: list = []  # the events a replay runs (``prepare``: allocations it must reset, steps)
        self.drops: dict[int, list] = {}  # program index -> the adopted tiles it uses last (``_last_uses``)
        self.swappable: set[int] = set()  # ids of step-made tensors no other tensor views: data is adopted
        self.poison_reads: list = []  # the recorded call's first reads of never-written memory (``liveness``)
        self.compiled: Compiled | None = None  # the steps as array operations, when every one has that form
        self.lock = threading.Lock()

    def unfit(self, reason: str) -> None:
        """It cannot be replayed: keep only the verdict (the tiles it held go as the kernel drops them)."""
        if self.reason is None:
            self.reason = reason
            self.events, self.hbm_allocations, self.hbm, self.result, self.roots = [], [], [], None, None
            self.program, self.nbytes, self.compiled, self.forms = [], 0, None, {}
            if self.signature is not None:
                with _lock:
                    _seen[self.signature] = False  # its signature runs in full from now on

    def prepare(self) -> bool:
        """Find the HBM views the steps use (once, at the first replay); False if it cannot be replayed."""
        if self.roots is not None:
            roots, self.roots = self.roots, None
            with _collector_held():
                try:
                    roots += [array_of(t) for t in self.hbm_allocations]
                    _find_views(self, roots, self.result)
                    if self.reason is not None:
                        return False
                    self.program = [(_reset, (self, event[1]), {}, ()) if event[0] is None else event
                                    for event in self.events if event[0] is not None or _changes(self, event[1])]
                    self.drops = _last_uses(self)
                    self.compiled = Compiled.of(self, roots)
                    if self.compiled is not None and self.compiled.steps is None:
                        # Its operations hold what they use: the recorded tiles' own storage can go.
                        self.events, self.program, self.forms, self.hbm, self.drops = [], [], {}, [], {}
                except Exception as error:  # noqa: BLE001 - a recording this cannot read is not replayed
                    self.unfit(f"reading the recording raised {type(error).__name__}: {error}")
        return self.reason is None

    def allocated(self, tensor, fill, lazy: bool) -> None:
        """``memory.new_tensor`` made ``tensor`` filled with ``fill`` (None: not filled; ``lazy``: on first use)."""
        if self.reason is not None:
            return
        array = array_of(tensor)
        self.nbytes += array.nbytes
        if lazy and tensor._unfilled is not None:
            fill = tensor._unfilled[1]
        state = (tensor, fill, lazy, _flags(tensor))
        if not tensor.buffer.on_chip:
            self.hbm_allocations.append(tensor)
        if self.allocations is not None:
            self.allocations.append(state)
        else:
            self.events.append((None, state))
        if self.nbytes > MAX_BYTES:
            self.unfit(f"its tiles and tensors take more than {MAX_BYTES >> 20} MiB")


def _flags(tensor):
    """A new tensor's flags as made: the written mask, and whether unwritten-PSUM flags are all set."""
    return tensor.written, tensor.unset is not None


def step(fn):
    """Decorate an instruction entry point: its outermost call in a recorded run is a step."""
    def call(*args, **kwargs):
        if not _run.recordings:
            return fn(*args, **kwargs)
        rec = _run.recording()
        if rec is None:
            return fn(*args, **kwargs)
        if rec.depth:  # called by another step
            rec.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                rec.depth -= 1
        rec.depth, rec.allocations, rec.tail, rec.form = 1, [], None, None
        allocations = rec.allocations
        try:
            result = fn(*args, **kwargs)
        finally:
            rec.depth, rec.allocations = 0, None
        if rec.reason is None:
            if rec.tail is not None and not allocations:
                event = (*rec.tail, {}, allocations)
            else:
                event = (fn, args, kwargs, allocations)
            rec.events.append(event)
            if rec.form is not None:
                rec.forms[id(event)] = rec.form
        return result

    call.__name__, call.__qualname__, call.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    call.__module__, call.__wrapped__ = fn.__module__, fn
    return call


def tail(fn, *args):
    """``fn(*args)``: the rest of the running instruction, its checks passed. Called by a step itself (not
    by another step inside it) that allocated nothing, it is what a replay of the step calls: what the
    checks proved on the recorded call holds for every call it is replayed for."""
    replays_as(fn, *args)
    return fn(*args)


def replays_as(fn, *args) -> None:
    """Register ``fn(*args)`` as what a replay of the running step calls, as ``tail`` does, for an instruction
    that has already done it (its checks come between its computation and its write)."""
    rec = _run.recording() if _run.recordings else None
    if rec is not None and rec.depth == 1:
        rec.tail = (fn, args)


def form(fn, *args, writes=()) -> None:
    """Register ``fn(*args)`` as the running step's array form: what it does to the values of its tensors, done
    to the arrays in ``args`` (their storage on the recorded call, ``array_of``; the array it writes first).
    ``writes``: the tensors it writes; one with flags (PSUM's unwritten elements, a legacy mask's written
    ones) that it does not keep leaves the form to recordings whose every step has one (``Compiled``), which
    read no flag. Such steps replay as these calls alone: no checks, flags or liveness, as what they proved
    on the recorded call holds on every replay."""
    rec = _run.recording() if _run.recordings else None
    if rec is not None and rec.depth == 1:
        rec.form = (fn, args, all(t is None or (t.unset is None and t.written is None) for t in writes))


def steps(namespace: dict, names=None, helpers=()) -> None:
    """Make each function ``names`` of a module's ``namespace`` a step (None: every public function it
    defines but its ``helpers``, which check or compute without writing a tile)."""
    if names is None:
        names = [name for name, value in namespace.items() if isinstance(value, types.FunctionType)
                 and value.__module__ == namespace["__name__"] and not name.startswith("_") and name not in helpers]
    for name in names:
        namespace[name] = step(namespace[name])


def start(run) -> Recording:
    """Record ``run`` (the program of a call that may be replayed later)."""
    rec = run.recording = Recording()
    with _lock:
        _run.recordings += 1
    _hold_collector()
    return rec


def stop(run) -> None:
    run.recording = None
    with _lock:
        _run.recordings -= 1
    _release_collector()


_holds = 0  # recordings growing or being read: while any is, the cyclic garbage collector waits
_collector_was_enabled = False


def _hold_collector() -> None:
    """A recording keeps every object it makes, so each young collection moves them on and the older ones
    rescan them: on a 12,800-instruction kernel that was 60% of its recorded call and a fifth of reading the
    recording. Cycles made meanwhile are collected once the last hold ends."""
    global _holds, _collector_was_enabled
    with _lock:
        _holds += 1
        if _holds == 1:
            _collector_was_enabled = gc.isenabled()
            gc.disable()


def _release_collector() -> None:
    global _holds
    with _lock:
        _holds -= 1
        if _holds == 0 and _collector_was_enabled:
            gc.enable()


@contextlib.contextmanager
def _collector_held():
    _hold_collector()
    try:
        yield
    finally:
        _release_collector()


def finish(rec: Recording, run, key, arguments: list, result) -> None:
    """After a recorded call that ended well: keep ``rec`` under ``key``, or remember that the kernel runs in
    full. What its steps use is worked out when a later call wants it (:meth:`Recording.prepare`)."""
    rec.poison_reads = list(run.ledger.poison_reads)  # reported again when a replay's outputs hold the NaN
    if run.ledger.direct:
        rec.unfit("it places tiles at fixed addresses")
    rec.signature = key[:-1]
    if rec.reason is not None:
        with _lock:
            _seen[rec.signature] = False  # its signature runs in full from now on
        return
    rec.result, rec.roots = result, arguments
    global _bytes
    with _lock:
        _bytes += rec.nbytes - getattr(_cache.get(key), "nbytes", 0)
        _cache[key] = rec
        while len(_cache) > CACHE_SIZE or _bytes > CACHE_BYTES:
            _bytes -= _cache.popitem(last=False)[1].nbytes


def lookup(key) -> Recording | None:
    """The recording of ``key`` (its ``reason`` says when the call must run in full), or None."""
    with _lock:
        rec = _cache.get(key)
        if rec is not None:
            _cache.move_to_end(key)
        return rec


def seen(signature) -> bool:
    """Whether calls with this ``signature`` ran ``RECORD_AT - 1`` times before (then this one may be
    recorded or replayed). Before that a call neither looks for a recording nor makes one: a kernel
    called once or twice pays nothing (a recording keeps the call's tiles alive, which costs time and
    memory); nor do calls whose recording could not be replayed."""
    with _lock:
        count = _seen.get(signature, 0)
        if count is False:
            return False
        _seen[signature] = count + 1
        _seen.move_to_end(signature)
        while len(_seen) > 4 * CACHE_SIZE:
            _seen.popitem(last=False)
        return count + 1 >= RECORD_AT


def clear() -> None:
    """Drop every recording and call count (each signature starts again from its first call)."""
    global _bytes
    with _lock:
        _cache.clear()
        _seen.clear()
        _states.clear()
        _bytes = 0


# ------------------------------------------------------------------------------------------------ key

_PLAIN = (type(None), bool, int, float, complex, str, bytes, enum.Enum, np.generic, np.dtype, type, np.ufunc,
          type(np.where), types.ModuleType, types.BuiltinFunctionType, slice, range, type(Ellipsis))
_SCALARS = frozenset((type(None), bool, int, float, str))
_NAMES: dict = {}  # code object -> the global names it and its nested code read


def signature(launch, bound) -> tuple:
    """The kernel, its launch and config, and its arguments' shapes, dtypes and layouts or values
    (``Unkeyable`` when a value cannot be held): a call with a signature seen before may be replayed."""
    arguments = tuple((name, _argument_key(value)) for name, value in bound.arguments.items())
    return (launch.func, type(launch), launch.grid, launch.programs, launch.config, launch.replay_key(), arguments)


def key(signature: tuple, func) -> tuple:
    """What a call must share with the recorded one to replay it: its ``signature`` and the values of the
    Python state ``func`` names (``Unkeyable`` when one cannot be held).

    That state is worked out again only when a name it read is bound to another object since: for the GIoU
    kernel, walking it takes about 0.2 ms, checking the 239 names it read 0.02-0.03 ms."""
    with _lock:
        known = _states.get(func)
    if known is None or not all(get(where, name, _ABSENT) is value for get, where, name, value in known[0]):
        walk = _Walk()
        known = (walk.reads, _state(func, walk))
        with _lock:
            _states[func] = known
            while len(_states) > 4 * CACHE_SIZE:
                _states.popitem(last=False)
    return signature + (known[1],)


_ABSENT = object()  # a name a scope does not hold
_states: collections.OrderedDict = collections.OrderedDict()  # kernel function -> (its walk's reads, its state)


class _Walk:
    """One walk of a kernel's state: the functions and modules entered (``seen``), and every value read, as
    ``(get, where, name, value)`` with ``get(where, name, _ABSENT) is value`` while nothing is rebound. Values
    read are compared by identity: each kind ``_frozen`` holds is immutable, or stands for what is read from it."""

    __slots__ = ("seen", "reads")

    def __init__(self):
        self.seen: set = set()
        self.reads: list = []

    def read(self, get, where, name):
        value = get(where, name, _ABSENT)
        self.reads.append((get, where, name, value))
        return value

    def names(self, scope: dict, names: tuple[str, ...]):
        """``(name, value)`` of each of ``names`` that ``scope`` holds."""
        return ((name, value) for name in names if (value := self.read(dict.get, scope, name)) is not _ABSENT)


def _argument_key(value):
    if isinstance(value, Tensor):
        data = value.data
        return ("tensor", data.shape, data.dtype, data.strides)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_argument_key(v) for v in value))
    return _frozen(value, _Walk(), ())


def _global_names(code) -> tuple[str, ...]:
    names = _NAMES.get(code)
    if names is None:
        found, stack = set(), [code]
        while stack:
            c = stack.pop()
            found.update(c.co_names)
            stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
        names = _NAMES[code] = tuple(sorted(found))
    return names


def _state(func, walk: _Walk) -> tuple:
    """A user function as the values it sees: the globals its code names (and, of a module it names, the
    attributes its code names: ``nisa.nc_matmul`` patched by a test), its closure cells, its defaults."""
    if func in walk.seen:
        return (func,)
    walk.seen.add(func)
    names = _global_names(walk.read(getattr, func, "__code__"))
    values = tuple((name, _frozen(value, walk, names)) for name, value in walk.names(func.__globals__, names))
    cells = []
    for cell in func.__closure__ or ():
        try:
            cells.append(_frozen(walk.read(getattr, cell, "cell_contents"), walk, names))
        except ValueError:  # a cell not filled yet
            raise Unkeyable(f"closure of {func.__qualname__}") from None
    defaults = (_frozen(walk.read(getattr, func, "__defaults__"), walk, names),
                _frozen(tuple((walk.read(getattr, func, "__kwdefaults__") or {}).items()), walk, names))
    return (func, values, tuple(cells), defaults)


def _frozen(value, walk: _Walk, names: tuple[str, ...]):
    """``value`` as a hashable stand-in that is equal only when the kernel would see the same thing."""
    if isinstance(value, types.ModuleType):
        if (value, names) in walk.seen:
            return value
        walk.seen.add((value, names))
        return (value, tuple((name, _attribute(v, walk, names)) for name, v in walk.names(vars(value), names)))
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, types.FunctionType):
        return value if value.__module__.startswith(_SIM) else _state(value, walk)
    if isinstance(value, (tuple, frozenset)):
        return (type(value), tuple(_frozen(v, walk, names) for v in value))
    if type(value).__module__.startswith(_SIM):
        func = walk.read(getattr, value, "func")  # a kernel (a kernel calling a kernel): its function's state
        if isinstance(func, types.FunctionType):
            return (value, _state(func, walk))
        try:
            hash(value)
        except TypeError:
            raise Unkeyable(type(value).__name__) from None
        return value
    raise Unkeyable(type(value).__name__)


def _attribute(value, walk: _Walk, names: tuple[str, ...]):
    """A module attribute the kernel's code may name: as ``_frozen``, or, for a kind that cannot be held,
    the object itself (a name matching by chance must not keep the kernel from replaying; rebinding it,
    as a test's monkeypatch does, still changes the key)."""
    try:
        return _frozen(value, walk, names)
    except (Unkeyable, TypeError):
        return _Same(value)


class _Same:
    """An object compared by identity (its own ``==`` may compare elements), and kept alive."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return type(other) is _Same and other.value is self.value

    def __hash__(self):
        return id(self.value)


_SIM = __name__.rpartition(".core.")[0]  # "nki_ops.sim": the simulator's own objects never change


# ---------------------------------------------------------------------------------------------- views

_walked: list[type] = []  # classes whose instances are walked by their attributes (output specs)
_static: list[type] = []  # immutable classes that hold no tensor (a generation's rules)


def walked(cls: type) -> type:
    """Register ``cls`` (a core class that step arguments hold, e.g. an output spec) as walked by attribute."""
    _walked.append(cls)
    return cls


def static(cls: type) -> type:
    """Register ``cls`` (an immutable core class that holds no tensor) as a plain step argument."""
    _static.append(cls)
    return cls


def array_of(tensor) -> np.ndarray:
    """A tensor's array, filled or not."""
    storage = getattr(tensor, "_storage", None)
    return storage() if storage is not None else tensor.data


def _find_views(rec: Recording, roots: list[np.ndarray], result) -> None:
    """Every HBM tensor the steps and the result use, as (tensor, root index, byte offset) into ``roots``."""
    found: dict[int, Tensor] = {}
    storages = {id(array_of(state[0])) for event in rec.events for state in _allocations(event)}
    for event in rec.events:
        if event[0] is None:
            _walk(rec, event[1][0], found, storages)
        else:
            _walk(rec, event[1], found, storages)
            _walk(rec, event[2], found, storages)
            for state in event[3]:
                _walk(rec, state[0], found, storages)
    _walk(rec, result, found, storages)
    viewed = set()  # storages that a tensor other than their allocation views
    found = {key: tensor for key, tensor in found.items() if tensor is not None}
    for tensor in found.values():
        array = array_of(tensor)
        base = _base(array)
        if base is not array and id(base) in storages:
            viewed.add(id(base))
    rec.swappable = {id(state[0]) for event in rec.events if event[0] is not None for state in event[3]
                     if id(array_of(state[0])) not in viewed and type(state[0].data) is np.ndarray}
    bounds = [byte_bounds(root) for root in roots]
    for index, (low, high) in enumerate(bounds):
        for other, (low2, high2) in enumerate(bounds[:index]):
            if low < high2 and low2 < high:
                rec.unfit(f"arguments or outputs {other} and {index} share memory")
                return
    for tensor in found.values():
        if tensor.buffer.on_chip:
            continue
        array = array_of(tensor)
        start = array.__array_interface__["data"][0]
        low, high = byte_bounds(array)
        root = next((i for i, (lo, hi) in enumerate(bounds) if lo <= low and high <= hi), None)
        if root is None:
            rec.unfit(f"HBM tensor '{tensor.name}' is neither an argument nor the kernel's")
            return
        rec.hbm.append((tensor, root, start - bounds[root][0]))


def _allocations(event):
    return (event[1],) if event[0] is None else event[3]


def _walk(rec: Recording, value, found: dict, storages: set) -> None:
    if type(value) in _SCALARS:  # most arguments: before the isinstance checks
        return
    if isinstance(value, types.FunctionType):
        if value.__closure__ and value.__module__.startswith(_SIM) and ("fn", id(value)) not in found:
            # A tail's computation: the tiles it reads (once: closures may recurse). Arrays it holds are the
            # core's own (a destination's storage), not values read on the recorded call.
            found["fn", id(value)] = None
            _walk(rec, [cell.cell_contents for cell in value.__closure__
                        if cell.cell_contents is not value and not isinstance(cell.cell_contents, np.ndarray)],
                  found, storages)
        return
    if isinstance(value, _PLAIN):
        return
    if isinstance(value, Tensor):
        if id(value) in found:
            return
        found[id(value)] = value
        if getattr(value, "gathers", False) or getattr(value, "runtime_offset", False) or value.offsets:
            rec.unfit(f"'{value.name}' takes addresses from a tile")
        root = getattr(value, "_root", None)
        if root is not None:
            _walk(rec, root, found, storages)
    elif isinstance(value, Access):
        if value.indirect or value.offsets:
            rec.unfit(f"'{value.name}' takes addresses from a tile")
        _walk(rec, value.tensor, found, storages)
    elif isinstance(value, Mask):
        _walk(rec, value.values, found, storages)
    elif isinstance(value, MaskedOperand):
        _walk(rec, (value.operand, value.mask), found, storages)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _walk(rec, item, found, storages)
    elif isinstance(value, dict):
        for item in value.values():
            _walk(rec, item, found, storages)
    elif isinstance(value, np.ndarray):
        if id(_base(value)) in storages:
            rec.unfit("an instruction took a tile's values as a NumPy array")
    elif isinstance(value, tuple(_static)):
        return
    elif isinstance(value, tuple(_walked)):
        _walk(rec, vars(value), found, storages)
    else:
        rec.unfit(f"an instruction argument of type {type(value).__name__}")


# --------------------------------------------------------------------------------------------- replay

class Replaying:
    """A replay's allocations: a step's are handed back in the order it made them."""

    def __init__(self, rec: Recording):
        self.rec = rec
        self.pending = iter(())

    def allocate(self, shape, dtype, fill, data) -> Tensor:
        """The recorded tensor of the running step's next allocation, as new (``memory.new_tensor``)."""
        state = next(self.pending, None)
        tensor = None if state is None else state[0]
        if tensor is None or tensor.shape != tuple(shape) or tensor.dtype != dtype:
            raise RuntimeError(f"replay diverged from the recorded run: an allocation of {list(shape)} {dtype}, "
                               f"recorded {None if tensor is None else (list(tensor.shape), tensor.dtype)}")
        own = id(tensor) in self.rec.swappable and not state[2]
        if own:  # nothing else views the recorded storage: the tensor takes a new array, as first made
            tensor.data = data if data is not None else np.empty(tensor.shape, tensor.dtype)
        _reset(self.rec, state)
        if data is not None and not own:
            np.copyto(array_of(tensor), data)
        return tensor


def _changes(rec: Recording, state) -> bool:
    """Whether the kernel's allocation ``state`` needs resetting before a replay: its call changed its flags,
    or its fill is part of what the kernel reads (an allocation written whole before any use needs none)."""
    tensor, fill, lazy, (written, had_unset) = state
    return (had_unset or tensor.written is not written or tensor.accumulates or tensor.combine is not None
            or (id(tensor) in rec.filled if lazy else fill is not None))


def _reset(rec: Recording, state) -> None:
    """A recorded tensor as its allocation left it: flags, and the fill its first use saw."""
    tensor, fill, lazy, (written, had_unset) = state
    tensor.written, tensor.accumulates, tensor.combine = written, False, None
    if had_unset:
        tensor.unset[...] = True
    if lazy:
        storage = array_of(tensor)
        if tensor._unfilled is not None:
            tensor._unfilled = None
            tensor.data = storage
        if id(tensor) in rec.filled:
            storage[...] = fill
    elif fill is not None:
        tensor.data[...] = fill


def run(rec: Recording, replaying_run, arguments: list[np.ndarray]) -> None:
    """Call the recorded steps again on ``arguments`` (the new call's argument arrays, in recorded order)."""
    global replayed, compiled_replays
    if rec.compiled is not None:
        rec.compiled.run(rec, replaying_run, arguments)
        with _lock:
            replayed += 1
            compiled_replays += 1
        return
    roots = list(arguments)
    roots += [np.empty_like(array_of(tensor)) for tensor in rec.hbm_allocations]
    flat = [root.reshape(-1).view(np.uint8) for root in roots]
    for tensor, index, offset in rec.hbm:
        old = array_of(tensor)
        new = np.ndarray(old.shape, old.dtype, buffer=flat[index], offset=offset, strides=old.strides)
        if not old.flags.writeable:
            new.flags.writeable = False
        _rebase(tensor, new)
    replaying = replaying_run.replaying = Replaying(rec)
    drops = rec.drops
    for index, (fn, args, kwargs, allocations) in enumerate(rec.program):
        replaying.pending = iter(allocations)
        fn(*args, **kwargs)
        if index in drops:
            for tensor in drops[index]:  # its array goes back to the allocator, as the kernel's did
                tensor.data = _PLACEHOLDERS[tensor.dtype, tensor.shape]
    replaying_run.replaying = None
    with _lock:
        replayed += 1


class _Placeholders(dict):
    def __missing__(self, key):
        dtype, shape = key
        self[key] = placeholder = np.broadcast_to(np.zeros((), dtype), shape)
        return placeholder


_PLACEHOLDERS = _Placeholders()  # (dtype, shape) -> a dropped tile's array: a read-only zero-strided view
DROP_BYTES = 64 << 10  # tiles smaller than this keep their array (dropping costs more than it saves)


def _last_uses(rec: Recording) -> dict[int, list]:
    """Per program index, the adopted tiles (``swappable``) no later step uses: a replay drops their arrays
    there, so its memory is the kernel's live tiles, as in a full run, not every tile the call made."""
    last: dict[int, tuple[int, Tensor]] = {}
    if not any(state[0].data.nbytes >= DROP_BYTES for event in rec.events if event[0] is not None
               for state in event[3] if id(state[0]) in rec.swappable):
        return {}
    for index, event in enumerate(rec.program):
        if event[0] is _reset:
            continue
        found: dict = {}
        _walk(rec, (event[1], event[2], [state[0] for state in event[3]]), found, set())
        for key, tensor in found.items():
            if tensor is not None and key in rec.swappable and tensor.data.nbytes >= DROP_BYTES:
                last[key] = (index, tensor)
    result_found: dict = {}
    _walk(rec, rec.result, result_found, set())
    drops: dict[int, list] = {}
    for key, (index, tensor) in last.items():
        if key not in result_found:
            drops.setdefault(index, []).append(tensor)
    return drops


def _rebase(tensor, array: np.ndarray) -> None:
    if hasattr(tensor, "_array"):
        tensor._array = array
        if tensor._unfilled is not None:
            tensor._unfilled = (array,) + tensor._unfilled[1:]
        else:
            tensor.data = array
    else:
        tensor.data = array


# ------------------------------------------------------------------------------------ compiled replay

# A root (an argument, or an HBM tensor the kernel made) is copied in and out whole, instead of its views
# being made again on the new call's array, when it holds at most this many bytes per view the steps use.
COPY_BYTES = 4096


def fill(storage: np.ndarray, value) -> None:
    storage[...] = value


_COPIES: dict = {fill: (0, 1)}  # array forms that copy element by element: fn -> positions of (dst, src)


def copies(fn):
    """Register ``fn(dst, src, ...)`` as an array form that copies ``src`` into ``dst`` element by element
    (casting or not): a replay may then split it into copies of parts of them (``_planes``)."""
    _COPIES[fn] = (0, 1)
    return fn


def _copy_sides(fn, args) -> tuple[int, int] | None:
    """Positions of (dst, src) when the operation ``fn(*args)`` copies element by element, else None."""
    if fn is into:
        return (0, 2) if args[1] is np.asarray else None
    return _COPIES.get(fn)


_DIRECT: dict = {}  # array form fn -> maker(dst, *args) of the one NumPy call ``into(dst, fn, *args)`` comes to


def direct(form):
    """Register the decorated ``maker(dst, *args)``: the ``(fn, args)`` that ``into(dst, form, *args)`` comes
    to for these arrays (their dtypes and shapes are every replay's), or None when it is more than that
    call. A compiled replay calls it instead, without the Python of ``into`` and the form."""
    def register(maker):
        _DIRECT[form] = maker
        return maker
    return register


def binary(out: np.ndarray, fn, lhs: np.ndarray, rhs: np.ndarray) -> None:
    """A direct operation (``direct``): the binary ufunc ``fn`` computed into ``out`` (first, as every
    operation's written array is)."""
    fn(lhs, rhs, out=out)


def _direct(fn, args: list) -> tuple:
    """The operation ``fn(*args)`` as the one NumPy call it comes to, where a form says so (``direct``);
    a copy without a cast is a fill."""
    if fn is into:
        if args[1] is np.asarray:
            if isinstance(args[2], np.ndarray) and args[2].dtype == args[0].dtype:
                return fill, [args[0], args[2]]
        elif args[1] in _DIRECT:
            found = _DIRECT[args[1]](args[0], *args[2:])
            if found is not None:
                return found
    return fn, args


def into(dst: np.ndarray, fn, *args) -> None:
    """A compiled instruction: ``fn(*args)``, the values it writes to ``dst``, rounded into it (as
    ``outputs.write_dst``) unless computed there."""
    values = fn(*args)
    if values is not dst:
        dst[...] = dt.cast(values, dst.dtype)


class Compiled:
    """A recording whose steps have array forms, as those calls (``ops``, each ``(fn, args)``) on the recorded
    tiles' storage, which they keep, and on the HBM roots: the arguments, then the kernel's own HBM tensors. A
    root is either copied in (and out, if written) of an array of the recording's own (``own``), or its views
    in the operations are made again on each call's array (``rebinds``). When some steps have no array form,
    or one writes a tensor with flags that other steps read (PSUM's unwritten elements), ``steps`` holds the
    program with the other steps as they were recorded and the recorded HBM tensors follow the roots.

    Where every step has its form, ``of`` rewrites the operations without changing a value: fills nothing
    reads are dropped (``_read_fills``), strided planes of a tile get arrays of their own (``_planes``), tiles
    whose uses do not overlap share storage (``_shared_storage``); in both cases an operation that is one
    NumPy call becomes that call (``_direct``)."""

    def __init__(self, ops, steps, own, written, rebinds, templates, results):
        self.ops, self.steps, self.own, self.written, self.rebinds = ops, steps, own, written, rebinds
        self.templates = templates  # root index -> the recorded array of a kernel-made HBM tensor
        self.results = results  # (tensor, root index, byte offset): HBM tensors the kernel returns (or all)

    @classmethod
    def of(cls, rec: Recording, roots: list[np.ndarray]) -> Compiled | None:
        """``rec`` compiled, or None when none of its steps has an array form it may use."""
        forms = [rec.forms.get(id(event)) for event in rec.program if event[0] is not _reset]
        if not all(root.flags.c_contiguous for root in roots) or not any(f is not None and f[2] for f in forms):
            return None
        ops, steps = [], None
        if all(f is not None for f in forms):
            for event in rec.program:
                op = _reset_op(*event[1]) if event[0] is _reset else rec.forms[id(event)]
                if op is not None:
                    ops.append((op[0], list(op[1])))
        else:  # the steps with a form it may use as array operations, the others as recorded
            steps = []
            for event in rec.program:
                op = rec.forms.get(id(event))
                if op is not None and op[2]:
                    ops.append(_direct(op[0], list(op[1])))
                    # The tensors it made, as made, for the recorded steps (their flags), then its values.
                    steps += [(_reset, (rec, state), {}, ()) for state in event[3] if _changes(rec, state)]
                    steps.append((*ops[-1], {}, ()))
                else:
                    steps.append(event)
            # The arrays the operations hold stay their tensors' own: a recorded step's new tile takes a new
            # array on each replay only where no operation holds its storage.
            made = _Storages(_base(array_of(state[0])) for event in rec.program if event[0] is not _reset
                             for state in event[3] if id(state[0]) in rec.swappable)
            held = {id(made.owner(array)) for _, args in ops for array in _arrays_in(args)}
            rec.swappable = {id(state[0]) for event in rec.program if event[0] is not _reset for state in event[3]
                             if id(state[0]) in rec.swappable and id(_base(array_of(state[0]))) not in held}
        arguments = len(roots) - len(rec.hbm_allocations)
        bounds = [byte_bounds(root) for root in roots]
        uses: dict[int, list] = collections.defaultdict(list)  # root -> (op args, position, byte offset)

        tiles = None if steps is not None else _Storages(_base(array) for _, args in ops for array in _arrays_in(args))
        by_base: dict[int, tuple] = {}  # id of an array's base -> (the base, kept alive, its root, decided)

        def within(low, high):
            return next((i for i, (lo, hi) in enumerate(bounds) if lo <= low and high <= hi), None)

        def root_of(array):
            base = _base(array)
            entry = by_base.get(id(base))
            if entry is None:  # a view lies in its base: the base's root is the view's, if the base has one
                low, high = byte_bounds(base) if tiles is None else tiles.bounds_of(base)
                root = within(low, high)
                decided = root is not None or not any(low < hi and lo < high for lo, hi in bounds)
                entry = by_base[id(base)] = (base, root, decided)
            return entry[1] if entry[2] else within(*byte_bounds(array))

        if steps is None:
            ops = _planes(_read_fills(ops, tiles), tiles, root_of)
            ops = _batched([_direct(fn, args) for fn, args in _shared_storage(ops, tiles, root_of)])
        for _, args in ops:
            for position, value in enumerate(args):
                if isinstance(value, np.ndarray):
                    root = root_of(value)
                    if root is not None:
                        uses[root].append((args, position, value.__array_interface__["data"][0] - bounds[root][0]))
                elif isinstance(value, (tuple, list)) and any(root_of(a) is not None for a in _arrays_in(value)):
                    return None  # an HBM view inside a structure: it would keep the recorded call's array
        own, rebinds = {}, []
        for root, used in uses.items():
            if roots[root].nbytes <= len(used) * COPY_BYTES:
                own[root] = mine = np.empty_like(roots[root])
                flat = mine.reshape(-1).view(np.uint8)
                for args, position, offset in used:
                    args[position] = _view_at(flat, args[position], offset)
            else:
                rebinds += [(args, position, root, offset, args[position]) for args, position, offset in used]
        # Arguments copied in go back when an operation writes them, or a recorded step might.
        written = [root for root in own if root < arguments and roots[root].flags.writeable
                   and (steps is not None or any(position == 0 for _, position, _ in uses[root]))]
        templates = {i + arguments: roots[i + arguments] for i in range(len(rec.hbm_allocations))}
        if steps is None:
            found: dict = {}
            _walk(rec, rec.result, found, set())
            results = [entry for entry in rec.hbm if id(entry[0]) in found]
        else:
            results = rec.hbm
        return cls(ops, steps, own, written, rebinds, templates, results)

    def run(self, rec: Recording, replaying_run, arguments: list[np.ndarray]) -> None:
        """The operations on a new call's ``arguments``; the returned HBM tensors then view the call's arrays."""
        own = self.own
        roots = list(arguments) + [None] * len(self.templates)
        for root, template in self.templates.items():
            if root not in own:
                roots[root] = np.empty_like(template)
        for root, mine in own.items():
            if root < len(arguments):
                np.copyto(mine, arguments[root])
        flat = [None if root is None else root.reshape(-1).view(np.uint8) for root in roots]
        for args, position, root, offset, template in self.rebinds:
            args[position] = _view_at(flat[root], template, offset)
        if self.steps is None:
            for fn, args in self.ops:
                fn(*args)
        else:
            for tensor, root, offset in self.results:  # the recorded steps' tensors, on what the operations use
                place = own[root].reshape(-1).view(np.uint8) if root in own else flat[root]
                _rebase(tensor, _view_at(place, array_of(tensor), offset))
            replaying = replaying_run.replaying = Replaying(rec)
            for fn, args, kwargs, allocations in self.steps:
                replaying.pending = iter(allocations)
                fn(*args, **kwargs)
            replaying_run.replaying = None
        for root in self.written:
            np.copyto(arguments[root], own[root])
        for root in self.templates:
            if root in own:
                roots[root] = own[root].copy()  # every call returns new outputs
                flat[root] = roots[root].reshape(-1).view(np.uint8)
        for tensor, root, offset in self.results:
            _rebase(tensor, _view_at(flat[root], array_of(tensor), offset))


def _writes_all(dst: np.ndarray, storage: np.ndarray) -> bool:
    """Whether an operation that writes all of ``dst`` (its first argument) writes every byte of ``storage``,
    the contiguous array ``dst`` lies in: ``dst`` is contiguous and as large (a view whose elements share
    memory, a zero step, may be as large and cover less)."""
    return storage.flags.c_contiguous and dst.flags.c_contiguous and dst.nbytes == storage.nbytes


# Operations whose values do not depend on how many elements one NumPy call computes (correctly rounded IEEE
# arithmetic, copies without a cast): the iterations of a loop of them may run as one call each.
_BATCHABLE = frozenset((np.add, np.subtract, np.multiply, np.divide))
MAX_PERIOD = 64  # operations per loop iteration looked for
BATCH_BYTES = 16 << 20  # the copies a batched loop makes of the tiles its iterations reuse


def _batchable(fn, args) -> bool:
    if fn is fill:
        return not isinstance(args[1], np.ndarray) or args[1].dtype == args[0].dtype
    return fn is binary and args[1] in _BATCHABLE


def _batched(ops: list) -> list:
    """``ops`` with each run of a loop's iterations as one operation per operation of an iteration: a run of
    batchable operations that repeats with period ``p`` (the same functions and values, arrays of the same
    layout whose addresses step by a constant from one iteration to the next) becomes ``p`` operations on
    arrays with a leading axis of iterations (``_batch``), where that computes the same values."""
    kinds: dict = {}

    def kind(fn, args):
        if not _batchable(fn, args):
            return None
        parts = [fn]
        for a in args:
            if isinstance(a, np.ndarray):  # its storage too: iterations on other storages never repeat
                parts.append((a.shape, a.dtype, a.strides, id(_base(a))))
            else:
                try:
                    parts.append((type(a), a))
                    hash(parts[-1])
                except TypeError:
                    return None
        return kinds.setdefault(tuple(parts), len(kinds))

    keys = [kind(fn, args) for fn, args in ops]
    out, i, n = [], 0, len(ops)
    while i < n:
        done = 0  # operations taken from ``ops`` at ``i``
        key = keys[i]
        if key is not None:
            for p in range(1, min(MAX_PERIOD, (n - i) // 2) + 1):
                if keys[i + p] != key:
                    continue
                period = keys[i:i + p]
                if None in period or keys[i + p:i + 2 * p] != period:
                    continue
                entries = _steps(ops[i:i + 2 * p], p)
                if entries is None:  # the first two iterations use other storages: try a longer period
                    continue
                count = 2
                while keys[i + count * p:i + (count + 1) * p] == period:
                    count += 1
                made, count = _batch(ops[i:i + count * p], p, count, entries)
                out += made if made else ops[i:i + count * p]  # iterations that may not run as one stay apart
                done = count * p
                break
        if not done:
            out.append(ops[i])
            done = 1
        i += done
    return out


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _steps(block: list, p: int) -> list | None:
    """Each argument array of the first of two iterations of ``p`` operations as ``(operation, position,
    array, step in bytes to the second iteration's, written)``; None when the two lie in other storages."""
    entries = []
    for k in range(p):
        for j, a in enumerate(block[k][1]):
            if isinstance(a, np.ndarray):
                base, b = _base(a), block[p + k][1][j]
                if not base.flags.c_contiguous or _base(b) is not base:
                    return None
                entries.append((k, j, a, _address(b) - _address(a), j == 0))
    return entries


def _batch(block: list, p: int, count: int, entries: list) -> tuple[list, int]:
    """The first ``count`` or fewer iterations of ``p`` operations (``entries``: their arrays, ``_steps``) as
    ``(p operations over all of them, how many)``, or ``([], how many)`` when running them so could change a
    value.

    Each argument array is, across the iterations, either one array (a tile every iteration reuses, or a
    value they all read) or views stepping through one storage (an HBM row per iteration). A reused array
    that the iterations write gets one copy per iteration, stacked, if each iteration writes it (through the
    same view) before reading it; its last iteration's values are copied back after. Views that iterations
    write must not overlap across iterations, nor any other array but the same view's."""
    for t in range(2, count):  # the iterations that keep to the first two's storages and steps
        if not all(_base(b) is _base(a) and _address(b) == _address(a) + t * step
                   for (k, j, a, step, _), b in zip(entries, (block[t * p + k][1][j] for k, j, *_ in entries))):
            count = t
            break
    spans = []  # each entry's bytes over all iterations, and in one iteration
    for _, _, a, step, _ in entries:
        low, high = byte_bounds(a) if a.size else (0, 0)
        spans.append((low + min(0, step * (count - 1)), high + max(0, step * (count - 1)), low, high))
    stacked: dict[tuple, np.ndarray] = {}  # bytes of a reused array the iterations write -> its copies
    for w, (k, _, a, step, written) in enumerate(entries):
        if not written or not a.size:
            continue
        low, high, one_low, one_high = spans[w]
        if step and abs(step) < one_high - one_low:
            return [], count  # iterations write overlapping memory
        group = [w]
        for x, (_, _, b, other_step, _) in enumerate(entries):
            if x == w or not b.size or spans[x][1] <= low or high <= spans[x][0]:
                continue
            if step and other_step == step and not _meets(spans[x][2:], (one_low, one_high), step, count):
                continue  # interleaved: another iteration's bytes never meet these
            if other_step != step or spans[x][2:] != (one_low, one_high) or b.shape != a.shape \
                    or b.strides != a.strides or b.dtype != a.dtype:
                return [], count  # another array in the memory it writes
            group.append(x)
        if not step and (one_low, one_high) not in stacked:
            first = min(entries[x][0] for x in group)
            touching = [x for x in group if entries[x][0] == first]
            if len(touching) != 1 or not entries[touching[0]][4]:
                return [], count  # read before an iteration writes it: a value carried from the last iteration
            stacked[one_low, one_high] = np.empty((count, *a.shape), a.dtype)
    if sum(s.nbytes for s in stacked.values()) > BATCH_BYTES:
        return [], count
    batched = [[fn, list(args)] for fn, args in block[:p]]
    back = {}  # bytes of a reused array -> the array, to hold its last iteration's values again
    for e, (k, j, a, step, _) in enumerate(entries):
        copies = stacked.get(spans[e][2:]) if not step else None
        if copies is not None:
            batched[k][1][j] = copies
            back[spans[e][2:]] = a
        elif step:
            base = _base(a)
            batched[k][1][j] = np.ndarray((count, *a.shape), a.dtype, buffer=base, offset=_address(a) - _address(base),
                                          strides=(step, *a.strides))
    return [(fn, args) for fn, args in batched] + [(fill, [a, stacked[where][-1]]) for where, a in back.items()], count


def _meets(x: tuple[int, int], w: tuple[int, int], step: int, count: int) -> bool:
    """Whether bytes ``x`` of one iteration meet bytes ``w`` of the same or another of ``count`` iterations, both
    moving by ``step`` bytes an iteration: ``x[0] + d * step < w[1]`` and ``w[0] < x[1] + d * step`` for some
    iteration distance ``d``."""
    if step < 0:
        x, w, step = (-x[1], -x[0]), (-w[1], -w[0]), -step
    lowest = (w[0] - x[1]) // step + 1  # the d from which x's end passes w's start
    highest = -((x[0] - w[1]) // step) - 1  # the last d at which x's start is before w's end
    return max(lowest, 1 - count) <= min(highest, count - 1)


def _read_fills(ops: list, storages: _Storages) -> list:
    """``ops`` without the fills that nothing reads: the next operation on the filled array writes all of it
    and reads none of it (a PSUM tile the recorded call viewed, which a matmul then overwrites). As in
    ``_shared_storage``, an operation writes all of its first argument."""
    unread: dict[int, int] = {}  # id of a storage -> the fill of all of it that nothing has read yet
    dead = set()
    for index, (fn, args) in enumerate(ops):
        owners = [id(storages.owner(array)) for array in _arrays_in(args)]
        dst = args[0] if isinstance(args[0], np.ndarray) else None
        whole = dst is not None and _writes_all(dst, storages.owner(dst))
        if whole and owners.count(owners[0]) == 1 and owners[0] in unread:
            dead.add(unread[owners[0]])
        for owner in owners:
            unread.pop(owner, None)
        if fn is fill and whole and owners.count(owners[0]) == 1:
            unread[owners[0]] = index
    return [op for index, op in enumerate(ops) if index not in dead]


def _planes(ops: list, tiles: _Storages, root_of) -> list:
    """``ops`` with each tile that they read or write through strided views (*planes*: a box tile's x1
    column, ``tile[:, 0::4]``) given one contiguous array per plane: NumPy runs an element-wise operation
    on a strided view several times slower than on contiguous arrays. A tile qualifies when every array of
    it the operations take is one of its planes, which do not overlap one another, or the whole tile in an
    element-wise copy (a DMA, a load, a store, a fill) from or to an HBM root or a constant; that copy
    becomes one copy per plane, between the plane's array and the view of its elements on the other side.
    The operations compute the same values on the same elements: only where they lie changes. The planes'
    arrays join ``tiles``, each a storage of its own."""
    if all(array.flags.c_contiguous for _, args in ops for array in _arrays_in(args)):
        return ops  # no strided view: no plane
    planes: dict[int, dict] = collections.defaultdict(dict)  # storage id -> plane key -> a view of it
    partners: dict[int, list] = collections.defaultdict(list)  # storage id -> the other sides of its copies
    read_whole: set[int] = set()
    unfit: set[int] = set()
    for fn, args in ops:
        sides = _copy_sides(fn, args)
        whole, parts = set(), set()
        for position, value in enumerate(args):
            for array in _arrays_in(value):
                holder = tiles.owner(array)
                key = id(holder)
                if (root_of(holder) is not None or key in tiles.partial or not holder.flags.c_contiguous
                        or array.dtype != holder.dtype):
                    unfit.add(key)
                elif array.shape == holder.shape and array.flags.c_contiguous:
                    whole.add(key)
                    partner = args[sum(sides) - position] if sides and position in sides and value is array else None
                    if partner is None or (isinstance(partner, np.ndarray) and partner.ndim
                                           and partner.shape != holder.shape):
                        unfit.add(key)  # not an element-wise copy, or one that broadcasts
                    else:
                        partners[key].append(partner)
                        if position == sides[1]:
                            read_whole.add(key)
                else:
                    parts.add(key)
                    offset = array.__array_interface__["data"][0] - holder.__array_interface__["data"][0]
                    planes[key].setdefault((offset, array.shape, array.strides), array)
        unfit |= whole & parts
    chosen = {key for key, found in planes.items() if key not in unfit
              and any(not plane.flags.c_contiguous for plane in found.values())}
    # A copy's other side may not be a tile that is split too (its planes would be cut across).
    for key in list(chosen):
        if any(isinstance(p, np.ndarray) and root_of(p) is None and id(tiles.owner(p)) in chosen
               for p in partners[key]):
            chosen.discard(key)
    maps: dict[int, list] = {}  # storage id -> [(plane array, start index, index steps)]
    for key in chosen:
        found = _plane_maps(tiles.owner(next(iter(planes[key].values()))), planes[key], key in read_whole)
        if found is not None:
            maps[key] = found
    if not maps:
        return ops
    mine: dict[int, np.ndarray] = {}  # id of a recorded plane view -> a view of its plane's array
    arrays: dict[tuple, np.ndarray] = {}  # (storage id, plane key) -> the plane's contiguous array

    def place(value):
        if isinstance(value, np.ndarray):
            key = id(tiles.owner(value))
            if key not in maps or value.shape == tiles.owner(value).shape and value.flags.c_contiguous:
                return value
            if id(value) not in mine:
                offset = value.__array_interface__["data"][0] - tiles.owner(value).__array_interface__["data"][0]
                plane = arrays.get((key, (offset, value.shape, value.strides)))
                if plane is None:
                    plane = arrays[key, (offset, value.shape, value.strides)] = np.empty(value.shape, value.dtype)
                    tiles.add(plane)
                mine[id(value)] = view = plane.view()
                view.flags.writeable = value.flags.writeable
            return mine[id(value)]
        if isinstance(value, (tuple, list)):
            return type(value)(place(item) for item in value)
        return value

    out = []
    for fn, args in ops:
        sides = _copy_sides(fn, args)
        split = next((position for position in sides or () if isinstance(args[position], np.ndarray)
                      and id(tiles.owner(args[position])) in maps and args[position].shape
                      == tiles.owner(args[position]).shape and args[position].flags.c_contiguous), None)
        if split is None:
            out.append((fn, [place(value) for value in args]))
            continue
        partner = args[sum(sides) - split]
        for plane, start, steps in maps[id(tiles.owner(args[split]))]:
            parts = list(args)
            parts[split] = place(plane)
            if isinstance(partner, np.ndarray) and partner.ndim:
                parts[sum(sides) - split] = _strided(partner, plane.shape, start, steps)
            out.append((fn, parts))
    return out


def _plane_maps(holder: np.ndarray, planes: dict, covered: bool) -> list | None:
    """Each plane of ``holder`` with the multi-index of its first element in ``holder`` and the multi-index
    step of each of its axes, or None when two planes overlap (or a plane itself), a plane is not affine in
    ``holder``'s indices, or (``covered``: the whole tile is read) some element lies in no plane.

    A plane's steps are the multi-index differences from its first element to the next along each axis; the
    plane is affine when every element's multi-index stays inside ``holder`` along that line, which is checked
    at the extremes (each index is linear in the plane's): the elements' flat indices then are the plane's
    own, one for one. Overlaps are counted on a mask of ``holder``'s elements."""
    itemsize, extents = holder.itemsize, holder.shape
    marked = np.zeros(holder.size, np.bool_)
    count = 0
    found = []
    for (offset, shape, strides), plane in planes.items():
        if not plane.size or offset % itemsize or any(stride % itemsize for stride in strides):
            return None
        first = offset // itemsize
        elements = [stride // itemsize for stride in strides]
        start = [int(i) for i in np.unravel_index(first, extents)]
        steps = []
        for n, step in zip(shape, elements):
            if n == 1:
                steps.append([0] * len(extents))
            elif not 0 <= first + step < holder.size:
                return None
            else:
                steps.append([int(i) - s for i, s in zip(np.unravel_index(first + step, extents), start)])
        for axis, (origin, extent) in enumerate(zip(start, extents)):
            low = origin + sum(min(0, (n - 1) * step[axis]) for n, step in zip(shape, steps))
            high = origin + sum(max(0, (n - 1) * step[axis]) for n, step in zip(shape, steps))
            if low < 0 or high >= extent:
                return None
        np.lib.stride_tricks.as_strided(marked[first:], shape, elements)[...] = True
        now = np.count_nonzero(marked)
        if now - count != plane.size:  # an element marked before, by another plane or this one
            return None
        count = now
        found.append((plane, start, steps))
    if covered and count < holder.size:
        return None
    return found


def _strided(array: np.ndarray, shape, start, steps) -> np.ndarray:
    """The view of ``array`` whose element ``i`` is ``array[start + sum(i[d] * steps[d])]``."""
    corner = array[tuple(slice(first, first + 1) for first in start)]
    strides = [sum(step * stride for step, stride in zip(axis, array.strides)) for axis in steps]
    return np.lib.stride_tricks.as_strided(corner, shape, strides, writeable=array.flags.writeable)


def _shared_storage(ops: list, tiles: _Storages, root_of) -> list:
    """``ops`` with tiles whose uses do not overlap on one array: each tile the recording made has storage of
    its own, and a replay then walks through all of them where the kernel's run reused the memory of the few
    live at a time (NumPy's allocator), which the caches hold. A tile shares only if its first use writes all
    of it (a fill, an instruction's result) and reads nothing of it, and it is no HBM root."""
    first: dict[int, int] = {}  # id of a tile's storage -> the operation that writes all of it first
    last: dict[int, int] = {}
    sizes: dict[int, int] = {}
    owner_of: dict[int, np.ndarray] = {}  # id of an array of ``ops`` -> its storage's holder
    for index, (_, args) in enumerate(ops):
        arrays = _arrays_in(args)
        owners = [tiles.owner(a) for a in arrays]
        owner_of.update(zip(map(id, arrays), owners))
        dst = args[0]
        if isinstance(dst, np.ndarray):  # dst itself may come again: the buffer the values are computed in
            base = owners[0]
            key = id(base)
            if (key not in last and key not in tiles.partial and _writes_all(dst, base)
                    and root_of(base) is None and not any(owner is base and a is not dst
                                                          for a, owner in zip(arrays, owners))):
                first[key], sizes[key] = index, base.nbytes
        for owner in owners:  # a storage used before its first whole write keeps its own
            last[id(owner)] = index
    # bytes -> storages whose tiles' uses ended, first ended first: a loop's next iteration then takes the storages
    # of its last one in the order it made its tiles, each tile the storage of the one it follows (``_batched``)
    free: dict[int, collections.deque] = collections.defaultdict(collections.deque)
    ending: list = []  # heap of (last use, first use, key, size) of the storages handed out
    storage: dict[int, np.ndarray] = {}
    for key, index in sorted(first.items(), key=lambda item: item[1]):
        while ending and ending[0][0] < index:
            _, _, ended, size = heapq.heappop(ending)
            free[size].append(storage[ended])
        size = sizes[key]
        storage[key] = free[size].popleft() if free[size] else np.empty(size, np.uint8)
        heapq.heappush(ending, (last[key], index, key, size))
    moved: dict[int, np.ndarray] = {}  # id of a recorded array -> its view on the shared storage (one per array)
    starts: dict[int, int] = {}  # id of a shared storage -> the address of its first byte

    def place(value):
        if isinstance(value, np.ndarray):
            base = owner_of[id(value)]
            flat = storage.get(id(base))
            if flat is None:
                return value
            view = moved.get(id(value))
            if view is None:
                start = starts.get(id(base))
                if start is None:
                    start = starts[id(base)] = base.__array_interface__["data"][0]
                view = moved[id(value)] = _view_at(flat, value, value.__array_interface__["data"][0] - start)
            return view
        if isinstance(value, (tuple, list)):
            return type(value)(place(item) for item in value)
        return value

    return [(fn, [place(value) for value in args]) for fn, args in ops]


class _Storages:
    """Which memory an array lies in, among ``arrays`` (storages): arrays whose memory overlaps are one storage,
    held by the one of them that spans it all (a view made by ``as_strided`` names no ``base``, and views of
    one tile may interleave). A storage none of them spans is ``partial``."""

    def __init__(self, arrays):
        unique = self.arrays = {id(a): a for a in arrays}  # kept alive: their ids key ``bounds``
        self.bounds = {key: byte_bounds(a) for key, a in unique.items()}  # NumPy's takes 1.3 µs an array
        groups: list = []  # [low, high, members], by address
        for (low, high), array in sorted(((self.bounds[key], a) for key, a in unique.items()),
                                         key=lambda span: span[0]):
            if groups and low < groups[-1][1]:
                groups[-1][1] = max(groups[-1][1], high)
                groups[-1][2].append(array)
            else:
                groups.append([low, high, [array]])
        self.lows = [low for low, _, _ in groups]
        self.highs = [high for _, high, _ in groups]
        self.holders = []
        self.partial: set[int] = set()  # ids of the holders of storages no array spans
        self.holder_of: dict[int, np.ndarray] = {}  # id of one of ``arrays`` -> its storage's holder
        for low, high, members in groups:
            holder = next((a for a in members if self.bounds[id(a)] == (low, high)), None)
            if holder is None:
                holder = members[0]
                self.partial.add(id(holder))
            self.holders.append(holder)
            self.holder_of.update((id(a), holder) for a in members)

    def add(self, array: np.ndarray) -> None:
        """A new array, which overlaps none of them: a storage of its own."""
        self.arrays[id(array)] = self.holder_of[id(array)] = array

    def bounds_of(self, array: np.ndarray) -> tuple[int, int]:
        bounds = self.bounds.get(id(array))
        return byte_bounds(array) if bounds is None else bounds

    def owner(self, array: np.ndarray) -> np.ndarray:
        """The array holding the storage ``array`` lies in (``array``'s own base if none of them)."""
        if array.size:  # a view lies in its base's memory: no bounds to take when the base is one of them
            holder = self.holder_of.get(id(_base(array)))
            if holder is not None:
                return holder
        low = self.bounds_of(array)[0]
        index = bisect.bisect_right(self.lows, low) - 1
        return self.holders[index] if index >= 0 and low < self.highs[index] else _base(array)


def _base(array: np.ndarray) -> np.ndarray:
    """The array that owns ``array``'s memory."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _arrays_in(value) -> list[np.ndarray]:
    """The arrays in ``value``, an array or nested tuples and lists of them and other values."""
    if isinstance(value, np.ndarray):
        return [value]
    found = []
    if isinstance(value, (tuple, list)):
        for item in value:
            if isinstance(item, np.ndarray):
                found.append(item)
            elif isinstance(item, (tuple, list)):
                found += _arrays_in(item)
    return found


def _view_at(flat: np.ndarray, like: np.ndarray, offset: int) -> np.ndarray:
    """An array like ``like`` (shape, dtype, strides, writability) at byte ``offset`` of ``flat``."""
    view = np.ndarray(like.shape, like.dtype, buffer=flat, offset=offset, strides=like.strides)
    if not like.flags.writeable:
        view.flags.writeable = False
    return view


def _reset_op(rec: Recording, state):
    """The value part of ``_reset``: the fill the kernel reads, if any (flags matter to no compiled step)."""
    tensor, value, lazy, _ = state
    if lazy:
        return (fill, (array_of(tensor), value)) if id(tensor) in rec.filled else None
    return None if value is None else (fill, (tensor.data, value))
