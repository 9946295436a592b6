"""The values of the ``nisa`` enums both API generations share, defined once; each front end makes them its
documented classes (``nki.isa.engine``, ``nki.isa.constants.engine``, ...) with ``spelled``. ``dge_mode``
is not here: the two generations number it differently."""

from __future__ import annotations

import enum

ENGINE = {"unknown": 0, "tensor": 1, "scalar": 2, "gpsimd": 3, "dma": 4, "vector": 5, "sync": 6}
REDUCE_CMD = {"idle": 0, "reset": 1, "reduce": 2, "reset_reduce": 3,
              "load_reduce": 4}  # load_reduce: tensor_scalar_cumulative's accumulator starts at imm1
NC_VERSION = {"gen2": 2, "gen3": 3, "gen4": 4}
OOB_MODE = {"error": 0, "skip": 1}


def spelled(module: str) -> tuple[type[enum.IntEnum], ...]:
    """``engine``, ``reduce_cmd``, ``nc_version`` and ``oob_mode`` as IntEnum classes of ``module``."""
    return tuple(enum.IntEnum(name, values, module=module) for name, values in (
        ("engine", ENGINE), ("reduce_cmd", REDUCE_CMD), ("nc_version", NC_VERSION), ("oob_mode", OOB_MODE)))
