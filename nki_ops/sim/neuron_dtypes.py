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
from .core import mx as _mx
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
# The packed MX types: four values per element, laid out as in ``core/mx.py``.
PACKED = (float8_e4m3fn_x4, float8_e5m2_x4, float4_e2m1fn_x4)


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
    if values.shape[-1] % 4:
        raise ValueError(f"packing into {packed.names[0]} needs a last axis divisible by 4, got {values.shape}")
    lanes = np.asarray(values, np.float32).reshape(values.shape[:-1] + (values.shape[-1] // 4, 4))
    return _mx.pack(lanes, packed.names[0]).view(packed)


def _unpack(values: np.ndarray, packed: np.dtype) -> np.ndarray:
    return _mx.unpack(values, packed.names[0]).reshape(values.shape[:-1] + (values.shape[-1] * 4,))


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
