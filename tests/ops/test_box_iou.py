"""box_iou (torch backend) against the slow loop reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

import nki_ops
from nki_ops.workloads import random_boxes
from tests.boxes import adversarial_pairs
from tests.slow_reference import box_iou_loop

# IoU is in [0, 1]: rounding to the output dtype dominates for half types (computed in fp32).
TOLERANCE = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6, torch.float64: 1e-12}


def test_published_workload_within_1e6():
    boxes1, boxes2 = random_boxes(1, 300, seed=3)[0], random_boxes(1, 200, seed=4)[0]
    got = nki_ops.box_iou(boxes1, boxes2, backend="torch")
    assert got.shape == (300, 200)
    torch.testing.assert_close(got.double(), box_iou_loop(boxes1, boxes2), rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", list(TOLERANCE))
def test_adversarial_boxes_per_dtype(dtype):
    boxes1, boxes2 = (b.to(dtype) for b in adversarial_pairs())
    got = nki_ops.box_iou(boxes1, boxes2, backend="torch")
    assert got.dtype == dtype and torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), box_iou_loop(boxes1, boxes2), rtol=0, atol=TOLERANCE[dtype])


def test_empty_sets():
    assert nki_ops.box_iou(torch.empty(0, 4), torch.rand(3, 4), backend="torch").shape == (0, 3)
    assert nki_ops.box_iou(torch.rand(2, 4), torch.empty(0, 4), backend="torch").shape == (2, 0)


# ------------------------------------------------------------------------ conformance strategy

@st.composite
def conformance_case(draw):
    """Random box_iou inputs for tests/ops/test_conformance.py: two adversarial box sets of any sizes."""
    from tests.ops.test_conformance import BOX_ATOL, DTYPES, SIZES, Case, _boxes

    dtype = draw(st.sampled_from(DTYPES))
    return Case([_boxes(draw, [draw(SIZES)]).to(dtype), _boxes(draw, [draw(SIZES)]).to(dtype)], atol=BOX_ATOL[dtype])
