"""The NKI simulator's speed: the GIoU example kernel on the published 1024 x 256 boxes workload,
simulated on this CPU, against the torch eager reference timed in the same run.

The ratio measures simulator overhead only; simulated time says nothing about a NeuronCore.
Run: ``python -m benchmarks.sim_giou`` or ``nki-ops bench sim_giou``.
"""

from __future__ import annotations

import numpy as np
import torch

from nki_ops.ops.giou.reference import giou_reference
from nki_ops.sim.examples import giou_kernel
from nki_ops.workloads import giou_workload

from .harness import RESULTS_DIR, Row, append_csv, format_table, make_row, time_fn

TARGET_RATIO = 3.0


def run(batch: int = 1024, n_boxes: int = 256, *, repeats: int = 20, csv_name: str = "sim_giou.csv") -> list[Row]:
    boxes1, boxes2 = giou_workload(batch, n_boxes)
    flat1, flat2 = boxes1.reshape(batch, -1).numpy(), boxes2.reshape(batch, -1).numpy()
    out = np.empty((batch, n_boxes), np.float32)
    giou_kernel(flat1, flat2, out)
    expected = giou_reference(boxes1, boxes2)
    torch.testing.assert_close(torch.from_numpy(out), expected, rtol=1e-5, atol=1e-5)

    reference = time_fn(giou_reference, boxes1, boxes2, repeats=repeats)
    simulated = time_fn(giou_kernel, flat1, flat2, out, repeats=repeats)
    shape = tuple(boxes1.shape)
    rows = [make_row("giou", "torch (eager reference)", shape, boxes1.dtype, reference, reference),
            make_row("giou", "NKI kernel on the simulator", shape, boxes1.dtype, simulated, reference,
                     note=f"simulator / torch eager = {simulated.median_ms / reference.median_ms:.2f}x on this CPU")]
    append_csv(rows, RESULTS_DIR / csv_name)
    return rows


if __name__ == "__main__":
    result = run()
    print(format_table(result))
    ratio = result[1].median_ms / result[0].median_ms
    print(f"simulator time is {ratio:.2f}x the torch eager reference (target <= {TARGET_RATIO:.0f}x)")
