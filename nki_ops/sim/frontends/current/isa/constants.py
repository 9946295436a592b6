"""``nki.isa.constants``: the enums ISA calls take (engine, reduce_cmd, dge_mode, oob_mode, ...)."""

from __future__ import annotations

import enum


class engine(enum.IntEnum):
    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


class reduce_cmd(enum.IntEnum):
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class nc_version(enum.IntEnum):
    gen2 = 2
    gen3 = 3
    gen4 = 4


class oob_mode(enum.IntEnum):
    error = 0
    skip = 1


class dge_mode(enum.IntEnum):
    # The API's numbering: kernels pass raw values (the kernel library's ``_DGE_MODE_NONE = 3``).
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class matmul_perf_mode(enum.IntEnum):
    none = 0
    double_row = 1


class dma_engine(enum.IntEnum):
    dma = 1
    gpsimd_dma = 2


__all__ = ["engine", "reduce_cmd", "nc_version", "oob_mode", "dge_mode", "matmul_perf_mode", "dma_engine"]
