"""Current API instructions the 2.32 API pages document beyond the basic set: ``nisa.activate2``,
``nisa.exponential`` (NeuronCore-v4), ``nisa.tensor_scalar_cumulative``, ``nisa.get_nc_sub_version``,
``nisa.NkiInstruction``, and ``nl.expand_dims``, ``gather_flattened``, ``gelu_apprx_sigmoid_dx``,
``load_transpose2d``, ``prelu``, ``rms_norm``; each against NumPy written here from the pages, with
the accumulator registers carried across two calls, and the errors they must raise."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from nki_ops.sim.core.errors import KernelUsageError, MemorySpaceError, UnsupportedError
from nki_ops.sim.frontends import current as nki

from .current_tiles import load, store

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation
RNG = np.random.default_rng(23)
BF16 = ml_dtypes.bfloat16
OUT_DTYPES = [np.float32, BF16]


def as_out(values: np.ndarray, dtype) -> np.ndarray:
    """The fp32 reference rounded to the output dtype, back in fp32 for comparison."""
    return values.astype(np.float32).astype(dtype).astype(np.float32)


def column(values: np.ndarray) -> np.ndarray:
    """A (P, 1) fp32 host array (loaded in the kernel as a per-partition operand)."""
    return values.reshape(-1, 1).astype(np.float32)


# ------------------------------------------------------------------------------ exponential

@nki.jit
def exponential_kernel(x, shift, out_dtype, second_cmd):
    """Two exponentials over the halves of x: the first resets the Vector accumulators, the second
    runs ``second_cmd`` on top; returns dst and the registers after each call."""
    p, f = x.shape
    src = load(x)
    dst = nl.ndarray((p, f), dtype=out_dtype, buffer=nl.sbuf)
    first = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    second = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    half = f // 2
    shift = load(shift)
    nisa.exponential(dst=dst[:, 0:half], src=src[:, 0:half], max_value=shift, reduce_res=first,
                     reduce_cmd=nisa.reduce_cmd.reset_reduce)
    init = 5.0 if second_cmd == nisa.reduce_cmd.load_reduce else 0.0
    nisa.exponential(dst=dst[:, half:f], src=src[:, half:f], max_value=shift, reduce_res=second,
                     reduce_cmd=second_cmd, reduce_init=init)
    return store(dst), store(first), store(second)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_exponential_subtracts_the_max_and_accumulates_over_two_calls(out_dtype):
    x = RNG.standard_normal((64, 16)).astype(np.float32)
    shift = x.max(axis=1)
    dst, first, second = exponential_kernel(x, column(shift), out_dtype, nisa.reduce_cmd.reduce)
    expected = np.exp(x - shift[:, None])
    np.testing.assert_allclose(dst.astype(np.float32), as_out(expected, out_dtype), rtol=1e-6)
    np.testing.assert_allclose(first[:, 0], expected[:, :8].sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(second[:, 0], expected.sum(axis=1), rtol=1e-5)


def test_exponential_load_reduce_starts_from_reduce_init():
    x = RNG.standard_normal((8, 4)).astype(np.float32)
    _, _, second = exponential_kernel(x, column(np.zeros(8)), np.float32, nisa.reduce_cmd.load_reduce)
    np.testing.assert_allclose(second[:, 0], 5.0 + np.exp(x[:, 2:]).sum(axis=1), rtol=1e-5)


@nki.jit
def exponential_call(x, **kwargs):
    dst = nl.ndarray(x.shape, dtype=kwargs.pop("dst_dtype", nl.float32), buffer=kwargs.pop("dst_buffer", nl.sbuf))
    nisa.exponential(dst=dst, src=load(x), **kwargs)
    return x


@pytest.mark.parametrize("kwargs, error, message", [
    ({"reduce_init": 1.0}, KernelUsageError, "reduce_init is used only with reduce_cmd=load_reduce"),
    ({"reduce_cmd": nisa.reduce_cmd.reset}, KernelUsageError, "reduce_cmd must be idle, reset_reduce, reduce"),
    ({"dst_dtype": nl.uint32}, KernelUsageError, "dst dtype must be one of"),
    ({"dst_buffer": nl.shared_hbm}, MemorySpaceError, "to be in address space 'psum|sbuf'"),
    ({"engine": nisa.engine.scalar}, TypeError, "unexpected keyword argument 'engine'"),
])
def test_exponential_rejects(kwargs, error, message):
    with pytest.raises(error, match=message):
        exponential_call(np.ones((4, 4), np.float32), **kwargs)


def test_exponential_and_activate2_need_trn3(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    with pytest.raises(KernelUsageError, match=r"nisa.exponential is available only on NeuronCore-v4 \(trn3\) and "
                                                r"newer; target is trn2"):
        exponential_call(np.ones((4, 4), np.float32))
    with pytest.raises(KernelUsageError, match=r"nisa.activate2 is available only on NeuronCore-v4 \(trn3\)"):
        activate2_call(np.ones((4, 4), np.float32))


# -------------------------------------------------------------------------------- activate2

@nki.jit
def softmax_numerator_kernel(x, out_dtype):
    """The flash-attention pattern: exp(x - rowmax) with imm0 a (P, 1) tile, op0 subtract, op1 add 0."""
    src = load(x)
    row_max = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=row_max, op=nl.maximum, data=src, axis=1)
    dst = nl.ndarray(x.shape, dtype=out_dtype, buffer=nl.sbuf)
    nisa.activate2(dst=dst, op=nl.exp, data=src, imm0=row_max, imm1=0.0, op0=nl.subtract, op1=nl.add)
    return store(dst)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_activate2_subtract_then_exp(out_dtype):
    x = RNG.standard_normal((32, 24)).astype(np.float32)
    expected = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(softmax_numerator_kernel(x, out_dtype).astype(np.float32), as_out(expected, out_dtype),
                               rtol=1e-6)


@nki.jit
def scaled_max_kernel(x, scale):
    """Scores scaled from PSUM into SBUF, their row max accumulated over two calls (reset_reduce, then
    reduce) in the Scalar engine's registers."""
    p, f = x.shape
    scores_psum = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.psum)
    nisa.tensor_copy(dst=scores_psum, src=load(x))
    scores = nl.ndarray((p, f), dtype=nl.bfloat16, buffer=nl.sbuf)
    first = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    running = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    half = f // 2
    nisa.activate2(dst=scores[:, 0:half], op=nl.copy, data=scores_psum[:, 0:half], imm0=scale, imm1=0.0,
                   op0=nl.multiply, op1=nl.add, reduce_op=nl.maximum, reduce_cmd=nisa.reduce_cmd.reset_reduce,
                   reduce_res=first)
    nisa.activate2(dst=scores[:, half:f], op=nl.copy, data=scores_psum[:, half:f], imm0=scale, imm1=0.0,
                   op0=nl.multiply, op1=nl.add, reduce_op=nl.maximum, reduce_cmd=nisa.reduce_cmd.reduce,
                   reduce_res=running)
    return store(scores), store(first), store(running)


