"""Current ``nki`` API against the rules its SDK pages state (round 3): the NeuronCore-v2 Tensor-engine
transpose with NaN/Inf, the Scalar engine's ``sin`` outside its valid range, and the result shapes
and dtypes of ``nl`` reductions and ``nl.logical_not``. Each test names the page it follows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nki_ops.sim import SimConfig, simulate
from nki_ops.sim import nisa as legacy_isa
from nki_ops.sim import nki as legacy_nki
from nki_ops.sim import nl as legacy_nl
from nki_ops.sim.frontends import current as nki

from .current_tiles import load, store

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation
RNG = np.random.default_rng(33)


@pytest.fixture(autouse=True)
def _target_from_the_kernel(monkeypatch):
    """The environment's target overrides would beat ``platform_target=``."""
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    monkeypatch.delenv("NKI_NC_VERSION", raising=False)


def with_nan_and_inf(p: int, f: int) -> np.ndarray:
    x = RNG.standard_normal((p, f)).astype(np.float32)
    x[3, 5] = np.nan
    x[p - 2, 1] = np.inf
    x[p - 1, 1] = 2.0  # a finite value in the Inf's column
    return x


def matmul_with_identity(x: np.ndarray) -> np.ndarray:
    """``x.T @ I`` in fp32 IEEE arithmetic (NaN * 0 = Inf * 0 = NaN)."""
    with np.errstate(all="ignore"):
        return x.T @ np.eye(x.shape[0], dtype=np.float32)


# ----------------------------------------------------------- NeuronCore-v2 Tensor-engine transpose

def transpose_kernel(x, how):
    p, f = x.shape
    tile = load(x)
    flipped = nl.ndarray((f, p), dtype=x.dtype, buffer=nl.psum)
    if how == "tensor":
        nisa.nc_transpose(dst=flipped, data=tile, engine=nisa.engine.tensor)
    elif how == "default":
        nisa.nc_transpose(dst=flipped, data=tile)
    elif how == "vector":
        flipped = nl.ndarray((f, p), dtype=x.dtype, buffer=nl.sbuf)
        nisa.nc_transpose(dst=flipped, data=tile, engine=nisa.engine.vector)
    elif how == "nl":
        flipped = nl.transpose(tile)
    else:  # nc_matmul against an identity with is_transpose=True
        identity = load(nl.shared_identity_matrix(p, dtype=nl.float32))
        nisa.nc_matmul(dst=flipped, stationary=tile, moving=identity, is_transpose=True)
    result = nl.ndarray((f, p), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=result, src=flipped)
    return store(result)


@pytest.mark.parametrize("how, shape", [("tensor", (16, 24)), ("default", (64, 48)), ("nl", (40, 8))])
def test_trn1_tensor_engine_transpose_spreads_nan_and_inf(how, shape):
    """nki.isa.nc_transpose page (awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/
    nki.isa.nc_transpose.html): "2D transpose on Tensor Engine is implemented by performing a matrix
    multiplication between data as the stationary tensor and an identity matrix as the moving tensor
    ... On NeuronCore-v2, Tensor Engine transpose is not bit-accurate if the input data contains
    NaN/Inf"; the trn2 architecture guide ("Built-in Transpose Support"): before NeuronCore-v3 "the
    NaN/Inf values will propagate through the accumulation chain and spread across the output tensor".
    So trn1 gives x.T @ I in fp32: NaN along the output rows a NaN or Inf feeds."""
    x = with_nan_and_inf(*shape)
    out = nki.jit(transpose_kernel, platform_target="trn1")(x, how)
    expected = matmul_with_identity(x)
    np.testing.assert_array_equal(out, expected)
    assert np.isnan(out[5]).all() and np.isinf(out[1, shape[0] - 2]) and np.isnan(out[1, shape[0] - 1])
    np.testing.assert_array_equal(np.delete(out, [1, 5], axis=0), np.delete(x.T, [1, 5], axis=0))


