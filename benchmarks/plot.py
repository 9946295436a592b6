"""Plot the latest run of each backend in a benchmark CSV: one PNG per op.

Usage: python -m benchmarks.plot benchmarks/results/giou.csv [--out giou.png]
"""

from __future__ import annotations

import argparse
import csv
import textwrap
from pathlib import Path

from .harness import ESTIMATE_TARGETS


def plot_csv(csv_path: Path, png_path: Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{csv_path} has no rows to plot")
    # The CSV is an append-only log; each run's rows share its start time: plot the latest run.
    run = max(r["timestamp"] for r in rows)
    # One horizontal bar per row, grouped by workload, its label beside it on the left (wrapped) and
    # its time and ratio at its end: long backend names stay readable however many rows there are.
    series = sorted((r for r in rows if r["timestamp"] == run),
                    key=lambda r: (r["shape"], r["dtype"], r.get("note", ""), -float(r["median_ms"])))
    labels = ["\n".join(textwrap.wrap(f"{r['backend']}  |  {r['shape']} {r['dtype']}"
                                       + (f"  |  {r['note']}" if r.get("note") else ""), 70))
              for r in series]
    medians = [float(r["median_ms"]) for r in series]
    errors = [[m - float(r["p20_ms"]) for m, r in zip(medians, series)],
              [float(r["p80_ms"]) - m for m, r in zip(medians, series)]]

    fig, ax = plt.subplots(figsize=(13.0, 1.2 + 0.2 * sum(label.count("\n") + 2 for label in labels)))
    positions = range(len(series))
    bars = ax.barh(positions, medians, xerr=errors, capsize=3, color="tab:blue")
    ax.bar_label(bars, [f" {m:.3g} ms, {float(r['speedup_vs_torch']):.2f}x{_estimate_label(r)}"
                        for m, r in zip(medians, series)], fontsize=8, padding=4)
    ax.set_yticks(positions, labels, fontsize=8)
    ax.invert_yaxis()  # first row on top
    ax.set_xscale("log")
    ax.set_xlim(min(medians) / 2, max(medians) * 100)  # room for the labels at the bar ends
    ax.set_xlabel("median ms (log scale), whiskers p20-p80; Nx: times as fast as the workload's reference row "
                  "(1.00x: torch eager, or the NumPy floor in sim_overhead)",
                  fontsize=8)
    op = series[0]["op"]
    ax.set_title(f"{op} on {series[0]['machine'].split()[0]} CPU, {series[0]['threads']} threads "
                 "(CPU timings, not device timings)", fontsize=9)
    fig.tight_layout()
    png_path = png_path or csv_path.with_suffix(".png")
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return png_path


def _estimate_label(row: dict) -> str:
    """The estimated device time of a simulated NKI row, labelled as an estimate per target."""
    parts = [f"{target} {float(row[f'est_{target}_ms']):.3g} ms" for target in ESTIMATE_TARGETS
             if row.get(f"est_{target}_ms")]
    return f"; estimated device time {', '.join(parts)} (cost model, not measured)" if parts else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    print(plot_csv(args.csv, args.out))


if __name__ == "__main__":
    main()
