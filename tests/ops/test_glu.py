"""nki_ops.swiglu and nki_ops.geglu (tanh and erf forms) on the torch and nki backends against float64
references: any shape (0-D, odd sizes, past one 128-partition tile and one column chunk), every dtype,
saturated and special gates, gradients of gate and up, torch.compile training, bad inputs; and their
conformance strategies."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import strategies as st

import nki_ops
from nki_ops.ops.glu.nki_kernel import CHUNK, glu_backward_kernel, glu_kernel
from nki_ops.ops.glu.reference import geglu_reference, gelu, swiglu_reference

from .compiled_training import check_compiled_training

# The three activations as (public call, float64 reference), by the name the kernels use.
OPS = {
    "silu": (lambda gate, up, backend: nki_ops.swiglu(gate, up, backend=backend), swiglu_reference),
    "gelu": (lambda gate, up, backend: nki_ops.geglu(gate, up, "none", backend=backend),
             lambda gate, up: geglu_reference(gate, up, "none")),
    "gelu_tanh": (lambda gate, up, backend: nki_ops.geglu(gate, up, "tanh", backend=backend),
                  lambda gate, up: geglu_reference(gate, up, "tanh")),
}
# Half types in, fp32 compute, rounded once on output, as in the reference: one ulp of the half type
# apart (2**-7 of the value in bf16, 2**-10 in fp16), plus, where the activation or its derivative is
# a small difference of fp32 values of order 1 (negative gates: 1 + erf, 1 + tanh), the fp32 roundings
# of those, 1e-5 of the largest value.
HALF_RTOL = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}


def _assert_half_close(got, expected):
    torch.testing.assert_close(got.float(), expected.float(), rtol=HALF_RTOL[got.dtype],
                               atol=1e-5 * expected.float().abs().max().item())



def _inputs(shape, dtype=torch.float32, seed=0):
    """gate spread over the activations' curved part and past it (3 * randn), up of either sign."""
    g = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(shape, generator=g)).to(dtype), torch.randn(shape, generator=g).to(dtype)


def _f64(t):
    return t.detach().double().requires_grad_()


# ------------------------------------------------------------------------------ torch reference

def test_references_match_torch_functional_in_float64():
    gate, up = (t.double() for t in _inputs((5, 300)))
    torch.testing.assert_close(nki_ops.swiglu(gate, up, backend="torch"), F.silu(gate) * up, rtol=1e-14, atol=0)
    for approximate in ("tanh", "none"):
        # atol: 1 + erf(x) cancels for negative x, in both, to a few float64 ulps of |x * up| <= 40.
        torch.testing.assert_close(nki_ops.geglu(gate, up, approximate, backend="torch"),
                                   F.gelu(gate, approximate=approximate) * up, rtol=1e-14, atol=1e-14)


def test_the_erf_form_is_the_formula_at_the_top_of_the_float_range():
    # torch's vectorised gelu kernel gives inf at 3e38 and NaN at +inf; the formula gives 3e38 and inf.
    x = torch.tensor([3e38, math.inf, -math.inf] + [1.0] * 13)
    values = gelu(x, "none")
    assert values[0].item() == x[0].item() and values[1].item() == math.inf and values[2].isnan()


@pytest.mark.parametrize("dtype", list(HALF_RTOL))
@pytest.mark.parametrize("activation", list(OPS))
def test_reference_in_half_precision_rounds_the_float64_result_once(activation, dtype):
    call, reference = OPS[activation]
    gate, up = _inputs((7, 129), dtype)
    got = call(gate, up, "torch")
    assert got.dtype == dtype
    _assert_half_close(got, reference(gate.double(), up.double()).to(dtype))


@pytest.mark.parametrize("activation", list(OPS))
def test_reference_gradcheck(activation):
    call, _ = OPS[activation]
    gate, up = (_f64(t) for t in _inputs((4, 9)))
    assert torch.autograd.gradcheck(lambda a, b: call(a, b, "torch"), (gate, up))


# ---------------------------------------------------------------------------------- nki forward

