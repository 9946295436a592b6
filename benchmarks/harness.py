"""The one timing utility every benchmark uses, plus the CSV log and the per-op plot.

Timings are wall-clock on this host. A backend that runs through the NKI simulator or the
C++ CPU emulation is timed as CPU code: those numbers compare implementations on this
machine only and say nothing about time on a NeuronCore. For the simulated NKI kernels each row
also carries the simulator cost model's estimated device time on trn1 and trn2
(``est_trn1_ms``, ``est_trn2_ms``): an estimate for the named target, never a measurement.
"""

from __future__ import annotations

import contextlib
import csv
import platform
import statistics
import time
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable

import torch

RESULTS_DIR = Path(__file__).resolve().parent / "results"
ESTIMATE_TARGETS = ("trn1", "trn2")  # targets of the estimated device time of the simulated NKI kernels


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    repeats: int


def time_fn(fn: Callable, *args, warmup: int = 3, repeats: int = 20, max_seconds: float = 10.0,
            **kwargs) -> Timing:
    """Call ``fn(*args, **kwargs)`` ``warmup`` times untimed, then up to ``repeats`` times timed.

    Stops early (after at least 3 timed runs) once ``max_seconds`` of timed work is spent,
    so a slow backend such as the simulator still finishes. Returns median, p20 and p80.
    """
    for _ in range(warmup):
        fn(*args, **kwargs)
    samples: list[float] = []
    spent = 0.0
    while len(samples) < repeats and (len(samples) < 3 or spent < max_seconds):
        start = time.perf_counter()
        fn(*args, **kwargs)
        elapsed = time.perf_counter() - start
        samples.append(elapsed * 1e3)
        spent += elapsed
    if len(samples) == 1:
        return Timing(samples[0], samples[0], samples[0], 1)
    # quantiles(n=10) gives the 10th..90th percentiles; index 1 is p20 and 7 is p80.
    deciles = statistics.quantiles(samples, n=10, method="inclusive")
    return Timing(statistics.median(samples), deciles[1], deciles[7], len(samples))


@dataclass(frozen=True)
class Row:
    """One CSV row: a backend of an op timed on one shape and dtype."""
    op: str
    backend: str
    shape: str
    dtype: str
    median_ms: float
    p20_ms: float
    p80_ms: float
    speedup_vs_torch: float
    threads: int
    machine: str
    package_version: str
    timestamp: str
    note: str = ""
    # The cost model's estimated device time of a simulated NKI row on each ESTIMATE_TARGETS target
    # (None elsewhere): an estimate for that target, not a measurement.
    est_trn1_ms: float | None = None
    est_trn2_ms: float | None = None


def make_row(op: str, backend: str, shape: Iterable[int], dtype: torch.dtype, timing: Timing,
             reference: Timing, note: str = "", estimate: dict[str, float] | None = None) -> Row:
    """A CSV row; ``estimate``: the estimated device ms per target (:func:`estimate_device_ms`)."""
    from nki_ops import __version__

    estimate = estimate or {}
    return Row(op=op, backend=backend, shape="x".join(map(str, shape)), dtype=str(dtype).removeprefix("torch."),
               median_ms=round(timing.median_ms, 4), p20_ms=round(timing.p20_ms, 4),
               p80_ms=round(timing.p80_ms, 4),
               speedup_vs_torch=round(reference.median_ms / timing.median_ms, 3),
               threads=torch.get_num_threads(), machine=f"{platform.machine()} {platform.node()}",
               package_version=__version__, timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"),
               note=note, **{f"est_{t}_ms": _round(estimate.get(t)) for t in ESTIMATE_TARGETS})


def _round(ms: float | None) -> float | None:
    return None if ms is None else float(f"{ms:.4g}")


def estimate_device_ms(fn: Callable, *args, **kwargs) -> dict[str, float] | None:
    """The simulator cost model's estimated device time (ms) of the NKI kernels ``fn(*args, **kwargs)``
    launches, per target in ESTIMATE_TARGETS (all launches of one call summed), or None when the NKI
    kernels do not run in the simulator here. Runs timing-only (no values computed); a kernel that
    mode refuses (addresses or control flow from tensor values) is run in full instead."""
    from nki_ops.ops._nki_backend import is_simulated
    from nki_ops.sim.core.config import configure
    from nki_ops.sim.core.errors import KernelUsageError
    from nki_ops.sim.observers.profile import listen

    if not is_simulated():
        return None
    estimates = {}
    for target in ESTIMATE_TARGETS:
        for timing_only in (True, False):
            try:
                with configure(timing_only=timing_only), listen(target) as launches:
                    fn(*args, **kwargs)
            except KernelUsageError as error:
                if timing_only and "timing-only mode" in str(error):
                    continue
                raise
            break
        estimated = launches()
        if not estimated:
            return None
        estimates[target] = sum(e.seconds for _, e in estimated) * 1e3
    return estimates