def test_trn1_nc_matmul_transpose_mode_is_an_ordinary_matmul():
    """nki.isa.nc_matmul page, "Transpose mode" (awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/
    api/generated/nki.isa.nc_matmul.html): "On NeuronCore-v2, Tensor Engine does not support transpose
    mode natively. However, setting is_transpose=True ensures neuron-profile identifies this instruction
    as a transpose": the instruction is accepted and multiplies by the identity, NaN/Inf spreading."""
    x = with_nan_and_inf(32, 20)
    out = nki.jit(transpose_kernel, platform_target="trn1")(x, "matmul")
    np.testing.assert_array_equal(out, matmul_with_identity(x))


@pytest.mark.parametrize("how, target", [("tensor", "trn2"), ("nl", "trn2"), ("matmul", "trn2"),
                                         ("vector", "trn1"), ("tensor", "trn3")])
def test_transpose_stays_bit_exact_where_documented(how, target):
    """nki.isa.nc_transpose page: "Starting NeuronCore-v3, all Tensor Engine transpose is
    bit-accurate"; a Vector-engine transpose moves data without a matmul."""
    x = with_nan_and_inf(24, 16)
    out = nki.jit(transpose_kernel, platform_target=target)(x, how)
    np.testing.assert_array_equal(out, x.T)


def legacy_transpose_kernel(x):
    out_tensor = legacy_nl.ndarray((x.shape[1], x.shape[0]), legacy_nl.float32, buffer=legacy_nl.shared_hbm)
    out_nl = legacy_nl.ndarray((x.shape[1], x.shape[0]), legacy_nl.float32, buffer=legacy_nl.shared_hbm)
    tile = legacy_nl.load(x)
    legacy_nl.store(out_tensor, legacy_nl.copy(legacy_isa.nc_transpose(tile, engine=legacy_isa.tensor_engine)))
    legacy_nl.store(out_nl, legacy_nl.copy(legacy_nl.transpose(tile)))
    return out_tensor, out_nl


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_legacy_tensor_engine_transposes_share_the_rule(target):
    """The same pages, legacy spelling (nki.isa.nc_transpose 2.26 page: "On NeuronCore-v2, such
    matmul-style transpose is not bit-accurate if the input data contains NaN/Inf"): one core model,
    for nc_transpose on the Tensor engine and nl.transpose."""
    x = with_nan_and_inf(24, 16)
    expected = matmul_with_identity(x) if target == "trn1" else x.T
    for out in simulate(legacy_nki.jit(legacy_transpose_kernel), x, config=SimConfig(target=target)):
        np.testing.assert_array_equal(out, expected)


def test_legacy_masked_transpose_spreads_only_what_it_reads():
    """Legacy masks compute only the selected elements: a NaN in a masked-off partition is not read,
    so it spreads nowhere; an Inf in the selected part spreads along its output row (nc_transpose
    pages as above)."""
    x = RNG.standard_normal((40, 16)).astype(np.float32)
    x[30, 2], x[3, 4] = np.nan, np.inf

    def kernel(x):
        out = legacy_nl.ndarray((16, 40), legacy_nl.float32, buffer=legacy_nl.shared_hbm)
        i_p, _ = legacy_nl.mgrid[0:40, 0:16]
        flipped = legacy_isa.nc_transpose(legacy_nl.load(x), engine=legacy_isa.tensor_engine, mask=(i_p < 24))
        legacy_nl.store(out, legacy_nl.copy(flipped))
        return out

    out = simulate(legacy_nki.jit(kernel), x, config=SimConfig(target="trn1", uninitialized="zeros"))
    np.testing.assert_array_equal(out[:, :24], matmul_with_identity(x[:24]))
    np.testing.assert_array_equal(out[2, :24], x[:24, 2])


# ------------------------------------------------------------------ Scalar engine sin out of range

