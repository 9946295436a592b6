"""The operand and destination conventions every current-API instruction shares: checking ``dst``, writing
results into it (rounding, the unwritten-PSUM flags), liveness touches, and an LNC2 program's turn."""

from __future__ import annotations

import numpy as np

from ....core import alu, instructions, memory
from ....core import dtypes as dt
from ....core.collectives import take_turn as _step  # an instruction starts: an LNC2 program's turn
from ....core.errors import KernelUsageError, MemorySpaceError, UnsupportedError
from ....core.run import active_config


def _dst(dst, api: str, on_chip: bool = True):
    _step()
    if not alu.is_tile(dst):
        raise KernelUsageError(f"dst of '{api}' must be a tensor, got {type(dst).__name__}")
    if on_chip and not dst.buffer.on_chip:
        raise MemorySpaceError(f"Expected operand 'dst' of '{api}' to be in address space 'psum|sbuf', but got a "
                               f"tensor in 'hbm' instead (tensor '{dst.name}')")
    if on_chip and dst.gathers:
        raise UnsupportedError(f"{api} into an indirect access", "only DMA scatters")
    if not dst.writeable and dst.ndim:
        raise KernelUsageError(f"dst of '{api}' is a read-only view of '{dst.name}' (a broadcast view cannot be "
                               f"written)")
    return dst


def _write(dst, values: np.ndarray, api: str) -> None:
    """Round ``values`` into ``dst``: same partitions, same elements per partition (or a broadcast scalar)."""
    if values is dst._storage():  # computed in dst's own storage (``_result_buffer``): it fits and fills dst
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


def _touch(written, *read) -> None:
    """Liveness uses of an instruction that moves data without ``memory.read``/``memory.write``: its
    sources are read, then ``written`` (None: nothing on chip) is written."""
    for src in read:
        if src.alloc is not None:
            src.alloc.read()
    if written is not None and written.alloc is not None:
        written.alloc.write()


def _result_buffer(dst, engine):
    """Where an instruction may compute its result: dst's fp32 storage, unless dst fails the engine
    check made after the computation (GpSimd cannot write PSUM), which must find dst untouched."""
    if int(engine) == instructions.GPSIMD and dst.buffer is memory.psum:
        return None
    return dst.result_buffer()


def _on_chip(x, api: str, arg: str):
    instructions.require_tile_operand(x, api, arg)
    memory.require_on_chip(x, api, arg)
    return x


def _no_packed(api: str, *tensors) -> None:
    for t in tensors:
        if alu.is_tile(t) and t.dtype.names:
            raise UnsupportedError(f"{api} on packed MX dtype {t.dtype.names[0]}")


def _accumulate(dst, values, accumulate, api: str) -> None:
    """A Tensor-engine result into PSUM ``dst``: ``accumulate=None`` overwrites elements no instruction wrote
    and adds into the others, True adds everywhere, False overwrites."""
    values = np.asarray(values, np.float32)
    if values.shape[0] != dst.shape[0] or values.size != dst.size:
        raise KernelUsageError(f"{api}: result of shape {list(values.shape)} does not match dst '{dst.name}' of "
                               f"shape {list(dst.shape)}")
    values = values.reshape(dst.shape)
    if accumulate is None:
        # Unwritten PSUM elements take the product, the others add it: all of one kind is the usual case.
        fresh = dst.unset
        if fresh is None or not fresh.any():
            values = dt.to_f32(dst.data) + values
        elif not fresh.all():
            values = np.where(fresh, values, dt.to_f32(dst.data) + values)
    elif accumulate:
        values = dt.to_f32(dst.data) + values
    _write(dst, values, api)


def _require_v4(api: str) -> None:
    config = active_config()
    if config.nc_version < 4:
        raise KernelUsageError(f"{api} is available only on NeuronCore-v4 (trn3) and newer; target is "
                               f"{config.target}")
