"""Current API: kernels the SDK's 2.32 API pages (and the NKI release notes) call illegal, each refused as
the page states it, next to its legal neighbour, which still runs. Pages: the ``nki.isa`` / ``nki.language``
API reference of aws-neuron-sdk 2.32 (nki/api/nki/isa/__init__.py, nki/api/nki/language/__init__.py,
nki/api/nki.api.shared.rst) and release-notes/components/nki.rst."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from nki_ops.sim import SimConfig, configure
from nki_ops.sim.core.errors import KernelUsageError, MemorySpaceError, SimulatorWarning
from nki_ops.sim.frontends import current as nki
from nki_ops.sim.frontends import legacy

from .current_tiles import load, on, store

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation
RNG = np.random.default_rng(31)


def in_psum(tile):
    """A PSUM copy of an SBUF tile (a Vector-engine copy)."""
    out = nl.ndarray(tile.shape, dtype=tile.dtype, buffer=nl.psum)
    nisa.tensor_copy(dst=out, src=tile)
    return out


def sbuf_copy(tile, dtype=None):
    out = nl.ndarray(tile.shape, dtype=dtype or tile.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out, src=tile)
    return out


# ------------------------------------------------------------------------------ 1. tensor_reduce axes

def reduce_kernel(x, axis):
    data = load(x)
    kept = [n for i, n in enumerate(x.shape) if i not in {a % len(x.shape) for a in axis}]
    dst = nl.ndarray(tuple(kept) if len(kept) > 1 else (kept[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=dst, op=nl.add, data=data, axis=axis)
    return store(dst)


@pytest.mark.parametrize("axis", [(1,), (1, 3), (2,)])
def test_tensor_reduce_over_a_non_trailing_axis_is_refused(axis):
    """nki.isa.tensor_reduce page (2.32): "The reduction axes must be the last contiguous free
    dimension(s) of the tile, ending at the final dimension." (for (P, D1, D2, D3): (3,), (2, 3) or
    (1, 2, 3))."""
    x = RNG.standard_normal((8, 2, 3, 4)).astype(np.float32)
    with pytest.raises(KernelUsageError, match=r"last contiguous free dimension.*ending at the final one"):
        on("trn2", reduce_kernel)(x, axis)


@pytest.mark.parametrize("axis", [(3,), (2, 3), (1, 2, 3), (-1,)])
def test_tensor_reduce_over_trailing_axes_runs(axis):
    x = RNG.standard_normal((8, 2, 3, 4)).astype(np.float32)
    out = on("trn2", reduce_kernel)(x, axis)
    expected = x.sum(axis=tuple(a % 4 for a in axis))
    np.testing.assert_allclose(out, expected.reshape(out.shape), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ 2. affine_select

def affine_select_kernel(x, on_true_in_psum):
    tile = load(x)
    on_true = in_psum(tile) if on_true_in_psum else tile
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.affine_select(dst=dst, pattern=[[-1, x.shape[1]]], channel_multiplier=1, on_true_tile=on_true,
                       on_false_value=0.0, cmp_op=nl.greater_equal)
    return store(dst)


def test_affine_select_with_a_psum_on_true_tile_is_refused():
    """nki.isa.affine_select page (2.32), Memory types: "The output dst tile must be in SBUF. The input
    on_true_tile must also be in SBUF." (The legacy front end keeps accepting it: its page names no such
    rule and public legacy kernels select from PSUM.)"""
    x = RNG.standard_normal((8, 8)).astype(np.float32)
    with pytest.raises(MemorySpaceError, match=r"'on_true_tile'.*'sbuf'.*'psum'"):
        on("trn2", affine_select_kernel)(x, True)


def test_affine_select_with_an_sbuf_on_true_tile_runs():
    x = RNG.standard_normal((8, 8)).astype(np.float32)
    out = on("trn2", affine_select_kernel)(x, False)
    np.testing.assert_array_equal(out, np.where(np.arange(8)[:, None] >= np.arange(8)[None, :], x, 0.0))


# ------------------------------------------------------------------------------ 3. tensor_scalar_reduce

def scalar_reduce_kernel(x, reverse0):
    data = load(x)
    dst = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_reduce(dst=dst, data=data, op0=nl.subtract, operand0=1.0, reduce_op=nl.add, reduce_res=res,
                              reverse0=reverse0)
    return store(res)


def test_tensor_scalar_reduce_with_reverse0_is_refused():
    """nki.isa.tensor_scalar_reduce page (2.32), ``reverse0``: "(not supported yet) reverse ordering of
    inputs to op0 ... <-- currently not supported yet."."""
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    with pytest.raises(KernelUsageError, match=r"reverse0=True is not supported yet.*reverse0=True"):
        on("trn2", scalar_reduce_kernel)(x, True)


