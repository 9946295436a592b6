"""GIoU's tiling parameter, tuned per target on the cost model (``nki_ops.ops._tuned``).

The kernels' one tiling choice is ``max_cols``, the most boxes per partition row (``launch_layout``): a
row tile is ``[128, 4 * cols]`` boxes, so it trades fewer, wider instructions against more row tiles
to overlap loads with compute. The studies cost each value at the benchmark's workload (two batches of
1,024 x 256 boxes, fp32; forward and backward separately), checking its values against the float64
reference at ``129 * max_cols + 5`` boxes (full-width rows, then a two-row tail tile, the last row
padded). Rerun with ``python -m nki_ops.ops.retune giou``.
"""

from __future__ import annotations

import torch

from ...workloads import giou_workload
from .._tuned import Tuned
from .nki_kernel import MAX_COLS, giou_backward_kernel, giou_kernel, launch_layout
from .reference import giou_reference

SPACE = {"max_cols": [MAX_COLS, 256, 128, 1024]}
STUDY = ("tune_kernel grid over max_cols, {kernel} at 2 x 1024 x 256 fp32 boxes, checked at 129 * max_cols + 5 "
         "boxes; studies giou-{kernel}-trn1/-trn2/-trn3 (python -m nki_ops.ops.retune giou)")

TUNED = {
    # trn1's forward: 256 boxes per row is estimated 0.3% faster than 512 (125.7 against 126.1 us)
    "forward": Tuned("giou_kernel", {"max_cols": MAX_COLS}, SPACE,
                     {"trn1": {"max_cols": 256}, "trn2": {"max_cols": 512}, "trn3": {"max_cols": 512}},
                     STUDY.format(kernel="forward")),
    "backward": Tuned("giou_backward_kernel", {"max_cols": MAX_COLS}, SPACE,
                      {"trn1": {"max_cols": 512}, "trn2": {"max_cols": 512}, "trn3": {"max_cols": 512}},
                      STUDY.format(kernel="backward")),
}


def _layouts(boxes1, boxes2, max_cols, grad=None):
    layout1, count = launch_layout(boxes1, max_cols=max_cols)
    layout2, _ = launch_layout(boxes2, max_cols=max_cols)
    if grad is None:
        return layout1, layout2, count
    return launch_layout(grad, per_box=1, max_cols=max_cols)[0], layout1, layout2, count


def _check_inputs(max_cols):
    boxes1, boxes2 = giou_workload(1, 129 * max_cols + 5, seed=3)
    return boxes1[0], boxes2[0], torch.randn(boxes1.shape[1], generator=torch.Generator().manual_seed(4))


def build_forward(max_cols):
    layout1, layout2, _ = _layouts(*giou_workload(), max_cols)
    return giou_kernel, (layout1, layout2)


def check_forward(max_cols):
    boxes1, boxes2, _ = _check_inputs(max_cols)
    layout1, layout2, count = _layouts(boxes1, boxes2, max_cols)
    got = giou_kernel(layout1, layout2).reshape(-1)[:count]
    torch.testing.assert_close(got, giou_reference(boxes1.double(), boxes2.double()).float(), rtol=1e-5, atol=1e-6)


def build_backward(max_cols):
    boxes1, boxes2 = giou_workload()
    grad = torch.randn(boxes1.shape[:-1], generator=torch.Generator().manual_seed(2))
    return giou_backward_kernel, _layouts(boxes1, boxes2, max_cols, grad)[:3]


def check_backward(max_cols):
    boxes1, boxes2, grad = _check_inputs(max_cols)
    grad_layout, layout1, layout2, count = _layouts(boxes1, boxes2, max_cols, grad)
    grad1, grad2 = giou_backward_kernel(grad_layout, layout1, layout2)
    b1, b2 = boxes1.double().requires_grad_(), boxes2.double().requires_grad_()
    giou_reference(b1, b2).backward(grad.double())
    torch.testing.assert_close(grad1.reshape(-1)[:count * 4].reshape(boxes1.shape), b1.grad.float(),
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grad2.reshape(-1)[:count * 4].reshape(boxes2.shape), b2.grad.float(),
                               rtol=1e-4, atol=1e-5)


BUILD = {"forward": (build_forward, check_forward), "backward": (build_backward, check_backward)}
