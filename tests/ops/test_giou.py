"""giou / giou_loss (torch backend) against the slow loop reference, per dtype, with gradients."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

import nki_ops
from nki_ops.workloads import giou_workload
from tests.boxes import adversarial_pairs, random_valid_boxes
from tests.slow_reference import giou_loop

# Output is in [-1, 1]: one rounding to the output dtype costs at most half its eps;
# fp16/bf16 are computed in fp32, so rounding dominates. fp32 error: a few roundings of
# products and quotients, well under 1e-6.
TOLERANCE = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6, torch.float64: 1e-12}


def test_published_workload_matches_loop_reference_within_1e6():
    boxes1, boxes2 = giou_workload(64, 256)
    got = nki_ops.giou(boxes1, boxes2, backend="torch")
    assert got.shape == (64, 256) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), giou_loop(boxes1, boxes2), rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", list(TOLERANCE))
def test_adversarial_boxes_per_dtype(dtype):
    boxes1, boxes2 = adversarial_pairs()
    b1, b2 = boxes1.to(dtype), boxes2.to(dtype)
    got = nki_ops.giou(b1, b2, backend="torch")
    assert got.dtype == dtype
    assert torch.isfinite(got).all(), got
    # The reference sees the same dtype-rounded coordinates the op saw.
    torch.testing.assert_close(got.double(), giou_loop(b1, b2), rtol=0, atol=TOLERANCE[dtype])


def test_known_values():
    boxes1, boxes2 = adversarial_pairs()
    got = nki_ops.giou(boxes1, boxes2, backend="torch")
    assert got[0] == 1.0                      # identical
    assert got[1] == pytest.approx(1 / 36 * 2 - 1)  # disjoint unit boxes in a 6x6 hull: 0 - (36 - 2) / 36
    assert got[2] == pytest.approx(4 / 100)   # nested: IoU only, the hull is the outer box
    assert got[6] == 0.0 and got[7] == 0.0    # zero-area identical: finite, 0


def test_batched_shapes_and_empty():
    b1 = random_valid_boxes(2 * 3 * 5).reshape(2, 3, 5, 4)
    b2 = random_valid_boxes(2 * 3 * 5).reshape(2, 3, 5, 4)
    assert nki_ops.giou(b1, b2, backend="torch").shape == (2, 3, 5)
    empty = torch.empty(0, 4)
    assert nki_ops.giou(empty, empty, backend="torch").shape == (0,)
    assert nki_ops.giou_loss(empty, empty, "mean", backend="torch").item() == 0.0


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_loss_reductions(reduction):
    b1, b2 = random_valid_boxes(7), random_valid_boxes(7)
    loss = nki_ops.giou_loss(b1, b2, reduction, backend="torch")
    elementwise = 1 - giou_loop(b1, b2)
    expected = {"none": elementwise, "mean": elementwise.mean(), "sum": elementwise.sum()}[reduction]
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_giou_loss_gradcheck(seed):
    g = torch.Generator().manual_seed(seed)
    b1 = random_valid_boxes(6, generator=g).requires_grad_()
    b2 = random_valid_boxes(6, generator=g).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: nki_ops.giou_loss(a, b, "sum", backend="torch"), (b1, b2))


def test_gradient_is_finite_on_degenerate_boxes():
    boxes1, boxes2 = adversarial_pairs()
    b1, b2 = boxes1.clone().requires_grad_(), boxes2.clone().requires_grad_()
    nki_ops.giou_loss(b1, b2, "sum", backend="torch").backward()
    assert torch.isfinite(b1.grad).all() and torch.isfinite(b2.grad).all()


def test_tie_subgradient_goes_to_boxes1():
    # The boxes share their x-edges, so every x max/min is a tie; the documented rule takes the
    # intersection and hull widths from boxes1. boxes2's x-gradient then flows only through its area:
    # inter 50, areas 100, union 150, hull 150, d giou / d area2 = -inter/union^2 + 1/hull = 1/225.
    b1 = torch.tensor([[0.0, 0.0, 10.0, 10.0]], dtype=torch.float64, requires_grad=True)
    b2 = torch.tensor([[0.0, 5.0, 10.0, 15.0]], dtype=torch.float64, requires_grad=True)
    nki_ops.giou(b1, b2, backend="torch").sum().backward()
    d_area2_dx = torch.tensor([-10.0, 10.0], dtype=torch.float64)  # d area2 / d (x1, x2)
    torch.testing.assert_close(b2.grad[0, [0, 2]], d_area2_dx / 225)


# ------------------------------------------------------------------------ conformance strategies

@st.composite
def _giou_case(draw):
    """Random GIoU inputs for tests/ops/test_conformance.py: adversarial boxes, any batch shape, every dtype."""
    from tests.ops.test_conformance import BOX_ATOL, BOX_RTOL, DTYPES, Case, _batch_shape, _boxes

    dtype = draw(st.sampled_from(DTYPES))
    batch = _batch_shape(draw)
    return Case([_boxes(draw, batch).to(dtype), _boxes(draw, batch).to(dtype)], atol=BOX_ATOL[dtype],
                rtol=BOX_RTOL[dtype])


@st.composite
def _giou_loss_case(draw):
    case = draw(_giou_case())
    case.options["reduction"] = draw(st.sampled_from(["none", "mean", "sum"]))
    if case.options["reduction"] == "sum":  # one rounding per element at most
        case.atol *= max(1, case.tensors[0].numel() // 4)
    return case


conformance_cases = {"giou": _giou_case, "giou_loss": _giou_loss_case}
