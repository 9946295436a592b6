"""GIoU forward: every available backend against the torch eager reference, in one run."""

from __future__ import annotations

import nki_ops
from nki_ops.ops.giou.reference import giou_reference
from nki_ops.workloads import giou_workload

from .harness import Row, TunedRow, compare_backends, tuned_estimates


def run(batch: int = 1024, n_boxes: int = 256, *, repeats: int = 20, include_compile: bool = True,
        csv_name: str = "giou.csv") -> list[Row]:
    return compare_backends("giou", nki_ops.giou, giou_reference, giou_workload(batch, n_boxes),
                            repeats=repeats, include_compile=include_compile, csv_name=csv_name)


def tuned() -> list[TunedRow]:
    """The kernels' estimated device time with their default and their tuned max_cols, per target."""
    from nki_ops.ops.giou import tuning

    return tuned_estimates(tuning)
