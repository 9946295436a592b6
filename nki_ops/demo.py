"""``nki-ops demo``: every op on every available backend checked against the torch reference,
GIoU's backends timed on the published workload, then a short tuning sweep of the example
training loop.

A backend that disagrees with the reference fails the demo. Times are medians on this CPU, and speedups are ratios
against the torch eager reference measured in the same run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

import nki_ops

from ._backends import BACKENDS, availability, label
from .ops._define import OPS
from .workloads import GIOU_BATCH, GIOU_BOXES, giou_workload


@dataclass(frozen=True)
class DemoCase:
    """One op on a small workload; ``differentiable`` ops also compare their input gradients."""
    fn: Callable
    inputs: tuple
    differentiable: bool


def demo_cases() -> dict[str, DemoCase]:
    """Every op that declares demo inputs (``define_op(demo=...)``), on those inputs."""
    return {name: DemoCase(op.function, op.demo(), op.differentiable) for name, op in OPS.items()
            if op.demo is not None}


def _run_case(case: DemoCase, backend: str) -> list[torch.Tensor]:
    """The op's outputs and, for a differentiable op, the gradients of a fixed weighting of them."""
    # Integer inputs (class indices) take no gradient.
    inputs = [t.clone().requires_grad_(case.differentiable and t.is_floating_point())
              if isinstance(t, torch.Tensor) else t for t in case.inputs]
    outs = case.fn(*inputs, backend=backend)
    outs = list(outs) if isinstance(outs, tuple) else [outs]  # rope returns (q, k)
    if not case.differentiable:
        return outs
    sum(((out * torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape)).sum() for out in outs)).backward()
    # Inputs an op does not differentiate (rope's cos and sin) keep no gradient.
    return [*(out.detach() for out in outs), *(t.grad for t in inputs if isinstance(t, torch.Tensor)
                                               and t.grad is not None)]


def check_all_ops() -> None:
    """Every available backend of every op against the torch reference, forward and gradients;
    raise on disagreement."""
    print("Every op on every backend, outputs and input gradients against the torch reference:")
    cases = demo_cases()
    width = max(10, *(len(op) for op in cases))
    print(f"{'op':<{width}} " + " ".join(f"{b:<10}" for b in BACKENDS).rstrip())
    for op, case in cases.items():
        expected = _run_case(case, "torch")
        cells = []
        for backend, why_not in availability(op).items():
            if backend == "torch":
                cells.append("reference")
                continue
            if why_not is not None:
                cells.append("-")
                continue
            got = _run_case(case, backend)
            if len(got) != len(expected):
                raise SystemExit(f"{op}: backend {backend!r} gives gradients of other inputs than the torch reference")
            for g, e in zip(got, expected):
                if g.dtype == torch.int64:
                    agrees = torch.equal(g, e)
                else:
                    agrees = torch.allclose(g, e, rtol=1e-4, atol=1e-5 * max(1.0, e.abs().max().item()))
                if not agrees:
                    raise SystemExit(f"{op}: backend {backend!r} disagrees with the torch reference")
            cells.append("agrees")
        print(f"{op:<{width}} " + " ".join(f"{c:<10}" for c in cells).rstrip())
    print("(-: no such backend for the op, or it cannot run here; nki_ops.availability(op) says why)")


def run(args) -> int:
    from .bench import import_benchmark

    start = time.perf_counter()
    print(f"Backends here: nki = {label('giou', 'nki')}, cpp = {label('giou', 'cpp')}\n")
    check_all_ops()
    print(f"\nGIoU on the published workload: 2 x {GIOU_BATCH} x {GIOU_BOXES} random boxes in a 256 x 256 image")
    harness = import_benchmark("benchmarks.harness")
    rows = import_benchmark("benchmarks.giou").run(repeats=args.repeats, csv_name="demo-giou.csv")
    print(f"\nMedian times on this CPU ({torch.get_num_threads()} threads); speedups against torch eager, same run.")
    print("Simulated and emulated backends are timed as CPU code: not device time.")
    print(harness.format_table(rows))
    print_estimated_giou_device_time()
    if args.tune:
        run_tuning_sweep()
    print(f"\ndemo finished in {time.perf_counter() - start:.1f} s")
    return 0


PUBLISHED_GIOU_INF2_MS = 0.211  # the study's inf2 figure, timed on the host: an upper bound


def print_estimated_giou_device_time() -> None:
    """The simulator's cost-model estimate of the GIoU NKI kernel on inf2, next to the published time."""
    reason = nki_ops.availability("giou")["nki"]
    if reason is not None:
        print(f"\nEstimated device time skipped: {reason}")
        return
    from .sim.core.config import configure
    from .sim.observers.profile import listen
    boxes1, boxes2 = giou_workload(GIOU_BATCH, GIOU_BOXES)
    with configure(target="inf2"), listen("inf2") as launches:
        nki_ops.giou(boxes1, boxes2, backend="nki")
    estimates = launches()
    seconds = sum(e.seconds for _, e in estimates)
    print(f"\nGIoU NKI kernel, estimated device time: {seconds * 1e3:.3f} ms ({estimates[-1][1].label}, from "
          f"the simulator's cost model, not a measurement); published inf2: {PUBLISHED_GIOU_INF2_MS} ms (timed on "
          f"the host, an upper bound)")


def run_tuning_sweep() -> None:
    try:
        from .tune.demo import run_demo_sweep
    except ImportError as missing:
        print(f"\nTuning sweep skipped: {missing.name} is not installed (pip install 'nki-ops[tune]')")
        return
    print("\nTuning: a sweep of the example ViT training loop's batch size (three trials, real training runs)")
    print(run_demo_sweep(progress=True))


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo", help="check and time every available GIoU backend, then run a short tuning sweep")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs per backend (default 10)")
    parser.add_argument("--no-tune", dest="tune", action="store_false", help="skip the tuning sweep")
    parser.set_defaults(func=run)
