"""NKI data types (NumPy and ml_dtypes), the legacy type-promotion rules and value casting.

Engines compute in fp32; a value is rounded (round-to-nearest-even) when it lands in a
typed buffer. fp32 -> integer casts round to nearest even and saturate; NaN becomes 0.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

bool_ = np.dtype(np.bool_)
int8, int16, int32 = np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32)
uint8, uint16, uint32 = np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32)
float16, float32 = np.dtype(np.float16), np.dtype(np.float32)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
# The legacy ``float8_e4m3`` is the IEEE-style variant (has infinities, max 240).
float8_e4m3 = np.dtype(ml_dtypes.float8_e4m3)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
# Current-API additions: OCP e4m3 (no infinities, max 448) and the MX scale type.
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e8m0fnu = np.dtype(ml_dtypes.float8_e8m0fnu)

SUPPORTED = (bool_, int8, int16, int32, uint8, uint16, uint32, float16, float32, bfloat16, float8_e4m3,
             float8_e5m2)
CURRENT_SUPPORTED = SUPPORTED + (float8_e4m3fn, float8_e8m0fnu)
_FLOATS = {float8_e4m3: 1, float8_e5m2: 1, float8_e4m3fn: 1, float8_e8m0fnu: 1, float16: 2, bfloat16: 2,
           float32: 4}


# (dtype argument, id of the supported tuple) -> np.dtype: every allocation asks, with a handful of arguments.
_known: dict[tuple, np.dtype] = {}


def as_dtype(dtype, supported=SUPPORTED) -> np.dtype:
    """Normalise a dtype argument (NumPy type, np.dtype, string, torch dtype) to a supported np.dtype."""
    try:
        return _known[dtype, id(supported)]
    except (KeyError, TypeError):  # TypeError: an unhashable argument, normalised (and refused) below
        pass
    result = _as_dtype(dtype, supported)
    _known[dtype, id(supported)] = result
    return result


def _as_dtype(dtype, supported) -> np.dtype:
    if dtype is None:
        raise TypeError("dtype must not be None here")
    if not isinstance(dtype, np.dtype):
        if type(dtype).__module__ == "torch":
            dtype = str(dtype).removeprefix("torch.")
        dtype = np.dtype(dtype)
    if dtype not in supported:
        names = ", ".join(str(d) for d in supported)
        raise TypeError(f"dtype {dtype} is not an NKI data type; expected one of: {names}")
    return dtype


def is_float(dtype: np.dtype) -> bool:
    return dtype in _FLOATS


def scalar_dtype(value) -> np.dtype:
    """Python scalars are typed, not weak: bool -> uint8, int -> int32, float -> float32."""
    if isinstance(value, (bool, np.bool_)):
        return uint8
    if isinstance(value, (int, np.integer)):
        return int32 if isinstance(value, int) else np.dtype(type(value))
    if isinstance(value, np.floating):
        return np.dtype(type(value)) if np.dtype(type(value)) in _FLOATS else float32
    return float32


def promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """The legacy NKI promotion of two operand dtypes (bool counts as uint8)."""
    a = uint8 if a == bool_ else a
    b = uint8 if b == bool_ else b
    if a == b:
        return a
    fa, fb = a in _FLOATS, b in _FLOATS
    if fa != fb:
        return a if fa else b
    if fa:
        pair = {a, b}
        if pair == {float16, bfloat16}:
            return float32
        if pair == {float8_e4m3, float8_e5m2}:
            return bfloat16
        return a if _FLOATS[a] > _FLOATS[b] else b
    if a.kind == b.kind:
        return a if a.itemsize > b.itemsize else b
    signed, unsigned = (a, b) if a.kind == "i" else (b, a)
    if signed.itemsize > unsigned.itemsize:
        return signed
    return {1: int16, 2: int32}.get(unsigned.itemsize, float32)


def result_dtype(dtypes) -> np.dtype:
    it = iter(dtypes)
    out = next(it)
    for d in it:
        out = promote(out, d)
    return out


def cast(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Round ``values`` into ``dtype`` as a store into a typed buffer does."""
    if values.dtype == dtype:
        return values
    if dtype == bool_:
        return values != 0
    if dtype.kind in "iu" and values.dtype.kind == "f":
        info = np.iinfo(dtype)
        with np.errstate(invalid="ignore"):
            rounded = np.rint(np.nan_to_num(values.astype(np.float64, copy=False), nan=0.0))
        return np.clip(rounded, info.min, info.max).astype(dtype)
    if dtype.kind in "iu" and values.dtype.kind in "iub":
        info = np.iinfo(dtype)
        return np.clip(values, info.min, info.max).astype(dtype)
    if values.dtype is float32 and dtype in _FP8:
        return _fp8_of_f32(values, dtype)
    if values.dtype in _ONE_BYTE_FLOATS and dtype in _FLOATS and values.ndim:
        return _by_table(values, dtype)
    return values.astype(dtype)


