"""Microscaling (OCP MX) data: the packed x4 element types, block scales and their SBUF layout.

A packed element holds four fp8 (32-bit word) or fp4 (16-bit word) values of consecutive free
positions, value ``j`` in bits ``[bits * j, bits * (j + 1))``. A scaling group is 32 values:
8 partitions x the 4 values of one packed element. Its scale is an E8M0 byte (a biased power of
two, 0xFF = NaN). Scales stay in their group's 32-partition quadrant: the groups of data
partitions ``8g .. 8g + 7`` of quadrant ``q`` have their scales on partition ``32q + g`` of the
scale tile (trn3 arch guide, "Quad-MXFP8/MXFP4 Matmul Performance"; MXFP deep dive, "Scale
Tensor" and "Packing Scale Values"). Packed dtypes are known here by name (``dtype.names[0]``).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from . import dtypes as dt

QUADRANT = 32
GROUP_PARTITIONS = 8
SCALES_PER_QUADRANT = QUADRANT // GROUP_PARTITIONS
# Where a scale tile may start within its quadrant (the deep dive's packing offsets).
SCALE_OFFSETS = (0, 4, 8, 12)
E8M0_BIAS, E8M0_NAN = 127, 0xFF

# Packed name -> (element type, bits per value, storage word, E_max of the element type).
ELEMENTS = {
    "float8_e4m3fn_x4": (np.dtype(ml_dtypes.float8_e4m3fn), 8, np.dtype(np.uint32), 8),
    "float8_e5m2_x4": (np.dtype(ml_dtypes.float8_e5m2), 8, np.dtype(np.uint32), 15),
    "float4_e2m1fn_x4": (np.dtype(ml_dtypes.float4_e2m1fn), 4, np.dtype(np.uint16), 2),
}


def packed_name(dtype: np.dtype) -> str | None:
    """The MX name of a packed dtype, or None for any other dtype."""
    return dtype.names[0] if dtype.names and dtype.names[0] in ELEMENTS else None


def unpack(words: np.ndarray, name: str) -> np.ndarray:
    """Packed elements ``[..., F]`` -> their values ``[..., F, 4]`` in fp32."""
    element, bits, storage, _ = ELEMENTS[name]
    word = np.ascontiguousarray(words).view(storage)
    lanes = [((word >> storage.type(bits * j)) & storage.type((1 << bits) - 1)).astype(np.uint8)
             for j in range(4)]
    return dt.to_f32(np.stack(lanes, axis=-1).view(element))


def pack(values: np.ndarray, name: str) -> np.ndarray:
    """Values ``[..., F, 4]`` (already representable) -> packed storage words ``[..., F]``."""
    element, bits, storage, _ = ELEMENTS[name]
    codes = np.asarray(values, np.float32).astype(element).view(np.uint8).astype(storage)
    word = np.zeros(codes.shape[:-1], storage)
    for j in range(4):
        word |= (codes[..., j] & storage.type((1 << bits) - 1)) << storage.type(bits * j)
    return word


def scale_values(scale_bytes: np.ndarray) -> np.ndarray:
    """E8M0 bytes -> the powers of two they encode (fp32; 0xFF is NaN)."""
    exponent = scale_bytes.astype(np.int32) - E8M0_BIAS
    values = np.ldexp(np.float32(1.0), exponent).astype(np.float32)
    return np.where(scale_bytes == E8M0_NAN, np.float32(np.nan), values)


def scale_rows(partitions: int) -> np.ndarray:
    """For data partitions ``0 .. partitions - 1`` (a multiple of 8), the scale tile partition of each
    of their groups: quadrant q's groups sit on partitions ``32q .. 32q + 3``."""
    groups = np.arange(partitions // GROUP_PARTITIONS)
    return QUADRANT * (groups // SCALES_PER_QUADRANT) + groups % SCALES_PER_QUADRANT


def quantize(values: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """MXFP8 quantization of fp32 ``values [P, F, 4]`` (P a multiple of 8) as AWS's references that
    mimic the hardware compute it (the MX deep dive's and the kernel library's goldens): per group,
    the scale byte is the largest biased fp32 exponent field of its 32 values minus E_max (the OCP
    scale; Inf and NaN have field 255, bf16 denormals and zeros field 0), at least 0 (an all-zero
    group gets 2^-127, as the quantize_mx page says); the values divided by that scale are clipped
    to the element type's largest finite value, then rounded to nearest even (NaN stays NaN).
    Returns (packed words [P, F], scale bytes [P // 8, F])."""
    element, _, _, e_max = ELEMENTS[name]
    largest = float(ml_dtypes.finfo(element).max)
    partitions, free = values.shape[0], values.shape[1]
    groups = np.asarray(values, np.float32).reshape(partitions // GROUP_PARTITIONS, GROUP_PARTITIONS, free, 4)
    field = (groups.view(np.uint32) >> np.uint32(23)) & np.uint32(0xFF)
    scale = np.maximum(field.max(axis=(1, 3)).astype(np.int32) - e_max, 0).astype(np.uint8)
    divisor = np.ldexp(np.float64(1.0), scale.astype(np.int32) - E8M0_BIAS)[:, None, :, None]
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = np.clip(groups.astype(np.float64) / divisor, -largest, largest).astype(np.float32)
    return pack(scaled.reshape(partitions, free, 4), name), scale


def dequantize(words: np.ndarray, scale_bytes: np.ndarray, name: str) -> np.ndarray:
    """Packed ``words [P, F]`` with their scales ``[P // 8, F]`` -> fp32 values ``[P, F, 4]``."""
    values = unpack(words, name)
    scale = np.repeat(scale_values(scale_bytes), GROUP_PARTITIONS, axis=0)
    with np.errstate(invalid="ignore", over="ignore"):
        return values * scale[:, :, None]
