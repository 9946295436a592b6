"""The random-number instructions in the one calling convention (``core/outputs.py``): ``dropout`` (both
generations), and the current API's ``rng``, ``rand2``, ``set_rng_seed``, ``rand_set_state`` and
``rand_get_state``. The generators (per-lane XORWOW, state per engine and launch) are ``core/random.py``'s;
this module checks operands, engines and architecture versions as the API pages document them."""

from __future__ import annotations

import numpy as np

from . import dtypes as dt
from . import instructions as ins
from . import memory, replay
from . import random as prng
from .enums import ENGINE
from .errors import KernelUsageError, MemorySpaceError
from .instructions import check_engine_access, per_partition, require_tile_operand
from .memory import read
from .run import active_config, current_run

INTEGER = (dt.int8, dt.int16, dt.int32, dt.uint8, dt.uint16, dt.uint32)
_ENGINE_NAMES = {value: name for name, value in ENGINE.items()}
VECTOR, GPSIMD = ENGINE["vector"], ENGINE["gpsimd"]
STATE_ENGINES = {GPSIMD: 3, VECTOR: 4}  # rand_set_state/rand_get_state: engine -> first NeuronCore version


def engine_unit(engine, api: str, allowed: dict[int, int]) -> str:
    """The generator unit of ``engine``; ``allowed`` maps an engine to the first NeuronCore version where ``api``
    runs on it."""
    config = active_config()
    code = int(engine)
    if code not in allowed:
        names = " or ".join(_ENGINE_NAMES[e] for e in allowed)
        raise KernelUsageError(f"{api}: engine must be {names}, got {_ENGINE_NAMES.get(code, code)}")
    if config.nc_version < allowed[code]:
        raise KernelUsageError(f"{api} on the {_ENGINE_NAMES[code]} engine needs NeuronCore-v{allowed[code]} or "
                               f"newer; target is {config.target} (NeuronCore-v{config.nc_version})")
    return "vector" if code == VECTOR else "gpsimd"


def require_version(api: str, version: int) -> None:
    config = active_config()
    if config.nc_version < version:
        raise KernelUsageError(f"{api} is available only on NeuronCore-v{version} and newer; target is "
                               f"{config.target} (NeuronCore-v{config.nc_version})")


def partitions(x, api: str, arg: str) -> None:
    if x.shape[0] > prng.LANES:
        raise KernelUsageError(f"{api}: the partition size of '{arg}' must not exceed {prng.LANES}, got {x.shape[0]}")


def _dtype(x, allowed, api: str, arg: str) -> None:
    if x.dtype not in allowed:
        raise KernelUsageError(f"{api}: '{arg}' dtype must be one of {', '.join(str(d) for d in allowed)}, got "
                               f"{x.dtype}")


def rng(out, engine=VECTOR):
    """32 random bits per element, truncated to dst's integer dtype (least significant bits)."""
    api, dst = out.api, out.dst
    unit = engine_unit(engine, api, {VECTOR: 2, GPSIMD: 3})
    check_engine_access(dst, int(engine), api, "dst")
    _dtype(dst, INTEGER, api, "dst")
    partitions(dst, api, "dst")
    words = prng.bits(current_run(api), unit, dst.shape)
    # Wrap to the low bits as the hardware does; ``put`` then stores them unchanged.
    return out.put(words.astype(dst.dtype).astype(np.float64))


def rand2(out, low, high):
    """Uniform fp32 values in [low, high) (scalars or (P, 1) per-partition), cast to dst's dtype
    (NeuronCore-v4 and newer)."""
    api, dst = out.api, out.dst
    require_version(api, 4)
    partitions(dst, api, "dst")
    low = per_partition(low, dst.shape[0], api, "min", len(dst.shape))
    high = per_partition(high, dst.shape[0], api, "max", len(dst.shape))
    if np.any(low >= high):
        raise KernelUsageError(f"{api}: min must be less than max, got min={low.ravel().tolist()} "
                               f"max={high.ravel().tolist()}")
    unit = prng.uniform(current_run(api), "vector", dst.shape)
    return out.put((low + unit * (high - low)).astype(np.float32).astype(np.float64))