_FP8 = (float8_e4m3, float8_e5m2, float8_e4m3fn)
_fp8_tables: dict[np.dtype, np.ndarray] = {}


def _fp8_of_f32(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``values.astype(dtype)``, 6x faster than ml_dtypes' element-by-element conversion. Rounding to 3 or 2
    mantissa bits looks at the top 16 bits of an fp32 value (sign, exponent, the kept and the round bits)
    and whether any lower bit is set (the sticky bit), so a table over those 2^17 keys, filled by
    ml_dtypes itself, gives every value's byte."""
    table = _fp8_tables.get(dtype)
    if table is None:
        top = np.arange(1 << 16, dtype=np.uint32) << 16
        with np.errstate(invalid="ignore", over="ignore"):
            table = np.stack([top, top | 1], axis=1).reshape(-1).view(np.float32).astype(dtype)
        table = _fp8_tables[dtype] = table.view(np.uint8)
    bits = np.asarray(values).view(np.uint32)
    return table.take(((bits >> 16) << 1) | ((bits & 0xFFFF) != 0)).view(dtype)


# ml_dtypes converts a one-byte float type element by element, at 5-6 ns each on this CPU. Each of the 256
# bytes' values in another float type, converted once by ml_dtypes itself (NaN payloads too), is a table
# whose lookup takes 0.7 ns. NumPy's fp16 to fp32 takes 1.2-2.4 ns an element, a lookup in the 65,536
# values' table 0.6-0.9 (unless the last axis steps far: the lookup's index then goes slower).
_ONE_BYTE_FLOATS = frozenset((float8_e4m3, float8_e5m2, float8_e4m3fn, float8_e8m0fnu,
                              np.dtype(ml_dtypes.float4_e2m1fn)))
_tables: dict[tuple[np.dtype, np.dtype, bool], np.ndarray] = {}


def _by_table(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``values`` (a one- or two-byte float type) as ``dtype``, a float type, by a table of every bit pattern.
    One-byte values whose last axis is contiguous and even go two at a time into a one- or two-byte type,
    through a table of every pair (a lookup's index is widened to 64 bits first: half as many lookups take
    half the time; into fp32, the pairs' 8-byte table took 5x longer a lookup here)."""
    paired = (values.itemsize == 1 and dtype.itemsize <= 2 and values.strides[-1] == 1
              and values.shape[-1] % 2 == 0)
    key = (values.dtype, dtype, paired)
    table = _tables.get(key)
    if table is None:
        width = values.itemsize * (1 + paired)
        patterns = np.arange(1 << 8 * width, dtype=f"u{width}").view(f"u{values.itemsize}")
        with np.errstate(all="ignore"):
            table = patterns.view(values.dtype).astype(dtype)
        if paired:
            table = table.view(f"u{2 * dtype.itemsize}")
        _tables[key] = table
    if paired:
        return table.take(values.view(np.uint16)).view(dtype)
    return table.take(values.view(f"u{values.itemsize}"))


def to_f32(values: np.ndarray) -> np.ndarray:
    """``values`` in fp32 (themselves when they are fp32)."""
    if values.dtype is float32:
        return values
    if not values.ndim:
        return values.astype(np.float32, copy=False)
    if values.dtype in _ONE_BYTE_FLOATS or (values.dtype is float16 and abs(values.strides[-1]) <= 64):
        return _by_table(values, float32)
    if values.dtype is bfloat16 and values.strides[-1] != 2:
        # ml_dtypes' cast takes 1.7 ns an element with a step in the last axis, NumPy's 16 to 32-bit widening
        # 0.4, and a bf16 is the top half of its fp32 (every bit pattern, NaN payloads included).
        return (values.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32, copy=False)
