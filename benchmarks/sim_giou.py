"""The NKI simulator's speed: GIoU kernels on the published 1024 x 256 boxes workload, simulated on
this CPU, against the torch eager reference timed in the same run.

Both front ends run the project's GIoU kernel: its legacy-dialect copy (``tests/sim/legacy_kernels``,
``neuronxcc.nki``) and the current-API kernel (``nki_ops/ops/giou/nki_kernel.py``, ``nki``); the
legacy example kernel of ``nki_ops.sim.examples`` is the row earlier runs reported. The simulator
runs on one thread, so torch eager is also timed on one thread: on a loaded machine torch's
multi-threaded time swings widely. The backends are timed in turns (one call of each per round),
so a change of machine load affects them alike.

The ratios measure simulator overhead only; simulated time says nothing about a NeuronCore.
Run: ``python -m benchmarks.sim_giou`` or ``nki-ops bench sim_giou``.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable

import numpy as np
import torch

from nki_ops.ops.giou import nki_kernel as current_giou
from nki_ops.ops.giou.reference import giou_reference
from nki_ops.sim.examples import giou_kernel as example_kernel
from nki_ops.workloads import giou_workload
from tests.sim.legacy_kernels import giou as legacy_giou

from .harness import RESULTS_DIR, Row, Timing, append_csv, format_table, make_row

TARGET_RATIO = 1.0  # simulator time / torch eager time (issue 11: the simulator at least as fast as torch eager)
TORCH = "torch (eager reference)"
TORCH_1 = "torch (eager reference, 1 thread)"
EXAMPLE = "NKI kernel on the simulator"
LEGACY = "GIoU, legacy dialect (neuronxcc.nki front end)"
CURRENT = "GIoU, current API (nki front end)"


def _single_threaded(fn: Callable) -> Callable:
    def run(*args):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn(*args)
        finally:
            torch.set_num_threads(threads)
    return run


def time_in_turns(calls: dict[str, Callable[[], object]], *, warmup: int = 2, repeats: int = 20,
                  max_seconds: float = 30.0) -> tuple[dict[str, Timing], dict[str, float]]:
    """Time every call once per round, for ``repeats`` rounds (at least 3; fewer once ``max_seconds``
    are spent): wall-clock median and p20/p80 of each, and the median CPU time of this process in ms
    (all its threads), which a busy machine disturbs less than wall-clock time."""
    for _ in range(warmup):
        for call in calls.values():
            call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    start = time.perf_counter()
    for i in range(repeats):
        if i >= 3 and time.perf_counter() - start > max_seconds:
            break
        for name, call in calls.items():
            t, c = time.perf_counter(), time.process_time()
            call()
            samples[name].append((time.perf_counter() - t) * 1e3)
            cpu[name].append((time.process_time() - c) * 1e3)
    timings = {}
    for name, ms in samples.items():
        deciles = statistics.quantiles(ms, n=10, method="inclusive")
        timings[name] = Timing(statistics.median(ms), deciles[1], deciles[7], len(ms))
    return timings, {name: statistics.median(ms) for name, ms in cpu.items()}


def run(batch: int = 1024, n_boxes: int = 256, *, repeats: int = 20, csv_name: str = "sim_giou.csv") -> list[Row]:
    boxes1, boxes2 = giou_workload(batch, n_boxes)
    expected = giou_reference(boxes1, boxes2)
    flat1, flat2 = boxes1.reshape(batch, -1).numpy(), boxes2.reshape(batch, -1).numpy()
    out = np.empty((batch, n_boxes), np.float32)
    layout1, count = current_giou.launch_layout(boxes1)
    layout2, _ = current_giou.launch_layout(boxes2)
    layout1, layout2 = layout1.numpy(), layout2.numpy()

    def example():
        example_kernel(flat1, flat2, out)
        return out

    calls = {TORCH: lambda: giou_reference(boxes1, boxes2),
             TORCH_1: _single_threaded(lambda: giou_reference(boxes1, boxes2)),
             EXAMPLE: example,
             LEGACY: lambda: legacy_giou.giou_kernel(layout1, layout2),
             CURRENT: lambda: current_giou.giou_kernel(layout1, layout2)}
    for name in (EXAMPLE, LEGACY, CURRENT):
        got = torch.as_tensor(np.asarray(calls[name]())).reshape(-1)[:count].reshape(expected.shape)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")

    load = os.getloadavg()[0]
    timings, cpu = time_in_turns(calls, repeats=repeats)
    reference, single = timings[TORCH], timings[TORCH_1]
    shape = tuple(boxes1.shape)
    rows = []
    for name, timing in timings.items():
        note = f"CPU {cpu[name]:.1f} ms; load average {load:.1f} on {os.cpu_count()} CPUs"
        if name not in (TORCH, TORCH_1):
            note = (f"simulator / torch eager = {timing.median_ms / reference.median_ms:.2f}x, "
                    f"/ torch eager on 1 thread = {timing.median_ms / single.median_ms:.2f}x "
                    f"(CPU time {cpu[name] / cpu[TORCH_1]:.2f}x); {note}")
        rows.append(make_row("giou", name, shape, boxes1.dtype, timing, reference, note=note))
    append_csv(rows, RESULTS_DIR / csv_name)
    return rows


if __name__ == "__main__":
    result = run()
    print(format_table(result))
    by_name = {r.backend: r for r in result}
    for name in (LEGACY, CURRENT):
        ratio = by_name[name].median_ms / by_name[TORCH].median_ms
        print(f"{name}: simulator time is {ratio:.2f}x the torch eager reference (target <= {TARGET_RATIO:.0f}x)")
    print(f"current / legacy front end on the same kernel: "
          f"{by_name[CURRENT].median_ms / by_name[LEGACY].median_ms:.2f}x (target <= 1)")