@nki.jit(platform_target="trn2")
def sin_kernel(x):
    tile = load(x)
    by_isa = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=by_isa, op=nl.sin, data=tile)
    return store(by_isa), store(nl.sin(tile))


def test_isa_sin_extrapolates_its_cubic_outside_minus_pi_pi():
    """nki.api.shared page, "Supported Activation Functions for NKI ISA" (awsdocs-neuron.readthedocs-
    hosted.com/en/latest/nki/api/nki.api.shared.html): sin's valid input range is [-PI, PI]; "the
    Scalar Engine performs no argument range reduction or clamping. It evaluates the fitting polynomial
    directly, so nki.isa.activation(op=nl.sin) extrapolates a cubic outside [-PI, PI] and sin(9.0)
    returns ~27.65 (not ~0.41)"; "nki.language.sin applies additional instructions to perform range
    reduction before the activation, so it stays accurate over the full input domain"."""
    x = np.array([[9.0, -9.0, 4.0, math.pi, 1.0, -3.0, 0.0, 2.5]], np.float32)
    by_isa, by_nl = sin_kernel(x)
    assert abs(by_isa[0, 0] - 27.65) < 0.01 and abs(by_isa[0, 1] + 27.65) < 0.01
    d = np.float32(4.0) - np.float32(math.pi)
    np.testing.assert_allclose(by_isa[0, 2], d * d * d / 6 - d, rtol=1e-6)
    np.testing.assert_allclose(by_isa[0, 3:], np.sin(x[0, 3:]), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(by_nl, np.sin(x), rtol=1e-6, atol=1e-7)


def test_legacy_isa_sin_is_the_same_instruction():
    """The same table (legacy nki.api.shared page lists sin's valid range as [-PI, PI]): the
    instruction is shared, so legacy nisa.activation(op=nl.sin) extrapolates the same cubic."""
    def kernel(x):
        out = legacy_nl.ndarray(x.shape, legacy_nl.float32, buffer=legacy_nl.shared_hbm)
        legacy_nl.store(out, legacy_isa.activation(op=legacy_nl.sin, data=legacy_nl.load(x)))
        return out

    out = simulate(legacy_nki.jit(kernel), np.array([[9.0, 1.0]], np.float32))
    assert abs(out[0, 0] - 27.65) < 0.01 and abs(out[0, 1] - np.sin(np.float32(1.0))) < 1e-6


# ------------------------------------------------------------------ nl reductions: shapes and dtypes

@nki.jit
def reduce_kernel(x, name, keepdims):
    fn = getattr(nl, name)
    if keepdims is None:
        return store(fn(load(x), axis=(1, 2)))
    return store(fn(load(x), axis=(1, 2), keepdims=keepdims))


@pytest.mark.parametrize("keepdims", [False, True])
def test_var_always_has_the_keepdims_shape(keepdims):
    """nki.language.var page (awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/
    nki.language.var.html): "keepdims: currently ignored; result always has keepdims=True shape"."""
    x = RNG.standard_normal((4, 3, 5)).astype(np.float32)
    out = reduce_kernel(x, "var", keepdims)
    assert out.shape == (4, 1, 1)
    np.testing.assert_allclose(out, x.var(axis=(1, 2), keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("name", ["sum", "max", "min", "prod", "mean"])
def test_reductions_keep_the_reduced_axes_only_with_keepdims(name):
    """nki.language.sum/max/min/prod/mean pages: "keepdims: if True, the reduced axes are kept as
    size-one dimensions" (without it an on-chip result stays 2-D, (P, 1))."""
    x = RNG.standard_normal((4, 3, 5)).astype(np.float32)
    assert reduce_kernel(x, name, True).shape == (4, 1, 1)
    assert reduce_kernel(x, name, False).shape == (4, 1)


@pytest.mark.parametrize("name, x, expected", [
    ("mean", np.arange(60, dtype=np.int32).reshape(4, 3, 5) * 3, None),
    ("var", np.arange(60, dtype=np.int32).reshape(4, 3, 5), None),
    ("all", np.ones((4, 3, 5), np.float32), np.ones((4, 1), np.float32)),
    ("sum", np.ones((4, 3, 5), np.int32), np.full((4, 1), 15, np.int32)),
])
def test_reductions_default_to_the_input_dtype(name, x, expected):
    """nki.language.mean/var/all/sum pages, dtype parameter: "if not specified, it will default to be
    the same as the data type of the input tile" (mean: "Float32 intermediate values are used for the
    computation")."""
    out = reduce_kernel(x, name, None)
    assert out.dtype == x.dtype
    if expected is None:
        reduce = getattr(np, name)
        expected = np.rint(reduce(x.astype(np.float64), axis=(1, 2), keepdims=True)).astype(x.dtype)
        expected = expected.reshape(4, 1) if name == "mean" else expected
    np.testing.assert_array_equal(out, expected)


@nki.jit
def logical_not_kernel(x):
    return store(nl.logical_not(load(x)))


@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.uint8])
def test_logical_not_defaults_to_the_input_dtype(dtype):
    """nki.language.logical_not page (awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/
    nki.language.logical_not.html): "Implemented as XOR with 1, so inputs should be boolean-like (0 or
    1 values)"; dtype "if not specified, it will default to be the same as the data type of the input
    tile"."""
    x = np.array([[0, 1, 1, 0]], dtype)
    out = logical_not_kernel(x)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, np.array([[1, 0, 0, 1]], dtype))