def test_activate2_scales_psum_and_accumulates_the_max_over_two_calls():
    x = RNG.standard_normal((16, 12)).astype(np.float32)
    scores, first, running = scaled_max_kernel(x, 0.125)
    expected = x * np.float32(0.125)
    np.testing.assert_array_equal(scores.astype(np.float32), as_out(expected, BF16))
    np.testing.assert_array_equal(first[:, 0], expected[:, :6].max(axis=1))
    np.testing.assert_array_equal(running[:, 0], expected.max(axis=1))


@nki.jit
def activate2_call(x, out_dtype=nl.float32, reduce_res=False, slope=None, **kwargs):
    """activate2 with the page example's gelu(2x + 0.5) unless ``kwargs`` say otherwise; ``slope``: an
    HBM (P, 1) relu_param."""
    args = {"op": nl.gelu, "imm0": 2.0, "imm1": 0.5, "op0": nl.multiply, "op1": nl.add}
    args.update(kwargs)
    if slope is not None:
        args["relu_param"] = load(slope)
    dst = nl.ndarray(x.shape, dtype=out_dtype, buffer=nl.sbuf)
    res = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=res, value=0.0)
    nisa.activate2(dst=dst, data=load(x), reduce_res=res if reduce_res else None, **args)
    return store(dst), store(res)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_activate2_scale_bias_gelu_reversed_ops_and_prelu(out_dtype):
    erf = np.vectorize(math.erf)  # the reference's own erf, not the simulator's torch one
    x = RNG.standard_normal((8, 32)).astype(np.float32)
    pre = x * 2 + 0.5
    gelu = 0.5 * pre * (1 + erf(pre / np.sqrt(2)))
    np.testing.assert_allclose(activate2_call(x, out_dtype)[0].astype(np.float32), as_out(gelu, out_dtype),
                               rtol=2e-3 if out_dtype is BF16 else 1e-5, atol=1e-6)
    # reverse0: imm0 - x; bypass skips op1; prelu's slope is relu_param (a (P, 1) tile here).
    slope = RNG.uniform(0.1, 0.3, 8).astype(np.float32)
    out, _ = activate2_call(x, out_dtype, False, column(slope), op=nl.prelu, imm0=1.0, op0=nl.subtract,
                            reverse0=True, op1=nl.bypass)
    pre = 1.0 - x
    np.testing.assert_array_equal(out.astype(np.float32), as_out(np.where(pre > 0, pre, pre * slope[:, None]),
                                                                 out_dtype))


