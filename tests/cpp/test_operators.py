"""The C++ operators (GIoU forward and backward, NMS) against the torch references, under the emulation's checks."""

from __future__ import annotations

import pytest
import torch

import nki_ops
from nki_ops._backends import BackendUnavailableError
from nki_ops.cpp import operators, options
from nki_ops.ops.giou.reference import giou_reference
from nki_ops.ops.nms.reference import nms_reference
from nki_ops.workloads import giou_workload
from tests.boxes import adversarial_pairs, random_valid_boxes

pytestmark = [pytest.mark.cpp, pytest.mark.usefixtures("built_operators")]


def box_batches(batch: int, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (random_valid_boxes(batch * n, dtype=torch.float32, generator=g).reshape(batch, n, 4),
            random_valid_boxes(batch * n, dtype=torch.float32, generator=g).reshape(batch, n, 4))


# B below, at and above the core count, not divisible by it, and N spanning several TCM tiles.
SHAPES = [(1, 1), (3, 5), (7, 300), (8, 256), (13, 129), (2, 1000)]


@pytest.mark.parametrize("cores", [1, 3, 7, 8])
@pytest.mark.parametrize("batch,n", SHAPES)
def test_giou_forward_equals_reference_for_any_core_count(batch, n, cores):
    b1, b2 = box_batches(batch, n)
    with options(core_count=cores):
        got = operators.load("giou").giou(b1, b2)
    # Same float32 operations in the same order: bit-identical.
    torch.testing.assert_close(got, giou_reference(b1, b2), rtol=0, atol=0)


@pytest.mark.parametrize("cores", [1, 3, 8])
def test_giou_backward_equals_reference_gradients(cores):
    b1, b2 = box_batches(5, 37, seed=1)
    grad = torch.randn(5, 37)
    x1, x2 = b1.clone().requires_grad_(), b2.clone().requires_grad_()
    giou_reference(x1, x2).backward(grad)
    with options(core_count=cores):
        both = operators.load("giou").giou_backward(grad, b1, b2)
    torch.testing.assert_close(both[..., :4], x1.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(both[..., 4:], x2.grad, rtol=1e-5, atol=1e-6)


def test_giou_loss_gradients_match_torch_backend_on_adversarial_boxes():
    # Identical, nested, touching and zero-area boxes, and ties of every min/max: the documented
    # subgradients must agree exactly in meaning, so values agree to float32 rounding.
    a, b = adversarial_pairs()
    grads = {}
    for backend in ("torch", "cpp"):
        x1, x2 = a.float().requires_grad_(), b.float().requires_grad_()
        loss = nki_ops.giou_loss(x1, x2, "sum", backend=backend)
        loss.backward()
        grads[backend] = (loss.detach(), x1.grad, x2.grad)
    for got, expected in zip(grads["cpp"], grads["torch"]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_torch_library_registration_passes_opcheck():
    # Schema, fake (meta) kernel and autograd registration of the ops wrapping the C++ operators.
    from nki_ops.ops.giou.cpp_op import giou_backward_fp32, giou_fp32

    b1, b2 = (b.requires_grad_() for b in box_batches(3, 4))
    torch.library.opcheck(giou_fp32, (b1, b2))
    torch.library.opcheck(giou_backward_fp32, (torch.randn(3, 4), b1.detach(), b2.detach()))


def test_giou_loss_trains_through_cpp_backend_like_torch_backend():
    target = torch.tensor([[10.0, 10.0, 50.0, 40.0]])
    final = {}
    for backend in ("torch", "cpp"):
        pred = torch.tensor([[0.0, 0.0, 20.0, 15.0]], requires_grad=True)
        optimizer = torch.optim.SGD([pred], lr=20.0)
        for _ in range(200):
            optimizer.zero_grad()
            nki_ops.giou_loss(pred, target, "mean", backend=backend).backward()
            optimizer.step()
        final[backend] = pred.detach()
    assert nki_ops.giou(final["cpp"], target, backend="torch").item() > 0.9
    torch.testing.assert_close(final["cpp"], final["torch"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype,atol", [(torch.float16, 1e-3), (torch.bfloat16, 8e-3), (torch.float32, 0)])
def test_public_giou_any_shape_and_dtype(dtype, atol):
    b1, b2 = box_batches(6, 10)
    b1, b2 = b1.reshape(2, 3, 10, 4).to(dtype), b2.reshape(2, 3, 10, 4).to(dtype)
    got = nki_ops.giou(b1, b2, backend="cpp")
    assert got.shape == (2, 3, 10) and got.dtype == dtype
    torch.testing.assert_close(got, giou_reference(b1, b2), rtol=0, atol=atol)
    empty = torch.empty(0, 4, dtype=dtype)
    assert nki_ops.giou(empty, empty, backend="cpp").shape == (0,)


def test_float64_goes_to_torch_under_auto_and_is_refused_by_cpp():
    b1, b2 = (b.double() for b in box_batches(2, 3))
    assert nki_ops.giou(b1, b2).dtype == torch.float64
    torch.testing.assert_close(nki_ops.giou(b1, b2), giou_reference(b1, b2), rtol=0, atol=0)
    with pytest.raises(BackendUnavailableError, match="float32, float16 or bfloat16.*got torch.float64"):
        nki_ops.giou(b1, b2, backend="cpp")


def test_auto_picks_cpp_on_cpu_for_float32():
    b1, b2 = giou_workload(4, 16)
    torch.testing.assert_close(nki_ops.giou(b1, b2), nki_ops.giou(b1, b2, backend="cpp"), rtol=0, atol=0)


def test_fast_mode_gives_the_same_results():
    b1, b2 = giou_workload(64, 256)
    with options(checks=False):
        fast = operators.load("giou").giou(b1, b2)
    torch.testing.assert_close(fast, operators.load("giou").giou(b1, b2), rtol=0, atol=0)


def random_detections(n: int, seed: int, *, spread: float = 100.0):
    g = torch.Generator().manual_seed(seed)
    boxes = random_valid_boxes(n, scale=spread, dtype=torch.float32, generator=g)
    scores = torch.rand(n, generator=g)
    scores[::5] = 0.5  # ties: equal scores are visited in input order
    return boxes, scores


@pytest.mark.parametrize("n", [0, 1, 2, 17, 500])
@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.7, 1.0])
def test_nms_equals_reference(n, threshold):
    boxes, scores = random_detections(n, seed=n)
    got = nki_ops.nms(boxes, scores, threshold, backend="cpp")
    assert got.dtype == torch.int64
    torch.testing.assert_close(got, nms_reference(boxes, scores, threshold), rtol=0, atol=0)


def test_nms_raw_op_returns_count_then_padded_indices():
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    padded = operators.load("nms").nms(boxes, scores, 0.5)
    assert padded.dtype == torch.int32
    assert padded.tolist() == [2, 0, 2, -1]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_nms_half_precision_computes_in_float32_like_reference(dtype):
    boxes, scores = random_detections(300, seed=3)
    boxes, scores = boxes.to(dtype), scores.to(dtype)
    torch.testing.assert_close(nki_ops.nms(boxes, scores, 0.5, backend="cpp"), nms_reference(boxes, scores, 0.5),
                               rtol=0, atol=0)


def test_nms_5000_boxes_equals_reference():
    boxes, scores = random_detections(5000, seed=7, spread=1000.0)
    torch.testing.assert_close(nki_ops.nms(boxes, scores, 0.5, backend="cpp"), nms_reference(boxes, scores, 0.5),
                               rtol=0, atol=0)
