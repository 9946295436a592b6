"""Buffers, tensors and their storage: allocation, poison, rounding on store, reads and writes.

The values themselves (buffers, tensors, accesses) are in ``tensors``; subscripts in ``indexing``.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import numpy as np

from . import dtypes as dt
from . import liveness, replay, trace
from . import run as _run
from .errors import (
    CapacityError,
    KernelUsageError,
    MemorySpaceError,
    SimulatorWarning,
    TileLimitError,
    UnsupportedError,
    user_site,
)
from .poison import TAGS, holds_sentinel, on_chip_fill
from .run import active_config, current_run, violation
from .tensors import (  # noqa: F401  (Buffer, ParDim, the buffers: memory's names for them too)
    Access,
    Buffer,
    MaskedOperand,
    ParDim,
    Tensor,
    mask_for,
    private_hbm,
    psum,
    sbuf,
    shared_hbm,
)

PMAX = 128
PSUM_BANK_BYTES = 2048


class TileSize:
    """``nl.tile_size``: the hardware's tile limits, SBUF sizes those of the target running."""

    pmax = PMAX
    psum_fmax = 512
    psum_bank_fmax = 512
    psum_bank_fmax_bytes = PSUM_BANK_BYTES
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    psum_min_align = 4
    sbuf_min_align = 1

    @property
    def total_available_sbuf_size(self) -> int:
        """Usable SBUF bytes per partition (the name says total; the API pages say per partition)."""
        return active_config().sbuf_usable


class Rules:
    """One API generation's allocation rules, where their pages differ: what new memory holds (the
    config's poison, or documented sentinels: ``sentinels`` = (float, int)), the largest PSUM tensor,
    which spaces one tensor is checked against the budget of, and how the messages say it
    (``messages``: templates of the ``rank``, ``partitions``, ``psum`` and ``capacity`` errors). A
    ``lazy`` generation's tensors are views (``views.View``): filled on first use, and an allocation
    without a fill is written by the caller's instruction, not here."""

    __slots__ = ("sentinels", "psum_bytes", "budgeted", "messages", "lazy")

    def __init__(self, psum_bytes: int, budgeted: tuple[str, ...], messages: dict[str, str], sentinels=None,
                 lazy: bool = False):
        self.psum_bytes, self.budgeted, self.messages = psum_bytes, budgeted, messages
        self.sentinels, self.lazy = sentinels, lazy

    def fill_value(self, config, dtype: np.dtype):
        """What uninitialised memory of ``dtype`` holds under ``config``."""
        if self.sentinels is None or config.uninitialized == "zeros":
            return config.fill_value(dtype)
        return self.sentinels[0] if dt.is_float(dtype) else self.sentinels[1]


# The legacy API's (``neuronxcc.nki``): one PSUM bank per tile, every space's budget, the config's poison.
TILE_RULES = Rules(PSUM_BANK_BYTES, ("sbuf", "psum"), {
    "rank": "{api}: Insufficient rank for on-chip tensor '{name}' of shape {shape}: SBUF/PSUM tiles need a "
            "partition and a free dimension, e.g. (128, 1)",
    "partitions": "{api}: Size of partition dimension {partitions} exceeds architecture limitation of {pmax} "
                  "(tensor '{name}', shape {shape})",
    "psum": "{api}: PSUM tile '{name}' of shape {shape} {dtype} needs {nbytes} bytes per partition, above one PSUM "
            "bank ({limit} bytes = 512 fp32)",
    "capacity": "{api}: tile '{name}' of shape {shape} {dtype} needs {nbytes} bytes per partition, above the "
                "{target} {space} budget of {budget}",
})
Tensor.rules = TILE_RULES
Tensor.supported = dt.SUPPORTED


