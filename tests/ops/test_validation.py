"""Bad input raises ValueError saying what was expected and what came."""

from __future__ import annotations

import pytest
import torch

import nki_ops

BOXES = torch.tensor([[0.0, 0.0, 1.0, 1.0]])


@pytest.mark.parametrize("call, message", [
    (lambda: nki_ops.giou(torch.rand(2, 3), torch.rand(2, 3)), r"shape \(\.\.\., 4\).*got shape \(2, 3\)"),
    (lambda: nki_ops.giou(torch.rand(2, 4), torch.rand(3, 4)), r"same shape, got \(2, 4\) and \(3, 4\)"),
    (lambda: nki_ops.giou(torch.ones(2, 4, dtype=torch.int64), torch.ones(2, 4, dtype=torch.int64)),
     r"floating dtype.*got torch.int64"),
    (lambda: nki_ops.giou(BOXES, BOXES.double()), r"same dtype"),
    (lambda: nki_ops.giou([0, 0, 1, 1], BOXES), r"torch.Tensor, got list"),
    (lambda: nki_ops.giou_loss(BOXES, BOXES, "avg"), r"'none', 'mean' or 'sum', got 'avg'"),
    (lambda: nki_ops.box_iou(torch.rand(2, 3, 4), BOXES), r"2-D tensor of shape \[N, 4\], got shape \(2, 3, 4\)"),
    (lambda: nki_ops.nms(BOXES, torch.rand(2), 0.5), r"one score per box \(1\), got shape \(2,\)"),
    (lambda: nki_ops.nms(BOXES, torch.rand(1), 1.5), r"\[0, 1\], got 1.5"),
    (lambda: nki_ops.nms(BOXES, torch.rand(1), -0.1), r"\[0, 1\], got -0.1"),
    (lambda: nki_ops.batched_nms(BOXES, torch.rand(1), torch.tensor([0.5]), 0.5), r"integer tensor"),
    (lambda: nki_ops.rms_norm(torch.rand(2, 8), torch.rand(7)), r"shape \[8\].*got \(7,\)"),
    (lambda: nki_ops.rms_norm(torch.ones(2, 8, dtype=torch.int32), torch.ones(8)), r"floating dtype"),
])
def test_bad_input_message(call, message):
    with pytest.raises(ValueError, match=message):
        call()
