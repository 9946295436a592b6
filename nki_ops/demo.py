"""``nki-ops demo``: every available GIoU backend on the published workload, checked and timed,
then a short tuning sweep of the example training loop.

Each backend's result is compared with the torch reference before it is timed; a backend
that disagrees fails the demo. Times are medians on this CPU, and speedups are ratios
against the torch eager reference measured in the same run.
"""

from __future__ import annotations

import time

import torch

from ._backends import availability
from .workloads import GIOU_BATCH, GIOU_BOXES, giou_workload


def check_giou_backends(boxes1: torch.Tensor, boxes2: torch.Tensor) -> dict[str, float]:
    """Max absolute difference from the reference for every available backend; raise on disagreement."""
    import nki_ops
    from .ops.giou.reference import giou_reference

    expected = giou_reference(boxes1, boxes2)
    errors = {}
    for backend, why_not in availability("giou").items():
        if why_not is not None:
            print(f"  {backend:<6} unavailable: {why_not}")
            continue
        got = nki_ops.giou(boxes1, boxes2, backend=backend)
        errors[backend] = (got - expected).abs().max().item()
        if not torch.allclose(got, expected, rtol=1e-5, atol=1e-6):
            raise SystemExit(f"giou backend {backend!r} disagrees with the reference: max |diff| {errors[backend]:.3g}")
        print(f"  {backend:<6} agrees with the reference (max |diff| {errors[backend]:.2e})")
    return errors


def run(args) -> int:
    from .bench import import_benchmark

    start = time.perf_counter()
    print(f"GIoU on the published workload: 2 x {GIOU_BATCH} x {GIOU_BOXES} random boxes in a 256 x 256 image")
    check_giou_backends(*giou_workload())
    harness = import_benchmark("benchmarks.harness")
    rows = import_benchmark("benchmarks.giou").run(repeats=args.repeats, csv_name="demo-giou.csv")
    print(f"\nMedian times on this CPU ({torch.get_num_threads()} threads); speedups against torch eager, same run.")
    print("Simulated and emulated backends are timed as CPU code: not device time.")
    print(harness.format_table(rows))
    if args.tune:
        run_tuning_sweep()
    print(f"\ndemo finished in {time.perf_counter() - start:.1f} s")
    return 0


def run_tuning_sweep() -> None:
    try:
        from .tune.demo import run_demo_sweep
    except ImportError as missing:
        print(f"\nTuning sweep skipped: {missing.name} is not installed (pip install 'nki-ops[tune]')")
        return
    print("\nTuning: a sweep of the example ViT training loop's batch size (three trials, real training runs)")
    print(run_demo_sweep(progress=True))


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="check and time every available GIoU backend, then run a short tuning sweep")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs per backend (default 10)")
    parser.add_argument("--no-tune", dest="tune", action="store_false", help="skip the tuning sweep")
    parser.set_defaults(func=run)