def new_tensor(shape, dtype, buffer: Buffer, name: str = "", fill="poison", site: str | None = None,
               api: str = "nl.ndarray", min_rank: int = 2, account: bool = True,
               data: np.ndarray | None = None, kind=None, unset: bool = False) -> Tensor:
    """Allocate a tensor of class ``kind`` (default: the run's ``tensor_type``), under its ``rules`` and
    ``supported`` dtypes: checks the tile rules and on-chip capacity, fills it (poison, 0 or a value),
    or adopts ``data``, an array of that shape and dtype that nothing else references.

    ``buffer`` may be a :class:`Placement` (a front end's direct allocator): its tiles then sit at
    the addresses it gives. Without ``fill`` (None) or with ``data``, the caller is an instruction
    writing its result: the tensor is written now (by the caller, for ``lazy`` rules). ``unset``: a PSUM
    tensor's elements are flagged as written by no instruction (``Tensor.unset``; ``lazy`` PSUM always is)."""
    run = current_run(api)
    kind = kind or run.tensor_type or Tensor
    rules = kind.rules
    placement = None
    if type(buffer) is not Buffer:
        placement, buffer = buffer, buffer.base
    shape, pdim = _shape_of(shape, api)
    dtype = dt.as_dtype(dtype, kind.supported)
    poisoned = fill == "poison"
    if poisoned:
        fill = _poison(run, dtype, buffer.on_chip, rules)
    if run.replaying is not None:  # a replayed instruction: the tensor it made the first time
        return run.replaying.allocate(shape, dtype, fill, data)
    site = site or user_site()
    name = name or default_name(api, site)
    if buffer is shared_hbm:
        tensor = _shared(run, kind, shape, dtype, fill, name, site)
        if tensor is not None:
            return tensor
    tile_bytes = (check_tile_shape(shape, pdim, dtype, buffer, name, api, site, min_rank, rules, run)
                  if buffer.on_chip else 0)
    if rules.lazy:
        tensor = kind(np.empty(shape, dtype), buffer, name, site)
        if fill is not None:  # filled on first use (``views.View``)
            tensor.defer_fill(fill if poisoned else np.full((), fill, dtype), poisoned)
        if buffer.on_chip:
            tensor.alloc = (placement.allocate(run, tensor, tile_bytes) if placement is not None
                            else liveness.Allocation(run, buffer.space, tile_bytes, name, site))
            if buffer is psum:
                tensor.unset = np.ones(shape, bool)
        if run.recording is not None:
            run.recording.allocated(tensor, fill, True)
        return tensor
    written = data is not None or fill is None
    if data is not None and run.recording is not None:
        _run.outside("values written")
    if data is None:
        if fill is None:
            data = np.empty(shape, dtype)
        elif run.config.timing_only:
            data = np.zeros(shape, dtype)  # values are not computed: no pass over the memory to fill it
        else:
            data = np.full(shape, fill, dtype)
    tensor = kind(data, buffer, name, site, pdim)
    if unset and buffer is psum:
        tensor.unset = np.ones(shape, bool)
    if buffer.on_chip and account:
        tensor.alloc = (placement.allocate(run, tensor, tile_bytes) if placement is not None
                        else auto_allocation(run, tensor, tile_bytes))
        if written:
            tensor.alloc.write()
        elif poisoned and not run.config.timing_only:
            mark_poison(tensor.alloc, data)
    if trace.listening and written:
        trace.write(tensor, api, fresh=True)
    if run.recording is not None:
        run.recording.allocated(tensor, None if written else fill, False)
    return tensor


def _shared(run, kind, shape, dtype, fill, name: str, site: str):
    """The ``shared_hbm`` tensor that every program of the launch sees for this allocation site and
    occurrence, or None when there is no other program. A legacy SPMD grid's instances run one after
    another on one run (no ``exchange``) and share its outputs; an LNC2 launch's programs run at
    once, one run each, and meet in ``run.shared`` under their exchange's lock."""
    exchange = getattr(run, "exchange", None)
    if exchange is not None and exchange.programs < 2:
        return None
    with exchange.lock if exchange is not None else contextlib.nullcontext():
        return run.shared_output(site, lambda: _made(run, kind(np.full(shape, fill, dtype) if fill is not None else
                                                               np.empty(shape, dtype), shared_hbm, name, site), fill))


def _made(run, tensor: Tensor, fill) -> Tensor:
    if run.recording is not None:
        run.recording.allocated(tensor, fill, False)
    return tensor


_NAMES: dict = {}  # (api, site) -> the name of an unnamed allocation


