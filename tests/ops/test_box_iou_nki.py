"""box_iou on the NKI kernel (run by the simulator here) against the torch reference."""

from __future__ import annotations

import pytest
import torch

import nki_ops
from nki_ops.ops.box_iou import nki_op as box_iou_nki_module
from nki_ops.ops.box_iou.reference import box_iou_reference
from tests.boxes import adversarial_pairs, random_valid_boxes

pytestmark = pytest.mark.simulation

# Half precision in, fp32 compute, rounded once on the way out, as in the reference: both round
# fp32 values that agree to ~1e-7 relative, so they differ by at most one ulp of the output dtype
# where the two straddle a rounding boundary. IoU is in [0, 1], where one ulp is at most 2**-8 for
# bfloat16 (8 significant bits) and 2**-11 for float16 (11 significant bits).
HALF_ATOL = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def _box_sets(n, m, dtype=torch.float32):
    return random_valid_boxes(n, dtype=dtype), random_valid_boxes(m, dtype=dtype)


# (1000, 300): 7 full row tiles and a 104-row tail, one narrow column chunk; (129, 513): one-row
# tail tile and one-box tail chunk; (256, 1024): whole tiles and chunks only, no tails.
@pytest.mark.parametrize("n, m", [(1000, 300), (1, 1), (129, 513), (256, 1024)])
def test_fp32_matches_reference_within_1e5_relative(n, m):
    boxes1, boxes2 = _box_sets(n, m)
    expected = box_iou_reference(boxes1, boxes2)
    got = nki_ops.box_iou(boxes1, boxes2, backend="nki")
    assert got.shape == (n, m) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)


def test_overlapping_boxes_give_nontrivial_values():
    # Guards the comparison above against box sets that barely overlap (an all-zero IoU).
    boxes1, boxes2 = _box_sets(129, 513)
    got = nki_ops.box_iou(boxes1, boxes2, backend="nki")
    overlapping = got > 0
    # About a fifth of these pairs overlap, some of them by more than half.
    assert overlapping.float().mean() > 0.1 and got.max() > 0.5
    assert (got <= 1).all()


@pytest.mark.parametrize("n, m", [(0, 5), (5, 0), (0, 0)])
def test_empty_set_gives_empty_result_without_launching(n, m, monkeypatch):
    def no_launch(*args):
        raise AssertionError("the kernel was launched for an empty box set")

    monkeypatch.setattr(box_iou_nki_module, "box_iou_kernel", no_launch)
    boxes1, boxes2 = _box_sets(n, m)
    got = nki_ops.box_iou(boxes1, boxes2, backend="nki")
    assert got.shape == (n, m) and got.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_within_one_output_ulp(dtype):
    boxes1, boxes2 = _box_sets(150, 70, dtype)
    got = nki_ops.box_iou(boxes1, boxes2, backend="nki")
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), box_iou_reference(boxes1, boxes2).float(),
                               rtol=0, atol=HALF_ATOL[dtype])


def test_adversarial_boxes_match_reference_and_known_values():
    pairs1, pairs2 = (b.float() for b in adversarial_pairs())
    # Every box of both sides against every other: identical, disjoint, nested, edge- and
    # corner-touching, zero-area and large-coordinate pairs all meet in one [24, 24] result.
    boxes = torch.cat([pairs1, pairs2])
    got = nki_ops.box_iou(boxes, boxes, backend="nki")
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, box_iou_reference(boxes, boxes), rtol=1e-5, atol=1e-7)
    # The pairs as listed in tests/boxes.py, by hand: identical 1, disjoint 0, nested 4/100 both
    # ways, edge- and corner-touching 0, zero-area 0 (union clamped, not NaN), large 0.25, far 0,
    # shared x-edges 50/150.
    expected = torch.tensor([1, 0, 0.04, 0.04, 0, 0, 0, 0, 0, 0.25, 0, 1 / 3])
    paired = nki_ops.box_iou(pairs1, pairs2, backend="nki").diagonal()
    torch.testing.assert_close(paired, expected, rtol=1e-6, atol=0)


def test_float64_is_refused_with_reason():
    boxes1, boxes2 = _box_sets(3, 2, torch.float64)
    with pytest.raises(nki_ops.BackendUnavailableError, match="float64"):
        nki_ops.box_iou(boxes1, boxes2, backend="nki")


def test_backward_raises_naming_the_forward_only_op():
    boxes1, boxes2 = _box_sets(3, 2)
    iou = nki_ops.box_iou(boxes1.requires_grad_(), boxes2, backend="nki")
    with pytest.raises(RuntimeError, match=r"box_iou_nki.*no autograd formula"):
        iou.sum().backward()


def test_opcheck_of_the_library_op():
    boxes1, boxes2 = _box_sets(4, 3)
    torch.library.opcheck(box_iou_nki_module.box_iou_nki, (boxes1, boxes2))


def test_compiled_fullgraph_function_calls_the_nki_backend():
    torch._dynamo.reset()
    boxes1, boxes2 = _box_sets(40, 30)

    @torch.compile(fullgraph=True)
    def best_match(a, b):
        return nki_ops.box_iou(a, b, backend="nki").max(dim=1)

    got = best_match(boxes1, boxes2)
    expected = box_iou_reference(boxes1, boxes2).max(dim=1)
    torch.testing.assert_close(got.values, expected.values, rtol=1e-5, atol=1e-7)
    assert torch.equal(got.indices, expected.indices)


@pytest.mark.neuron
def test_box_iou_on_a_neuron_device_matches_reference():
    import torch_xla.core.xla_model as xm
    device = xm.xla_device()
    boxes1, boxes2 = _box_sets(130, 515)
    got = nki_ops.box_iou(boxes1.to(device), boxes2.to(device), backend="nki")
    torch.testing.assert_close(got.cpu(), box_iou_reference(boxes1, boxes2), rtol=1e-5, atol=1e-6)
