"""Random-number instructions of the current API: ``nisa.rng``, ``rand2``, ``dropout``,
``set_rng_seed``, ``rand_set_state``, ``rand_get_state``. The generators (per-lane XORWOW, state
per engine and launch) are in ``core/random.py``; this module checks operands, engines and
architecture versions as the API pages document them."""

from __future__ import annotations

import numpy as np

from ....core import dtypes as dt
from ....core import isa, memory
from ....core import random as prng
from ....core.errors import KernelUsageError, MemorySpaceError
from ....core.instructions import check_engine_access, per_partition, require_tile_operand
from ....core.outputs import Dst
from ....core.run import active_config, current_run
from .constants import engine as _engine
from .instruction import instruction

_INTEGER = (dt.int8, dt.int16, dt.int32, dt.uint8, dt.uint16, dt.uint32)


def _engine_name(engine, api: str, allowed: dict[int, int]) -> str:
    """``allowed`` maps an engine to the first NeuronCore version where ``api`` runs on it."""
    config = active_config()
    code = int(engine)
    if code not in allowed:
        names = " or ".join(_engine(e).name for e in allowed)
        raise KernelUsageError(f"{api}: engine must be {names}, got {_engine(code).name}")
    if config.nc_version < allowed[code]:
        raise KernelUsageError(f"{api} on the {_engine(code).name} engine needs NeuronCore-v{allowed[code]} or "
                               f"newer; target is {config.target} (NeuronCore-v{config.nc_version})")
    return "vector" if code == _engine.vector else "gpsimd"


def _require_version(api: str, version: int) -> None:
    config = active_config()
    if config.nc_version < version:
        raise KernelUsageError(f"{api} is available only on NeuronCore-v{version} and newer; target is "
                               f"{config.target} (NeuronCore-v{config.nc_version})")


def _partitions(x, api: str, arg: str) -> None:
    if x.shape[0] > prng.LANES:
        raise KernelUsageError(f"{api}: the partition size of '{arg}' must not exceed {prng.LANES}, got {x.shape[0]}")


def _dtype(x, allowed, api: str, arg: str) -> None:
    if x.dtype not in allowed:
        raise KernelUsageError(f"{api}: '{arg}' dtype must be one of {', '.join(str(d) for d in allowed)}, got "
                               f"{x.dtype}")


@instruction
def rng(dst, engine=_engine.vector, name=None):
    """32 random bits per element, truncated to ``dst``'s integer dtype (least significant bits)."""
    api = "nisa.rng"
    out = Dst(dst, api)
    unit = _engine_name(engine, api, {_engine.vector: 2, _engine.gpsimd: 3})
    check_engine_access(dst, int(engine), api, "dst")
    _dtype(dst, _INTEGER, api, "dst")
    _partitions(dst, api, "dst")
    words = prng.bits(current_run(api), unit, dst.shape)
    # Wrap to the low bits as the hardware does; ``_write`` then stores them unchanged.
    out.put(words.astype(dst.dtype).astype(np.float64))


@instruction
def rand2(dst, min, max, name=None):  # noqa: A002  (the documented keyword names)
    """Uniform fp32 values in [min, max) (scalars or (P, 1) per-partition), cast to ``dst``'s dtype."""
    api = "nisa.rand2"
    out = Dst(dst, api)
    _require_version(api, 4)
    _partitions(dst, api, "dst")
    low = per_partition(min, dst.shape[0], api, "min", len(dst.shape))
    high = per_partition(max, dst.shape[0], api, "max", len(dst.shape))
    if np.any(low >= high):
        raise KernelUsageError(f"{api}: min must be less than max, got min={low.ravel().tolist()} "
                               f"max={high.ravel().tolist()}")
    unit = prng.uniform(current_run(api), "vector", dst.shape)
    out.put((low + unit * (high - low)).astype(np.float32).astype(np.float64))


