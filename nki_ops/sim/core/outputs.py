"""Where an instruction's result lands: the output spec of the one calling convention.

A core instruction (``core/isa.py``) takes an ``Out`` and its operands; it validates, computes and hands its
values to ``out.put``, which rounds, writes, records and returns the written tile. The two generations differ
only in the spec they pass:

- ``Tile`` (legacy ``neuronxcc.nki``): a new tile of ``dtype`` (default: the instruction's own) written only
  where ``mask=`` selects (poison elsewhere), or, for the instructions that take one, a ``dst`` written there.
- ``Dst`` (current ``nki``): ``dst``, checked when the call starts (a writable tensor on chip, not a gather),
  the result computed in its fp32 storage where it may be, its unwritten-PSUM flags cleared on write, a
  Tensor-engine result accumulating by the ``accumulate`` rule.

``out.api`` is the name errors carry (``tensor_tensor`` in legacy, ``nisa.tensor_tensor`` in current);
``out.current`` says the current API's pages apply, with the rules they add to the legacy pages'.
"""

from __future__ import annotations

import numpy as np

from . import alu, memory, replay
from . import dtypes as dt
from .collectives import take_turn
from .errors import KernelUsageError, MemorySpaceError, UnsupportedError
from .indexing import mask_values
from .instructions import GPSIMD, check_engine_access, product, require_tile_operand
from .run import active_config

_SELECTED = object()  # put()'s default: the elements the instruction's mask selects


@replay.walked
class Out:
    """The common part of both specs: the API name, the destination (None: a new tile), the mask."""

    current = False
    dst = None
    selected = None  # the legacy mask as a boolean array (None: every element)

    def on_chip(self, x, arg: str):
        """The current API checks an operand's address space when the call starts; legacy when it is read."""
        return x

    def result_buffer(self, engine=0):
        """The fp32 array the instruction may compute its result into (None: a new array)."""
        return None

    def check_engine(self, engine) -> None:
        """The destination is one the engine can write (checked after the computation)."""

    def also(self, dst, what: str) -> Out:
        """The spec of a second destination the instruction writes (``reduce_res``, ``dst_idx``)."""
        raise NotImplementedError


class Tile(Out):
    """The legacy result: a new tile (``dtype`` or the instruction's default) in ``buffer``, or ``dst``."""

    def __init__(self, api: str, dtype=None, mask=None, dst=None, label: str | None = None):
        self.api = api
        self.label = label or f"nisa.{api}"
        self.dtype = None if dtype is None else dt.as_dtype(dtype)
        self.selected = mask_values(mask)
        self.dst = dst

    def out_dtype(self, default):
        return self.dtype if self.dtype is not None else default

    def also(self, dst, what: str) -> Tile:
        return Tile(self.api, dst=dst, label=f"{self.label} {what}")

    def put_raw(self, values, default=None):
        """Integer values (indices) stored as they are in the output dtype, everywhere."""
        if self.dst is not None:
            return self.put(values.reshape(tuple(self.dst.shape)), where=None)
        dtype = self.out_dtype(default)
        return self.put(values.astype(dtype), dtype, where=None)

    def put(self, values, default=None, where=_SELECTED, buffer=memory.sbuf, account: bool = True):
        """``values`` rounded into a new tile of the output dtype (``default`` without ``dtype=``), or into
        ``dst``, only where ``where`` holds (default: the mask; None: everywhere). Returns the tile."""
        where = self.selected if where is _SELECTED else where
        if self.dst is not None:
            memory.write(self.dst, values, self.label, where)
            return self.dst
        return memory.tile_from_values(values, self.out_dtype(default), self.label, buffer=buffer, mask=where,
                                       account=account)


