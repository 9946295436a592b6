"""The project's ops written in the legacy ``neuronxcc.nki`` dialect (tests/sim/legacy_kernels), run by
the simulator's legacy front end against the torch references: real multi-tile kernels (tail tiles,
strided ``nl.arange`` access, broadcasts, PSUM matmuls, sequential accumulation) on that front end."""

from __future__ import annotations

import pytest
import torch

from nki_ops.ops.box_iou.reference import box_iou_reference
from nki_ops.ops.giou.nki_kernel import launch_layout
from nki_ops.ops.giou.reference import giou_reference
from nki_ops.ops.rms_norm.reference import rms_norm_reference
from tests.boxes import random_valid_boxes

from .legacy_kernels import box_iou, giou, rms_norm

pytestmark = pytest.mark.simulation


def test_legacy_giou_forward_and_backward_match_reference():
    # 7 * 129 boxes: 8 boxes per row, 113 rows (a single narrower row tile), 7 padding boxes.
    shape = (7, 129)
    boxes1 = random_valid_boxes(7 * 129, dtype=torch.float32).reshape(*shape, 4)
    boxes2 = random_valid_boxes(7 * 129, dtype=torch.float32).reshape(*shape, 4)
    layout1, count = launch_layout(boxes1)
    layout2, _ = launch_layout(boxes2)
    got = torch.as_tensor(giou.giou_kernel(layout1, layout2)).reshape(-1)[:count].reshape(shape)
    torch.testing.assert_close(got, giou_reference(boxes1, boxes2), rtol=1e-5, atol=1e-7)

    weights = torch.rand(shape)
    a, b = boxes1.double().requires_grad_(), boxes2.double().requires_grad_()
    (giou_reference(a, b) * weights).sum().backward()
    grad_layout, _ = launch_layout(weights, per_box=1)
    grad1, grad2 = giou.giou_backward_kernel(grad_layout, layout1, layout2)
    scale = a.grad.abs().max().item()
    for got, expected in ((grad1, a.grad), (grad2, b.grad)):
        got = torch.as_tensor(got).reshape(-1)[:count * 4].reshape(*shape, 4)
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-5 * scale)


def test_legacy_box_iou_with_tail_tile_and_tail_chunk_matches_reference():
    boxes1, boxes2 = random_valid_boxes(129, dtype=torch.float32), random_valid_boxes(513, dtype=torch.float32)
    got = torch.as_tensor(box_iou.box_iou_kernel(boxes1, boxes2))
    torch.testing.assert_close(got, box_iou_reference(boxes1, boxes2), rtol=1e-5, atol=1e-7)
    assert (got > 0).float().mean() > 0.1


def test_legacy_rms_norm_forward_and_backward_match_reference():
    x, weight, grad = torch.randn(130, 600), torch.randn(600), torch.randn(130, 600)
    eps = 1e-6
    got = torch.as_tensor(rms_norm.rms_norm_kernel(x, weight.reshape(1, -1), eps))
    torch.testing.assert_close(got, rms_norm_reference(x, weight, eps), rtol=1e-5, atol=1e-7)

    x64, w64 = x.double().requires_grad_(), weight.double().requires_grad_()
    rms_norm_reference(x64, w64, eps).backward(grad.double())
    dx, dw = rms_norm.rms_norm_backward_kernel(grad, x, weight.reshape(1, -1), eps)
    torch.testing.assert_close(torch.as_tensor(dx).double(), x64.grad, rtol=1e-4,
                               atol=1e-5 * x64.grad.abs().max().item())
    torch.testing.assert_close(torch.as_tensor(dw).reshape(-1).double(), w64.grad, rtol=1e-4,
                               atol=1e-4 * w64.grad.abs().max().item())
