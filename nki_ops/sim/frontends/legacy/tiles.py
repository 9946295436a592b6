"""The legacy API's tiles: the core's tensors and accesses with ``neuronxcc.nki``'s spelling on them.

Subscripts (``t[i_p, i_f]``, ``t[...] = value``), Python operators (``a + b`` is ``nl.add(a, b)``,
``a < b`` is ``nl.less``), in-place accumulation (``psum += nisa.nc_matmul(...)``), ``broadcast_to``
and operand masking (``access[mask]``). A legacy launch makes every tensor one of these
(``Run.tensor_type``).
"""

from __future__ import annotations

import numpy as np

from ...core import alu, indexing, instructions, memory
from ...core import dtypes as dt
from ...core.errors import KernelUsageError
from ...core.replay import step
from ...core.tensors import Access, Mask, MaskedOperand, Tensor


def _operator(name: str, reflected: bool = False):
    def operator(self, other):
        if alu.is_tile(other) and self.shape[:1] != other.shape[:1] and self.ndim > 1 and other.ndim > 1:
            raise KernelUsageError(
                f"operator on tiles with {self.shape[0]} and {other.shape[0]} partitions: tile operators do not "
                f"broadcast along the partition dimension; use nl.{name} or broadcast_to")
        return instructions.binary(name, other, self) if reflected else instructions.binary(name, self, other)
    return operator


class TileOperators:
    """Python operators on tiles and accesses."""

    __slots__ = ()
    __hash__ = object.__hash__

    def __neg__(self):
        return instructions.unary("negative", self)

    def __invert__(self):
        return instructions.invert(self)


for _dunder, _name in (("add", "add"), ("sub", "subtract"), ("mul", "multiply"), ("truediv", "divide"),
                       ("pow", "power"), ("mod", "mod"), ("and", "bitwise_and"), ("or", "bitwise_or"),
                       ("xor", "bitwise_xor"), ("lshift", "left_shift"), ("rshift", "right_shift")):
    setattr(TileOperators, f"__{_dunder}__", _operator(_name))
    setattr(TileOperators, f"__r{_dunder}__", _operator(_name, reflected=True))
for _dunder, _name in (("lt", "less"), ("le", "less_equal"), ("gt", "greater"), ("ge", "greater_equal"),
                       ("eq", "equal"), ("ne", "not_equal")):
    setattr(TileOperators, f"__{_dunder}__", _operator(_name))


@step
def inplace_result(target, op: str, other, unset):
    """``target op other`` for ``target op= other``. A Tensor-engine result added where ``unset`` marks
    PSUM no instruction has written starts the accumulation there (the first matmul into a PSUM
    location overwrites it); a masked ``other`` updates only the elements it wrote."""
    result = instructions.binary(op, target, other, dtype=target.dtype)
    if op == "add" and unset is not None and getattr(other, "accumulates", False) and unset.any():
        fresh = memory.fit(unset, result.shape, target.name, "+=")
        np.copyto(result.data, dt.cast(memory.fit(memory.read(other, "+=", "value"), result.shape, target.name,
                                                  "+="), result.dtype), where=fresh)
    written = memory.written_of(other)
    if written is not None:
        result.written = np.array(memory.fit(written, result.shape, target.name, "+="))
    return result


class TileAccess(TileOperators, Access):
    """An advanced-indexing access ``t[i_p, 4 * i_f + 1]`` of a legacy tile."""

    __slots__ = ()

    def __getitem__(self, key):
        if isinstance(key, Mask):
            return MaskedOperand(self, key)
        raise KernelUsageError(f"an indexed access of '{self.name}' can only be subscripted with a mask (operand "
                               f"masking); index the tensor once")

    def broadcast_to(self, shape):
        """A new tile of the accessed values with size-1 dimensions replicated to ``shape``."""
        return memory.broadcast_tile(self, shape)

    def __iadd__(self, other):
        unset = self.gather(self.tensor.unset) if self.tensor.unset is not None else None
        return inplace_result(self, "add", other, unset)

    def __isub__(self, other):
        return instructions.binary("subtract", self, other, dtype=self.dtype)

    def __imul__(self, other):
        return instructions.binary("multiply", self, other, dtype=self.dtype)


class Tile(TileOperators, Tensor):
    """A legacy tensor in HBM, SBUF or PSUM."""

    __slots__ = ()
    access_type = TileAccess

    def __getitem__(self, key):
        return indexing.index(self, key)

    def __setitem__(self, key, value):
        memory.assign(indexing.index(self, key), value, "assignment")

    def broadcast_to(self, shape):
        """A (1, F) tile replicated over partitions (a new tile); on HBM, a read-only view."""
        if self.buffer.on_chip:
            return memory.broadcast_tile(self, shape)
        try:
            return Tile(np.broadcast_to(self.data, tuple(shape)), self.buffer, self.name, self.site, alloc=self.alloc)
        except ValueError:
            raise KernelUsageError(f"cannot broadcast '{self.name}' of shape {list(self.shape)} to "
                                   f"{list(shape)}") from None

    # In-place operators update the tensor itself (PSUM accumulation: psum += nisa.nc_matmul(...)).
    def _inplace(self, op: str, other):
        memory.assign(self, inplace_result(self, op, other, self.unset), f"{op} (in place)")
        return self

    def __iadd__(self, other):
        return self._inplace("add", other)

    def __isub__(self, other):
        return self._inplace("subtract", other)

    def __imul__(self, other):
        return self._inplace("multiply", other)

    def __itruediv__(self, other):
        return self._inplace("divide", other)