def test_tensor_scalar_reduce_without_reverse0_runs():
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    out = on("trn2", scalar_reduce_kernel)(x, False)
    np.testing.assert_allclose(out, (x - 1.0).sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ 4. select_reduce / range_select

def select_reduce_kernel(x, on_true_dtype, res_dtype):
    values = sbuf_copy(load(x), on_true_dtype)
    pred = nl.ndarray(x.shape, dtype=nl.uint8, buffer=nl.sbuf)
    nisa.memset(dst=pred, value=1)
    dst = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((x.shape[0], 1), dtype=res_dtype, buffer=nl.sbuf)
    nisa.select_reduce(dst=dst, predicate=pred, on_true=values, on_false=-1.0, reduce_res=res,
                       reduce_cmd=nisa.reduce_cmd.reset_reduce)
    return store(res)


@pytest.mark.parametrize("on_true_dtype, res_dtype, message", [
    (nl.int32, nl.float32, r"on_true can be any dtype except tfloat32, int32 and uint32, got int32"),
    (nl.uint32, nl.float32, r"got uint32"),
    (nl.float32, nl.int32, r"reduce_res must have a floating-point dtype, got int32"),
])
def test_select_reduce_with_a_32_bit_integer_on_true_or_an_integer_reduce_res_is_refused(on_true_dtype, res_dtype,
                                                                                          message):
    """nki.isa.select_reduce page (2.32): "on_true can be any supported dtype except tfloat32, int32,
    uint32" and "reduce_res dtype must of float type"."""
    x = RNG.integers(0, 50, (8, 16)).astype(np.float32)
    with pytest.raises(KernelUsageError, match=message):
        on("trn2", select_reduce_kernel)(x, on_true_dtype, res_dtype)


@pytest.mark.parametrize("on_true_dtype", [nl.float32, nl.bfloat16, nl.int16, nl.uint8])
def test_select_reduce_with_other_on_true_dtypes_and_a_float_reduce_res_runs(on_true_dtype):
    x = RNG.integers(0, 50, (8, 16)).astype(np.float32)
    out = on("trn2", select_reduce_kernel)(x, on_true_dtype, nl.float32)
    np.testing.assert_array_equal(out, x.max(axis=1, keepdims=True))


def range_select_kernel(x, on_true_dtype):
    values = sbuf_copy(load(x), on_true_dtype)
    bounds = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=bounds[:, 0:1], value=2.0)
    nisa.memset(dst=bounds[:, 1:2], value=6.0)
    dst = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.range_select(dst=dst, on_true_tile=values, comp_op0=nl.greater_equal, comp_op1=nl.less,
                      bound0=bounds[:, 0:1], bound1=bounds[:, 1:2])
    return store(dst)


