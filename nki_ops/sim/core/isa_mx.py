"""The MX (microscaling) instructions of the current API in the one calling convention (``core/outputs.py``):
``quantize_mx`` (Vector engine) and ``nc_matmul_mx`` (Tensor engine), NeuronCore-v4 (trn3) and later. The
data and scale semantics are ``core/mx.py``'s; this module checks operands as the API pages document them."""

from __future__ import annotations

import numpy as np

from . import blas, memory, mx, replay, trace
from . import dtypes as dt
from .errors import KernelUsageError, MemorySpaceError, TileLimitError
from .instructions import TENSOR, VECTOR, require_tile_operand
from .outputs import require_v4, write_dst
from .run import violation

_SCALE_DTYPES = (dt.uint8, dt.float8_e8m0fnu)


def _sbuf(x, api: str, arg: str) -> None:
    require_tile_operand(x, api, arg)
    if x.buffer is not memory.sbuf:
        raise MemorySpaceError(f"Expected operand '{arg}' of '{api}' to be in address space 'sbuf', but got a "
                               f"tensor in '{x.buffer.space}' instead (tensor '{x.name}')")


def _start_partition(x) -> int:
    """The first partition of an on-chip view within its allocation."""
    root = x.root._storage()
    return (x._storage().__array_interface__["data"][0] - root.__array_interface__["data"][0]) // root.strides[0]


