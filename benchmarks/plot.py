"""Plot the latest run of each backend in a benchmark CSV: one PNG per op.

Usage: python -m benchmarks.plot benchmarks/results/giou.csv [--out giou.png]
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path


def plot_csv(csv_path: Path, png_path: Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{csv_path} has no rows to plot")
    # The latest timestamp per (backend, shape, dtype) wins: the CSV is an append-only log.
    latest = {}
    for r in rows:
        latest[(r["backend"], r["shape"], r["dtype"])] = r
    series = sorted(latest.values(), key=lambda r: float(r["median_ms"]))
    labels = [f"{r['backend']}\n{r['shape']} {r['dtype']}" for r in series]
    medians = [float(r["median_ms"]) for r in series]
    errors = [[m - float(r["p20_ms"]) for m, r in zip(medians, series)],
              [float(r["p80_ms"]) - m for m, r in zip(medians, series)]]

    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(series)), 4.5))
    bars = ax.bar(range(len(series)), medians, yerr=errors, capsize=4, color="tab:blue")
    ax.bar_label(bars, [f"{m:.3g} ms\n{float(r['speedup_vs_torch']):.2f}x" for m, r in zip(medians, series)],
                 fontsize=8, padding=2)
    ax.set_xticks(range(len(series)), labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("median ms (log), bars p20-p80")
    op = series[0]["op"]
    ax.set_title(f"{op} on {series[0]['machine'].split()[0]} CPU, {series[0]['threads']} threads "
                 "(CPU timings, not device timings)", fontsize=9)
    fig.tight_layout()
    png_path = png_path or csv_path.with_suffix(".png")
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return png_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    print(plot_csv(args.csv, args.out))


if __name__ == "__main__":
    main()
