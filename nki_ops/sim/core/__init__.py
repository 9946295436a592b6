"""The simulator core: what both API generations share.

In import order, nothing importing upward: ``errors``, ``dtypes``, ``config``, ``poison`` (the tag of
never-written memory); ``liveness`` (on-chip capacity); ``run`` (per-thread launch state); ``tensors``
(the values: buffers, tensors, accesses, index expressions, masks); ``trace`` (the instruction record);
``memory`` (allocation, reads and writes with rounding and poison); ``indexing`` (subscripts); ``alu``
(operator tables); ``instructions`` (every instruction's semantics); ``outputs`` (the output spec of the one
calling convention: a legacy new tile or a current ``dst``); ``isa``, ``isa_dma``, ``isa_mx``, ``isa_random``
(the ``nisa`` instructions taking that spec); ``enums`` (the enum values both generations share). Front ends
build on these and add their spelling in subclasses; nothing here imports a front end.
"""

from . import alu, dtypes, indexing, liveness, memory, poison, races, run, tensors, trace
from .config import TARGETS, SimConfig, configure, current_config
from .errors import (
                     CapacityError,
                     KernelUsageError,
                     MemorySpaceError,
                     OutOfBoundsError,
                     RaceError,
                     SimulatorError,
                     SimulatorWarning,
                     TileLimitError,
                     UnsupportedError,
                     user_site,
)
from .indexing import Access, IndexExpr, Mask, index, mask_values
from .memory import (
                     PMAX,
                     PSUM_BANK_BYTES,
                     Buffer,
                     ParDim,
                     Placement,
                     Tensor,
                     assign,
                     check_tile_shape,
                     fit,
                     new_tensor,
                     private_hbm,
                     psum,
                     read,
                     sbuf,
                     shared_hbm,
                     tile_from_values,
                     value_of,
                     write,
)
from .run import Run, active_config, current_run, get_run, set_run, violation

__all__ = [
    "alu", "dtypes", "indexing", "liveness", "memory", "poison", "races", "run", "tensors", "trace", "TARGETS",
    "SimConfig", "configure", "current_config",
    "CapacityError", "KernelUsageError", "MemorySpaceError", "OutOfBoundsError", "RaceError", "SimulatorError",
    "SimulatorWarning", "TileLimitError", "UnsupportedError", "user_site", "Access", "IndexExpr", "Mask", "index",
    "mask_values", "PMAX", "PSUM_BANK_BYTES", "Buffer", "ParDim", "Placement", "Tensor", "assign", "check_tile_shape",
    "fit", "new_tensor", "private_hbm", "psum", "read", "sbuf", "shared_hbm", "tile_from_values", "value_of", "write",
    "Run", "active_config", "current_run", "get_run", "set_run", "violation",
]