def test_activate2_abs_max_and_add_reductions():
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    _, res = activate2_call(x, op=nl.copy, op0=nl.bypass, op1=nl.bypass, reduce_op=nl.abs_max, reduce_res=True,
                            reduce_cmd=nisa.reduce_cmd.reset_reduce)
    np.testing.assert_array_equal(res[:, 0], np.abs(x).max(axis=1))
    _, res = activate2_call(x, op=nl.square, imm0=-1.0, op1=nl.bypass, reduce_op=nl.add, reduce_res=True,
                            reduce_cmd=nisa.reduce_cmd.reset_reduce)
    np.testing.assert_allclose(res[:, 0], np.square(x).sum(axis=1), rtol=1e-5)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"op0": nl.bypass}, KernelUsageError, "op1 requires op0 to be set"),
    ({"op1": nl.bypass, "reverse1": True}, KernelUsageError, "reverse1 requires op1 to be set"),
    ({"op0": nl.greater}, KernelUsageError, "op0 must be an arithmetic operator"),
    ({"reduce_op": nl.multiply, "reduce_cmd": nisa.reduce_cmd.reset_reduce}, KernelUsageError,
     "reduce_op must be one of nl.add, nl.maximum"),
    ({"reduce_cmd": nisa.reduce_cmd.reset_reduce}, KernelUsageError, "needs reduce_op"),
    ({"op": nl.multiply}, UnsupportedError, "activation function 'multiply'"),
    ({"scale": 2.0}, TypeError, "unexpected keyword argument 'scale'"),
])
def test_activate2_rejects(kwargs, error, message):
    with pytest.raises(error, match=message):
        activate2_call(np.ones((4, 4), np.float32), **kwargs)


def test_prelu_is_an_operator_constant_only():
    with pytest.raises(UnsupportedError, match="nl.prelu"):
        nl.prelu(np.ones(2))
    with pytest.raises(UnsupportedError, match="activation function 'prelu'"):
        prelu_activation_kernel(np.ones((4, 4), np.float32))


@nki.jit
def prelu_activation_kernel(x):
    dst = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=dst, op=nl.prelu, data=load(x))  # nisa.activation has no relu_param
    return store(dst)


# ------------------------------------------------------------------ tensor_scalar_cumulative

@nki.jit
def cumulative_kernel(x, out_dtype, op1, second_cmd, imm1):
    """Two cumulative scans over x's halves, the second continuing per ``second_cmd``."""
    p, f = x.shape
    src = load(x)
    dst = nl.ndarray((p, f), dtype=out_dtype, buffer=nl.sbuf)
    nisa.tensor_scalar_cumulative(dst=dst[:, 0:f // 2], src=src[:, 0:f // 2], op0=nl.multiply, op1=op1, imm0=2.0)
    nisa.tensor_scalar_cumulative(dst=dst[:, f // 2:f], src=src[:, f // 2:f], op0=nl.multiply, op1=op1, imm0=2.0,
                                  imm1=imm1, reduce_cmd=second_cmd)
    return store(dst)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("op1, scan", [(nl.add, np.cumsum), (nl.maximum, np.maximum.accumulate)])
def test_tensor_scalar_cumulative_continues_across_two_calls(out_dtype, op1, scan):
    x = RNG.standard_normal((16, 10)).astype(np.float32)
    got = cumulative_kernel(x, out_dtype, op1, nisa.reduce_cmd.reduce, None).astype(np.float32)
    np.testing.assert_allclose(got, as_out(scan(x * 2, axis=1), out_dtype), rtol=1e-6, atol=1e-6)


def test_tensor_scalar_cumulative_load_reduce_starts_from_imm1():
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    got = cumulative_kernel(x, np.float32, nl.add, nisa.reduce_cmd.load_reduce, 10.0)
    np.testing.assert_allclose(got[:, 3:], 10.0 + np.cumsum(x[:, 3:] * 2, axis=1), rtol=1e-6)


@nki.jit
def cumulative_call(x, dst_dtype=nl.float32, **kwargs):
    dst = nl.ndarray(x.shape, dtype=dst_dtype, buffer=nl.sbuf)
    nisa.tensor_scalar_cumulative(dst=dst, src=load(x), op0=nl.add, op1=nl.add, imm0=1.0, **kwargs)
    return store(dst)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"dst_dtype": nl.int32}, KernelUsageError, "dst dtype must be one of"),
    ({"reduce_cmd": nisa.reduce_cmd.load_reduce}, KernelUsageError, "starts the accumulator at imm1, which is None"),
    ({"reverse0": True}, TypeError, "unexpected keyword argument 'reverse0'"),
])
def test_tensor_scalar_cumulative_rejects(kwargs, error, message):
    with pytest.raises(error, match=message):
        cumulative_call(np.ones((4, 4), np.float32), **kwargs)