def default_name(api: str, site: str) -> str:
    """The name of an unnamed allocation: the API's short name at the allocation site's file and line."""
    name = _NAMES.get((api, site))
    if name is None:
        name = _NAMES[(api, site)] = f"{api.rpartition('.')[2]}@{site.rpartition('/')[2]}"
    return name


def _shape_of(shape, api: str) -> tuple[tuple[int, ...], int]:
    """A shape argument as a tuple of ints, and the index of its partition dimension (an ``nl.par_dim``, else 0)."""
    if type(shape) is not tuple:
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    pdim = 0
    for size in shape:
        if type(size) is not int:  # NumPy integers, ParDim
            pdim = next((i for i, s in enumerate(shape) if isinstance(s, ParDim)), 0)
            shape = tuple(int(s) for s in shape)
            break
    for size in shape:
        if size < 0:
            raise KernelUsageError(f"{api}: negative dimension in shape {list(shape)}")
    return shape, pdim


def _poison(run, dtype: np.dtype, on_chip: bool, rules: Rules = TILE_RULES) -> np.ndarray:
    """The fill of new memory of ``dtype`` under ``run``'s config and ``rules`` (on chip, NaN is the tagged
    NaN), as a read-only 0-d array made once per run."""
    key = (dtype, on_chip, rules)
    fill = run.fills.get(key)
    if fill is None:
        fill = rules.fill_value(run.config, dtype)
        fill = np.full((), on_chip_fill(fill, dtype) if on_chip else fill, dtype)
        fill.flags.writeable = False
        run.fills[key] = fill
    return fill


class Placement(Buffer):
    """A request for fixed on-chip addresses (a front end's direct allocator) passed as ``buffer=``.

    ``base`` is the buffer the tensor lives in; ``allocate(run, tensor, tile_bytes)`` returns its
    liveness record(s): a :class:`liveness.DirectAllocation` per tile, in a :class:`liveness.Blocks`
    for tensors with block dimensions."""

    __slots__ = ("base",)

    def __init__(self, base: Buffer):
        super().__init__(base.name, base.space)
        self.base = base

    def allocate(self, run, tensor: Tensor, tile_bytes: int):
        raise NotImplementedError


class Address(Placement):
    """A tensor at ``address`` = (partition_offset, free_offset): the first partition, and the byte
    offset in each partition (the SDK's examples count bytes: ``bank * 2048`` in PSUM, ``offset + i *
    n * 2`` for bfloat16 tiles in SBUF). The range must lie in the target's partition; two tensors on
    overlapping addresses may not hold data at once (``liveness``)."""

    __slots__ = ("address", "api")

    def __init__(self, base: Buffer, address, api: str):
        super().__init__(base)
        self.address, self.api = address, api

    def allocate(self, run, tensor: Tensor, tile_bytes: int):
        api, address, name, shape, site = self.api, self.address, tensor.name, tensor.shape, tensor.site
        p0, b0 = (int(a) for a in address)
        p1, b1 = p0 + shape[0], b0 + tile_bytes
        if p0 < 0 or p1 > PMAX:
            raise CapacityError(f"{api}: tensor '{name}' of shape {list(shape)} at address {tuple(address)} needs "
                                f"partitions [{p0}, {p1}); there are {PMAX} (0-{PMAX - 1})", site)
        capacity = run.budget(self.space)
        if b0 < 0 or b1 > capacity:
            raise CapacityError(f"{api}: tensor '{name}' of shape {list(shape)} at address {tuple(address)} needs "
                                f"bytes [{b0}, {b1}) of each partition; {self.space.upper()} partitions have "
                                f"{capacity} bytes on {run.config.target}", site)
        return liveness.DirectAllocation(run, self.space, tile_bytes, name, site, (p0, p1, b0, b1))


def auto_allocation(run, tensor: Tensor, tile_bytes: int):
    """Compiler-placed storage: one allocation per tile (per block of a tensor with block dimensions,
    which the compiler places independently)."""
    space = tensor.buffer.space
    if tensor.pdim == 0:
        return liveness.Allocation(run, space, tile_bytes, tensor.name, tensor.site)
    recs = np.empty(tensor.shape[:tensor.pdim], object)
    for i in range(recs.size):
        recs.flat[i] = liveness.Allocation(run, space, tile_bytes, tensor.name, tensor.site)
    return liveness.Blocks(recs)