@pytest.mark.parametrize("on_true_dtype", [nl.int32, nl.int16, nl.uint8])
def test_range_select_with_an_integer_on_true_tile_is_refused(on_true_dtype):
    """nki.isa.range_select page (2.32, legacy likewise), Constraints: "on_true_tile must be one of the FP
    dtypes, and bound0/bound1 must be FP32 types"."""
    x = RNG.integers(0, 50, (8, 16)).astype(np.float32)
    with pytest.raises(KernelUsageError, match=rf"on_true_tile must have a floating-point dtype, got "
                                               rf"{np.dtype(on_true_dtype)}"):
        on("trn2", range_select_kernel)(x, on_true_dtype)


@pytest.mark.parametrize("on_true_dtype", [nl.float32, nl.bfloat16])
def test_range_select_with_a_float_on_true_tile_runs(on_true_dtype):
    x = RNG.integers(0, 50, (8, 16)).astype(np.float32)
    out = on("trn2", range_select_kernel)(x, on_true_dtype)
    j = np.arange(16)[None, :]
    np.testing.assert_array_equal(out, np.where((j >= 2) & (j < 6), x, nl.fp32.min))


# ------------------------------------------------------------------------------ 5. and 6. tensor_scalar

def tensor_scalar_kernel(x, op0, operand0, op1, operand1, engine):
    data = load(x)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=dst, data=data, op0=op0, operand0=operand0, op1=op1, operand1=operand1, engine=engine)
    return store(dst)


@pytest.mark.parametrize("op0, operand0, op1, operand1", [
    (nl.bitwise_and, 0xFF, nl.add, 1.0),
    (nl.multiply, 2.0, nl.left_shift, 1),
])
def test_tensor_scalar_mixing_a_bitvec_and_an_arithmetic_operator_is_refused(op0, operand0, op1, operand1):
    """nki.isa.tensor_scalar page (2.32, legacy likewise): "The two operators, op0 and op1, in a
    tensor_scalar instruction must be of the same type (both bitvec or both arithmetic)"."""
    x = RNG.integers(0, 1000, (8, 16)).astype(np.int32)
    with pytest.raises(KernelUsageError, match=r"op0 and op1 must be of the same type.*(bitvec|arithmetic)\)"):
        on("trn2", tensor_scalar_kernel)(x, op0, operand0, op1, operand1, nisa.engine.unknown)


def test_tensor_scalar_with_two_bitvec_or_two_arithmetic_operators_runs():
    x = RNG.integers(0, 1000, (8, 16)).astype(np.int32)
    out = on("trn2", tensor_scalar_kernel)(x, nl.bitwise_and, 0xFF, nl.left_shift, 1, nisa.engine.vector)
    np.testing.assert_array_equal(out, (x & 0xFF) << 1)
    f = RNG.standard_normal((8, 16)).astype(np.float32)
    out = on("trn2", tensor_scalar_kernel)(f, nl.multiply, 2.0, nl.add, 1.0, nisa.engine.unknown)
    np.testing.assert_allclose(out, f * 2.0 + 1.0, rtol=1e-6)


@pytest.mark.parametrize("op0, operand0, op1, operand1", [
    (nl.multiply, 2.0, None, None),
    (nl.add, 1.0, nl.multiply, 3.0),
])
def test_tensor_scalar_on_gpsimd_without_rsqrt_is_refused(op0, operand0, op1, operand1):
    """nki.isa.tensor_scalar page (2.32, legacy likewise), ``engine``: "nki.isa.engine.gpsimd (only allowed
    for rsqrt)"; the engine-selection section of nki.api.shared: "Reverse square root can run on GpSIMD
    Engine with nki.isa.tensor_scalar(op0=nl.rsqrt, operand0=0.0)"."""
    x = RNG.uniform(1, 4, (8, 16)).astype(np.float32)
    with pytest.raises(KernelUsageError, match=r"engine=gpsimd is only allowed for rsqrt.*op0=nl\.(multiply|add)"):
        on("trn2", tensor_scalar_kernel)(x, op0, operand0, op1, operand1, nisa.engine.gpsimd)


