"""The NKI kernels refuse malformed inputs themselves, saying what they expected and what came, before
any instruction runs (the ops' wrappers never pass such inputs; a direct caller of a kernel may)."""

from __future__ import annotations

import pytest
import torch

from nki_ops.ops.box_iou.nki_kernel import box_iou_kernel
from nki_ops.ops.giou.nki_kernel import giou_backward_kernel, giou_kernel
from nki_ops.ops.rms_norm.nki_kernel import rms_norm_backward_kernel, rms_norm_kernel

pytestmark = pytest.mark.simulation


def _zeros(*shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype)


@pytest.mark.parametrize("kernel, args, message", [
    (giou_kernel, (_zeros(3, 6), _zeros(3, 6)), r"boxes1 must be HBM \[rows, 4 \* cols\].*got shape \(3, 6\)"),
    (giou_kernel, (_zeros(3, 8), _zeros(3, 4)), r"boxes2 must have boxes1's shape \(3, 8\), got \(3, 4\)"),
    (giou_kernel, (_zeros(3, 8), _zeros(3, 8, dtype=torch.bfloat16)),
     r"boxes must both be float32, bfloat16 or float16, got float32 and bfloat16"),
    (giou_backward_kernel, (_zeros(3, 1), _zeros(3, 8), _zeros(3, 8)),
     r"grad must be HBM \[3, 2\] \(one value per box\), got shape \(3, 1\)"),
    (box_iou_kernel, (_zeros(3, 5), _zeros(2, 4)), r"boxes1 must be HBM \[N, 4\] with N > 0, got shape \(3, 5\)"),
    (box_iou_kernel, (_zeros(3, 4), _zeros(0, 4)), r"boxes2 must be HBM \[M, 4\] with M > 0, got shape \(0, 4\)"),
    (rms_norm_kernel, (_zeros(3, 8), _zeros(1, 7), 1e-6), r"weight must be HBM \[1, 8\], got shape \(1, 7\)"),
    (rms_norm_kernel, (_zeros(3, 8), _zeros(1, 8), -1.0), r"eps must be a non-negative float, got -1.0"),
    (rms_norm_backward_kernel, (_zeros(3, 7), _zeros(3, 8), _zeros(1, 8), 1e-6),
     r"grad must have x's shape \(3, 8\), got \(3, 7\)"),
])
def test_kernel_refuses_malformed_inputs_saying_what_it_expected(kernel, args, message):
    with pytest.raises(AssertionError, match=message):
        kernel(*args)
