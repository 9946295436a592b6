"""``nki.language.dtypes`` (also ``nki.dtype``): the data types of the current API as NumPy dtypes.

bfloat16 and the fp8 types are ml_dtypes types, as in the real simulator with ``NKI_PRECISE_FP=1``.
The packed MX types (four fp8 or fp4 values per element) have no ml_dtypes counterpart: they are
opaque 32-bit (fp8 x4) or 16-bit (fp4 x4) element types that DMA moves but no engine computes on here.
"""

from __future__ import annotations

import numpy as np

from ...core import dtypes as _dt

bool_ = _dt.bool_
int8, int16, int32 = _dt.int8, _dt.int16, _dt.int32
uint8, uint16, uint32 = _dt.uint8, _dt.uint16, _dt.uint32
float16, float32, bfloat16 = _dt.float16, _dt.float32, _dt.bfloat16
float8_e4m3, float8_e5m2 = _dt.float8_e4m3, _dt.float8_e5m2
float8_e4m3fn, float8_e8m0fnu = _dt.float8_e4m3fn, _dt.float8_e8m0fnu
DType = np.dtype  # the type of every dtype above (the API names it for annotations)
tfloat32 = float32  # stored as fp32; the Tensor engine's tf32 rounding is not modelled

# Distinct opaque types: the field name tells them apart (they are dict keys in kernels' tables).
float8_e4m3fn_x4 = np.dtype([("float8_e4m3fn_x4", np.uint32)])
float8_e5m2_x4 = np.dtype([("float8_e5m2_x4", np.uint32)])
float4_e2m1fn_x4 = np.dtype([("float4_e2m1fn_x4", np.uint16)])
PACKED = {float8_e4m3fn_x4: float8_e4m3fn, float8_e5m2_x4: float8_e5m2}

SUPPORTED = _dt.CURRENT_SUPPORTED + (float8_e4m3fn_x4, float8_e5m2_x4, float4_e2m1fn_x4)


def as_dtype(dtype) -> np.dtype:
    """A dtype argument (NumPy type, string, torch dtype) as a supported np.dtype; float64 is refused."""
    return _dt.as_dtype(dtype, SUPPORTED)


__all__ = ["DType", "bool_", "int8", "int16", "int32", "uint8", "uint16", "uint32", "float16", "float32", "bfloat16",
           "float8_e4m3", "float8_e5m2", "float8_e4m3fn", "float8_e8m0fnu", "tfloat32", "float8_e4m3fn_x4",
           "float8_e5m2_x4", "float4_e2m1fn_x4", "as_dtype"]