def test_tensor_scalar_rsqrt_on_gpsimd_and_multiply_elsewhere_run():
    x = RNG.uniform(1, 4, (8, 16)).astype(np.float32)
    out = on("trn2", tensor_scalar_kernel)(x, nl.rsqrt, 0.0, None, None, nisa.engine.gpsimd)
    np.testing.assert_allclose(out, 1.0 / np.sqrt(x), rtol=1e-6)
    out = on("trn2", tensor_scalar_kernel)(x, nl.multiply, 2.0, None, None, nisa.engine.vector)
    np.testing.assert_array_equal(out, x * 2.0)


def test_legacy_tensor_scalar_shares_the_operator_rules():
    """The legacy nki.isa.tensor_scalar page states both rules too; they live once, in the core."""
    lnl, lnisa = legacy.language, legacy.isa

    @legacy.jit
    def kernel(x, engine, op1):
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        lnl.store(out, lnisa.tensor_scalar(lnl.load(x), np.multiply, 2.0, op1=op1, operand1=1, engine=engine))
        return out

    x = RNG.uniform(1, 4, (8, 16)).astype(np.float32)
    with configure(SimConfig(target="trn2")):
        with pytest.raises(KernelUsageError, match=r"engine=gpsimd is only allowed for rsqrt"):
            kernel(x, lnisa.engine.gpsimd, None)
        with pytest.raises(KernelUsageError, match=r"op0 and op1 must be of the same type"):
            kernel(x, lnisa.engine.unknown, np.bitwise_and)
        np.testing.assert_array_equal(kernel(x, lnisa.engine.vector, np.add), x * 2.0 + 1)


# ------------------------------------------------------------------------------ 7. nc_transpose

def transpose_kernel(x, dst_dtype, engine):
    data = load(x)
    buffer = nl.sbuf if engine == nisa.engine.vector else nl.psum
    dst = nl.ndarray(x.shape[::-1], dtype=dst_dtype, buffer=buffer)
    nisa.nc_transpose(dst=dst, data=data, engine=engine)
    return store(sbuf_copy(dst)) if buffer is nl.psum else store(dst)


@pytest.mark.parametrize("engine", [nisa.engine.tensor, nisa.engine.vector])
def test_nc_transpose_between_dtypes_is_refused(engine):
    """nki.isa.nc_transpose page (2.32), Data types: "The output dst tile must have the same data type as
    that of data." (The legacy page instead casts to its dtype= with an extra instruction.)"""
    x = RNG.standard_normal((16, 32)).astype(ml_dtypes.bfloat16)
    with pytest.raises(KernelUsageError, match=r"same dtype as data.*bfloat16.*float32"):
        on("trn2", transpose_kernel)(x, nl.float32, engine)


@pytest.mark.parametrize("engine", [nisa.engine.tensor, nisa.engine.vector])
def test_nc_transpose_within_one_dtype_runs(engine):
    x = RNG.standard_normal((16, 32)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(on("trn2", transpose_kernel)(x, nl.bfloat16, engine), x.T)


# ------------------------------------------------------------------------------ 8. nc_find_index8

def find_index8_kernel(x, dst_dtype):
    data = load(x)
    top = nl.ndarray((x.shape[0], 8), dtype=x.dtype, buffer=nl.sbuf)
    nisa.max8(dst=top, src=data)
    where = nl.ndarray((x.shape[0], 8), dtype=dst_dtype, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=where, data=data, vals=top)
    return store(where)


@pytest.mark.parametrize("dst_dtype", [nl.float32, nl.bfloat16, nl.int32])
def test_nc_find_index8_into_a_dst_that_is_not_uint16_or_uint32_is_refused(dst_dtype):
    """nki.isa.nc_find_index8 page (2.32, legacy likewise): "The output will contain exactly 8 elements per
    partition and will be uint16 or uint32 type."; dst: "a 2D tile containing indices (uint16 or uint32)"."""
    x = RNG.permutation(8 * 32).reshape(8, 32).astype(np.float32)
    with pytest.raises(KernelUsageError, match=rf"must be uint16 or uint32; got dst .* in {np.dtype(dst_dtype)}"):
        on("trn2", find_index8_kernel)(x, dst_dtype)


@pytest.mark.parametrize("dst_dtype", [nl.uint32, nl.uint16])
def test_nc_find_index8_into_uint16_or_uint32_runs(dst_dtype):
    x = RNG.permutation(8 * 32).reshape(8, 32).astype(np.float32)
    out = on("trn2", find_index8_kernel)(x, dst_dtype)
    np.testing.assert_array_equal(out, np.argsort(-x, axis=1)[:, :8])


# ------------------------------------------------------------------------------ 9. tensor_tensor power

def power_kernel(x, y, where):
    a, b = load(x), load(y)
    if where == "data1":
        a = in_psum(a)
    elif where == "data2":
        b = in_psum(b)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.psum if where == "dst" else nl.sbuf)
    nisa.tensor_tensor(dst=dst, data1=a, data2=b, op=nl.power)
    return store(sbuf_copy(dst) if where == "dst" else dst)