# ----------------------------------------------------------- NkiTensor.rearrange (nki.language.NkiTensor page)

def test_rearrange_takes_the_pages_tuple_patterns_and_fixed_sizes():
    """The page's own example: a ``(128, 24)`` tile split into ``(h, w)`` with ``h=4`` and reordered is
    ``(128, 6, 4)``; element ``[b, w, h]`` is ``x[b, h * 6 + w]``."""
    x = RNG.standard_normal((128, 24)).astype(np.float32)

    @nki.jit
    def kernel(x):
        tile = load(x)
        view = tile.rearrange(("b", ("h", "w")), ("b", "w", "h"), {"h": 4})
        assert view.shape == (128, 6, 4)
        out = nl.ndarray(view.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=view)
        return out

    np.testing.assert_array_equal(kernel(x), x.reshape(128, 4, 6).transpose(0, 2, 1))


def test_rearrange_merges_and_infers_one_size_per_group():
    x = RNG.standard_normal((8, 6, 10)).astype(np.float32)

    @nki.jit
    def kernel(x):
        view = x.rearrange(("a", "b", ("c", "d")), (("a", "b"), "d", "c"), fixed_sizes={"d": 5})
        out = nl.ndarray(view.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        tile = nl.ndarray(view.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=view)
        nisa.dma_copy(dst=out, src=tile)
        return out

    np.testing.assert_array_equal(kernel(x), x.reshape(48, 2, 5).transpose(0, 2, 1))


@pytest.mark.parametrize("src, dst, sizes, message", [
    ("b (h w)", "b w h", {"h": 4}, "tuples of dim names"),
    (("b", ("h", "w")), ("b", "w", "h"), None, "all but one of"),
    (("b", ("h", "w")), ("b", "w", "h"), {"h": 5}, "do not split size 24"),
    (("b", ("h", "w")), ("b", "w"), {"h": 4}, "same dims"),
    (("b", ("h", "w")), ("b", "w", "h"), {"h": 4, "z": 2}, "fixed_sizes names ['z']"),
    (("b", "f"), ("f", "b"), None, "partition dimension"),
])
def test_rearrange_refuses_what_the_page_rules_out(src, dst, sizes, message):
    @nki.jit
    def kernel(x):
        load(x).rearrange(src, dst, sizes)
        return x

    with pytest.raises(Exception, match=message.replace("[", r"\[").replace("]", r"\]")):
        kernel(np.zeros((128, 24), np.float32))
