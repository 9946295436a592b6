"""Results of a study, as ``nki-ops tune report`` and ``best`` show them: a table sorted by the metric with
the speedup over the default, CSV, PNG, best config; for flag sweeps and kernel sweeps (``tune kernel``)
alike. (Not ``report.py``: importing that would replace the package's ``report()`` with the module.)"""

from __future__ import annotations

import csv
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.trial import TrialState

from .protocol import PARAMS_ENV
from .space import describe
from .study import STATE_DIR, SweepError, check_study_name, counted, open_storage


@dataclass
class Row:
    number: int
    config: dict
    value: float | None
    failure: str | None
    output_tail: str
    no_effect: list
    env: dict
    params: dict
    warnings: list = field(default_factory=list)  # a kernel candidate's simulator warnings


@dataclass
class Results:
    study_name: str
    metric: str
    direction: str
    baseline_key: str
    completed: list[Row]  # best first
    failed: list[Row]
    interrupted: int
    skipped: int
    target: str | None = None  # a kernel sweep's cost-model target; None for a flag sweep

    @property
    def kernel(self) -> bool:
        return self.target is not None

    @property
    def baseline(self) -> Row | None:
        return next((r for r in self.completed if json.dumps(r.config, sort_keys=True) == self.baseline_key), None)

    def speedup(self, row: Row) -> float | None:
        base = self.baseline
        if base is None or not base.value or not row.value:
            return None
        return row.value / base.value if self.direction == "maximize" else base.value / row.value

    @property
    def varying_axes(self) -> list[str]:
        rows = self.completed + self.failed
        axes = sorted({axis for row in rows for axis in row.config})
        return [a for a in axes if len({repr(r.config.get(a)) for r in rows}) > 1] or axes


def load_results(study_name: str, storage: str | None = None) -> Results:
    check_study_name(study_name)
    where = storage or str(STATE_DIR / f"{study_name}.journal")
    missing = SweepError(f"no study named {study_name!r} in {where}; "
                         f"run `nki-ops tune run --study {study_name} ...` first")
    if "://" not in where and not Path(where).exists():
        raise missing  # and leave no empty journal behind
    try:
        study = optuna.load_study(study_name=study_name, storage=open_storage(study_name, storage, write=False))
    except KeyError:
        raise missing from None
    return results_of(study)


def results_of(study: optuna.Study) -> Results:
    rows, interrupted, skipped = [], 0, 0
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.PRUNED:
            skipped += 1
        elif t.state == TrialState.FAIL and not counted(t):
            interrupted += 1
        elif counted(t):
            a = t.user_attrs
            rows.append(Row(t.number, json.loads(a["point"]), t.value, a.get("failure"), a.get("output_tail", ""),
                            a.get("no_effect", []), a.get("env", {}), a.get("params", {}), a.get("warnings", [])))
    direction = study.user_attrs["direction"]
    completed = sorted((r for r in rows if r.failure is None), key=lambda r: r.value,
                       reverse=direction == "maximize")
    return Results(study.study_name, study.user_attrs["metric"], direction, study.user_attrs["baseline"],
                   completed, [r for r in rows if r.failure is not None], interrupted, skipped,
                   study.user_attrs.get("target") if study.user_attrs.get("kind") == "kernel" else None)


def _short(axis: str) -> str:
    return axis.split(".", 1)[1]


