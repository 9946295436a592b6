"""rms_norm on the NKI kernels (run by the simulator here) against the torch reference."""

from __future__ import annotations

import pytest
import torch

import nki_ops
from nki_ops.ops.rms_norm.reference import rms_norm_reference
from nki_ops.sim import CapacityError

from .compiled_training import check_compiled_training

pytestmark = pytest.mark.simulation

EPS = 1e-6
# Half types in, fp32 compute, rounded once on output, as in the reference: the two fp32 values
# differ only in summation order, so the rounded outputs are at most one ulp apart, and one ulp
# is at most 2**-7 (bf16) or 2**-10 (fp16) of the value; 2**-24 covers fp16's subnormal range.
HALF_TOLERANCE = {torch.bfloat16: dict(rtol=2.0 ** -7, atol=0.0),
                  torch.float16: dict(rtol=2.0 ** -10, atol=2.0 ** -24)}


def _inputs(shape, dtype=torch.float32):
    return torch.randn(shape).to(dtype), torch.randn(shape[-1]).to(dtype)


@pytest.mark.parametrize("shape", [(1000, 300), (1, 1), (3, 129, 64), (130, 1000), (256, 48), (129, 4096)])
def test_forward_fp32_within_1e5_relative(shape):
    x, weight = _inputs(shape)
    got = nki_ops.rms_norm(x, weight, EPS, backend="nki")
    assert got.shape == shape and got.dtype == torch.float32
    torch.testing.assert_close(got, rms_norm_reference(x, weight, EPS), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", list(HALF_TOLERANCE))
def test_forward_half_within_one_ulp(dtype):
    x, weight = _inputs((300, 257), dtype)
    got = nki_ops.rms_norm(x, weight, EPS, backend="nki")
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), rms_norm_reference(x, weight, EPS).float(), **HALF_TOLERANCE[dtype])


def test_rows_of_very_different_scale_are_normalised_independently():
    # Per-row statistics must not leak across partitions or tiles: rows span 1e-3 .. 1e3, one is 0.
    x = torch.randn(200, 96) * torch.logspace(-3, 3, 200)[:, None]
    x[77] = 0.0
    weight = torch.randn(96)
    got = nki_ops.rms_norm(x, weight, 1e-5, backend="nki")
    torch.testing.assert_close(got, rms_norm_reference(x, weight, 1e-5), rtol=1e-5, atol=1e-7)
    assert torch.equal(got[77], torch.zeros(96))


def test_zeros_input_gives_finite_output_and_gradients():
    x = torch.zeros(5, 40, requires_grad=True)
    weight = torch.randn(40, requires_grad=True)
    grad = torch.randn(5, 40)
    y = nki_ops.rms_norm(x, weight, 1e-5, backend="nki")
    assert torch.equal(y, torch.zeros(5, 40))
    y.backward(grad)
    # At x = 0, r = eps**-0.5 and the projection term vanishes: dx = r * grad * weight, dw = 0.
    torch.testing.assert_close(x.grad, grad * weight.detach() * 1e-5 ** -0.5, rtol=1e-5, atol=0.0)
    assert torch.equal(weight.grad, torch.zeros(40))


@pytest.mark.parametrize("shape", [(0, 16), (4, 0, 8), (3, 0)])
def test_empty_input_gives_empty_result_and_gradients(shape):
    x = torch.empty(shape, requires_grad=True)
    weight = torch.randn(shape[-1], requires_grad=True)
    y = nki_ops.rms_norm(x, weight, EPS, backend="nki")
    assert y.shape == shape
    y.sum().backward()
    assert x.grad.shape == shape
    assert torch.equal(weight.grad, torch.zeros(shape[-1]))