def _scale_partitions(data, scale, api: str, data_arg: str, scale_arg: str) -> np.ndarray:
    """The scale tile partitions holding the scales of ``data``'s groups, checked against the
    layout rule: each scale in its group's quadrant, the scale tile starting at offset 0, 4, 8 or
    12 of a quadrant."""
    partitions = data.shape[0]
    if partitions % mx.QUADRANT or partitions > 128:
        raise KernelUsageError(f"{api}: the partition size of '{data_arg}' must be a multiple of 32 up to 128, got "
                               f"{partitions}")
    data_start, scale_start = _start_partition(data), _start_partition(scale)
    if scale_start % mx.QUADRANT not in mx.SCALE_OFFSETS:
        raise KernelUsageError(f"{api}: '{scale_arg}' starts at partition {scale_start}; MX scales start at offset "
                               f"0, 4, 8 or 12 within a 32-partition quadrant")
    rows = mx.scale_rows(partitions)
    if rows[-1] >= scale.shape[0]:
        raise KernelUsageError(f"{api}: '{scale_arg}' has {scale.shape[0]} partitions; the scales of {partitions} "
                               f"data partitions occupy partitions {sorted(set(rows.tolist()))} of it (4 per "
                               f"32-partition quadrant)")
    groups = np.arange(rows.size) * mx.GROUP_PARTITIONS
    if np.any((data_start + groups) // mx.QUADRANT != (scale_start + rows) // mx.QUADRANT):
        raise KernelUsageError(f"{api}: the scales of '{data_arg}' (from partition {data_start}) must lie in the same "
                               f"32-partition quadrants as their data; '{scale_arg}' starts at partition "
                               f"{scale_start}")
    return rows


def _free(values: np.ndarray) -> np.ndarray:
    return values.reshape(values.shape[0], -1)


def quantize_mx(out, src, dst_scale):
    """Quantize fp16/bf16 ``src [P, F]`` to MXFP8: ``dst [P, F // 4]`` packed x4, one E8M0 scale per
    group of 8 partitions x 4 elements in ``dst_scale`` (quadrant layout, see ``core/mx.py``)."""
    api, dst = out.api, out.dst
    require_v4(api)
    for x, arg in ((src, "src"), (dst, "dst"), (dst_scale, "dst_scale")):
        _sbuf(x, api, arg)
    if src.dtype not in (dt.float16, dt.bfloat16):
        raise KernelUsageError(f"{api}: src must be float16 or bfloat16, got {src.dtype}")
    element = mx.packed_name(dst.dtype)
    if element is None or element == "float4_e2m1fn_x4":
        raise KernelUsageError(f"{api}: dst must be float8_e5m2_x4 or float8_e4m3fn_x4, got {dst.dtype}")
    if dst_scale.dtype not in _SCALE_DTYPES:
        raise KernelUsageError(f"{api}: dst_scale must be float8_e8m0fnu or uint8, got {dst_scale.dtype}")
    values = _free(dt.to_f32(memory.read(src, api, "src")))
    partitions, free = values.shape
    if free % 4:
        raise KernelUsageError(f"{api}: the free size of src must be a multiple of 4, got {free}")
    if dst.shape[0] != partitions or dst.size != partitions * free // 4:
        raise KernelUsageError(f"{api}: dst {list(dst.shape)} must have src's {partitions} partitions and a quarter "
                               f"of its {free} elements per partition")
    _scale_partitions(src, dst_scale, api, "src", "dst_scale")
    if dst_scale.size // dst_scale.shape[0] != free // 4:
        raise KernelUsageError(f"{api}: dst_scale {list(dst_scale.shape)} must have dst's {free // 4} elements per "
                               f"partition")
    if trace.listening:
        trace.engine(VECTOR)
    words, scales = mx.quantize(values.reshape(partitions, free // 4, 4), element)
    out.put(words.reshape(dst.shape).view(dst.dtype))
    scales = scales.view(dst_scale.dtype)
    per_quadrant = mx.SCALES_PER_QUADRANT
    for q in range(partitions // mx.QUADRANT):
        quadrant = dst_scale[q * mx.QUADRANT:q * mx.QUADRANT + per_quadrant]
        write_dst(quadrant, scales[q * per_quadrant:(q + 1) * per_quadrant].reshape(quadrant.shape), api)


def _tiling(api: str, tile_position, tile_size, contraction: int) -> None:
    """Row tiling only: ``tile_size = (rows, 128)`` with rows 32, 64 or 128, ``tile_position =
    (start_row, 0)`` with start_row a multiple of rows; both set or neither."""
    if tile_position is None and tile_size is None:
        return
    if tile_position is None or tile_size is None or len(tile_position) != 2 or len(tile_size) != 2:
        raise KernelUsageError(f"{api}: tile_position and tile_size must both be set, as (start_row, 0) and "
                               f"(row_size, 128); got {tile_position!r} and {tile_size!r}")
    start, column = (int(v) for v in tile_position)
    rows, columns = (int(v) for v in tile_size)
    if rows not in (32, 64, 128) or columns != 128 or column != 0 or start % rows or start + rows > 128:
        raise KernelUsageError(f"{api}: only row tiling: tile_size (32|64|128, 128) and tile_position (a multiple "
                               f"of the row size, 0); got tile_position={tuple(tile_position)} "
                               f"tile_size={tuple(tile_size)}")
    if contraction > rows:
        raise KernelUsageError(f"{api}: the stationary tile's {contraction} partitions exceed the row tile size "
                               f"{rows}")


def nc_matmul_mx(out, stationary, moving, stationary_scale, moving_scale, tile_position=None, tile_size=None,
                 accumulate=None):
    """``dst[M, N] (+)= sum over partitions k and packed lanes j of dequantized stationary[k, M, j] *
    moving[k, N, j]`` into PSUM (fp32 products and sums, the Tensor engine's accumulation)."""
    api, dst = out.api, out.dst
    require_v4(api)
    if dst.buffer is not memory.psum:
        raise MemorySpaceError(f"Expected operand 'dst' of '{api}' to be in address space 'psum', but got a "
                               f"tensor in '{dst.buffer.space}' instead")
    if dst.dtype not in (dt.float32, dt.bfloat16):
        raise KernelUsageError(f"{api}: dst must be float32 or bfloat16, got {dst.dtype}")
    operands = {}
    for data, scale, arg in ((stationary, stationary_scale, "stationary"), (moving, moving_scale, "moving")):
        _sbuf(data, api, arg)
        _sbuf(scale, api, f"{arg}_scale")
        element = mx.packed_name(data.dtype)
        if element is None:
            raise KernelUsageError(f"{api}: {arg} must be float8_e5m2_x4, float8_e4m3fn_x4 or float4_e2m1fn_x4, "
                                   f"got {data.dtype}")
        if scale.dtype not in _SCALE_DTYPES:
            raise KernelUsageError(f"{api}: {arg}_scale must be float8_e8m0fnu or uint8, got {scale.dtype}")
        rows = _scale_partitions(data, scale, api, arg, f"{arg}_scale")
        words = _free(memory.read(data, api, arg))
        scale_bytes = _free(memory.read(scale, api, f"{arg}_scale").view(np.uint8))
        if scale_bytes.shape[1] != words.shape[1]:
            raise KernelUsageError(f"{api}: {arg}_scale {list(scale.shape)} must have {arg}'s {words.shape[1]} "
                                   f"elements per partition")
        operands[arg] = (words, scale_bytes[rows], element)
    (s_words, s_scale, s_el), (m_words, m_scale, m_el) = operands["stationary"], operands["moving"]
    contraction, m_free, n_free = s_words.shape[0], s_words.shape[1], m_words.shape[1]
    if m_words.shape[0] != contraction:
        raise KernelUsageError(f"{api}: stationary and moving must have the same partition (contraction) size, got "
                               f"{contraction} and {m_words.shape[0]}")
    if m_free % 2 or m_free > 128:
        raise KernelUsageError(f"{api}: the free size of stationary must be even and at most 128, got {m_free}")
    _tiling(api, tile_position, tile_size, contraction)
    n_max = 4096 if dst.dtype == dt.float32 else 8192
    if n_free > n_max:
        violation(TileLimitError(f"{api}: moving free size {n_free} exceeds {n_max} (all of PSUM for a {dst.dtype} "
                                 f"dst)"))
    if trace.listening:
        trace.engine(TENSOR)
    s = mx.dequantize(s_words, s_scale, s_el)  # [K, M, 4]
    m = mx.dequantize(m_words, m_scale, m_el)  # [K, N, 4]
    lhs = np.ascontiguousarray(s.transpose(0, 2, 1)).reshape(-1, m_free)
    rhs = np.ascontiguousarray(m.transpose(0, 2, 1)).reshape(-1, n_free)
    with np.errstate(invalid="ignore", over="ignore"):
        out.accumulate(blas.matmul(lhs.T, rhs), accumulate)


replay.steps(globals())  # every instruction's outermost call is a replay step