def check_tile_shape(shape, pdim, dtype, buffer, name, api, site=None, min_rank: int = 2,
                     rules: Rules = TILE_RULES, run=None) -> int:
    """Check an on-chip tensor's shape and size against ``rules``; returns its bytes per partition. Beyond
    the budget is checked before the array exists: one tile larger than the partition cannot be
    accessed by any instruction (the compiler's GCA035, "couldn't be allocated in SB"), and must not
    exhaust host memory first."""
    messages = rules.messages
    if len(shape) < min_rank:
        raise KernelUsageError(messages["rank"].format(api=api, name=name, shape=list(shape)), site)
    if shape[pdim] > PMAX:
        violation(TileLimitError(messages["partitions"].format(api=api, name=name, shape=list(shape),
                                                               partitions=shape[pdim], pmax=PMAX), site))
    nbytes = math.prod(shape[pdim + 1:]) * dtype.itemsize
    space = buffer.space
    if space == "psum" and nbytes > rules.psum_bytes:
        violation(TileLimitError(messages["psum"].format(api=api, name=name, shape=list(shape), dtype=dtype,
                                                         nbytes=nbytes, limit=rules.psum_bytes), site))
    run = run or current_run(api)
    if space in rules.budgeted and nbytes > run.budgets[space]:
        violation(CapacityError(messages["capacity"].format(
            api=api, name=name, shape=list(shape), dtype=dtype, nbytes=nbytes, site=site, target=run.config.target,
            space=space.upper(), budget=run.budget(space)), site))
    return nbytes


def tile_from_values(values: np.ndarray, dtype, api: str, buffer: Buffer = sbuf, mask=None,
                     account: bool = True, min_rank: int = 1, fresh: bool = False) -> Tensor:
    """A new on-chip tile holding ``values`` rounded to ``dtype`` (outside ``mask``: poison).

    ``account=False`` is for Tensor-engine results, which on the device accumulate straight
    into the PSUM bank they are added to rather than occupying one of their own. ``fresh`` says
    that nothing else references ``values``, so the tile may take the array over uncopied."""
    if _run.recordings:
        _run.outside("a new tile's values")
    if mask is None and fresh and values.flags.c_contiguous and values.flags.writeable:
        return new_tensor(values.shape, dtype, buffer, api=api, fill=None, min_rank=min_rank, account=account,
                          data=dt.cast(values, dt.as_dtype(dtype)))
    tensor = new_tensor(values.shape, dtype, buffer, api=api, fill=None, min_rank=min_rank, account=account)
    if mask is None:
        tensor.data[...] = dt.cast(values, tensor.dtype)
    else:
        selected = np.broadcast_to(mask, values.shape)
        tensor.data[...] = on_chip_fill(active_config().fill_value(tensor.dtype), tensor.dtype)
        np.copyto(tensor.data, dt.cast(values, tensor.dtype), where=selected)
        if not selected.all():
            tensor.written = selected.copy()
            if tensor.alloc is not None:
                mark_poison(tensor.alloc, tensor.data)
    return tensor


def mark_poison(alloc, data: np.ndarray) -> None:
    """``data`` (an allocation's storage) holds the tagged NaN somewhere: its first read looks for it
    (``liveness``). Integer sentinels are ordinary values and are not traced."""
    if data.dtype not in TAGS or not active_config().nan_fill:
        return
    if alloc.__class__ is liveness.Blocks:
        for index, rec in np.ndenumerate(alloc.recs):
            rec.poison = data[index]
    else:
        alloc.poison = data


def report_poison(run, outputs) -> None:
    """After a launch: a kernel output holding the tagged NaN of new on-chip memory is reported (a
    warning: reading uninitialised memory is no compile error, and the device returns whatever the
    memory held) with the allocations whose first read found it and the reading instructions' sites."""
    reads = run.ledger.poison_reads
    if not reads:
        return
    for tensor in _tensors(outputs):
        if holds_sentinel(tensor.data):
            listing = "; ".join(f"'{name}' (allocated at {site}) read at {reader}" for name, site, reader in reads)
            warnings.warn(f"{reads[0][2]}: kernel output '{tensor.name}' holds NaN computed from memory no "
                          f"instruction had written (the NaN of new SBUF/PSUM memory); reads of such memory: "
                          f"{listing}", SimulatorWarning, stacklevel=2)
            return


