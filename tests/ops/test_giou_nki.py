"""giou / giou_loss on the NKI kernels (run by the simulator here) against the torch reference."""

from __future__ import annotations

import pytest
import torch

import nki_ops
from nki_ops.ops.giou.reference import giou_reference
from tests.boxes import adversarial_pairs, random_valid_boxes

pytestmark = pytest.mark.simulation

# bf16 in, fp32 compute, bf16 out, as in the reference: both round the same fp32-computed value
# once, so they differ by at most one bf16 ulp where the fp32 values straddle a rounding boundary.
# GIoU is in [-1, 1], where one bf16 ulp is at most 2**-7.
BF16_ATOL = 2.0 ** -7


def _paired(shape, dtype=torch.float32):
    count = torch.Size(shape).numel()
    return (random_valid_boxes(count, dtype=dtype).reshape(*shape, 4),
            random_valid_boxes(count, dtype=dtype).reshape(*shape, 4))


@pytest.mark.parametrize("shape", [(1000, 300), (1, 1), (1,), (7, 129), (130,)])
def test_forward_fp32_within_1e5_relative(shape):
    boxes1, boxes2 = _paired(shape)
    got = nki_ops.giou(boxes1, boxes2, backend="nki")
    assert got.shape == shape and got.dtype == torch.float32
    torch.testing.assert_close(got, giou_reference(boxes1, boxes2), rtol=1e-5, atol=1e-7)


def test_forward_bf16_within_one_ulp():
    boxes1, boxes2 = _paired((33, 70), torch.bfloat16)
    got = nki_ops.giou(boxes1, boxes2, backend="nki")
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), giou_reference(boxes1, boxes2).float(), rtol=0, atol=BF16_ATOL)


@pytest.mark.parametrize("shape", [(0, 4), (3, 0, 4), (0,  4, 4)])
def test_empty_batch_gives_empty_result_and_gradients(shape):
    boxes1 = torch.empty(shape, requires_grad=True)
    boxes2 = torch.empty(shape, requires_grad=True)
    loss = nki_ops.giou_loss(boxes1, boxes2, backend="nki")
    assert loss.shape == shape[:-1]
    loss.sum().backward()
    assert boxes1.grad.shape == shape and boxes2.grad.shape == shape


def test_adversarial_boxes_forward_and_subgradient_match_reference():
    boxes1, boxes2 = (b.float() for b in adversarial_pairs())
    grads = {}
    for backend, fn in (("nki", lambda a, b: nki_ops.giou_loss(a, b, backend="nki")),
                        ("torch", lambda a, b: 1 - giou_reference(a, b))):
        a, b = boxes1.clone().requires_grad_(), boxes2.clone().requires_grad_()
        loss = fn(a, b)
        assert torch.isfinite(loss).all()
        loss.backward(torch.linspace(0.5, 2.0, loss.numel()))
        grads[backend] = (loss.detach(), a.grad, b.grad)
    for got, expected in zip(grads["nki"], grads["torch"]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-9)


def test_tie_gradient_goes_to_boxes1():
    boxes1 = torch.tensor([[0.0, 0.0, 10.0, 10.0]], requires_grad=True)
    boxes2 = torch.tensor([[0.0, 5.0, 10.0, 15.0]], requires_grad=True)
    nki_ops.giou_loss(boxes1, boxes2, backend="nki").sum().backward()
    # x1 and x2 tie, so the intersection and enclosing widths take their x-gradients from boxes1
    # alone and boxes2's x-gradient is its area term: inter 50, union 150, enclose 150,
    # d giou / d union = 1/150 - 50/150**2 = 1/225, times the height 10, negated for the loss.
    torch.testing.assert_close(boxes2.grad[0, [0, 2]], torch.tensor([10 / 225, -10 / 225]))
    assert boxes1.grad[0, 0] != boxes2.grad[0, 0]


@pytest.mark.parametrize("shape", [(1000, 300), (5, 3)])
def test_gradients_match_autograd_of_reference(shape):
    boxes1, boxes2 = _paired(shape)
    weights = torch.rand(shape)
    a64, b64 = boxes1.double().requires_grad_(), boxes2.double().requires_grad_()
    ((1 - giou_reference(a64, b64)) * weights).sum().backward()
    a, b = boxes1.clone().requires_grad_(), boxes2.clone().requires_grad_()
    (nki_ops.giou_loss(a, b, backend="nki") * weights).sum().backward()
    # fp32 kernel against the float64 reference: relative 1e-4 of the largest gradient.
    scale = a64.grad.abs().max().item()
    torch.testing.assert_close(a.grad.double(), a64.grad, rtol=1e-4, atol=1e-5 * scale)
    torch.testing.assert_close(b.grad.double(), b64.grad, rtol=1e-4, atol=1e-5 * scale)


def test_bf16_gradients_are_bf16_and_close():
    boxes1, boxes2 = _paired((9, 20), torch.bfloat16)
    a, b = boxes1.clone().requires_grad_(), boxes2.clone().requires_grad_()
    nki_ops.giou_loss(a, b, "sum", backend="nki").backward()
    ar, br = boxes1.clone().requires_grad_(), boxes2.clone().requires_grad_()
    (1 - giou_reference(ar, br)).sum().backward()
    assert a.grad.dtype == torch.bfloat16
    # Both round an fp32 gradient once to bf16: one bf16 ulp (2**-8 relative) apart at most.
    torch.testing.assert_close(a.grad.float(), ar.grad.float(), rtol=2.0 ** -7, atol=1e-6)
    torch.testing.assert_close(b.grad.float(), br.grad.float(), rtol=2.0 ** -7, atol=1e-6)


def test_float64_is_refused_with_reason():
    boxes1, boxes2 = _paired((3,), torch.float64)
    with pytest.raises(nki_ops.BackendUnavailableError, match="float64"):
        nki_ops.giou(boxes1, boxes2, backend="nki")


def test_opcheck_of_the_library_ops():
    from nki_ops.ops.giou.nki_op import giou_backward_nki, giou_nki
    boxes1, boxes2 = _paired((4, 3))
    torch.library.opcheck(giou_nki, (boxes1.requires_grad_(), boxes2.requires_grad_()))
    torch.library.opcheck(giou_backward_nki, (torch.rand(4, 3), boxes1.detach(), boxes2.detach()))


def test_compiled_fullgraph_model_trains_with_the_nki_giou_op():
    torch._dynamo.reset()
    target = random_valid_boxes(32, dtype=torch.float32)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    @torch.compile(fullgraph=True)
    def step(inputs):
        predicted = inputs + model(inputs)
        return nki_ops.giou_loss(predicted, target, "mean", backend="nki")

    losses = []
    for _ in range(5):
        optimizer.zero_grad()
        loss = step(target + 3.0)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


@pytest.mark.neuron
def test_giou_loss_on_a_neuron_device_matches_reference():
    import torch_xla.core.xla_model as xm
    device = xm.xla_device()
    boxes1, boxes2 = _paired((130, 7))
    a = boxes1.to(device).requires_grad_()
    loss = nki_ops.giou_loss(a, boxes2.to(device), "sum", backend="nki")
    loss.backward()
    ar = boxes1.clone().requires_grad_()
    expected = (1 - giou_reference(ar, boxes2)).sum()
    expected.backward()
    torch.testing.assert_close(loss.cpu(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.grad.cpu(), ar.grad, rtol=1e-4, atol=1e-6)
