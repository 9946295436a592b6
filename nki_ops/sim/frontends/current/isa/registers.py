"""Scalar registers of the current API: ``VirtualRegister`` and the ``register_*`` instructions."""

from __future__ import annotations

import numpy as np

from ....core import alu, memory
from ....core.errors import (
    KernelUsageError,
)
from ....core.run import require_values
from .instruction import instruction

# ----------------------------------------------------------------------------------- registers

class VirtualRegister:
    """A 32-bit scalar register (dynamic loop bounds, offsets); holds a value at run time."""

    __slots__ = ("value",)

    def __init__(self, value: int = 0):
        self.value = int(np.int32(value))

    def __repr__(self) -> str:
        return f"VirtualRegister({self.value})"

    def __bool__(self):
        return self.value != 0

    def __int__(self):
        return self.value

    __index__ = __int__


def register_value(x) -> int:
    if isinstance(x, VirtualRegister):
        return x.value
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return int(x)
    raise KernelUsageError(f"expected an int or a register, got {type(x).__name__}")


@instruction
def register_alloc(x=None) -> VirtualRegister:
    return VirtualRegister(0 if x is None else register_value(x))


@instruction
def register_move(dst: VirtualRegister, src) -> None:
    dst.value = register_value(src)


def _one(src, api: str) -> np.ndarray:
    if not alu.is_tile(src) or src.data.size != 1:
        raise KernelUsageError(f"{api}: needs a 1x1 tensor, got {getattr(src, 'shape', type(src).__name__)}")
    return src.data.reshape(-1)


@instruction
def register_load(dst: VirtualRegister, src) -> None:
    require_values("nisa.register_load (a register, e.g. a loop bound, set from a tensor value)")
    dst.value = int(np.int32(_one(src, "nisa.register_load")[0]))


@instruction
def register_store(dst, src: VirtualRegister) -> None:
    memory.write(dst, np.asarray(register_value(src), np.int64), "nisa.register_store")