# ------------------------------------------------------------------------- versions, handles

@nki.jit
def version_kernel(x):
    assert nisa.get_nc_version() == nisa.nc_version.gen4 and nisa.get_nc_sub_version() == 0
    return x


def test_nc_sub_version_is_the_first_revision():
    version_kernel(np.zeros((1, 1), np.float32))
    assert nisa.NkiInstruction().depends_on(nisa.NkiInstruction()) is not None
    with pytest.raises(KernelUsageError, match="depends_on takes instructions"):
        nisa.NkiInstruction().depends_on(3)


# ------------------------------------------------------------------------------- nl functions

@nki.jit
def nl_kernel(x, w, idx, out_dtype):
    src = load(x)
    norm = nl.rms_norm(src, load(w), axis=1, n=x.shape[1], dtype=out_dtype)
    dx = nl.gelu_apprx_sigmoid_dx(src, dtype=out_dtype)
    gathered = nl.gather_flattened(src, load(idx), dtype=out_dtype)
    flipped = nl.load_transpose2d(x, dtype=out_dtype)
    expanded = nl.expand_dims(src, 2)
    assert expanded.shape == (x.shape[0], x.shape[1], 1)
    wide = nl.ndarray(expanded.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=wide, src=expanded)
    return store(norm), store(dx), store(gathered), store(flipped), store(wide)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_nl_functions_match_numpy(out_dtype):
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    w = RNG.standard_normal((8, 16)).astype(np.float32)
    idx = RNG.integers(0, 16, (8, 5)).astype(np.uint32)
    norm, dx, gathered, flipped, wide = nl_kernel(x, w, idx, out_dtype)
    rms = np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(norm.astype(np.float32), as_out(x / rms * w, out_dtype), rtol=1e-5)
    s = 1 / (1 + np.exp(-1.702 * x))
    np.testing.assert_allclose(dx.astype(np.float32), as_out(s + 1.702 * x * s * (1 - s), out_dtype), rtol=1e-5)
    np.testing.assert_array_equal(gathered.astype(np.float32), as_out(np.take_along_axis(x, idx.astype(int), 1),
                                                                      out_dtype))
    np.testing.assert_array_equal(flipped.astype(np.float32), as_out(x.T, out_dtype))
    np.testing.assert_array_equal(wide, x[:, :, None])


def test_gelu_apprx_sigmoid_dx_is_the_derivative_of_gelu_apprx_sigmoid():
    x = np.linspace(-4, 4, 33, dtype=np.float32).reshape(1, -1)
    h = 1e-3
    f = lambda v: v / (1 + np.exp(-1.702 * v))  # noqa: E731
    got = nl_kernel(np.repeat(x, 2, 0), np.ones((2, 33), np.float32), np.zeros((2, 1), np.uint32), np.float32)[1]
    np.testing.assert_allclose(got[0], (f(x[0] + h) - f(x[0] - h)) / (2 * h), atol=1e-3)


@nki.jit
def nl_misuse_kernel(x, what):
    src = load(x)
    if what == "gather_axis":
        nl.gather_flattened(src, src, axis=1)
    elif what == "gather_dtype":
        nl.gather_flattened(src, src)
    elif what == "transpose_sbuf":
        nl.load_transpose2d(src)
    elif what == "expand_axis":
        nl.expand_dims(src, 4)
    elif what == "rms_compute_dtype":
        nl.rms_norm(src, src, axis=1, n=4, compute_dtype=nl.bfloat16)
    elif what == "rms_kwarg":
        nl.rms_norm(src, src, axis=1, n=4, mask=None)
    return x


@pytest.mark.parametrize("what, error, message", [
    ("gather_axis", UnsupportedError, r"nl.gather_flattened\(axis=1\)"),
    ("gather_dtype", KernelUsageError, "indices must be uint32, got float32"),
    ("transpose_sbuf", KernelUsageError, "src must be an HBM tensor"),
    ("expand_axis", KernelUsageError, r"axis 4 is outside \[-3, 2\]"),
    ("rms_compute_dtype", UnsupportedError, r"nl.rms_norm\(compute_dtype=bfloat16\)"),
    ("rms_kwarg", TypeError, "unexpected keyword argument 'mask'"),
])
def test_nl_functions_reject(what, error, message):
    with pytest.raises(error, match=message):
        nl_misuse_kernel(np.ones((4, 4), np.float32), what)
