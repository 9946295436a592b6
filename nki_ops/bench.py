"""``nki-ops bench OP``: time every available backend of an op against its torch reference.

The benchmarks live in the source checkout's ``benchmarks/`` directory; each appends rows
to ``benchmarks/results/<op>.csv`` and the plot step draws ``benchmarks/results/<op>.png``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from .ops._define import OPS

REPO_ROOT = Path(__file__).resolve().parents[1]
# Each op's own benchmark (``define_op(benchmark=...)``), two that compare implementations across ops, and
# the simulator's cost per executed instruction against a NumPy floor.
BENCHMARKS = {**{name: f"benchmarks.{op.benchmark}" for name, op in OPS.items() if op.benchmark},
              "sim_giou": "benchmarks.sim_giou", "cpp_ops": "benchmarks.cpp_ops",
              "sim_overhead": "benchmarks.sim_overhead"}


def import_benchmark(module: str):
    """Import ``benchmarks.<name>`` from the source checkout this package was installed from."""
    if not (REPO_ROOT / "benchmarks" / "harness.py").is_file():
        raise SystemExit(f"nki-ops bench runs from a source checkout; no benchmarks/ found next to "
                         f"{REPO_ROOT / 'nki_ops'}")
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    return importlib.import_module(module)


def run(args) -> int:
    harness = import_benchmark("benchmarks.harness")
    plot = import_benchmark("benchmarks.plot")
    for op in args.ops:
        module = import_benchmark(BENCHMARKS[op])
        rows = module.run(repeats=args.repeats)
        print(f"\n{op}: median of up to {args.repeats} runs on this CPU "
              "(simulated and emulated backends are timed as CPU code, not device time)")
        print(harness.format_table(rows))
        tuned = module.tuned() if hasattr(module, "tuned") else []  # ops whose kernels take tuned parameters
        if tuned:
            print(harness.format_tuned(tuned))
        csv_path = harness.RESULTS_DIR / f"{op}.csv"
        print(f"rows appended to {csv_path}; plot: {plot.plot_csv(csv_path)}")
    return 0


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="benchmark the backends of an op on this machine")
    parser.add_argument("ops", nargs="+", choices=sorted(BENCHMARKS), help="ops to benchmark")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per backend (default 20)")
    parser.set_defaults(func=run)