def dropout(out, data, prob):
    """Each element of ``data`` replaced by zero with probability ``prob`` (a scalar or (P, 1)) from the Vector
    engine's generators; kept values unscaled. An integer input keeps its dtype (the current API: any input)."""
    api = out.api
    out.on_chip(data, "data")
    dtype = out.out_dtype(data.dtype)
    if out.current:
        if dtype != data.dtype:
            raise KernelUsageError(f"{api}: dst dtype {dtype} must match data dtype {data.dtype}")
        if tuple(out.dst.shape) != tuple(data.shape):
            raise KernelUsageError(f"{api}: dst shape {list(out.dst.shape)} must match data shape "
                                   f"{list(data.shape)}")
        return out.put(dropped(data, prob, api))
    if data.dtype.kind in "iu" and dtype != data.dtype:
        raise KernelUsageError(f"{api}: an integer input keeps its dtype, got dtype={dtype}")
    return out.put(ins.dropout(api, read(data, api, "data", out.selected), prob, current_run(api)), data.dtype)


def dropped(data, prob, api: str) -> np.ndarray:
    """``nisa.dropout`` and ``nl.dropout`` of the current API: ``data``'s values (storage dtype), each zeroed
    with probability ``prob`` from the Vector engine's generators; kept values unscaled."""
    require_tile_operand(data, api, "data")
    memory.require_on_chip(data, api, "data")
    partitions(data, api, "data")
    if hasattr(prob, "dtype") and not dt.is_float(data.dtype) and prob.dtype != dt.float32:
        raise KernelUsageError(f"{api}: prob must be float32 for integer data ({data.dtype}), got {prob.dtype}")
    if hasattr(prob, "dtype") and not dt.is_float(prob.dtype):
        raise KernelUsageError(f"{api}: prob must be a float type, got {prob.dtype}")
    return ins.dropout(api, read(data, api, "data"), prob, current_run(api))


def seed_vector_engine(src_seeds, api: str) -> None:
    """``set_rng_seed`` and ``nl.random_seed``: the Vector engine's generators seeded from the documented [1, 1]
    32-bit seed tensor (SBUF or PSUM)."""
    require_tile_operand(src_seeds, api, "src_seeds")
    memory.require_on_chip(src_seeds, api, "src_seeds")
    if tuple(src_seeds.shape) != (1, 1):
        raise KernelUsageError(f"{api}: src_seeds must be a [1, 1] tensor, got {list(src_seeds.shape)}")
    if src_seeds.dtype.itemsize != 4:
        raise KernelUsageError(f"{api}: src_seeds must hold a 32-bit value, got {src_seeds.dtype}")
    seed = np.asarray(read(src_seeds, api, "src_seeds")).astype(src_seeds.dtype).view(np.uint32)
    prng.set_seed(current_run(api), "vector", int(seed.ravel()[0]))


def _state_operand(x, unit: str, api: str, arg: str) -> None:
    _dtype(x, (dt.uint32,), api, arg)
    partitions(x, api, arg)
    words = prng.GENERATORS[unit] * prng.WORDS
    per_lane = int(np.prod(x.shape[1:], dtype=np.int64))
    if len(x.shape) != 2 or per_lane != words:
        raise KernelUsageError(f"{api}: '{arg}' must be a 2D uint32 tensor [lanes, {words}] on the {unit} engine "
                               f"(XORWOW: {prng.WORDS} words x {prng.GENERATORS[unit]} generators per lane), got "
                               f"{list(x.shape)}")


def rand_set_state(api: str, src_seeds, engine=GPSIMD) -> None:
    """Lane p's generator states become row p of ``src_seeds`` (uint32, SBUF)."""
    require_version(api, 3)
    unit = engine_unit(engine, api, STATE_ENGINES)
    require_tile_operand(src_seeds, api, "src_seeds")
    if src_seeds.buffer is not memory.sbuf:
        raise MemorySpaceError(f"Expected operand 'src_seeds' of '{api}' to be in address space 'sbuf', but got a "
                               f"tensor in '{src_seeds.buffer.space}' instead (tensor '{src_seeds.name}')")
    _state_operand(src_seeds, unit, api, "src_seeds")
    state = np.asarray(read(src_seeds, api, "src_seeds")).astype(np.uint32)
    prng.set_state(current_run(api), unit, state)


def rand_get_state(out, engine=GPSIMD):
    """Row p of dst (uint32) receives lane p's generator states."""
    api, dst = out.api, out.dst
    require_version(api, 3)
    unit = engine_unit(engine, api, STATE_ENGINES)
    check_engine_access(dst, int(engine), api, "dst")
    if active_config().nc_version < 4 and dst.buffer is not memory.sbuf:
        raise MemorySpaceError(f"Expected operand 'dst' of '{api}' to be in address space 'sbuf' on "
                               f"{active_config().target}, got '{dst.buffer.space}'")
    _state_operand(dst, unit, api, "dst")
    return out.put(prng.get_state(current_run(api), unit, dst.shape[0]).astype(np.float64))


replay.steps(globals(), helpers=("engine_unit", "partitions", "require_version"))  # a call: a replay step
