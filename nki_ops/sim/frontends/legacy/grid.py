"""SPMD grid dimensions that name physical NeuronCores, made by ``nl.nc(n)`` and ``nl.spmd_dim(...)``.

``kernel[nl.spmd_dim(4, nl.nc(2)), 2]`` is a grid of 8 x 2 instances whose first dimension is
spread over 2 physical cores. The simulator runs every instance serially on one CPU either way;
the spread only matters for which targets accept the grid (those with several cores per logical
core). ``program_id`` counts along the whole dimension.
"""

from __future__ import annotations

from ...core.errors import KernelUsageError


class GridDim:
    """One launch-grid dimension of ``size`` instances spread over ``cores`` physical NeuronCores."""

    __slots__ = ("size", "cores")

    def __init__(self, size: int, cores: int = 1):
        self.size, self.cores = size, cores

    def __mul__(self, other):
        other = other if isinstance(other, GridDim) else GridDim(positive(other, "nl.spmd_dim"))
        return GridDim(self.size * other.size, self.cores * other.cores)

    __rmul__ = __mul__

    def __repr__(self) -> str:
        return f"spmd_dim(size={self.size}, cores={self.cores})"


def positive(value, api: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise KernelUsageError(f"{api}: sizes must be positive ints, got {value!r}")
    return value
