"""``nki.isa.constants``: the enums ISA calls take (engine, reduce_cmd, dge_mode, oob_mode, ...)."""

from __future__ import annotations

import enum

from ....core import enums

# The enums both generations share are defined once in the core.
engine, reduce_cmd, nc_version, oob_mode = enums.spelled(__name__)


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
