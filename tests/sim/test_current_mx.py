"""MX instructions of the current API (``nisa.quantize_mx``, ``nisa.nc_matmul_mx``) in small kernels,
checked against NumPy references written here from the API pages (quantize_mx's scale: from the
description of AWS's hardware-mimicking goldens, see docs/simulator.md), and the errors they must raise."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nki_ops.sim import neuron_dtypes
from nki_ops.sim.core.errors import KernelUsageError, MemorySpaceError
from nki_ops.sim.frontends import current as nki

from .current_tiles import load, store

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation
RNG = np.random.default_rng(7)
ELEMENT = {"float8_e4m3fn_x4": (ml_dtypes.float8_e4m3fn, 8), "float8_e5m2_x4": (ml_dtypes.float8_e5m2, 15),
           "float4_e2m1fn_x4": (ml_dtypes.float4_e2m1fn, 2)}


# ------------------------------------------------------------------------------ references

def pack(values: np.ndarray, name: str) -> np.ndarray:
    """Host packing as the trn3 guide lays it out: 4 consecutive values per element, value j in bits
    [bits * j, bits * (j + 1)) of a little-endian word (uint32 for fp8, uint16 for fp4)."""
    element, _ = ELEMENT[name]
    bits, word = (4, np.uint16) if name.startswith("float4") else (8, np.uint32)
    codes = values.astype(element).view(np.uint8).astype(word).reshape(values.shape[0], -1, 4) & ((1 << bits) - 1)
    return sum(codes[:, :, j] << word(bits * j) for j in range(4)).astype(word).view(getattr(nl, name))


def unpack(words: np.ndarray) -> np.ndarray:
    """fp8 x4 words -> their values [P, 4F]: little-endian bytes in lane order."""
    element, _ = ELEMENT[words.dtype.names[0]]
    return np.ascontiguousarray(words).view(np.uint8).reshape(words.shape[0], -1).view(element).astype(np.float32)


def quantize_reference(src: np.ndarray, name: str):
    """AWS's goldens that mimic the hardware (MX deep dive, kernel library): per 8 x 4 group, the scale
    byte is the largest biased exponent field of the group's fp32 values (0 for zeros and denormals,
    255 for Inf/NaN) minus E_max, but not below 0 (an all-zero group: 2^-127, as the API page says);
    values / 2^(byte - 127) are clipped to the element's largest finite value, then rounded to nearest
    even. Returns (values [P, F] fp32, scales [P // 8, F // 4])."""
    element, e_max = ELEMENT[name]
    largest = float(ml_dtypes.finfo(element).max)
    p, f = src.shape
    values = np.empty((p, f), np.float32)
    scales = np.empty((p // 8, f // 4), np.uint8)
    for g in range(p // 8):
        for c in range(f // 4):
            block = src[8 * g:8 * g + 8, 4 * c:4 * c + 4].astype(np.float32)
            fields = [(int(v) >> 23) & 0xFF for v in block.view(np.uint32).ravel()]
            scales[g, c] = max(max(fields) - e_max, 0)
            scaled = np.clip(block.astype(np.float64) / 2.0 ** (int(scales[g, c]) - 127), -largest, largest)
            values[8 * g:8 * g + 8, 4 * c:4 * c + 4] = scaled.astype(np.float32).astype(element).astype(np.float32)
    return values, scales


def quadrant_scales(scales: np.ndarray, offset: int = 0, partitions: int = 128) -> np.ndarray:
    """Compact scales [P // 8, F] laid out as the hardware wants them: 4 rows per 32-partition quadrant."""
    tile = np.zeros((partitions, scales.shape[1]), np.uint8)
    for g in range(scales.shape[0]):
        tile[offset + 32 * (g // 4) + g % 4] = scales[g]
    return tile


def matmul_reference(s_values, s_scales, m_values, m_scales):
    """dst[M, N] = sum over k, j of S[k, M, j] * 2^(s_scale - 127) * Mv[k, N, j] * 2^(m_scale - 127),
    the values given as [K, F * 4] with the 4 lanes of a packed element adjacent."""
    k = s_values.shape[0]
    s = s_values.reshape(k, -1, 4).astype(np.float64) * 2.0 ** (np.repeat(s_scales, 8, 0)[:, :, None] - 127.0)
    m = m_values.reshape(k, -1, 4).astype(np.float64) * 2.0 ** (np.repeat(m_scales, 8, 0)[:, :, None] - 127.0)
    return np.einsum("kmj,knj->mn", s, m)


# ------------------------------------------------------------------------------ kernels

@nki.jit
def quantize_kernel(src, data_like, scale_rows):
    p, f = src.shape
    data = nl.ndarray((p, f // 4), dtype=data_like.dtype, buffer=nl.sbuf)
    scale = nl.ndarray((scale_rows, f // 4), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.memset(dst=scale, value=0)
    nisa.quantize_mx(dst=data, src=load(src), dst_scale=scale)
    return store(data), store(scale)


@nki.jit
def matmul_mx_kernel(stationary, moving, stationary_scale, moving_scale):
    m, n = stationary.shape[1], moving.shape[1]
    acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=acc, stationary=load(stationary), moving=load(moving),
                      stationary_scale=load(stationary_scale), moving_scale=load(moving_scale))
    result = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=result, src=acc)
    return store(result)


@nki.jit
def quantize_then_matmul_kernel(a_t, b):
    """Both operands quantized on chip, their scales packed in one tile (stationary's at offset 0 of
    each quadrant, moving's at offset 4), then one MX matmul: a_t.T @ b over a contraction of 4 K."""
    k, m4 = a_t.shape
    n4 = b.shape[1]
    scales = nl.ndarray((k, max(m4, n4) // 4), dtype=nl.float8_e8m0fnu, buffer=nl.sbuf)
    a_q = nl.ndarray((k, m4 // 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    b_q = nl.ndarray((k, n4 // 4), dtype=nl.float8_e5m2_x4, buffer=nl.sbuf)
    nisa.quantize_mx(dst=a_q, src=load(a_t), dst_scale=scales[0:k, 0:m4 // 4])
    nisa.quantize_mx(dst=b_q, src=load(b), dst_scale=scales[4:k, 0:n4 // 4])
    acc = nl.ndarray((m4 // 4, n4 // 4), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=acc, stationary=a_q, moving=b_q, stationary_scale=scales[0:k, 0:m4 // 4],
                      moving_scale=scales[4:k, 0:n4 // 4])
    result = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=result, src=acc)
    return store(result)


# ------------------------------------------------------------------------------ tests

@pytest.mark.parametrize("name", ["float8_e4m3fn_x4", "float8_e5m2_x4"])
@pytest.mark.parametrize("shape", [(32, 8), (128, 64)])
def test_quantize_mx_matches_the_reference_scale_and_rounding(name, shape):
    src = (RNG.standard_normal(shape) * np.exp(RNG.uniform(-6, 6, (shape[0], 1)))).astype(ml_dtypes.bfloat16)
    src[:8, :4] = 0  # an all-zero group: scale 2^-127
    packed = getattr(nl, name)
    data, scale = quantize_kernel(src, np.zeros((1, 1), packed), shape[0])
    values, scales = quantize_reference(src.astype(np.float32), name)
    np.testing.assert_array_equal(unpack(data), values)
    np.testing.assert_array_equal(scale, quadrant_scales(scales, partitions=shape[0]))
    assert scale[0, 0] == 0


def test_quantize_mx_uses_the_ocp_scale_and_saturates_and_reads_fp16():
    """255 has exponent 7, so the scale is 2^(7 - 8); 255 / 2^-1 = 510 saturates to e4m3fn's 448 (the
    API page's prose, a scale twice as large, would give 256). The other values, 1, become 2."""
    src = np.full((32, 4), 1.0, np.float16)
    src[0, 0] = 255.0
    data, scale = quantize_kernel(src, np.zeros((1, 1), nl.float8_e4m3fn_x4), 32)
    values = unpack(data)
    assert scale[0, 0] == 127 - 1 and values[0, 0] == 448.0 and (values[1:8] == 2.0).all()


@pytest.mark.parametrize("name", ["float8_e4m3fn_x4", "float8_e5m2_x4"])
def test_quantize_mx_inf_and_nan_groups_take_exponent_field_255(name):
    element, e_max = ELEMENT[name]
    src = np.ones((32, 12), ml_dtypes.bfloat16)
    src[9, 5] = np.nan
    src[17, 9] = -np.inf
    data, scale = quantize_kernel(src, np.zeros((1, 1), getattr(nl, name)), 32)
    values = unpack(data)
    assert scale[1, 1] == scale[2, 2] == 255 - e_max and scale[0, 0] == 127 - e_max
    assert np.isnan(values[9, 5]) and values[17, 9] == -float(ml_dtypes.finfo(element).max)
    nan_group, inf_group = values[8:16, 4:8].copy(), values[16:24, 8:12].copy()
    nan_group[1, 1] = inf_group[1, 1] = 0
    assert (nan_group == 0).all() and (inf_group == 0).all()  # 1 / 2^(128 - E_max) underflows


def test_quantize_mx_zero_and_denormal_groups_get_the_smallest_scale():
    """Exponent field 0 (zeros, bf16 denormals): the scale byte stays 0 (2^-127)."""
    src = np.zeros((32, 8), ml_dtypes.bfloat16)
    src[8, 4] = 2.0 ** -130  # bf16 denormal
    data, scale = quantize_kernel(src, np.zeros((1, 1), nl.float8_e4m3fn_x4), 32)
    values = unpack(data)
    assert scale[0, 0] == 0 and scale[1, 1] == 0 and (values[:8, :4] == 0).all()
    assert values[8, 4] == 2.0 ** -3


@nki.jit
def quantize_over_filled_scales_kernel(src):
    p, f = src.shape
    data = nl.ndarray((p, f // 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    scale = nl.ndarray((p, f // 4), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.memset(dst=scale, value=7)
    nisa.quantize_mx(dst=data, src=load(src), dst_scale=scale)
    return store(scale)


def test_quantize_mx_writes_only_the_4_scale_rows_of_each_quadrant():
    """The trn3 guide: 28 partitions of each quadrant are unused by one tile's scales and may hold
    other tiles' (packing), so quantize_mx leaves them as they were."""
    src = np.ones((64, 8), ml_dtypes.bfloat16)
    scale = quantize_over_filled_scales_kernel(src)
    written = np.zeros(64, bool)
    written[[0, 1, 2, 3, 32, 33, 34, 35]] = True
    assert (scale[written] == 127 - 8).all() and (scale[~written] == 7).all()


@pytest.mark.parametrize("stationary_name, moving_name",
                         [("float8_e4m3fn_x4", "float8_e5m2_x4"), ("float4_e2m1fn_x4", "float8_e4m3fn_x4")])
def test_nc_matmul_mx_dequantizes_per_group_and_contracts_partitions_and_lanes(stationary_name, moving_name):
    k, m, n = 64, 16, 24
    rng = np.random.default_rng(17)  # its own inputs, whatever ran before it on this worker
    s_el, m_el = ELEMENT[stationary_name][0], ELEMENT[moving_name][0]
    s_values = rng.uniform(-4, 4, (k, m * 4)).astype(s_el).astype(np.float32)
    m_values = rng.uniform(-4, 4, (k, n * 4)).astype(m_el).astype(np.float32)
    s_scales = rng.integers(120, 135, (k // 8, m)).astype(np.uint8)
    m_scales = rng.integers(120, 135, (k // 8, n)).astype(np.uint8)
    out = matmul_mx_kernel(pack(s_values, stationary_name), pack(m_values, moving_name),
                           quadrant_scales(s_scales, partitions=k), quadrant_scales(m_scales, partitions=k))
    # fp32 accumulation of 4k products: its error scales with the sum of their magnitudes, not with the
    # result, which cancellation can make small.
    magnitude = matmul_reference(np.abs(s_values), s_scales, np.abs(m_values), m_scales)
    error = np.abs(out - matmul_reference(s_values, s_scales, m_values, m_scales))
    assert (error <= 1e-5 * magnitude + 1e-6).all(), (error / magnitude).max()


def test_quantize_then_matmul_with_packed_scales_approximates_the_product():
    k, m4, n4 = 128, 64, 128
    a_t = RNG.standard_normal((k, m4)).astype(ml_dtypes.bfloat16)
    b = RNG.standard_normal((k, n4)).astype(ml_dtypes.bfloat16)
    out = quantize_then_matmul_kernel(a_t, b)
    a_values, a_scales = quantize_reference(a_t.astype(np.float32), "float8_e4m3fn_x4")
    b_values, b_scales = quantize_reference(b.astype(np.float32), "float8_e5m2_x4")
    np.testing.assert_allclose(out, matmul_reference(a_values, a_scales, b_values, b_scales), rtol=1e-5, atol=1e-5)
    # Contraction over partitions and the 4 lanes: lane j of packed column c is original column 4c + j.
    exact = np.einsum("kmj,knj->mn", a_t.astype(np.float64).reshape(k, -1, 4), b.astype(np.float64).reshape(k, -1, 4))
    assert np.abs(out - exact).max() < 0.1 * np.abs(exact).max()


# ------------------------------------------------------------------------------ errors

def test_mx_instructions_need_trn3(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    src = np.ones((32, 8), ml_dtypes.bfloat16)
    with pytest.raises(KernelUsageError, match=r"nisa.quantize_mx is available only on NeuronCore-v4 \(trn3\) and "
                                                r"newer; target is trn2"):
        quantize_kernel(src, np.zeros((1, 1), nl.float8_e4m3fn_x4), 32)
    words = pack(np.ones((32, 8), np.float32), "float8_e4m3fn_x4")
    with pytest.raises(KernelUsageError, match="nisa.nc_matmul_mx is available only on NeuronCore-v4"):
        matmul_mx_kernel(words, words, np.full((32, 2), 127, np.uint8), np.full((32, 2), 127, np.uint8))


def test_quantize_mx_refuses_fp4_output_and_fp32_input():
    with pytest.raises(KernelUsageError, match="dst must be float8_e5m2_x4 or float8_e4m3fn_x4, got"):
        quantize_kernel(np.ones((32, 8), ml_dtypes.bfloat16), np.zeros((1, 1), nl.float4_e2m1fn_x4), 32)
    with pytest.raises(KernelUsageError, match="src must be float16 or bfloat16, got float32"):
        quantize_kernel(np.ones((32, 8), np.float32), np.zeros((1, 1), nl.float8_e4m3fn_x4), 32)


def test_quantize_mx_scale_tile_must_cover_each_quadrants_rows():
    with pytest.raises(KernelUsageError, match=r"'dst_scale' has 8 partitions; the scales of 64 data partitions "
                                                r"occupy partitions \[0, 1, 2, 3, 32, 33, 34, 35\]"):
        quantize_kernel(np.ones((64, 8), ml_dtypes.bfloat16), np.zeros((1, 1), nl.float8_e4m3fn_x4), 8)


@nki.jit
def misplaced_scale_kernel(src, offset):
    data = nl.ndarray((32, 2), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    scale = nl.ndarray((64, 2), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.quantize_mx(dst=data, src=load(src), dst_scale=scale[offset:offset + 4])
    return store(data)


def test_quantize_mx_scales_stay_in_their_quadrant_at_offset_0_4_8_12():
    src = np.ones((32, 8), ml_dtypes.bfloat16)
    with pytest.raises(KernelUsageError, match="'dst_scale' starts at partition 6; MX scales start at offset 0, 4, "
                                               "8 or 12 within a 32-partition quadrant"):
        misplaced_scale_kernel(src, 6)
    with pytest.raises(KernelUsageError, match="must lie in the same 32-partition quadrants as their data; "
                                               "'dst_scale' starts at partition 32"):
        misplaced_scale_kernel(src, 32)
    misplaced_scale_kernel(src, 12)


@nki.jit
def matmul_mx_into_sbuf_kernel(words, scale):
    dst = nl.ndarray((words.shape[1], words.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.nc_matmul_mx(dst=dst, stationary=load(words), moving=load(words), stationary_scale=load(scale),
                      moving_scale=load(scale))
    return store(dst)


@nki.jit
def matmul_mx_tiled_kernel(words, scale, tile_position, tile_size):
    dst = nl.ndarray((words.shape[1], words.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=dst, stationary=load(words), moving=load(words), stationary_scale=load(scale),
                      moving_scale=load(scale), tile_position=tile_position, tile_size=tile_size)
    result = nl.ndarray(dst.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=result, src=dst)
    return store(result)


def test_nc_matmul_mx_operand_rules():
    words = pack(np.ones((32, 8), np.float32), "float8_e4m3fn_x4")
    scale = np.full((32, 2), 127, np.uint8)
    with pytest.raises(MemorySpaceError, match="Expected operand 'dst' of 'nisa.nc_matmul_mx' to be in address "
                                               "space 'psum'"):
        matmul_mx_into_sbuf_kernel(words, scale)
    with pytest.raises(KernelUsageError, match="stationary must be float8_e5m2_x4, float8_e4m3fn_x4 or "
                                               "float4_e2m1fn_x4, got bfloat16"):
        matmul_mx_kernel(np.ones((32, 2), ml_dtypes.bfloat16), words, scale, scale)
    with pytest.raises(KernelUsageError, match="only row tiling"):
        matmul_mx_tiled_kernel(words, scale, (0, 32), (32, 128))
    # Row tile of 32: 32 partitions x 4 lanes of ones at scale 1, so each output is 128.
    out = matmul_mx_tiled_kernel(words, scale, (32, 0), (32, 128))
    np.testing.assert_array_equal(out, np.full((2, 2), 128.0, np.float32))
    with pytest.raises(TypeError, match="unexpected keyword argument 'perf_mode'"):
        nisa.nc_matmul_mx(dst=None, stationary=None, moving=None, stationary_scale=None, moving_scale=None,
                          perf_mode=None)


@pytest.mark.parametrize("name", sorted(ELEMENT))
def test_neuron_dtypes_static_cast_packs_lanes_in_order(name):
    values = RNG.uniform(-4, 4, (4, 16)).astype(ELEMENT[name][0]).astype(np.float32)
    packed = neuron_dtypes.static_cast(values, getattr(nl, name))
    np.testing.assert_array_equal(packed.view(packed.dtype[0]), pack(values, name).view(packed.dtype[0]))
    np.testing.assert_array_equal(neuron_dtypes.static_cast(packed, np.float32), values)


@nki.jit
def matmul_mx_twice_kernel(words, scale, accumulate):
    """Two MX matmuls into one fresh PSUM tile: with accumulate=None the first overwrites the NaN of
    new PSUM and the second adds; with False the second overwrites."""
    dst = nl.ndarray((words.shape[1], words.shape[1]), dtype=nl.bfloat16, buffer=nl.psum)
    for _ in range(2):
        nisa.nc_matmul_mx(dst=dst, stationary=load(words), moving=load(words), stationary_scale=load(scale),
                          moving_scale=load(scale), accumulate=accumulate)
    result = nl.ndarray(dst.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=result, src=dst)
    return store(result)


@pytest.mark.parametrize("accumulate, expected", [(None, 2 * 128.0), (False, 128.0)])
def test_nc_matmul_mx_accumulates_in_psum_like_nc_matmul(accumulate, expected):
    words = pack(np.ones((32, 8), np.float32), "float8_e5m2_x4")
    out = matmul_mx_twice_kernel(words, np.full((32, 2), 127, np.uint8), accumulate)
    np.testing.assert_array_equal(out, np.full((2, 2), expected, np.float32))
