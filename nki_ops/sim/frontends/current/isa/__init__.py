"""``nki.isa`` (``nisa``) of the current API: destination passing. Each instruction writes ``dst``
(its dtype is the output dtype) and returns nothing; the semantics are the core instructions the
legacy front end uses too. Unknown keyword arguments are errors.
"""

from __future__ import annotations

from ....core.errors import NkiValidationError, refuse_unknown
from ....core.run import active_config
from . import constants
from .constants import (  # noqa: F401  (nki.isa re-exports the enums)
    dge_mode,
    dma_engine,
    engine,
    matmul_perf_mode,
    nc_version,
    oob_mode,
    reduce_cmd,
)
from .instruction import INSTRUCTIONS, NkiInstruction
from .registers import VirtualRegister, register_value

__all__ = ["constants", "engine", "reduce_cmd", "nc_version", "oob_mode", "dge_mode", "matmul_perf_mode",
           "dma_engine", "VirtualRegister", "NkiInstruction", "NkiValidationError", "INSTRUCTIONS", "register_value",
           "get_nc_version", "get_nc_sub_version"]

vector_engine, scalar_engine, gpsimd_engine = engine.vector, engine.scalar, engine.gpsimd
tensor_engine, unknown_engine = engine.tensor, engine.unknown


def get_nc_version() -> nc_version:
    return nc_version(active_config().nc_version)


def get_nc_sub_version() -> int:
    """The silicon revision within the target's generation: 0, the first (the API page's default);
    no simulated target models a second revision."""
    return 0


# The instructions, each module declaring its own with @instruction (instruction.INSTRUCTIONS).
from . import dma, engines, gpsimd, lnc, mx, random, registers  # noqa: E402, F401

globals().update(INSTRUCTIONS)
__all__ += list(INSTRUCTIONS)


__getattr__ = refuse_unknown("nki.isa")
