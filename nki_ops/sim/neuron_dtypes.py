"""A stand-in for the Neuron SDK's ``neuron_dtypes`` host package, on ml_dtypes.

``install()`` registers it as ``neuron_dtypes`` when the real package is absent. It offers what
kernel test harnesses use: the NKI dtypes as NumPy dtypes, ``static_cast`` (round-to-nearest-even,
integers saturate), ``finfo``, ``sizeinbytes``, ``is_float_type``, and the packed MX types
(``float8_e4m3fn_x4``, ``float8_e5m2_x4``, ``float4_e2m1fn_x4``): ``static_cast`` to one packs four
values of the last axis into one element, ``static_cast`` from one unpacks them.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .core import dtypes as _dt
from .frontends.current.dtypes import (  # noqa: F401  (re-exported dtypes)
    bfloat16,
    bool_,
    float4_e2m1fn_x4,
    float8_e4m3,
    float8_e4m3fn,
    float8_e4m3fn_x4,
    float8_e5m2,
    float8_e5m2_x4,
    float8_e8m0fnu,
    float16,
    float32,
    int8,
    int16,
    int32,
    uint8,
    uint16,
    uint32,
)

float4_e2m1fn = np.dtype(ml_dtypes.float4_e2m1fn)
# Packed type -> (element type, bits per value, storage unsigned type).
PACKED = {
    float8_e4m3fn_x4: (float8_e4m3fn, 8, np.uint32),
    float8_e5m2_x4: (float8_e5m2, 8, np.uint32),
    float4_e2m1fn_x4: (float4_e2m1fn, 4, np.uint16),
}


def _dtype(dtype) -> np.dtype:
    return dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)


def is_float_type(dtype) -> bool:
    dtype = _dtype(dtype)
    return dtype.kind == "f" or _dt.is_float(dtype) or dtype == float4_e2m1fn


def sizeinbytes(dtype) -> int:
    return _dtype(dtype).itemsize


def finfo(dtype):
    return ml_dtypes.finfo(_dtype(dtype))


def _pack(values: np.ndarray, packed: np.dtype) -> np.ndarray:
    element, bits, storage = PACKED[packed]
    if values.shape[-1] % 4:
        raise ValueError(f"packing into {packed.names[0]} needs a last axis divisible by 4, got {values.shape}")
    codes = np.asarray(values, np.float32).astype(element).view(np.uint8).astype(storage)
    codes = codes.reshape(values.shape[:-1] + (values.shape[-1] // 4, 4))
    word = np.zeros(codes.shape[:-1], storage)
    for k in range(4):
        word |= (codes[..., k] & storage((1 << bits) - 1)) << storage(bits * k)
    return word.view(packed)


def _unpack(values: np.ndarray, packed: np.dtype) -> np.ndarray:
    element, bits, storage = PACKED[packed]
    word = values.view(storage)
    parts = [((word >> storage(bits * k)) & storage((1 << bits) - 1)).astype(np.uint8) for k in range(4)]
    codes = np.stack(parts, axis=-1).reshape(values.shape[:-1] + (values.shape[-1] * 4,))
    return codes.view(element).astype(np.float32)


def static_cast(array, dtype) -> np.ndarray:
    """``array`` rounded into ``dtype`` as the device stores it (packed MX types: 4 values per element)."""
    dtype = _dtype(dtype)
    array = np.asarray(array)
    if dtype in PACKED:
        return array if array.dtype == dtype else _pack(array, dtype)
    if array.dtype in PACKED:
        return _dt.cast(_unpack(array, array.dtype), dtype)
    return _dt.cast(array, dtype)


__all__ = ["static_cast", "finfo", "sizeinbytes", "is_float_type", "bfloat16", "float8_e4m3", "float8_e5m2",
           "float8_e4m3fn", "float8_e8m0fnu", "float4_e2m1fn", "float8_e4m3fn_x4", "float8_e5m2_x4",
           "float4_e2m1fn_x4"]
