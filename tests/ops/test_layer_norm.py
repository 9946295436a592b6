"""nki_ops.layer_norm on the torch and nki backends against float64 references: odd row counts and widths
(one past a 128-row tile, past a 512-column chunk), every dtype, with and without a bias, gradients of x,
weight and bias, torch.compile training, bad inputs; and its conformance strategy."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import strategies as st

import nki_ops
from nki_ops.ops.layer_norm.nki_kernel import layer_norm_backward_kernel, layer_norm_kernel
from nki_ops.ops.layer_norm.reference import layer_norm_reference

from .compiled_training import check_compiled_training

EPS = 1e-5
# Half types in, fp32 compute, rounded once on output, as in the reference: the two fp32 values differ
# only in summation order, so the rounded outputs are at most one ulp apart (2**-7 of the value in bf16,
# 2**-10 in fp16; 2**-24 covers fp16's subnormals).
HALF_TOLERANCE = {torch.bfloat16: dict(rtol=2.0 ** -7, atol=0.0),
                  torch.float16: dict(rtol=2.0 ** -10, atol=2.0 ** -24)}


def _inputs(shape, dtype=torch.float32, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(dtype)
    weight = torch.randn(shape[-1], generator=g).to(dtype)
    return x, weight, torch.randn(shape[-1], generator=g).to(dtype) if bias else None


def _f64(t):
    return None if t is None else t.detach().double().requires_grad_()


# ------------------------------------------------------------------------------ torch reference

@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(3, 64), (2, 5, 130), (1, 1)])
def test_reference_matches_torch_layer_norm_in_float64(shape, bias):
    x, weight, b = (_f64(t) for t in _inputs(shape, bias=bias))
    got = nki_ops.layer_norm(x, weight, b, EPS, backend="torch")
    expected = torch.nn.functional.layer_norm(x, (shape[-1],), weight, b, EPS)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_reference_in_half_and_single_precision_rounds_the_float64_result_once(dtype):
    x, weight, b = _inputs((7, 129), dtype)
    got = nki_ops.layer_norm(x, weight, b, EPS, backend="torch")
    assert got.dtype == dtype
    expected = layer_norm_reference(x.double(), weight.double(), b.double(), EPS)
    torch.testing.assert_close(got.double(), expected, **HALF_TOLERANCE.get(dtype, dict(rtol=1e-5, atol=1e-6)))


@pytest.mark.parametrize("bias", [True, False])
def test_reference_gradcheck(bias):
    x, weight, b = (_f64(t) for t in _inputs((4, 16), bias=bias))
    inputs = (x, weight) if b is None else (x, weight, b)
    assert torch.autograd.gradcheck(lambda *a: nki_ops.layer_norm(*a, eps=EPS, backend="torch"), inputs)


# ---------------------------------------------------------------------------------- nki forward

@pytest.mark.simulation
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(130, 300), (1, 1), (3, 129, 64), (2, 1100), (256, 48)])
def test_nki_forward_fp32_matches_the_float64_reference(shape, bias):
    x, weight, b = _inputs(shape, bias=bias)
    got = nki_ops.layer_norm(x, weight, b, EPS, backend="nki")
    assert got.shape == shape and got.dtype == torch.float32
    expected = layer_norm_reference(x.double(), weight.double(), None if b is None else b.double(), EPS)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.simulation
@pytest.mark.parametrize("dtype", list(HALF_TOLERANCE))
def test_nki_forward_half_within_one_ulp_of_the_reference(dtype):
    x, weight, b = _inputs((300, 257), dtype)
    got = nki_ops.layer_norm(x, weight, b, EPS, backend="nki")
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), layer_norm_reference(x, weight, b, EPS).float(), **HALF_TOLERANCE[dtype])


@pytest.mark.simulation
def test_rows_far_from_zero_and_of_very_different_scale_are_normalised_independently():
    # A mean of 1e3 next to spreads of 1 .. 1e2: mean(x**2) - mean**2 would lose several percent of the
    # variance of the narrowest rows to fp32 cancellation. Per-row statistics must not leak across
    # partitions or tiles. Row 77 is constant: its output is the bias, exactly.
    g = torch.Generator().manual_seed(3)
    x = 1e3 + torch.randn(200, 96, generator=g) * torch.logspace(0, 2, 200)[:, None]
    x[77] = 1e3
    weight, bias = torch.randn(96, generator=g), torch.randn(96, generator=g)
    got = nki_ops.layer_norm(x, weight, bias, EPS, backend="nki")
    assert torch.equal(got[77], bias)
    others = torch.arange(200) != 77
    expected = layer_norm_reference(x.double(), weight.double(), bias.double(), EPS)
    torch.testing.assert_close(got[others].double(), expected[others], rtol=1e-5,
                               atol=_mean_shift_atol(x[others], weight, EPS) + 1e-6)


@pytest.mark.simulation
@pytest.mark.parametrize("shape", [(0, 16), (4, 0, 8), (3, 0)])
def test_empty_input_gives_empty_result_and_zero_gradients(shape):
    x, weight, b = (t.requires_grad_() for t in _inputs(shape))
    y = nki_ops.layer_norm(x, weight, b, EPS, backend="nki")
    assert y.shape == shape
    y.sum().backward()
    assert x.grad.shape == shape
    assert torch.equal(weight.grad, torch.zeros(shape[-1])) and torch.equal(b.grad, torch.zeros(shape[-1]))


# --------------------------------------------------------------------------------- nki gradients

def _nki_and_float64_gradients(x, weight, b, grad):
    x64, w64, b64 = (_f64(t) for t in (x, weight, b))
    layer_norm_reference(x64, w64, b64, EPS).backward(grad.double())
    xk, wk = x.clone().requires_grad_(), weight.clone().requires_grad_()
    bk = None if b is None else b.clone().requires_grad_()
    nki_ops.layer_norm(xk, wk, bk, EPS, backend="nki").backward(grad)
    return (xk, wk, bk), (x64, w64, b64)


@pytest.mark.simulation
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(300, 200), (3, 129, 64), (130, 1100), (2, 5000)])
def test_nki_gradients_match_autograd_of_the_float64_reference(shape, bias):
    x, weight, b = _inputs(shape, bias=bias)
    grad = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    (xk, wk, bk), (x64, w64, b64) = _nki_and_float64_gradients(x, weight, b, grad)
    # fp32 kernel against the float64 reference. dx: relative 1e-4, plus 1e-5 of the largest dx where its
    # three terms cancel. dweight and dbias sum terms of both signs over all rows, so their fp32 error
    # scales with the sum of the terms' magnitudes, not with the (possibly small) sum itself.
    torch.testing.assert_close(xk.grad.double(), x64.grad, rtol=1e-4, atol=1e-5 * x64.grad.abs().max().item())
    centred = x64.detach() - x64.detach().mean(-1, keepdim=True)
    xhat = centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + EPS)
    dw_scale = (grad.double() * xhat).abs().reshape(-1, shape[-1]).sum(0).max().item()
    torch.testing.assert_close(wk.grad.double(), w64.grad, rtol=1e-4, atol=1e-5 * dw_scale)
    if bias:
        db_scale = grad.double().abs().reshape(-1, shape[-1]).sum(0).max().item()
        torch.testing.assert_close(bk.grad.double(), b64.grad, rtol=1e-4, atol=1e-5 * db_scale)
    else:
        assert bk is None


@pytest.mark.simulation
@pytest.mark.parametrize("dtype", list(HALF_TOLERANCE))
def test_half_gradients_keep_the_input_dtypes(dtype):
    x, _, _ = _inputs((9, 70), dtype)
    weight, b = torch.randn(70), torch.randn(70).to(dtype)  # an fp32 weight beside half x and bias
    grad = torch.randn(9, 70).to(dtype)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    ws = [weight.clone().requires_grad_() for _ in range(2)]
    bs = [b.clone().requires_grad_() for _ in range(2)]
    nki_ops.layer_norm(xs[0], ws[0], bs[0], EPS, backend="nki").backward(grad)
    layer_norm_reference(xs[1], ws[1], bs[1], EPS).backward(grad)
    assert (xs[0].grad.dtype, ws[0].grad.dtype, bs[0].grad.dtype) == (dtype, torch.float32, dtype)
    # dx: both round an fp32 gradient once to the half type, one ulp apart at most. dweight stays fp32;
    # dbias sums half-precision gradients in fp32 and rounds once.
    torch.testing.assert_close(xs[0].grad.float(), xs[1].grad.float(), **HALF_TOLERANCE[dtype])
    torch.testing.assert_close(ws[0].grad, ws[1].grad, rtol=1e-4, atol=1e-5 * ws[1].grad.abs().max().item())
    torch.testing.assert_close(bs[0].grad.float(), bs[1].grad.float(), **HALF_TOLERANCE[dtype])


# ------------------------------------------------------------------------------ library ops, compile

@pytest.mark.simulation
@pytest.mark.parametrize("bias", [True, False])
def test_opcheck_of_the_library_ops(bias):
    from nki_ops.ops.layer_norm.nki_op import layer_norm_backward_nki, layer_norm_nki
    x, weight, b = _inputs((5, 24), bias=bias)
    torch.library.opcheck(layer_norm_nki, (*(None if t is None else t.clone().requires_grad_() for t in (x, weight, b)),
                                           EPS))
    torch.library.opcheck(layer_norm_backward_nki, (torch.randn(5, 24), x, weight, b, EPS))


@pytest.mark.simulation
def test_compiled_fullgraph_training_step_through_the_public_op():
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    inputs, target = torch.randn(130, 32, generator=g), torch.randn(130, 32, generator=g)
    linear = torch.nn.Linear(32, 32)
    weight, bias = torch.nn.Parameter(torch.ones(32)), torch.nn.Parameter(torch.zeros(32))
    parameters = [weight, bias, *linear.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=0.1)

    def loss_of(backend):
        return (nki_ops.layer_norm(linear(inputs), weight, bias, EPS, backend=backend) - target).pow(2).mean()

    check_compiled_training(loss_of, parameters, optimizer)


@pytest.mark.simulation
def test_float64_is_refused_by_the_nki_backend_with_reason():
    x, weight, b = _inputs((3, 8), torch.float64)
    with pytest.raises(nki_ops.BackendUnavailableError, match="float32"):
        nki_ops.layer_norm(x, weight, b, EPS, backend="nki")


# ---------------------------------------------------------------------------------- bad inputs

X, W = torch.ones(2, 8), torch.ones(8)


@pytest.mark.parametrize("call, message", [
    (lambda b: nki_ops.layer_norm(X, torch.ones(7), backend=b), r"weight must have shape \[8\].*got \(7,\)"),
    (lambda b: nki_ops.layer_norm(X, W, torch.ones(2, 8), backend=b),
     r"bias must be None or have shape \[8\] \(x's last dimension\), got \(2, 8\)"),
    (lambda b: nki_ops.layer_norm(X.int(), W, backend=b), r"x must have a floating dtype.*got torch.int32"),
    (lambda b: nki_ops.layer_norm(X, W, W.long(), backend=b), r"bias must have a floating dtype.*got torch.int64"),
    (lambda b: nki_ops.layer_norm(torch.tensor(1.0), torch.ones(1), backend=b), r"at least one dimension"),
    (lambda b: nki_ops.layer_norm(X, W, [0.0] * 8, backend=b), r"bias must be a torch.Tensor, got list"),
    (lambda b: nki_ops.layer_norm(X, W, torch.ones(8, device="meta"), backend=b),
     r"x and weight and bias must be on the same device, got cpu and cpu and meta"),
    (lambda b: nki_ops.layer_norm(X, W, None, -1e-6, backend=b), r"eps must be a finite number >= 0, got -1e-06"),
    (lambda b: nki_ops.layer_norm(X, W, None, math.nan, backend=b), r"eps must be a finite number >= 0, got nan"),
])
@pytest.mark.parametrize("backend", ["torch", "nki"])
def test_bad_inputs_say_what_was_expected_and_what_came(call, message, backend):
    with pytest.raises(ValueError, match=message):
        call(backend)


@pytest.mark.simulation
@pytest.mark.parametrize("kernel, args, message", [
    (layer_norm_kernel, (torch.zeros(3, 8), torch.zeros(1, 7), None, EPS),
     r"weight must be HBM \[1, 8\], got shape \(1, 7\)"),
    (layer_norm_kernel, (torch.zeros(3, 8), torch.zeros(1, 8), torch.zeros(8), EPS),
     r"bias must be None or HBM \[1, 8\], got shape \(8,\)"),
    (layer_norm_kernel, (torch.zeros(3, 8), torch.zeros(1, 8), None, -1.0), r"eps must be a non-negative float"),
    (layer_norm_backward_kernel, (torch.zeros(3, 7), torch.zeros(3, 8), torch.zeros(1, 8), None, EPS),
     r"grad must have x's shape \(3, 8\), got \(3, 7\)"),
])
def test_the_kernels_refuse_malformed_inputs_saying_what_they_expected(kernel, args, message):
    with pytest.raises(AssertionError, match=message):
        kernel(*args)


# ------------------------------------------------------------------------ conformance strategy

# fp32 unit roundoff: the kernel's and the reference's row means, summed in different orders over at
# most 513 values, each lie within (log2(513) + 2) * U * max|x| of the exact mean.
U = 2.0 ** -24
# The output's own rounding: one ulp of the output dtype, relative.
OUTPUT_RTOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 2.0 ** -9, torch.bfloat16: 2.0 ** -6}


def _mean_shift_atol(x: torch.Tensor, weight: torch.Tensor, eps: float) -> float:
    """How far apart two fp32 LayerNorms of these rows may be when only their means differ: a shift of the
    mean by ``2 * 12 * U * max|x_row|`` moves every output of the row by that times ``r * |w|``. For
    near-constant rows r is up to ``eps ** -0.5``, so the bound is large there and tiny elsewhere."""
    rows = x.double().reshape(-1, x.shape[-1])
    rows = rows[rows.isfinite().all(-1)]
    if rows.numel() == 0 or not math.isfinite(eps) or eps <= 0:
        return 0.0
    inv_std = torch.rsqrt(rows.var(-1, unbiased=False) + eps)
    return 24 * U * (rows.abs().amax(-1) * inv_std).max().item() * weight.double().abs().max().item()


@st.composite
def conformance_case(draw):
    """Random layer_norm inputs for tests/ops/test_conformance.py, with and without a bias, and eps values
    the op must refuse. NaN and inf only in x: in the weight, inf times a normalised value that is 0 in
    one backend and a rounding residue in the other is NaN against inf, a difference of no use."""
    from tests.ops.test_conformance import DTYPES, Case, _batch_shape, _values

    dtype = draw(st.sampled_from(DTYPES))
    d = draw(st.sampled_from([1, 2, 3, 7, 64, 129, 513]))
    batch = _batch_shape(draw)
    if math.prod(batch) * d > 20000:
        batch = [s % 8 for s in batch]
    finite = st.floats(-1e4, 1e4, allow_subnormal=False, width=16)
    x = _values(draw, (*batch, d), finite, 0.2).to(dtype)
    weight = _values(draw, (d,), finite, 0.0).to(dtype)
    tensors = [x, weight]
    bias = None
    if draw(st.booleans()):
        bias = _values(draw, (d,), finite, 0.0).to(dtype)
        tensors.append(bias)
    # eps = 0 is valid but not drawn: a constant row then gives 0 * inf in one backend and a residue
    # over itself in the other; tests above cover eps of every valid size on ordinary rows.
    eps = draw(st.sampled_from([1e-6, 1e-5, 0.1]) | st.sampled_from([-1e-6, math.nan, math.inf]))
    atol = 1e-12 if dtype == torch.float64 else _mean_shift_atol(x, weight, eps)
    if bias is not None and dtype != torch.float64:
        atol += 4 * U * bias.double().abs().max().item()  # the final add's rounding when w * xhat and bias cancel
    if dtype == torch.float16:
        atol += 2.0 ** -24  # subnormal outputs
    return Case(tensors, {"eps": eps}, atol=atol, rtol=OUTPUT_RTOL[dtype])


# ---------------------------------------------------------------------------------- benchmark

@pytest.mark.simulation
def test_the_benchmark_times_every_available_backend_with_device_estimates():
    from benchmarks import layer_norm
    rows = layer_norm.run(rows=130, features=64, repeats=2)
    assert rows[0].backend == "torch (eager reference)" and rows[0].speedup_vs_torch == 1.0
    simulated = [r for r in rows if r.backend == "nki (simulated on CPU)"]
    assert len(simulated) == 1 and simulated[0].median_ms > 0
    assert 0 < simulated[0].est_trn1_ms and 0 < simulated[0].est_trn2_ms