def _tensors(value):
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)



# --------------------------------------------------------------------------- reads and writes

def require_on_chip(x, api: str, arg: str) -> None:
    if not x.buffer.on_chip:
        raise MemorySpaceError(f"Expected operand '{arg}' of '{api}' to be in address space 'psum|sbuf', but got "
                               f"a tile in 'hbm' instead (tensor '{x.name}'; move data on chip with nl.load)")


def require_tile(x: Tensor, api: str, arg: str) -> None:
    if x.pdim != 0:
        raise KernelUsageError(f"operand '{arg}' of '{api}': tensor '{x.name}' of shape {list(x.shape)} has "
                               f"leading block dimension(s) before its partition dimension; index them first")


def read(x, api: str, arg: str, mask=None) -> np.ndarray:
    """The values of an on-chip operand (storage dtype), restricted to ``mask``."""
    if _run.recordings:
        _run.outside("a tile read")
    if isinstance(x, Access):
        require_on_chip(x, api, arg)
        if x.tensor.alloc is not None:
            liveness.access_part(x.tensor.alloc, x.comps).read()
        if trace.listening:
            trace.read(x)
        return x.read(mask)
    if isinstance(x, Tensor):
        if not x.buffer.on_chip:
            require_on_chip(x, api, arg)
        if x.pdim:
            require_tile(x, api, arg)
        data = x.data  # first: a front end may fill new memory with its sentinel on first use
        if x.alloc is not None:
            x.alloc.read()
        if trace.listening:
            trace.read(x)
        if mask is None:
            return data
        data = column(data)
        selected = mask_for(mask, data.shape)
        values = np.where(selected, data, np.array(active_config().fill_value(x.dtype), x.dtype))
        return values.reshape(x.shape)
    if isinstance(x, MaskedOperand):
        raise UnsupportedError(f"operand masking (tile[mask]) of operand '{arg}' of '{api}'",
                               "only nc_matmul and nl.matmul operands take it; pass mask= to the instruction")
    raise KernelUsageError(f"operand '{arg}' of '{api}' must be a tile, got {type(x).__name__}")


def hbm_values(src, selected) -> np.ndarray:
    """The values of an HBM region (recorded as read), poison outside the legacy mask."""
    if _run.recordings:
        _run.outside("an HBM read")
    if trace.listening:
        trace.read(src, selected)
    if isinstance(src, Access):
        return src.read(selected)
    if selected is None:
        return src.data
    return np.where(np.broadcast_to(selected, src.shape), src.data,
                    np.array(active_config().fill_value(src.dtype), src.dtype))


def column(values: np.ndarray) -> np.ndarray:
    """An on-chip (P,) vector (a reduction result, ``t[:, 3]``) is a (P, 1) column: partition-aligned."""
    return values[:, None] if values.ndim == 1 else values


def fit(values: np.ndarray, shape: tuple[int, ...], target_name: str, api: str) -> np.ndarray:
    """Broadcast ``values`` to ``shape``; a (P,) per-partition vector counts as (P, 1)."""
    if values.shape == shape:
        return values
    if values.ndim == 1 and len(shape) >= 2 and values.shape[0] == shape[0]:
        values = values.reshape((shape[0],) + (1,) * (len(shape) - 1))
    elif values.size == math.prod(shape) and values.ndim > 0:
        return values.reshape(shape)
    try:
        return np.broadcast_to(values, shape)
    except ValueError:
        raise KernelUsageError(f"{api}: value of shape {list(values.shape)} does not fit destination "
                               f"'{target_name}' of shape {list(shape)} (the source must not be larger than "
                               f"the destination)") from None