@pytest.mark.parametrize("where", ["data1", "data2", "dst"])
def test_tensor_tensor_power_with_a_psum_operand_is_refused(where):
    """nki.isa.tensor_tensor page (2.32, legacy likewise): "Since GpSimd Engine cannot access PSUM, the
    input/output tiles cannot be in PSUM if op is nl.power"."""
    x = RNG.uniform(1, 2, (8, 16)).astype(np.float32)
    y = RNG.uniform(0, 2, (8, 16)).astype(np.float32)
    with pytest.raises(MemorySpaceError, match=rf"'{where}'.*op=nl\.power.*'psum'.*GpSimd"):
        on("trn2", power_kernel)(x, y, where)


def test_tensor_tensor_power_in_sbuf_and_add_with_a_psum_operand_run():
    x = RNG.uniform(1, 2, (8, 16)).astype(np.float32)
    y = RNG.uniform(0, 2, (8, 16)).astype(np.float32)
    np.testing.assert_allclose(on("trn2", power_kernel)(x, y, None), x ** y, rtol=1e-6)

    def add_from_psum(x, y):
        dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=dst, data1=in_psum(load(x)), data2=load(y), op=nl.add)
        return store(dst)

    np.testing.assert_array_equal(on("trn2", add_from_psum)(x, y), x + y)


# ------------------------------------------------------------------------------ 10. activation reciprocal bias

def reciprocal_kernel(x, b, with_bias):
    data = load(x)
    dst = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=dst, op=nl.reciprocal, data=data, bias=load(b) if with_bias else None)
    return store(dst)


def test_activation_reciprocal_with_a_bias_on_neuroncore_v2_is_refused():
    """NKI ISA API Common Fields page (nki.api.shared, 2.32 and legacy), engine selection: "Note
    nki.isa.activation(op=nl.reciprocal) doesn't support setting bias on NeuronCore-v2."."""
    x = RNG.uniform(1, 2, (8, 16)).astype(np.float32)
    b = RNG.uniform(1, 2, (8, 1)).astype(np.float32)
    with pytest.raises(KernelUsageError, match=r"op=nl\.reciprocal takes no bias on NeuronCore-v2 \(target trn1\)"):
        on("trn1", reciprocal_kernel)(x, b, True)


def test_activation_reciprocal_with_a_bias_from_trn2_and_without_one_on_trn1_runs():
    x = RNG.uniform(1, 2, (8, 16)).astype(np.float32)
    b = RNG.uniform(1, 2, (8, 1)).astype(np.float32)
    np.testing.assert_allclose(on("trn2", reciprocal_kernel)(x, b, True), 1.0 / (x + b), rtol=1e-6)
    np.testing.assert_allclose(on("trn1", reciprocal_kernel)(x, b, False), 1.0 / x, rtol=1e-6)