@pytest.mark.parametrize("shape", [(1000, 300), (3, 129, 64), (130, 8192), (3, 20000)])
def test_gradients_match_autograd_of_reference(shape):
    x, weight = _inputs(shape)
    grad = torch.randn(shape)
    x64, w64 = x.double().requires_grad_(), weight.double().requires_grad_()
    rms_norm_reference(x64, w64, EPS).backward(grad.double())
    xk, wk = x.clone().requires_grad_(), weight.clone().requires_grad_()
    nki_ops.rms_norm(xk, wk, EPS, backend="nki").backward(grad)
    # fp32 kernel against the float64 reference. dx: relative 1e-4, plus 1e-5 of the largest
    # dx where its two terms cancel. dw sums terms of both signs over all rows, so its fp32 error
    # scales with the sum of their magnitudes, not with the (possibly small) sum itself.
    dx_scale = x64.grad.abs().max().item()
    torch.testing.assert_close(xk.grad.double(), x64.grad, rtol=1e-4, atol=1e-5 * dx_scale)
    inv_rms = torch.rsqrt(x64.detach().pow(2).mean(-1, keepdim=True) + EPS)
    dw_scale = (grad.double() * x64.detach() * inv_rms).abs().reshape(-1, shape[-1]).sum(0).max().item()
    torch.testing.assert_close(wk.grad.double(), w64.grad, rtol=1e-4, atol=1e-5 * dw_scale)


def test_half_gradients_keep_the_input_dtypes():
    x = torch.randn(9, 70).bfloat16().requires_grad_()
    weight = torch.randn(70).requires_grad_()
    xr, wr = x.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    grad = torch.randn(9, 70).bfloat16()
    nki_ops.rms_norm(x, weight, EPS, backend="nki").backward(grad)
    rms_norm_reference(xr, wr, EPS).backward(grad)
    assert x.grad.dtype == torch.bfloat16 and weight.grad.dtype == torch.float32
    # dx: both round an fp32 gradient once to bf16, one bf16 ulp apart at most. dw stays fp32.
    torch.testing.assert_close(x.grad.float(), xr.grad.float(), rtol=2.0 ** -7, atol=1e-6)
    torch.testing.assert_close(weight.grad, wr.grad, rtol=1e-4, atol=1e-5 * wr.grad.abs().max().item())


def test_rows_wider_than_sbuf_are_refused_naming_the_allocation(monkeypatch):
    # One fp32 row tile of 50,000 columns needs 200,000 bytes per partition: more than trn1's 192 KiB.
    # The current API's simulator defaults to trn3 (256 KiB) like the SDK's, so the target is set.
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    x, weight = _inputs((2, 50_000))
    with pytest.raises(CapacityError, match=r"SBUF.*nki_kernel\.py:\d+"):
        nki_ops.rms_norm(x, weight, EPS, backend="nki")


def test_float64_is_refused_with_reason():
    x, weight = _inputs((3, 8), torch.float64)
    with pytest.raises(nki_ops.BackendUnavailableError, match="float32"):
        nki_ops.rms_norm(x, weight, EPS, backend="nki")


def test_opcheck_of_the_library_ops():
    from nki_ops.ops.rms_norm.nki_op import rms_norm_backward_nki, rms_norm_nki
    x, weight = _inputs((5, 24))
    torch.library.opcheck(rms_norm_nki, (x.requires_grad_(), weight.requires_grad_(), EPS))
    torch.library.opcheck(rms_norm_backward_nki, (torch.randn(5, 24), x.detach(), weight.detach(), EPS))


def test_compiled_fullgraph_training_step_through_the_public_op():
    torch._dynamo.reset()
    inputs, target = torch.randn(130, 32), torch.randn(130, 32)
    linear = torch.nn.Linear(32, 32)
    weight = torch.nn.Parameter(torch.ones(32))
    parameters = [weight, *linear.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=0.1)

    def loss_of(backend):
        return (nki_ops.rms_norm(linear(inputs), weight, EPS, backend=backend) - target).pow(2).mean()

    check_compiled_training(loss_of, parameters, optimizer)


@pytest.mark.neuron
def test_rms_norm_on_a_neuron_device_matches_reference():
    import torch_xla.core.xla_model as xm
    device = xm.xla_device()
    x, weight = _inputs((130, 300))
    grad = torch.randn(130, 300)
    xd, wd = x.to(device).requires_grad_(), weight.to(device).requires_grad_()
    y = nki_ops.rms_norm(xd, wd, EPS, backend="nki")
    y.backward(grad.to(device))
    xr, wr = x.clone().requires_grad_(), weight.clone().requires_grad_()
    expected = rms_norm_reference(xr, wr, EPS)
    expected.backward(grad)
    torch.testing.assert_close(y.cpu(), expected.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(xd.grad.cpu(), xr.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(wd.grad.cpu(), wr.grad, rtol=1e-4, atol=1e-4)