def append_csv(rows: list[Row], path: Path) -> Path:
    """Append ``rows`` to ``path``, writing the header when the file is new. A log written with fewer
    columns (before a column was added) is rewritten under the current header first, its old rows
    left empty in the new columns, so every row of the file has the same columns. The rows of one
    call are one run and carry its start time, which is how the plot finds the latest run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    names = [fld.name for fld in fields(Row)]
    new = not path.exists()
    if not new:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames != names:
                old_rows = list(reader)
                with path.open("w", newline="") as out:
                    writer = csv.DictWriter(out, fieldnames=names, extrasaction="ignore")
                    writer.writeheader()
                    writer.writerows(old_rows)
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=names)
        if new:
            writer.writeheader()
        run = min(r.timestamp for r in rows)
        writer.writerows(asdict(r) | {"timestamp": run} for r in rows)
    return path


def compare_backends(op: str, call: Callable, reference: Callable, inputs: tuple[torch.Tensor, ...], *,
                     repeats: int = 20, include_compile: bool = True, csv_name: str | None = None,
                     shape: tuple[int, ...] | None = None, note: str = "") -> list[Row]:
    """Time ``reference(*inputs)`` (torch eager), ``torch.compile`` of it, and ``call(*inputs, backend=b)``
    for every backend of ``op`` that can run here, in one run; append the rows to ``results/<csv_name>``.

    The emulated C++ operator is timed twice, checked (its default) and in fast mode. ``shape``
    (default: the first input's) and ``note`` describe the workload in every row.
    """
    from nki_ops._backends import availability, label
    from nki_ops.cpp import options as cpp_options
    from nki_ops.cpp.backend import is_emulated as cpp_is_emulated

    shape, dtype = shape or tuple(inputs[0].shape), inputs[0].dtype
    eager = time_fn(reference, *inputs, repeats=repeats)
    rows = [make_row(op, "torch (eager reference)", shape, dtype, eager, eager, note)]
    if include_compile:
        compiled = torch.compile(reference, fullgraph=True, dynamic=False)
        rows.append(make_row(op, "torch.compile (reference)", shape, dtype,
                             time_fn(compiled, *inputs, repeats=repeats), eager, note))
    for backend, why_not in availability(op).items():
        if backend == "torch" or why_not is not None:
            continue
        modes = ([cpp_options(checks=True), cpp_options(checks=False)] if backend == "cpp" and cpp_is_emulated()
                 else [contextlib.nullcontext()])
        for mode in modes:
            with mode:
                timing = time_fn(call, *inputs, backend=backend, repeats=repeats)
                estimate = estimate_device_ms(call, *inputs, backend=backend) if backend == "nki" else None
                rows.append(make_row(op, label(op, backend), shape, dtype, timing, eager, note, estimate))
    append_csv(rows, RESULTS_DIR / (csv_name or f"{op}.csv"))
    return rows


ESTIMATE_HEADER = f"est. device ms {'/'.join(ESTIMATE_TARGETS)}"


def format_estimate(row: Row) -> str:
    """``0.211/0.187`` (ms on each ESTIMATE_TARGETS target), or ``-`` for rows without an estimate."""
    values = [getattr(row, f"est_{t}_ms") for t in ESTIMATE_TARGETS]
    if all(v is None or v == "" for v in values):
        return "-"
    return "/".join("-" if v is None or v == "" else f"{float(v):.3g}" for v in values)


@dataclass(frozen=True)
class TunedRow:
    """One kernel on one target: the cost model's estimate with its default and its tuned parameters."""
    kernel: str
    target: str
    default: dict
    default_us: float
    tuned: dict
    tuned_us: float


def tuned_estimates(tuning) -> list[TunedRow]:
    """Estimated device time of each kernel of an op's ``tuning.py`` (``TUNED``, ``BUILD``) at its tuning
    workload, with the kernel's default and with the tuned parameters, per target; empty when the NKI kernels
    do not run in the simulator here."""
    from nki_ops.ops._nki_backend import is_simulated
    from nki_ops.ops._tuned import TARGETS
    from nki_ops.sim import profile

    if not is_simulated():
        return []

    def estimate(build, params, target):
        kernel, args = build(**params)
        return profile(kernel, target=target, timing_only=True)(*args).estimate.microseconds

    rows = []
    for name, tuned in tuning.TUNED.items():
        build = tuning.BUILD[name][0]
        for target in TARGETS:
            chosen = tuned.params(target)
            default_us = estimate(build, tuned.defaults, target)
            tuned_us = default_us if chosen == tuned.defaults else estimate(build, chosen, target)
            rows.append(TunedRow(name, target, dict(tuned.defaults), default_us, chosen, tuned_us))
    return rows


def format_tuned(rows: list[TunedRow]) -> str:
    def text(params):
        return " ".join(f"{k}={v}" for k, v in params.items())
    header = (f"{'kernel':<10} {'target':<6} {'default':<18} {'est. us':>9}  {'tuned':<18} {'est. us':>9} "
              f"{'vs default':>10}")
    lines = ["tuned kernel parameters (the cost model's estimated device time, not a measurement; the op's "
             "tuning.py records the study that chose them):", header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r.kernel:<10} {r.target:<6} {text(r.default):<18} {r.default_us:>9.1f}  "
                     f"{text(r.tuned):<18} {r.tuned_us:>9.1f} {r.default_us / r.tuned_us:>9.3f}x")
    return "\n".join(lines)


def format_table(rows: list[Row]) -> str:
    width = max([len("backend"), *(len(r.backend) for r in rows)])
    header = (f"{'backend':<{width}} {'shape':<14} {'dtype':<9} {'median ms':>10} {'p20-p80 ms':>19} {'vs torch':>9}"
              f"  {ESTIMATE_HEADER:>22}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r.backend:<{width}} {r.shape:<14} {r.dtype:<9} {r.median_ms:>10.3f} "
                     f"{f'{r.p20_ms:.3f}-{r.p80_ms:.3f}':>19} {r.speedup_vs_torch:>8.2f}x  {format_estimate(r):>22}"
                     + (f"  ({r.note})" if r.note else ""))
    if any(format_estimate(r) != "-" for r in rows):
        lines.append(f"{ESTIMATE_HEADER}: the simulator cost model's estimate of the NKI kernels' device time on "
                     f"each named target (not a measurement; docs/simulator.md)")
    return "\n".join(lines)