# ------------------------------------------------------------------------------ 11. memset

def memset_kernel(value, dtype):
    dst = nl.ndarray((4, 8), dtype=dtype, buffer=nl.sbuf)
    nisa.memset(dst=dst, value=value)
    return store(dst)


@pytest.mark.parametrize("value", [2.5, np.float32(2.5), np.float64(-0.5)])
def test_memset_of_a_fractional_float_into_an_integer_tile_is_refused(value):
    """NKI 0.3.0 release notes, Breaking Changes: "nisa.memset - Enforces strict type matching between
    value and destination dtype. ... Kernels that pass float values to integer-typed tensors (e.g.,
    value=2.0 instead of value=2) will now raise an error at compile time." (NumPy floats included.)"""
    with pytest.raises(KernelUsageError, match=r"does not match the integer dtype int32"):
        on("trn2", memset_kernel)(value, nl.int32)


@pytest.mark.parametrize("value", [2.0, np.float32(0.0)])
def test_memset_of_an_integral_float_into_an_integer_tile_warns(value):
    """The same release note, for a float holding an integer: a SimulatorWarning, not an error, because
    AWS's kernel library (@d2ad3a5) clears integer tiles with value=0.0 in kernels it tests: its uint8 MX
    scale tile in moe_tkg's gate_up_projection_mx, and router_topk's uint32 tiles in
    core/utils/cross_partition_copy.py."""
    with pytest.warns(SimulatorWarning, match=r"is a float but dst .* is int32.*NKI 0\.3\.0 release notes"):
        out = on("trn2", memset_kernel)(value, nl.int32)
    np.testing.assert_array_equal(out, np.full((4, 8), int(value), np.int32))


