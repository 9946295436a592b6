"""GIoU forward: every available backend against the torch eager reference, in one run."""

from __future__ import annotations

import contextlib

import torch

import nki_ops
from nki_ops._backends import availability, label
from nki_ops.cpp import options as cpp_options
from nki_ops.cpp.backend import is_emulated as cpp_is_emulated
from nki_ops.ops.giou.reference import giou_reference
from nki_ops.workloads import giou_workload

from .harness import RESULTS_DIR, Row, append_csv, make_row, time_fn


def run(batch: int = 1024, n_boxes: int = 256, *, repeats: int = 20, include_compile: bool = True,
        csv_name: str = "giou.csv") -> list[Row]:
    boxes1, boxes2 = giou_workload(batch, n_boxes)
    reference = time_fn(giou_reference, boxes1, boxes2, repeats=repeats)
    shape = tuple(boxes1.shape)
    rows = [make_row("giou", "torch (eager reference)", shape, boxes1.dtype, reference, reference)]
    if include_compile:
        compiled = torch.compile(giou_reference, fullgraph=True, dynamic=False)
        rows.append(make_row("giou", "torch.compile (reference)", shape, boxes1.dtype,
                             time_fn(compiled, boxes1, boxes2, repeats=repeats), reference))
    for backend, why_not in availability("giou").items():
        if backend == "torch" or why_not is not None:
            continue
        for mode in _modes(backend):
            with mode:
                timing = time_fn(nki_ops.giou, boxes1, boxes2, backend=backend, repeats=repeats)
                rows.append(make_row("giou", label("giou", backend), shape, boxes1.dtype, timing, reference))
    append_csv(rows, RESULTS_DIR / csv_name)
    return rows


def _modes(backend: str) -> list:
    """The emulated C++ operator runs checked (the default) and in fast mode; each gets a row."""
    if backend == "cpp" and cpp_is_emulated():
        return [cpp_options(checks=True), cpp_options(checks=False)]
    return [contextlib.nullcontext()]