SHAPES = [(130, 300), (1, 1), (), (7,), (3, 129, 5), (2, CHUNK + 76), (256, 48), (4, 2 * CHUNK + 64)]


@pytest.mark.simulation
@pytest.mark.parametrize("activation", list(OPS))
@pytest.mark.parametrize("shape", SHAPES)
def test_nki_forward_fp32_matches_the_float64_reference(activation, shape):
    call, reference = OPS[activation]
    gate, up = _inputs(shape)
    got = call(gate, up, "nki")
    assert got.shape == shape and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), reference(gate.double(), up.double()), rtol=1e-5, atol=1e-6)


@pytest.mark.simulation
@pytest.mark.parametrize("dtype", list(HALF_RTOL))
@pytest.mark.parametrize("activation", list(OPS))
def test_nki_forward_half_within_one_ulp_of_the_reference(activation, dtype):
    call, reference = OPS[activation]
    gate, up = _inputs((300, 257), dtype)
    got = call(gate, up, "nki")
    assert got.dtype == dtype
    _assert_half_close(got, reference(gate, up))


@pytest.mark.simulation
@pytest.mark.parametrize("activation", list(OPS))
def test_saturated_and_special_gates_match_the_reference(activation):
    # Past the curved part silu and gelu are 0 or x; at +-inf and NaN the reference's pattern of inf and NaN.
    call, reference = OPS[activation]
    gate = torch.tensor([-1e4, -100.0, -30.0, -0.0, 0.0, 30.0, 100.0, 1e4, 3e38, math.inf, -math.inf, math.nan])
    up = torch.linspace(-2.0, 2.0, gate.numel())
    torch.testing.assert_close(call(gate, up, "nki"), reference(gate, up), rtol=1e-6, atol=1e-30, equal_nan=True)


@pytest.mark.simulation
@pytest.mark.parametrize("shape", [(0, 16), (4, 0, 8)])
def test_empty_input_gives_empty_result_and_gradients(shape):
    gate, up = (t.requires_grad_() for t in _inputs(shape))
    out = nki_ops.swiglu(gate, up, backend="nki")
    assert out.shape == shape
    out.sum().backward()
    assert gate.grad.shape == shape and up.grad.shape == shape


# --------------------------------------------------------------------------------- nki gradients

@pytest.mark.simulation
@pytest.mark.parametrize("activation", list(OPS))
@pytest.mark.parametrize("shape", [(130, 300), (), (3, 129, 5), (4, 2 * CHUNK + 64)])
def test_nki_gradients_match_autograd_of_the_float64_reference(activation, shape):
    call, reference = OPS[activation]
    gate, up = _inputs(shape)
    grad = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    gate64, up64 = _f64(gate), _f64(up)
    reference(gate64, up64).backward(grad.double())
    gate_k, up_k = gate.clone().requires_grad_(), up.clone().requires_grad_()
    call(gate_k, up_k, "nki").backward(grad)
    # fp32 against float64: relative 1e-4, plus 1e-5 of the largest gradient where act' or act is near 0.
    for got, expected in ((gate_k.grad, gate64.grad), (up_k.grad, up64.grad)):
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-5 * expected.abs().max().item())