@instruction
def dropout(dst, data, prob, name=None):
    """Zero each element of ``data`` with probability ``prob`` (scalar or (P, 1)); kept values are not
    scaled. ``dst.dtype`` must equal ``data.dtype``."""
    isa.dropout(Dst(dst, "nisa.dropout"), data, prob)


dropped = isa.dropped  # nl.dropout's too


@instruction
def set_rng_seed(src_seeds, name=None):
    """Seed the Vector engine's generators from one 32-bit value in a [1, 1] SBUF/PSUM tensor."""
    seed_vector_engine(src_seeds, "nisa.set_rng_seed")


def seed_vector_engine(src_seeds, api: str) -> None:
    """``set_rng_seed`` and ``nl.random_seed``: the documented [1, 1] 32-bit seed tensor."""
    require_tile_operand(src_seeds, api, "src_seeds")
    memory.require_on_chip(src_seeds, api, "src_seeds")
    if tuple(src_seeds.shape) != (1, 1):
        raise KernelUsageError(f"{api}: src_seeds must be a [1, 1] tensor, got {list(src_seeds.shape)}")
    if src_seeds.dtype.itemsize != 4:
        raise KernelUsageError(f"{api}: src_seeds must hold a 32-bit value, got {src_seeds.dtype}")
    seed = np.asarray(memory.read(src_seeds, api, "src_seeds")).astype(src_seeds.dtype).view(np.uint32)
    prng.set_seed(current_run(api), "vector", int(seed.ravel()[0]))


def _state_operand(x, unit: str, api: str, arg: str) -> None:
    _dtype(x, (dt.uint32,), api, arg)
    _partitions(x, api, arg)
    words = prng.GENERATORS[unit] * prng.WORDS
    per_lane = int(np.prod(x.shape[1:], dtype=np.int64))
    if len(x.shape) != 2 or per_lane != words:
        raise KernelUsageError(f"{api}: '{arg}' must be a 2D uint32 tensor [lanes, {words}] on the {unit} engine "
                               f"(XORWOW: {prng.WORDS} words x {prng.GENERATORS[unit]} generators per lane), got "
                               f"{list(x.shape)}")


@instruction
def rand_set_state(src_seeds, engine=_engine.gpsimd, name=None):
    """Lane p's generator states become row p of ``src_seeds`` (uint32, SBUF)."""
    api = "nisa.rand_set_state"
    _require_version(api, 3)
    unit = _engine_name(engine, api, {_engine.gpsimd: 3, _engine.vector: 4})
    require_tile_operand(src_seeds, api, "src_seeds")
    if src_seeds.buffer is not memory.sbuf:
        raise MemorySpaceError(f"Expected operand 'src_seeds' of '{api}' to be in address space 'sbuf', but got a "
                               f"tensor in '{src_seeds.buffer.space}' instead (tensor '{src_seeds.name}')")
    _state_operand(src_seeds, unit, api, "src_seeds")
    state = np.asarray(memory.read(src_seeds, api, "src_seeds")).astype(np.uint32)
    prng.set_state(current_run(api), unit, state)


@instruction
def rand_get_state(dst, engine=_engine.gpsimd, name=None):
    """Row p of ``dst`` (uint32) receives lane p's generator states."""
    api = "nisa.rand_get_state"
    out = Dst(dst, api)
    _require_version(api, 3)
    unit = _engine_name(engine, api, {_engine.gpsimd: 3, _engine.vector: 4})
    check_engine_access(dst, int(engine), api, "dst")
    if active_config().nc_version < 4 and dst.buffer is not memory.sbuf:
        raise MemorySpaceError(f"Expected operand 'dst' of '{api}' to be in address space 'sbuf' on "
                               f"{active_config().target}, got '{dst.buffer.space}'")
    _state_operand(dst, unit, api, "dst")
    out.put(prng.get_state(current_run(api), unit, dst.shape[0]).astype(np.float64))
