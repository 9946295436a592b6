"""The C++ operators under the CPU emulation against the torch references, in one run.

GIoU on the published 1024 x 256 workload: the C++ operator in fast mode (no checks) and with
checks, torch eager and torch.compile of the reference. NMS on 5,000 boxes: the C++ operator
against the torch reference. All of it is CPU time on this host, not GpSimd time.
"""

from __future__ import annotations

import torch

from nki_ops.cpp import operators, options
from nki_ops.ops.giou.reference import giou_reference
from nki_ops.ops.nms.cpp_op import nms_cpp
from nki_ops.ops.nms.reference import nms_reference
from nki_ops.workloads import giou_workload

from .harness import RESULTS_DIR, Row, append_csv, make_row, time_fn


def nms_workload(n: int = 5000, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` detections in a 1000 x 1000 image, sides up to 100: enough overlap that NMS removes many."""
    g = torch.Generator().manual_seed(seed)
    top_left = torch.rand(n, 2, generator=g) * 1000
    boxes = torch.cat([top_left, top_left + 4 + torch.rand(n, 2, generator=g) * 96], dim=1)
    return boxes, torch.rand(n, generator=g)


def run(*, repeats: int = 20, csv_name: str = "cpp_ops.csv") -> list[Row]:
    giou_ops = operators.load("giou")
    boxes1, boxes2 = giou_workload()
    shape = tuple(boxes1.shape)
    eager = time_fn(giou_reference, boxes1, boxes2, repeats=repeats)
    compiled = torch.compile(giou_reference, fullgraph=True, dynamic=False)
    compiled_timing = time_fn(compiled, boxes1, boxes2, repeats=repeats)
    rows = [make_row("giou", "torch (eager reference)", shape, boxes1.dtype, eager, eager),
            make_row("giou", "torch.compile (reference)", shape, boxes1.dtype, compiled_timing, eager)]
    for checks, mode in ((False, "fast mode"), (True, "all checks on")):
        with options(checks=checks):
            timing = time_fn(giou_ops.giou, boxes1, boxes2, repeats=repeats)
        rows.append(make_row("giou", "cpp (emulated on CPU, 8 cores)", shape, boxes1.dtype, timing, eager,
                             f"{mode}; {compiled_timing.median_ms / timing.median_ms:.2f}x torch.compile"))

    boxes, scores = nms_workload()
    reference = time_fn(nms_reference, boxes, scores, 0.5, warmup=1, repeats=max(3, repeats // 4))
    rows.append(make_row("nms", "torch (reference)", tuple(boxes.shape), boxes.dtype, reference, reference))
    with options(checks=False):
        timing = time_fn(nms_cpp, boxes, scores, 0.5, repeats=repeats)
    rows.append(make_row("nms", "cpp (emulated on CPU, 1 core)", tuple(boxes.shape), boxes.dtype, timing, reference,
                         "fast mode"))
    append_csv(rows, RESULTS_DIR / csv_name)
    return rows
