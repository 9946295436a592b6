"""nms / batched_nms (torch backend) against the slow greedy loop."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import strategies as st

import nki_ops
from nki_ops.workloads import random_boxes
from tests.slow_reference import nms_loop


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.5, 0.7, 1.0])
def test_random_boxes_match_loop(threshold):
    boxes = random_boxes(1, 400, seed=5)[0]
    scores = torch.rand(400)
    keep = nki_ops.nms(boxes, scores, threshold, backend="torch")
    assert keep.dtype == torch.int64
    assert keep.tolist() == nms_loop(boxes, scores, threshold)
    assert (scores[keep].diff() <= 0).all()


def test_box_exactly_at_threshold_is_kept():
    # IoU of these two boxes is exactly 0.5 (inter 2, union 4): suppression needs IoU > threshold.
    boxes = torch.tensor([[0.0, 0.0, 3.0, 1.0], [1.0, 0.0, 4.0, 1.0]])
    scores = torch.tensor([0.9, 0.8])
    assert nki_ops.nms(boxes, scores, 0.5, backend="torch").tolist() == [0, 1]
    assert nki_ops.nms(boxes, scores, 0.4999, backend="torch").tolist() == [0]


def test_equal_scores_visit_in_input_order():
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0]])
    scores = torch.tensor([0.5, 0.5, 0.5])
    assert nki_ops.nms(boxes, scores, 0.5, backend="torch").tolist() == [0, 2]
    assert nki_ops.nms(boxes.flip(0), scores, 0.5, backend="torch").tolist() == [0, 1]


def test_zero_area_boxes_are_never_suppressed():
    boxes = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    assert nki_ops.nms(boxes, torch.tensor([0.2, 0.1]), 0.0, backend="torch").tolist() == [0, 1]


def test_empty_input():
    keep = nki_ops.nms(torch.empty(0, 4), torch.empty(0), 0.5, backend="torch")
    assert keep.dtype == torch.int64 and keep.numel() == 0


def test_batched_nms_is_per_category():
    boxes = random_boxes(1, 300, seed=6)[0]
    scores = torch.rand(300)
    idxs = torch.randint(0, 4, (300,))
    keep = nki_ops.batched_nms(boxes, scores, idxs, 0.5, backend="torch")
    expected = []
    for c in range(4):
        members = torch.nonzero(idxs == c).flatten()
        expected += [int(members[i]) for i in nms_loop(boxes[members], scores[members], 0.5)]
    assert sorted(keep.tolist()) == sorted(expected)
    assert (scores[keep].diff() <= 0).all()
    # Identical boxes in different categories never suppress each other.
    same = torch.tensor([[0.0, 0.0, 1.0, 1.0]] * 2)
    assert nki_ops.batched_nms(same, torch.tensor([0.9, 0.8]), torch.tensor([0, 1]), 0.5,
                               backend="torch").tolist() == [0, 1]


# ------------------------------------------------------------------------ conformance strategy

@st.composite
def conformance_case(draw):
    """Random nms inputs for tests/ops/test_conformance.py, with thresholds the op must refuse."""
    from tests.ops.test_conformance import DTYPES, SIZES, Case, _boxes, _values

    dtype = draw(st.sampled_from(DTYPES))
    n = draw(SIZES)
    # Few distinct scores, so ties (kept in input order) are common.
    scores = _values(draw, (n,), st.integers(0, 6).map(lambda k: k / 8), 0.1)
    threshold = draw(st.sampled_from([0.0, 0.25, 0.5, 0.7, 1.0]) | st.floats(-0.1, 1.1)
                     | st.sampled_from([math.nan, True]))
    return Case([_boxes(draw, [n]).to(dtype), scores.to(dtype)], {"iou_threshold": threshold})