@pytest.mark.parametrize("value, dtype", [(2, nl.int32), (2.5, nl.float32), (2, nl.float32), (0, nl.uint8)])
def test_memset_of_a_matching_value_runs_without_warning(value, dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("error", SimulatorWarning)
        out = on("trn2", memset_kernel)(value, dtype)
    np.testing.assert_array_equal(out, np.full((4, 8), value, np.dtype(dtype)))


# ------------------------------------------------------------------------------ 12. nl.rsqrt, nl.power, broadcasting

def rsqrt_kernel(x, from_psum):
    tile = load(x)
    return store(nl.rsqrt(in_psum(tile) if from_psum else tile))


def test_nl_rsqrt_of_a_psum_tile_is_refused():
    """NKI 0.5.0 release notes (and the 0.4-to-0.5 migration guide, "nki.language.rsqrt - PSUM inputs no
    longer supported"): "The experimental nki.language.rsqrt API now provides higher numerical precision
    using the GpSimd Engine. PSUM inputs are no longer supported; use nki.isa.activation directly if you
    need PSUM input or Scalar Engine throughput."."""
    x = RNG.uniform(1, 4, (8, 16)).astype(np.float32)
    with pytest.raises(MemorySpaceError, match=r"'x' of 'nl\.rsqrt'.*'sbuf'.*'psum'"):
        on("trn2", rsqrt_kernel)(x, True)


def test_nl_rsqrt_of_an_sbuf_tile_and_activation_rsqrt_of_a_psum_tile_run():
    x = RNG.uniform(1, 4, (8, 16)).astype(np.float32)
    np.testing.assert_allclose(on("trn2", rsqrt_kernel)(x, False), 1.0 / np.sqrt(x), rtol=1e-6)

    def activation_rsqrt(x):
        dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.activation(dst=dst, op=nl.rsqrt, data=in_psum(load(x)))
        return store(dst)

    np.testing.assert_allclose(on("trn2", activation_rsqrt)(x), 1.0 / np.sqrt(x), rtol=1e-6)


def power_of_kernel(x, exponent, is_tile):
    return store(nl.power(load(x), load(exponent) if is_tile else exponent))


def test_nl_power_with_a_scalar_exponent_is_refused():
    """NKI 0.4.0 release notes, Known Issues (carried forward into 0.5.0 and 0.6.0): "nki.language.power
    does not support scalar exponents - nl.power(tile, scalar) is not supported. Use nl.power(tile, tile)
    instead, where both operands are tiles."."""
    x = RNG.uniform(1, 2, (8, 16)).astype(np.float32)
    with pytest.raises(KernelUsageError, match=r"scalar exponent is not supported; got nl\.power\(tile, 2\.0\)"):
        on("trn2", power_of_kernel)(x, 2.0, False)


def test_nl_power_with_a_tile_exponent_runs():
    x = RNG.uniform(1, 2, (8, 16)).astype(np.float32)
    exponent = np.full((8, 16), 2.0, np.float32)
    np.testing.assert_allclose(on("trn2", power_of_kernel)(x, exponent, True), x ** 2, rtol=1e-6)


def add_kernel(x, y, is_tile):
    return store(nl.add(load(x), load(y) if is_tile else y))


@pytest.mark.parametrize("y_shape", [(8, 1), (8, 4)])
def test_nl_add_that_broadcasts_is_refused(y_shape):
    """NKI 0.4.0 release notes, Known Issues (carried forward into 0.6.0): "Binary operations do not support
    broadcasting - Operations like nl.add(a, b) require both operands to have the same shape. Broadcasting
    (e.g., adding a (128, 1) tile to a (128, 512) tile) is not yet supported."."""
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    y = RNG.standard_normal(y_shape).astype(np.float32)
    with pytest.raises(KernelUsageError, match=r"do not broadcast; x and y must have the same shape, got \[8, 16\]"):
        on("trn2", add_kernel)(x, y, True)


def test_nl_add_of_same_shape_tiles_or_a_scalar_and_tensor_scalar_broadcast_run():
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    y = RNG.standard_normal((8, 16)).astype(np.float32)
    np.testing.assert_array_equal(on("trn2", add_kernel)(x, y, True), x + y)
    np.testing.assert_array_equal(on("trn2", add_kernel)(x, 1.5, False), x + np.float32(1.5))
    column = RNG.standard_normal((8, 1)).astype(np.float32)

    def add_column(x, c):
        dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=dst, data=load(x), op0=nl.add, operand0=load(c))
        return store(dst)

    np.testing.assert_array_equal(on("trn2", add_column)(x, column), x + column)


# --------------------------------------------------- half-precision operand and scale tiles (warned, read as fp32)

def operand_tile_kernel(x, column, how):
    data, col = load(x), load(column)
    dst = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    if how == "tensor_scalar":
        nisa.tensor_scalar(dst=dst, data=data, op0=nl.multiply, operand0=col)
    else:
        nisa.activation(dst=dst, op=nl.copy, data=data, scale=col)
    return store(dst)


@pytest.mark.parametrize("how", ["tensor_scalar", "activation"])
def test_a_bfloat16_operand_or_scale_tile_warns_and_is_read_as_float32(how):
    """nki.isa.tensor_scalar page: "the operand0 and operand1 (if used) must be float32"; nki.isa.activation:
    "The scale parameter must have a float32 data type". Kernels of the kernel library can pass bfloat16 there,
    so it warns (with the page's rule) instead of refusing; a float32 tile runs silently."""
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    column = RNG.standard_normal((8, 1)).astype(np.float32)
    half = column.astype(ml_dtypes.bfloat16)
    arg = "operand0" if how == "tensor_scalar" else "scale"
    with pytest.warns(SimulatorWarning, match=rf"{arg} must be a float32 tile per the API page, got bfloat16"):
        out = nki.jit(operand_tile_kernel)(x, half, how)
    np.testing.assert_array_equal(out, x * half.astype(np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SimulatorWarning)
        np.testing.assert_array_equal(nki.jit(operand_tile_kernel)(x, column, how), x * column)
