"""The simulator core: what both API generations share.

``run`` (per-thread launch state and config), ``memory`` (buffers, tensors, allocation, reads and
writes with rounding and poison), ``indexing`` (subscripts and index expressions), ``alu``
(element-wise operators), ``dtypes`` and ``errors``. Front ends (``frontends.legacy`` for
``neuronxcc.nki``) build on these; nothing here imports a front end.
"""

from . import alu, dtypes, indexing, liveness, memory, run, trace
from .config import TARGETS, SimConfig, configure, current_config
from .errors import (
                     CapacityError,
                     KernelUsageError,
                     MemorySpaceError,
                     OutOfBoundsError,
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
    "alu", "dtypes", "indexing", "liveness", "memory", "run", "trace", "TARGETS", "SimConfig", "configure",
    "current_config",
    "CapacityError", "KernelUsageError", "MemorySpaceError", "OutOfBoundsError", "SimulatorError",
    "SimulatorWarning", "TileLimitError", "UnsupportedError", "user_site", "Access", "IndexExpr", "Mask", "index",
    "mask_values", "PMAX", "PSUM_BANK_BYTES", "Buffer", "ParDim", "Placement", "Tensor", "assign", "check_tile_shape",
    "fit",
    "new_tensor", "private_hbm", "psum", "read", "sbuf", "shared_hbm", "tile_from_values", "value_of", "write",
    "Run", "active_config", "current_run", "get_run", "set_run", "violation",
]