def write(target, values: np.ndarray, api: str, mask=None) -> None:
    """Round ``values`` into ``target`` (a view tensor or an access), only where ``mask`` holds."""
    if _run.recordings:
        _run.outside("a tile write")
    if mask is None and not isinstance(target, Access) and values is target.data:
        # The instruction computed its result in target's own storage: nothing to fit, round or copy.
        if trace.listening:
            trace.write(target, api)
        if target.alloc is not None:
            _write_alloc(target)
        if target.written is not None or target.unset is not None:
            mark_written(target.written, target.unset, None)
        return
    shape = tuple(target.shape)
    values = dt.cast(fit(values, shape, target.name, api), target.dtype)
    if trace.listening:
        trace.write(target, api, mask=mask)
    if isinstance(target, Access):
        if target.tensor.alloc is not None:
            liveness.access_part(target.tensor.alloc, target.comps).write()
        target.write(values, mask)
        return
    if target.alloc is not None:
        _write_alloc(target, mask)
    if mask is None:
        if values is not target.data:  # else the instruction computed its result in place
            target.data[...] = values
    else:
        mask = np.broadcast_to(mask, shape)
        np.copyto(target.data, values, where=mask)
    mark_written(target.written, target.unset, mask)


def _write_alloc(target, mask=None) -> None:
    """The liveness write of ``target``; writing all of an allocation's storage (a writable view as
    large as it) leaves no never-written element to look for at its first read."""
    alloc = target.alloc
    alloc.write()
    if alloc.poison is not None and mask is None and target.data.size == alloc.poison.size:
        alloc.poison = None


def mark_written(written, unset, mask) -> None:
    """Record a write (where ``mask`` holds, or everywhere) in a tile's written/unset flags. (Assigning
    a constant, not ``|= True``: NumPy's in-place logic with a Python bool is some 50 times slower.)"""
    if written is not None:
        if mask is None:
            written[...] = True
        else:
            written[...] |= mask
    if unset is not None:
        if mask is None:
            unset[...] = False
        else:
            unset[...] &= ~mask


def written_of(value):
    """The elements of ``value`` a masked instruction wrote, or None when all hold data."""
    if isinstance(value, Tensor):
        return value.written
    if isinstance(value, Access) and value.tensor.written is not None:
        return value.gather(value.tensor.written)
    return None


def value_of(x, api: str, arg: str, mask=None) -> np.ndarray:
    if isinstance(x, (Tensor, Access, MaskedOperand)):
        return read(x, api, arg, mask)
    if isinstance(x, (int, float, bool, np.number, np.bool_)):
        return np.asarray(x, dtype=dt.scalar_dtype(x))
    raise KernelUsageError(f"operand '{arg}' of '{api}' must be a tile or a scalar, got {type(x).__name__}")


def assign(target, value, api: str, mask=None) -> None:
    """``target[...] = value`` on chip. The destination of an instruction is written in place, so a
    masked result (``t[...] = nl.add(a, b, mask=m)``) changes only the elements its mask selected."""
    if not target.buffer.on_chip:
        raise MemorySpaceError(f"cannot assign into HBM tensor '{target.name}' with '='; write HBM with nl.store "
                               f"(or nisa.dma_copy)")
    values = value_of(value, api, "value", mask)
    if getattr(value, "combine", None) is not None:
        fn, operand = value.combine
        current = read(target, api, "destination")
        with np.errstate(all="ignore"):
            values = fn(dt.to_f32(fit(operand, current.shape, target.name, api)), dt.to_f32(current))
    written = written_of(value)
    if written is not None:
        written = fit(written, tuple(target.shape), target.name, api)
        mask = written if mask is None else written & np.broadcast_to(mask, written.shape)
    write(target, values, api, mask)


def broadcast_tile(src, shape) -> Tensor:
    """A new tile holding ``src`` with its size-1 dimensions replicated to ``shape``."""
    return tile_from_values(broadcast_values(column(read(src, "nl.broadcast_to", "src")), shape), src.dtype,
                            "nl.broadcast_to")


def broadcast_values(values: np.ndarray, shape) -> np.ndarray:
    """``values`` with size-1 dimensions replicated to ``shape`` (``nl.broadcast_to`` of both generations)."""
    try:
        return np.broadcast_to(values, tuple(shape))
    except ValueError:
        raise KernelUsageError(f"nl.broadcast_to: cannot broadcast {list(values.shape)} to {list(shape)}") from None


replay.steps(globals(), ("assign", "broadcast_tile"))