class Dst(Out):
    """The current result: ``dst``, checked now (``on_chip=False``: a DMA's, which may be in HBM; ``later``: the
    instruction calls ``check`` after its first operand rules, as the DMA instructions do)."""

    current = True

    def __init__(self, dst, api: str, on_chip: bool = True, later: bool = False):
        self.dst, self.api, self.label, self._on_chip = dst, api, api, on_chip
        if not later:
            self.check()

    def check(self) -> None:
        """An instruction starts: take its place in an LNC2 launch's order, then check dst (an engine's dst is
        on chip, in the program's own SBUF or PSUM; a DMA's may be in HBM, which the programs share)."""
        dst, api, on_chip = self.dst, self.api, self._on_chip
        take_turn(shared=not on_chip)
        if not isinstance(dst, alu.TILES):
            raise KernelUsageError(f"dst of '{api}' must be a tensor, got {type(dst).__name__}")
        if on_chip and not dst.buffer.on_chip:
            raise MemorySpaceError(f"Expected operand 'dst' of '{api}' to be in address space 'psum|sbuf', but got "
                                   f"a tensor in 'hbm' instead (tensor '{dst.name}')")
        if on_chip and dst.gathers:
            raise UnsupportedError(f"{api} into an indirect access", "only DMA scatters")
        if not dst.writeable and dst.ndim:
            raise KernelUsageError(f"dst of '{api}' is a read-only view of '{dst.name}' (a broadcast view cannot be "
                                   f"written)")

    def out_dtype(self, default=None):
        return self.dst.dtype

    def on_chip(self, x, arg: str):
        require_tile_operand(x, self.api, arg)
        memory.require_on_chip(x, self.api, arg)
        return x

    def result_buffer(self, engine=0):
        """dst's fp32 storage, unless dst fails the engine check made after the computation (GpSimd cannot
        write PSUM), which must find dst untouched."""
        if int(engine) == GPSIMD and self.dst.buffer is memory.psum:
            return None
        return self.dst.result_buffer()

    def check_engine(self, engine) -> None:
        check_engine_access(self.dst, int(engine), self.api, "dst")

    def also(self, dst, what: str) -> Dst:
        return Dst(dst, self.api)

    def put_raw(self, values, default=None):
        write_raw(self.dst, values)
        return self.dst

    def put(self, values, default=None, where=None, **_):
        """Round ``values`` into dst: same partitions, same elements per partition (or a broadcast scalar)."""
        write_dst(self.dst, values, self.api)
        return self.dst

    def accumulate(self, values, accumulate):
        """A Tensor-engine result into PSUM dst: ``accumulate=None`` overwrites elements no instruction wrote
        and adds into the others, True adds everywhere, False overwrites. Returns which elements it
        overwrote (``fresh``: True all, False none, or a mask)."""
        dst = self.dst
        values = np.asarray(values, np.float32)
        if values.shape[0] != dst.shape[0] or values.size != dst.size:
            raise KernelUsageError(f"{self.api}: result of shape {list(values.shape)} does not match dst "
                                   f"'{dst.name}' of shape {list(dst.shape)}")
        if accumulate is None:
            # Unwritten PSUM elements take the product, the others add it: all of one kind is the usual case.
            unset = dst.unset
            fresh = False if unset is None or not unset.any() else True if unset.all() else unset.copy()
        else:
            fresh = not accumulate
        current = dst.data
        if fresh is False and dst.result_buffer() is current:  # added in place: no sum to make and copy
            write_dst(dst, np.add(current, values.reshape(dst.shape), out=current), self.api)
        else:
            write_dst(dst, accumulated(values.reshape(dst.shape), current, fresh), self.api)
        return fresh


def accumulated(values: np.ndarray, current: np.ndarray, fresh) -> np.ndarray:
    """A product into PSUM holding ``current``: overwriting where ``fresh`` (True: everywhere), else adding."""
    if fresh is True:
        return values
    if fresh is False:
        return dt.to_f32(current) + values
    return np.where(fresh, values, dt.to_f32(current) + values)


def shaped_product(stationary: np.ndarray, moving: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``nc_matmul``'s values on arrays where it overwrites all of dst (``shape``): the product alone."""
    return np.asarray(product(stationary, moving), np.float32).reshape(shape)


def accumulated_product(stationary: np.ndarray, moving: np.ndarray, current: np.ndarray, fresh) -> np.ndarray:
    """``nc_matmul``'s values on arrays: the product, accumulated into ``current`` (``Dst.accumulate``)."""
    return accumulated(shaped_product(stationary, moving, current.shape), current, fresh)


def write_dst(dst, values: np.ndarray, api: str) -> None:
    """Round ``values`` into a current-API ``dst``: same partitions, same elements per partition (or a broadcast
    scalar); the unwritten-PSUM flags are cleared."""
    if values is dst._storage():  # computed in dst's own storage (``result_buffer``): it fits and fills dst
        dst.overwrite_all()
        memory.write(dst, values, api)
        return
    values = np.asarray(values)
    if values.ndim and dst.buffer.on_chip:
        values = memory.column(values)
        if values.shape[0] != dst.shape[0] or values.size != dst.size:
            raise KernelUsageError(f"{api}: result of shape {list(values.shape)} does not match dst "
                                   f"'{dst.name}' of shape {list(dst.shape)} (partitions and elements per "
                                   f"partition must agree)")
    if not values.ndim or dst.buffer.on_chip:
        dst.overwrite_all()  # the result fits: every element of dst is written
    memory.write(dst, values, api)
    if dst.unset is not None:
        dst.unset[...] = False


def write_raw(dst, values: np.ndarray) -> None:
    """Values stored into a current-API ``dst`` as they are, converted to its dtype without rounding (index
    bits: a uint16 dst keeps the low bits)."""
    touch(dst)
    dst.data[...] = values.reshape(dst.shape).astype(dst.dtype)


def touch(written, *read) -> None:
    """Liveness uses of an instruction that moves data without ``memory.read``/``memory.write``: its
    sources are read, then ``written`` (None: nothing on chip) is written."""
    for src in read:
        if src.alloc is not None:
            src.alloc.read()
    if written is not None and written.alloc is not None:
        written.alloc.write()


def no_packed(api: str, *tensors) -> None:
    for t in tensors:
        if isinstance(t, alu.TILES) and t.dtype.names:
            raise UnsupportedError(f"{api} on packed MX dtype {t.dtype.names[0]}")


def require_v4(api: str) -> None:
    config = active_config()
    if config.nc_version < 4:
        raise KernelUsageError(f"{api} is available only on NeuronCore-v4 (trn3) and newer; target is "
                               f"{config.target}")
