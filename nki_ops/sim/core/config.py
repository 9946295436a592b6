"""Simulator configuration: one frozen dataclass, set per call or for a block of code."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np

__all__ = ["SimConfig", "TARGETS", "configure", "current_config"]

KIB = 1024

# Per-partition on-chip capacities by target: SBUF is 24 MiB (trn1/inf2), 28 MiB (trn2) or
# 32 MiB (trn3) over 128 partitions; PSUM is 16 KiB per partition (8 banks of 2 KiB) on every generation.
# Usable SBUF is what the compiler leaves kernels of a partition (nl.tile_size.total_available_sbuf_size:
# 180224, 212984, 245752 bytes).
TARGETS = {
    "trn1": {"nc_version": 2, "sbuf_bytes_per_partition": 192 * KIB, "sbuf_usable_bytes_per_partition": 180224,
             "psum_bytes_per_partition": 16 * KIB},
    "inf2": {"nc_version": 2, "sbuf_bytes_per_partition": 192 * KIB, "sbuf_usable_bytes_per_partition": 180224,
             "psum_bytes_per_partition": 16 * KIB},
    "trn2": {"nc_version": 3, "sbuf_bytes_per_partition": 224 * KIB, "sbuf_usable_bytes_per_partition": 212984,
             "psum_bytes_per_partition": 16 * KIB},
    "trn3": {"nc_version": 4, "sbuf_bytes_per_partition": 256 * KIB, "sbuf_usable_bytes_per_partition": 245752,
             "psum_bytes_per_partition": 16 * KIB},
}


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """How the simulator runs a kernel.

    target: "trn1", "inf2", "trn2" or "trn3"; selects the SBUF budget and ``nisa.get_nc_version()``.
    strict: raise on hardware-limit violations (tile sizes, on-chip capacity); when False
        they are reported as ``SimulatorWarning`` and the kernel keeps running.
    uninitialized: "poison" fills new SBUF, PSUM and kernel-created HBM tensors (and the
        elements a masked instruction skips) with ``float_poison`` / ``int_poison`` so reads
        before writes show; "zeros" fills them with 0.
    float_poison: the fill value for floating-point tensors (NaN).
    int_poison: the fill value for integer tensors, clipped to the dtype's range (bool: True).
    seed: when not None, shuffles ``affine_range`` iteration order and the SPMD grid order with
        this seed, to expose hidden loop-carried dependencies.
    sbuf_budget_bytes: SBUF bytes per partition; None uses the target's capacity.
    races: what to do when program instances sharing HBM (an LNC2 launch's two programs, a legacy
        SPMD grid's instances) touch the same bytes, one writing, with nothing ordering them
        (``core/races.py``): "warn" (a ``SimulatorWarning`` naming both sites), "error" (``RaceError``)
        or "off" (not tracked: launches of several instances run a little faster).
    timing_only: cost the kernel without computing floating-point values (shapes, buffers and
        dependencies only, for the cost model's estimate): results hold meaningless values, integer
        results (indices, possibly addresses of indirect DMA) are computed, and a kernel whose
        control flow reads tensor values is refused.
    replay: a kernel called again and again with arguments of the same shapes, dtypes and other values,
        under the same config, calls the instructions one call recorded instead of running its Python
        again (``core/replay.py``: bit-identical results; kernels it cannot prove replayable run in full).

    The defaults of ``target``, ``timing_only``, ``races`` and ``replay`` come from the environment variables
    ``NKI_OPS_SIM_TARGET``, ``NKI_OPS_SIM_TIMING_ONLY=1``, ``NKI_OPS_SIM_RACES`` and ``NKI_OPS_SIM_REPLAY=0``
    when set.
    """

    target: str = "trn1"
    strict: bool = True
    uninitialized: str = "poison"
    float_poison: float = math.nan
    int_poison: int = 0x7FFFFFFF
    seed: int | None = None
    sbuf_budget_bytes: int | None = None
    races: str = "warn"
    timing_only: bool = False
    replay: bool = True

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"SimConfig.target must be one of {sorted(TARGETS)}, got {self.target!r}")
        if self.uninitialized not in ("poison", "zeros"):
            raise ValueError(f"SimConfig.uninitialized must be 'poison' or 'zeros', got {self.uninitialized!r}")
        if self.races not in ("warn", "error", "off"):
            raise ValueError(f"SimConfig.races must be 'warn', 'error' or 'off', got {self.races!r}")
        if self.sbuf_budget_bytes is not None and self.sbuf_budget_bytes <= 0:
            raise ValueError(f"SimConfig.sbuf_budget_bytes must be positive, got {self.sbuf_budget_bytes}")

    def fill_value(self, dtype: np.dtype):
        """What uninitialised memory of ``dtype`` holds."""
        if self.uninitialized == "zeros":
            return 0
        if dtype.kind == "b":
            return True
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            return min(max(self.int_poison, info.min), info.max)
        return self.float_poison

    @property
    def nan_fill(self) -> bool:
        """Whether new float memory holds NaN (``fill_value`` of a float dtype is NaN)."""
        return self.uninitialized != "zeros" and math.isnan(self.float_poison)

    @property
    def sbuf_budget(self) -> int:
        if self.sbuf_budget_bytes is not None:
            return self.sbuf_budget_bytes
        return self.sbuf_capacity

    @property
    def sbuf_capacity(self) -> int:
        """The target's SBUF bytes per partition, whatever budget the config sets."""
        return TARGETS[self.target]["sbuf_bytes_per_partition"]

    @property
    def sbuf_usable(self) -> int:
        """SBUF bytes per partition the compiler leaves kernels on the target."""
        return TARGETS[self.target]["sbuf_usable_bytes_per_partition"]

    @property
    def psum_budget(self) -> int:
        return TARGETS[self.target]["psum_bytes_per_partition"]

    @property
    def nc_version(self) -> int:
        return TARGETS[self.target]["nc_version"]


def _from_environment() -> SimConfig:
    changes = {}
    target = os.environ.get("NKI_OPS_SIM_TARGET")
    if target:
        changes["target"] = target
    timing = os.environ.get("NKI_OPS_SIM_TIMING_ONLY", "")
    if timing not in ("", "0", "1"):
        raise ValueError(f"NKI_OPS_SIM_TIMING_ONLY must be 0 or 1, got {timing!r}")
    changes["timing_only"] = timing == "1"
    replay = os.environ.get("NKI_OPS_SIM_REPLAY", "")
    if replay not in ("", "0", "1"):
        raise ValueError(f"NKI_OPS_SIM_REPLAY must be 0 or 1, got {replay!r}")
    changes["replay"] = replay != "0"
    races = os.environ.get("NKI_OPS_SIM_RACES")
    if races:
        changes["races"] = races
    return SimConfig(**changes)


_current = _from_environment()


def current_config() -> SimConfig:
    return _current


@contextlib.contextmanager
def configure(config: SimConfig | None = None, **changes) -> Iterator[SimConfig]:
    """Use ``config`` (or the current one with ``changes``) for every kernel run inside the block."""
    global _current
    previous = _current
    _current = dataclasses.replace(config or previous, **changes)
    try:
        yield _current
    finally:
        _current = previous