def printable(text: str) -> str:
    """``text`` with control and invisible characters escaped (``\\x1b``, ``\\u202e``): a trial's output must
    not move the cursor, recolour or reorder the terminal the report is read on."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def format_report(results: Results) -> str:
    axes = results.varying_axes
    no_effect = sorted({a for r in results.completed + results.failed for a in r.no_effect})
    headers = ["trial"] + [_short(a) + ("*" if a in no_effect else "") for a in axes] + [results.metric, "vs default"]
    body = []
    for row in results.completed:
        speedup = results.speedup(row)
        mark = " (default)" if row is results.baseline else ""
        body.append([f"#{row.number}"] + [printable(str(row.config.get(a, "-"))) for a in axes]
                    + [f"{row.value:.4g}", (f"{speedup:.2f}x" if speedup else "-") + mark])
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]
    def line(cells):
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    if results.kernel:
        title = (f"study {results.study_name}: {len(results.completed)} ok, {len(results.failed)} refused, wrong or "
                 f"failed ({results.metric}: estimated {results.target} device time in microseconds, lower is "
                 f"better; a cost-model estimate, not a measurement)")
    else:
        title = (f"study {results.study_name}: {len(results.completed)} completed, {len(results.failed)} failed "
                 f"({results.metric}, {results.direction})")
    out = [title, line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in body]
    if results.baseline is None:
        out.append("the default configuration has not completed, so there is no speedup to show")
    if no_effect:
        out.append("* no effect on this host (passed to every trial, but nothing here reads it): "
                   + ", ".join(_short(a) for a in no_effect))
    warned = [r for r in results.completed if r.warnings]
    if warned:
        out.append("\nsimulator warnings (the estimate includes their cost):")
        out += [printable(f"  #{r.number}: {'; '.join(r.warnings)}") for r in warned]
    if results.failed:
        out.append("\nnever chosen (refused, wrong values, timeout or failed):" if results.kernel
                   else "\nfailed trials:")
        for row in results.failed:
            out.append(printable(f"  #{row.number} {describe(row.config)}: {row.failure}"))
            last = row.output_tail.strip().splitlines()[-1:]
            if last:
                out.append(f"      last output: {printable(last[0][:200])}")
    if results.interrupted:
        out.append(f"{results.interrupted} interrupted trial(s) were queued again")
    return "\n".join(out)


def write_csv(results: Results, path: str) -> None:
    axes = sorted({a for r in results.completed + results.failed for a in r.config})
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["trial", "state"] + [_short(a) for a in axes] + [results.metric, "speedup", "failure"])
        for row in results.completed + results.failed:
            speedup = results.speedup(row) if row.failure is None else None
            writer.writerow([row.number, "failed" if row.failure else "complete"]
                            + [row.config.get(a, "") for a in axes]
                            + ["" if row.value is None else row.value, "" if speedup is None else f"{speedup:.4f}",
                               row.failure or ""])


def write_plot(results: Results, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results.completed[::-1]  # best at the top
    axes = results.varying_axes
    labels = [f"#{r.number} " + " ".join(f"{_short(a)}={r.config.get(a, '-')}" for a in axes) for r in rows]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.5))
    colors = ["tab:orange" if r is results.baseline else "tab:blue" for r in rows]
    ax.barh(range(len(rows)), [r.value for r in rows], color=colors)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    if results.kernel:
        ax.set_xlabel(f"estimated {results.target} device time, microseconds (cost model; lower is better; "
                      f"orange = default)")
    else:
        ax.set_xlabel(f"{results.metric} ({results.direction}; orange = default configuration)")
    ax.set_title(f"nki-ops tune: study {results.study_name}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def best_row(results: Results) -> Row:
    if not results.completed:
        raise SweepError(f"study {results.study_name!r} has no completed trial yet")
    return results.completed[0]


def format_best(results: Results, fmt: str | None = None) -> str:
    """``env`` (export lines) or ``json``; None picks env for a flag sweep, json for a kernel sweep."""
    row = best_row(results)
    fmt = fmt or ("json" if results.kernel else "env")
    if fmt == "json" and results.kernel:
        return json.dumps({"trial": row.number, "target": results.target, results.metric: row.value,
                           "params": row.params}, indent=2)
    if fmt == "json":
        return json.dumps({"trial": row.number, results.metric: row.value, "env": row.env, "params": row.params},
                          indent=2)
    lines = [f"export {name}={shlex.quote(value)}" for name, value in row.env.items()]
    if row.params:
        lines.append(f"export {PARAMS_ENV}={shlex.quote(json.dumps(row.params, sort_keys=True))}")
    return "\n".join(lines)
