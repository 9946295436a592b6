"""Simulator semantics: dtypes and promotion, broadcasting, PSUM accumulation, nisa instructions,
block tensors, and the ways to select the simulator (install, nki_ops.nki_api, the pytest plugin)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

from nki_ops.sim import KernelUsageError, OutOfBoundsError, SimConfig, install, nisa, nki, nl, simulate
from nki_ops.sim.core import dtypes as dt

pytestmark = pytest.mark.simulation

RNG = np.random.default_rng(7)
X = RNG.standard_normal((128, 64)).astype(np.float32)


def run(body, *arrays, **config):
    return simulate(nki.jit(body), *(arrays or (X,)), config=SimConfig(**config))


def result_of(expression):
    """dtype and values of ``expression(tile)`` computed in a kernel on X."""
    def kernel(x):
        result = expression(nl.load(x))
        out = nl.ndarray(result.shape, result.dtype, buffer=nl.shared_hbm)
        nl.store(out, result)
        return out
    return run(kernel)


# ------------------------------------------------------------------------------------- dtypes

@pytest.mark.parametrize("a, b, expected", [
    (dt.float16, dt.bfloat16, dt.float32), (dt.float8_e4m3, dt.float8_e5m2, dt.bfloat16),
    (dt.bfloat16, dt.int32, dt.bfloat16), (dt.int8, dt.uint8, dt.int16), (dt.int8, dt.uint16, dt.int32),
    (dt.int32, dt.uint32, dt.float32), (dt.uint8, dt.uint16, dt.uint16), (dt.bool_, dt.int8, dt.int16),
    (dt.float16, dt.float32, dt.float32),
])
def test_legacy_type_promotion(a, b, expected):
    assert dt.promote(a, b) == expected and dt.promote(b, a) == expected


def test_python_scalars_are_typed_not_weak():
    def kernel(x):
        tile = nl.load(x, dtype=nl.bfloat16)
        assert (tile + 1).dtype == nl.bfloat16       # (bf16, int32) -> the float
        assert (tile * 0.5).dtype == nl.float32      # (bf16, float32) -> the wider float
        assert nl.multiply(tile, 0.5, dtype=nl.bfloat16).dtype == nl.bfloat16
        assert (nl.load(x, dtype=nl.int8) + 1).dtype == nl.int32
        assert nl.greater(tile, 0.0).dtype == nl.bool_

    run(kernel)


def test_compute_is_fp32_and_rounds_once_into_bf16():
    a = np.full((128, 1), 1.0, np.float32)
    b = np.full((128, 1), 1.25 * 2.0 ** -8, np.float32)  # exact in bf16

    def kernel(a, b):
        out = nl.ndarray((128, 1), nl.bfloat16, buffer=nl.shared_hbm)
        ta, tb = nl.load(a, dtype=nl.bfloat16), nl.load(b, dtype=nl.bfloat16)
        # In fp32, 1 + 2 * 1.25 * 2^-8 = 1 + 1.25 * 2^-7, which rounds to 1 + 2^-7 in bf16; rounding
        # the intermediate sum to bf16 first would give 1 + 2^-6.
        nl.store(out, nl.add(nl.add(ta, tb, dtype=nl.float32), tb, dtype=nl.bfloat16))
        return out

    out = run(kernel, a, b)
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.astype(np.float32), np.float32(1 + 2.0 ** -7))


def test_float_to_int_casts_round_half_even_and_saturate():
    values = np.array([[0.5, 1.5, 2.5, -0.5, 300.0, -300.0, np.nan, 127.4]], np.float32).repeat(128, 0)

    def kernel(x):
        out = nl.ndarray(x.shape, nl.int8, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(nl.load(x), dtype=nl.int8))
        return out

    np.testing.assert_array_equal(run(kernel, values)[0], [0, 2, 2, 0, 127, -128, 0, 127])


def test_fp8_e4m3_is_the_ieee_style_variant():
    assert float(ml_dtypes.finfo(nl.float8_e4m3).max) == 240.0


@pytest.mark.parametrize("dtype", [dt.float8_e4m3, dt.float8_e5m2, dt.float8_e4m3fn, dt.float8_e8m0fnu,
                                   np.dtype(ml_dtypes.float4_e2m1fn)], ids=str)
def test_one_byte_floats_convert_as_ml_dtypes_converts_them(dtype):
    every_byte = np.arange(256, dtype=np.uint8).view(dtype)
    strided = np.stack([every_byte, every_byte[::-1]])[:, ::3]  # two partitions, a step in the free axis
    unaligned = np.stack([every_byte, every_byte[::-1]])[:, 1:-1]  # pairs of bytes at odd addresses
    for values in (every_byte, strided, unaligned, every_byte[1:], every_byte[7]):
        got = dt.to_f32(values)
        assert got.dtype == np.float32 and got.shape == np.shape(values)
        np.testing.assert_array_equal(got.view(np.uint32), values.astype(np.float32).view(np.uint32))  # NaN bits too
        for target in (dt.bfloat16, dt.float16, dt.float32, dt.float8_e4m3, dt.float8_e5m2, dt.float8_e4m3fn):
            try:
                with np.errstate(all="ignore"):
                    expected = np.asarray(values).astype(target)
            except TypeError:  # a cast ml_dtypes has no rule for (e8m0 to the fp8 types) stays an error
                with pytest.raises(TypeError):
                    dt.cast(values, target)
                continue
            got = np.asarray(dt.cast(values, target))
            assert got.dtype == target and got.shape == expected.shape
            np.testing.assert_array_equal(got.view(f"u{target.itemsize}"), expected.view(f"u{target.itemsize}"))


@pytest.mark.parametrize("dtype", [dt.bfloat16, dt.float16], ids=str)
def test_every_two_byte_float_widens_to_fp32_as_its_cast_does_in_any_layout(dtype):
    every = np.arange(1 << 16, dtype=np.uint16).view(dtype).reshape(256, 256)
    for values in (every, np.stack([every, every], axis=2)[:, :, 1], every.T, every[:, ::3], every[::-1, ::-2],
                   every[7]):
        got = dt.to_f32(values)
        assert got.shape == values.shape
        np.testing.assert_array_equal(got.view(np.uint32), values.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("dtype", [dt.float8_e4m3, dt.float8_e5m2, dt.float8_e4m3fn], ids=str)
def test_fp32_rounds_into_fp8_as_ml_dtypes_rounds_it(dtype):
    # Every sign, exponent and top 7 mantissa bits, with lower bits that make ties, near-ties and sticky bits.
    top = np.arange(1 << 16, dtype=np.uint32) << 16
    bits = np.concatenate([top | np.uint32(low) for low in (0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF)])
    values = bits.view(np.float32).reshape(64, -1)
    with np.errstate(invalid="ignore", over="ignore"):
        expected = values.astype(dtype)
    np.testing.assert_array_equal(dt.cast(values, dtype).view(np.uint8), expected.view(np.uint8))
    np.testing.assert_array_equal(dt.cast(values[:, ::5], dtype).view(np.uint8), expected[:, ::5].view(np.uint8))


def test_static_cast_rounds_host_data():
    np.testing.assert_array_equal(nl.static_cast(np.array([1.00390625], np.float32), nl.bfloat16).astype(
        np.float32), [1.0])


# ---------------------------------------------------------------------------------- broadcasting

def test_reduced_vector_broadcasts_per_partition():
    out = result_of(lambda t: nl.subtract(t, nl.max(t, axis=1)))
    np.testing.assert_allclose(out, X - X.max(axis=1, keepdims=True))


def test_keepdims_and_reductions():
    np.testing.assert_allclose(result_of(lambda t: nl.sum(t, axis=1, keepdims=True)), X.sum(1, keepdims=True),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result_of(lambda t: nl.var(t, axis=[1], keepdims=True)), X.var(1, keepdims=True),
                               rtol=1e-5)
    np.testing.assert_allclose(result_of(lambda t: nl.mean(t, axis=1, keepdims=True)), X.mean(1, keepdims=True),
                               rtol=1e-5, atol=1e-6)


def test_partition_broadcast_with_nl_functions():
    out = result_of(lambda t: nl.add(t, nl.load(nl.shared_constant(np.ones((1, 64), np.float32)))))
    np.testing.assert_allclose(out, X + 1)


@pytest.mark.parametrize("name, reference", [
    ("exp", np.exp), ("tanh", np.tanh), ("sigmoid", lambda x: 1 / (1 + np.exp(-x))), ("relu", lambda x: x * (x > 0)),
    ("square", np.square), ("abs", np.abs), ("silu", lambda x: x / (1 + np.exp(-x))),
    ("gelu_apprx_tanh", lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))),
])
def test_unary_functions(name, reference):
    np.testing.assert_allclose(result_of(getattr(nl, name)), reference(X.astype(np.float64)), rtol=2e-6, atol=1e-6)


def test_gelu_matches_erf_form():
    import math
    expected = np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(X.astype(np.float64))
    np.testing.assert_allclose(result_of(nl.gelu), expected, rtol=1e-5, atol=1e-6)


def test_where_and_comparisons():
    out = result_of(lambda t: nl.where(nl.greater(t, 0.0), t, nl.multiply(t, 0.1)))
    np.testing.assert_allclose(out, np.where(X > 0, X, X * np.float32(0.1)))


def test_bitwise_ops_work_on_integers_and_reject_floats():
    ints = RNG.integers(-1000, 1000, (128, 8)).astype(np.int32)

    def kernel(x):
        out = nl.ndarray(x.shape, nl.int32, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out, nl.bitwise_xor(nl.right_shift(t, 2), nl.left_shift(t, 1)))
        return out

    expected = ((ints.view(np.uint32) >> 2).view(np.int32)) ^ (ints << 1)
    np.testing.assert_array_equal(run(kernel, ints), expected)
    with pytest.raises(KernelUsageError, match="needs integer operands"):
        result_of(lambda t: nl.bitwise_and(t, 1))


# -------------------------------------------------------------------------- PSUM and block tensors

def test_psum_accumulation_with_iadd_and_indexed_iadd():
    a = RNG.standard_normal((128, 32)).astype(np.float32)

    def kernel(a):
        out = nl.ndarray((32, 32), nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((32, 32), nl.float32, buffer=nl.psum)
        tile = nl.load(a)
        acc += nisa.nc_matmul(tile, tile)
        acc[...] += nl.matmul(tile, tile, transpose_x=True)
        nl.store(out, acc)
        return out

    np.testing.assert_allclose(run(kernel, a), 2 * a.T.astype(np.float64) @ a, rtol=1e-4, atol=1e-4)


def test_matmul_without_transpose_x_computes_x_at_y():
    a = RNG.standard_normal((64, 128)).astype(np.float32)
    b = RNG.standard_normal((128, 96)).astype(np.float32)

    def kernel(a, b):
        out = nl.ndarray((64, 96), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.matmul(nl.load(a), nl.load(b)))
        return out

    np.testing.assert_allclose(run(kernel, a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_a_one_partition_matmul_is_the_outer_product_a_sum_from_zero_gives():
    # The ones-row idiom (a row copied to every partition) multiplies element by element; its zeros, infinities
    # and NaNs must be those of the fp32 product summed from zero, as every other contraction's.
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38, -1.0], np.float32)
    row = np.concatenate([special, RNG.standard_normal(119).astype(np.float32)])[None, :]
    other = np.concatenate([special[::-1], (RNG.standard_normal(247) * 1e30).astype(np.float32)])[None, :]

    def kernel(a, b):
        out = nl.ndarray((128, 256), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nisa.nc_matmul(nl.load(a), nl.load(b)))
        return out

    with np.errstate(all="ignore"):
        expected = np.zeros((128, 256), np.float32) + row.T * other
        got = run(kernel, row, other)
    assert got.view(np.uint32).tobytes() == expected.view(np.uint32).tobytes()
    assert np.signbit(row[0, 0] * other[0, 0]) and not np.signbit(got[0, 0])  # 0 x -1 is -0; summed from +0, +0


@pytest.mark.parametrize("op, reference", [(nl.maximum, np.maximum), (nl.minimum, np.minimum)])
def test_max_and_min_with_a_scalar_are_numpys_to_the_bit(op, reference):
    # Computed against an array of the scalar (NumPy has no fast loop for a scalar operand): the values must
    # stay those of the scalar, signed zeros and NaNs included, whichever zero came first.
    special = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-45, -1e-45, 1.0, -1.0], np.float32)
    data = RNG.choice(special, size=(128, 64)).astype(np.float32)
    scalars = (0.0, -0.0, float("nan"), -1.0)

    def kernel(x):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        tile = nl.load(x)
        for i, scalar in enumerate(scalars):
            nl.store(out[:, 64 * i:64 * (i + 1)], nisa.tensor_scalar(tile, op, scalar))
            nl.store(out[:, 256 + 64 * i:256 + 64 * (i + 1)], op(scalar, tile))
        return out

    got = run(kernel, data)
    expected = np.concatenate([reference(data, np.float32(s)) for s in scalars]
                              + [reference(np.float32(s), data) for s in scalars], axis=1)
    assert got.view(np.uint32).tobytes() == expected.view(np.uint32).tobytes()


def test_block_tensor_must_be_indexed_to_a_tile():
    def kernel(x):
        out = nl.ndarray((2, 128, 64), nl.float32, buffer=nl.shared_hbm)
        blocks = nl.ndarray((2, nl.par_dim(128), 64), nl.float32, buffer=nl.sbuf)
        for b in nl.affine_range(2):
            blocks[b] = nl.multiply(nl.load(x), b + 1)
        for b in nl.affine_range(2):
            nl.store(out[b], nl.copy(blocks[b]))
        return out

    out = run(kernel)
    np.testing.assert_allclose(out, np.stack([X, 2 * X]))

    def bad(x):
        nl.exp(nl.ndarray((2, nl.par_dim(128), 64), nl.float32))

    with pytest.raises(KernelUsageError, match="leading block dimension"):
        run(bad)


# ------------------------------------------------------------------------------------- nki.isa

def test_activation_with_scale_bias_and_reduce():
    bias = RNG.standard_normal((128, 1)).astype(np.float32)

    def kernel(x, bias):
        out = nl.ndarray((128, 65), nl.float32, buffer=nl.shared_hbm)
        row_sum = nl.ndarray((128, 1), nl.float32)
        act = nisa.activation(op=nl.exp, data=nl.load(x), bias=nl.load(bias), scale=0.5, reduce_op=nl.add,
                              reduce_res=row_sum, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nl.store(out[:, 0:64], act)
        nl.store(out[:, 64:65], row_sum)
        return out

    out = run(kernel, X, bias)
    expected = np.exp(X.astype(np.float64) * 0.5 + bias)
    np.testing.assert_allclose(out[:, :64], expected, rtol=1e-5)
    np.testing.assert_allclose(out[:, 64], expected.sum(1), rtol=1e-5)


def test_tensor_scalar_tensor_tensor_and_reduce():
    column = RNG.standard_normal((128, 1)).astype(np.float32)

    def kernel(x, column):
        out = nl.ndarray((128, 66), nl.float32, buffer=nl.shared_hbm)
        t, c = nl.load(x), nl.load(column)
        scaled = nisa.tensor_scalar(t, np.multiply, c, op1=np.subtract, operand1=1.0, reverse1=True)
        nl.store(out[:, 0:64], nisa.tensor_tensor(scaled, t, op=nl.maximum))
        nl.store(out[:, 64:65], nisa.tensor_reduce(np.max, t, axis=1, keepdims=True))
        nl.store(out[:, 65:66], nisa.tensor_reduce(nl.add, t, axis=(1,), negate=True, keepdims=True))
        return out

    out = run(kernel, X, column)
    np.testing.assert_allclose(out[:, :64], np.maximum(1.0 - X * column, X), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out[:, 64], X.max(1))
    np.testing.assert_allclose(out[:, 65], -X.sum(1), rtol=1e-5, atol=1e-5)


def test_iota_memset_affine_select_partition_reduce_and_copy():
    def kernel(x):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        rows = nl.ndarray((1, 64), nl.float32, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:128, 0:64]
        index = nisa.iota(i_p * 64 + i_f, dtype=nl.int32)
        causal = nisa.affine_select(i_p - i_f >= 0, nisa.tensor_copy(index, dtype=nl.float32), -1.0)
        nl.store(out, causal)
        nl.store(rows, nisa.tensor_partition_reduce(np.add, nisa.memset((128, 64), 2.0, nl.float32)))
        return out, rows

    out, rows = run(kernel)
    index = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    np.testing.assert_array_equal(out, np.where(np.tril(np.ones((128, 64), bool)), index, -1.0))
    np.testing.assert_array_equal(rows, np.full((1, 64), 256.0))


def test_bn_stats_and_bn_aggr_give_mean_and_population_variance():
    data = RNG.standard_normal((128, 1000)).astype(np.float32) * 3 + 1

    def kernel(x):
        out = nl.ndarray((128, 2), nl.float32, buffer=nl.shared_hbm)
        stats = nl.ndarray((128, 12), nl.float32)
        for half in nl.affine_range(2):
            stats[:, nl.ds(half * 6, 6)] = nisa.bn_stats(nl.load(x[:, nl.ds(half * 500, 500)]))
        nl.store(out, nisa.bn_aggr(stats))
        return out

    out = run(kernel, data)
    np.testing.assert_allclose(out[:, 0], data.mean(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[:, 1], data.var(1), rtol=1e-5)


def test_nc_transpose_engines_and_dma_copy():
    def kernel(x):
        out = nl.ndarray((64, 128), nl.float32, buffer=nl.shared_hbm)
        small = nl.ndarray((32, 32), nl.float32, buffer=nl.shared_hbm)
        tile = nl.load(x)
        transposed = nisa.nc_transpose(tile)
        assert transposed.buffer is nl.psum
        nisa.dma_copy(dst=out, src=nl.copy(transposed))
        vector = nisa.nc_transpose(tile[0:32, 0:32], engine=nisa.vector_engine)
        assert vector.buffer is nl.sbuf
        nisa.dma_copy(dst=small, src=vector)
        return out, small

    out, small = run(kernel)
    np.testing.assert_array_equal(out, X.T)
    np.testing.assert_array_equal(small, X[:32, :32].T)


def test_nc_version_follows_target():
    seen = []
    run(lambda x: seen.append(nisa.get_nc_version()), target="trn2")
    run(lambda x: seen.append(nisa.get_nc_version()))
    assert seen == [nisa.nc_version.gen3, nisa.nc_version.gen2]


# --------------------------------------------------------------------------- selecting the simulator

def test_install_resolves_neuronxcc_and_restores_sys_modules():
    before = {name: sys.modules.get(name) for name in ("neuronxcc", "neuronxcc.nki", "neuronxcc.nki.language")}
    with install() as installed:
        assert installed.active
        import neuronxcc.nki as sdk_nki
        import neuronxcc.nki.isa as sdk_isa
        import neuronxcc.nki.language as sdk_nl
        from neuronxcc import nki as from_package
        from neuronxcc.nki import typing as sdk_typing
        assert sdk_nki is nki and from_package is nki and sdk_nl is nl and sdk_isa is nisa
        assert sdk_typing.tensor is not None
    after = {name: sys.modules.get(name) for name in before}
    assert after == before


def test_pytest_plugin_runs_a_suite_that_imports_neuronxcc(tmp_path):
    (tmp_path / "test_user_kernel.py").write_text(textwrap.dedent("""
        import numpy as np
        import neuronxcc.nki as nki
        import neuronxcc.nki.language as nl

        @nki.jit(mode="simulation")
        def double(x):
            out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
            nl.store(out, nl.multiply(nl.load(x), 2))
            return out

        def test_double():
            x = np.arange(128 * 4, dtype=np.float32).reshape(128, 4)
            np.testing.assert_array_equal(double(x), 2 * x)
    """))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    without = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert "ModuleNotFoundError" in without.stdout or "ImportError" in without.stdout
    with_sim = subprocess.run(command + ["--nki-sim"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert "1 passed" in with_sim.stdout, with_sim.stdout + with_sim.stderr


def test_masked_reductions_skip_excluded_elements():
    def kernel(x):
        out = nl.ndarray((128, 4), nl.float32, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:128, 0:64]
        tile = nl.load(x)
        valid = i_f < 10
        nl.store(out[:, 0:1], nl.sum(tile, axis=1, keepdims=True, mask=valid))
        nl.store(out[:, 1:2], nl.max(tile, axis=1, keepdims=True, mask=valid))
        nl.store(out[:, 2:3], nl.mean(tile, axis=1, keepdims=True, mask=valid))
        nl.store(out[:, 3:4], nl.sum(tile, axis=1, keepdims=True, mask=(i_p < 3) & valid))
        return out

    out = run(kernel)
    np.testing.assert_allclose(out[:, 0], X[:, :10].sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out[:, 1], X[:, :10].max(1))
    np.testing.assert_allclose(out[:, 2], X[:, :10].mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[:3, 3], X[:3, :10].sum(1), rtol=1e-5, atol=1e-6)
    assert np.isnan(out[3:, 3]).all()  # partitions outside the mask are not computed


def test_masked_softmax_normalises_over_the_valid_columns():
    def kernel(x):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:128, 0:64]
        nl.store(out, nl.softmax(nl.load(x), axis=1, mask=i_f < 20))
        return out

    out = run(kernel)
    e = np.exp(X[:, :20] - X[:, :20].max(1, keepdims=True))
    np.testing.assert_allclose(out[:, :20], e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert np.isnan(out[:, 20:]).all()


def test_nl_rms_norm():
    w = RNG.standard_normal((1, 64)).astype(np.float32)

    def kernel(x, w):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        weight = nl.broadcast_to(nl.load(w), shape=(128, 64))
        nl.store(out, nl.rms_norm(nl.load(x), weight, axis=1, n=64, epsilon=1e-5))
        return out

    expected = X / np.sqrt((X.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(run(kernel, X, w), expected, rtol=1e-5, atol=1e-6)


def test_masked_isa_reductions_skip_excluded_elements():
    def kernel(x):
        out = nl.ndarray((128, 3), nl.float32, buffer=nl.shared_hbm)
        column = nl.ndarray((1, 64), nl.float32, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:128, 0:64]
        tile = nl.load(x)
        nl.store(out[:, 0:1], nisa.tensor_reduce(np.max, tile, axis=1, keepdims=True, mask=i_f < 5))
        row_sum = nl.ndarray((128, 1), nl.float32)
        nisa.activation(op=nl.copy, data=tile, reduce_op=nl.add, reduce_res=row_sum, mask=i_f >= 60,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nl.store(out[:, 1:2], row_sum)
        nl.store(column, nisa.tensor_partition_reduce(np.add, tile, mask=i_p < 7))
        return out, column

    out, column = run(kernel)
    np.testing.assert_array_equal(out[:, 0], X[:, :5].max(1))
    np.testing.assert_allclose(out[:, 1], X[:, 60:].sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(column[0], X[:7].sum(0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [nl.float16, nl.float8_e4m3, nl.float8_e5m2])
def test_low_precision_stores_round_like_ml_dtypes(dtype):
    def kernel(x):
        out = nl.ndarray(x.shape, dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.multiply(nl.load(x), 0.25))
        return out

    out = run(kernel)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out.astype(np.float32), (X * np.float32(0.25)).astype(dtype).astype(np.float32))


def test_indirect_load_gathers_hbm_rows_by_a_runtime_index_tile():
    table = RNG.standard_normal((300, 16)).astype(np.float32)
    rows = RNG.permutation(300)[:128].astype(np.int32).reshape(128, 1)

    def kernel(table, rows):
        out = nl.ndarray((128, 16), nl.float32, buffer=nl.shared_hbm)
        i_p, i_f = nl.arange(128)[:, None], nl.arange(16)[None, :]
        index = nl.load(rows)
        nl.store(out, nl.load(table[index[i_p, 0], i_f]))
        return out

    np.testing.assert_array_equal(run(kernel, table, rows), table[rows[:, 0]])
    rows[5] = 300
    with pytest.raises(OutOfBoundsError, match=r"tensor `table` on dimension 0: index range \[\d+, 300\]"):
        run(kernel, table, rows)


def test_dma_copy_hbm_to_hbm_and_read_modify_write():
    def kernel(x):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x)
        nisa.dma_copy(dst=out, src=nl.load(x), dst_rmw_op=np.add)
        return out

    np.testing.assert_allclose(run(kernel), 2 * X)


# ------------------------------------------------------------------------- max8, find_index8, match_replace8

def _ranked_rows(seed: int, partitions: int, width: int) -> np.ndarray:
    """Rows with ties, -0.0 beside 0.0, infinities and NaNs: what the stable order and the pairing must keep."""
    g = np.random.default_rng(seed)
    specials = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan], np.float32)
    rows = [g.standard_normal(width).astype(np.float32), g.integers(-2, 2, width).astype(np.float32),
            g.choice(specials, width)]
    mixed = g.standard_normal(width).astype(np.float32)
    mixed[g.random(width) < 0.4] = g.choice(specials)
    return np.stack((rows + [mixed]) * (partitions // 4 + 1))[:partitions]


def _pairs(values: np.ndarray, targets: np.ndarray, order) -> np.ndarray:
    """Each target (in ``order``) takes the first position of an equal value no earlier target took."""
    index = np.full(targets.shape, 0xFFFFFFFF, np.uint32)
    for p in range(values.shape[0]):
        taken = set()
        for k in order:
            match = next((int(i) for i in np.flatnonzero(values[p] == targets[p, k]) if i not in taken), None)
            if match is not None:
                taken.add(match)
                index[p, k] = match
    return index


@pytest.mark.parametrize("width", [8, 64, 65, 300, 2000])
def test_top8_instructions_keep_the_stable_order_and_the_pairing_of_equal_values(width):
    from nki_ops.sim.core import instructions as ins
    for seed in range(6):
        values = _ranked_rows(seed, 12, width)
        top = ins.max8("max8", values)
        np.testing.assert_array_equal(top.view(np.uint32),
                                      (-np.sort(-values, axis=1, kind="stable")[:, :8]).view(np.uint32))
        targets = values[np.arange(12)[:, None], np.random.default_rng(seed).integers(0, width, (12, 8))]
        targets[:, 5] = targets[:, 2]  # a duplicate target takes the next occurrence
        targets[:, 7] = -targets[:, 2]  # -0.0 pairs with 0.0
        np.testing.assert_array_equal(ins.find_index8("find_index8", values, targets),
                                      _pairs(values, targets, range(8)))
        replaced, index = ins.match_replace8("match_replace8", values, targets, -5.0)
        expected = _pairs(values, targets, range(7, -1, -1))
        np.testing.assert_array_equal(index, expected)
        rows, slots = np.nonzero(expected != 0xFFFFFFFF)
        kept = values.copy()
        kept[rows, expected[rows, slots].astype(np.int64)] = -5.0
        np.testing.assert_array_equal(replaced.view(np.uint32), kept.view(np.uint32))