@pytest.mark.simulation
@pytest.mark.parametrize("activation", list(OPS))
def test_gradients_past_the_curved_part(activation):
    # act' is 1 far right and 0 far left (silu's dips below 0 first): the recomputed derivative must not
    # overflow into NaN, and must match autograd of the reference there.
    call, reference = OPS[activation]
    gate = torch.tensor([-1e4, -80.0, -30.0, -8.0, -3.0, -1.2, 0.0, 1.2, 3.0, 8.0, 30.0, 80.0, 1e4])
    up, grad = torch.full_like(gate, 1.5), torch.full_like(gate, -2.0)
    gate64, up64 = _f64(gate), _f64(up)
    reference(gate64, up64).backward(grad.double())
    gate_k, up_k = gate.clone().requires_grad_(), up.clone().requires_grad_()
    call(gate_k, up_k, "nki").backward(grad)
    torch.testing.assert_close(gate_k.grad.double(), gate64.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(up_k.grad.double(), up64.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.simulation
@pytest.mark.parametrize("dtype", list(HALF_RTOL))
@pytest.mark.parametrize("activation", list(OPS))
def test_half_gradients_keep_the_input_dtype(activation, dtype):
    call, reference = OPS[activation]
    gate, up = _inputs((9, 70), dtype)
    grad = torch.randn(9, 70).to(dtype)
    pairs = [(gate.clone().requires_grad_(), up.clone().requires_grad_()) for _ in range(2)]
    call(*pairs[0], "nki").backward(grad)
    reference(*pairs[1]).backward(grad)
    for got, expected in zip(pairs[0], pairs[1]):
        assert got.grad.dtype == dtype
        # Both round an fp32 gradient once to the half type (the reference's autograd computes in fp32).
        _assert_half_close(got.grad, expected.grad)


# ------------------------------------------------------------------------------ library ops, compile

@pytest.mark.simulation
@pytest.mark.parametrize("activation", list(OPS))
def test_opcheck_of_the_library_ops(activation):
    from nki_ops.ops.glu.nki_op import glu_backward_nki, glu_nki
    gate, up = _inputs((5, 24))
    torch.library.opcheck(glu_nki, (gate.clone().requires_grad_(), up.clone().requires_grad_(), activation))
    torch.library.opcheck(glu_backward_nki, (torch.randn(5, 24), gate, up, activation))


@pytest.mark.simulation
@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_compiled_fullgraph_training_step_of_a_gated_mlp(op):
    torch._dynamo.reset()
    torch.manual_seed(0)
    inputs, target = torch.randn(130, 16), torch.randn(130, 16)
    gate_proj, up_proj, down_proj = torch.nn.Linear(16, 40), torch.nn.Linear(16, 40), torch.nn.Linear(40, 16)
    parameters = [p for layer in (gate_proj, up_proj, down_proj) for p in layer.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=0.05)

    def loss_of(backend):
        hidden = getattr(nki_ops, op)(gate_proj(inputs), up_proj(inputs), backend=backend)
        return (down_proj(hidden) - target).pow(2).mean()

    check_compiled_training(loss_of, parameters, optimizer)


@pytest.mark.simulation
def test_float64_is_refused_by_the_nki_backend_with_reason():
    gate, up = _inputs((3, 8), torch.float64)
    with pytest.raises(nki_ops.BackendUnavailableError, match="float32"):
        nki_ops.geglu(gate, up, backend="nki")


# ---------------------------------------------------------------------------------- bad inputs

G = torch.ones(2, 8)


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
@pytest.mark.parametrize("up, message", [
    (torch.ones(2, 7), r"gate and up must have the same shape, got \(2, 8\) and \(2, 7\)"),
    (torch.ones(2, 8, dtype=torch.float16), r"gate and up must have the same dtype, got torch.float32 and "
                                            r"torch.float16"),
    (torch.ones(2, 8, dtype=torch.int32), r"up must have a floating dtype.*got torch.int32"),
    ([[1.0] * 8] * 2, r"up must be a torch.Tensor, got list"),
    (torch.ones(2, 8, device="meta"), r"gate and up must be on the same device, got cpu and meta"),
])
@pytest.mark.parametrize("backend", ["torch", "nki"])
def test_bad_inputs_say_what_was_expected_and_what_came(op, up, message, backend):
    with pytest.raises(ValueError, match=message):
        getattr(nki_ops, op)(G, up, backend=backend)


@pytest.mark.parametrize("approximate", ["erf", None, "Tanh"])
def test_geglu_refuses_an_unknown_approximation(approximate):
    with pytest.raises(ValueError, match=rf"approximate must be 'tanh' or 'none', got {approximate!r}"):
        nki_ops.geglu(G, G, approximate)


@pytest.mark.simulation
@pytest.mark.parametrize("kernel, args, message", [
    (glu_kernel, (torch.zeros(3, 8), torch.zeros(3, 7), "silu"), r"up must have gate's shape \(3, 8\), got \(3, 7\)"),
    (glu_kernel, (torch.zeros(3, 8), torch.zeros(3, 8), "relu"), r"activation must be one of .*got 'relu'"),
    (glu_kernel, (torch.zeros(3, 8), torch.zeros(3, 8, dtype=torch.float16), "gelu"),
     r"gate and up must both be float32, bfloat16 or float16, got float32 and float16"),
    (glu_backward_kernel, (torch.zeros(3, 7), torch.zeros(3, 8), torch.zeros(3, 8), "gelu_tanh"),
     r"grad must have gate's shape \(3, 8\), got \(3, 7\)"),
])
def test_the_kernels_refuse_malformed_inputs_saying_what_they_expected(kernel, args, message):
    with pytest.raises(AssertionError, match=message):
        kernel(*args)


# ------------------------------------------------------------------------ conformance strategies

U = 2.0 ** -24  # fp32 unit roundoff
# One ulp of the output dtype, relative: rounding fp32 values a few fp32 ulps apart.
OUTPUT_RTOL = {torch.float64: 1e-12, torch.float32: 2.0 ** -20, torch.float16: 2.0 ** -10,
               torch.bfloat16: 2.0 ** -7}
# Gates over the curved part of the activations, and far past it on both sides.
GATES = st.floats(-40, 40, allow_subnormal=False, width=16) | st.sampled_from([-1e4, -100.0, 100.0, 1e4])


def _cancellation_atol(gate: torch.Tensor, up: torch.Tensor) -> float:
    """For gates in (-40, 0), gelu is ``0.5 * x * (1 + f)`` with ``f`` near -1 and silu divides by
    ``1 + exp(-x)``: the two backends' fp32 activations then differ by a few ulps of 1 times ``|x|``,
    not of the (tiny) result. Past 40 in magnitude both activations are 0 or x to rounding."""
    spread = (gate.double().abs().clamp(max=40) * up.double().abs())
    spread = spread[spread.isfinite()]
    return 16 * U * spread.max().item() if spread.numel() else 0.0


def _glu_case(draw, options):
    from tests.ops.test_conformance import DTYPES, Case, _batch_shape, _values

    dtype = draw(st.sampled_from(DTYPES))
    batch = _batch_shape(draw)
    last = draw(st.sampled_from([(), (1,), (129,), (CHUNK + 1,)]))
    if math.prod(batch) * math.prod(last) > 20000:
        batch = [s % 4 for s in batch]
    shape = (*batch, *last)
    gate = _values(draw, shape, GATES, 0.2).to(dtype)
    up = _values(draw, shape, st.floats(-40, 40, allow_subnormal=False, width=16), 0.2).to(dtype)
    atol = 1e-12 if dtype == torch.float64 else _cancellation_atol(gate, up)
    if dtype == torch.float16:
        atol += 2.0 ** -24  # subnormal outputs
    return Case([gate, up], options, atol=atol, rtol=OUTPUT_RTOL[dtype])


@st.composite
def _swiglu_case(draw):
    return _glu_case(draw, {})


@st.composite
def _geglu_case(draw):
    return _glu_case(draw, {"approximate": draw(st.sampled_from(["tanh", "none"]) | st.just("exact"))})


# Random inputs for tests/ops/test_conformance.py: any shape (0-D, empty, odd, past a tile and a chunk),
# NaN and inf in either input, and for geglu an approximation the op must refuse.
conformance_cases = {"swiglu": _swiglu_case, "geglu": _geglu_case}


# ---------------------------------------------------------------------------------- benchmark

@pytest.mark.simulation
def test_the_benchmark_times_both_ops_on_every_available_backend_with_device_estimates():
    from benchmarks import glu
    rows = glu.run(rows=130, features=64, repeats=2)
    assert [r.op for r in rows if r.backend == "torch (eager reference)"] == ["swiglu", "geglu"]
    simulated = [r for r in rows if r.backend == "nki (simulated on CPU)"]
    assert [r.op for r in simulated] == ["swiglu", "geglu"]
    assert all(r.median_ms > 0 and 0 < r.est_trn1_ms and 0 < r.est_trn2_ms for r in simulated)
