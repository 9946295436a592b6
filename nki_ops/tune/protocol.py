"""How a trial talks to the training script: two environment variables.

``NKI_OPS_TUNE_PARAMS`` carries the ``[params]`` of the trial as JSON (read with :func:`trial_params`);
``NKI_OPS_TUNE_RESULT`` names the file :func:`report` writes the metrics to. Outside a sweep the script
runs with its own defaults and ``report`` just prints, so the same script serves both.
"""

from __future__ import annotations

import json
import math
import os
import sys

PARAMS_ENV = "NKI_OPS_TUNE_PARAMS"
RESULT_ENV = "NKI_OPS_TUNE_RESULT"


def trial_params(defaults: dict | None = None) -> dict:
    """The trial's ``[params]`` over ``defaults``; a name the defaults lack is refused (likely a typo)."""
    params = dict(defaults or {})
    given = json.loads(os.environ.get(PARAMS_ENV, "{}"))
    unknown = sorted(set(given) - set(params)) if defaults is not None else []
    if unknown:
        raise KeyError(f"{PARAMS_ENV} has params {unknown} this script does not read; it reads {sorted(params)}")
    params.update(given)
    return params


def _is_reporting_process() -> bool:
    # under torchrun every rank runs the script; rank 0 reports for the job
    return os.environ.get("RANK", "0") == "0"


def report(**metrics: float) -> None:
    """Report this run's metrics (e.g. ``report(samples_per_sec=1093.2)``); call once, at the end."""
    if not metrics:
        raise TypeError("report() needs at least one metric, e.g. report(samples_per_sec=...)")
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"metric {name!r} must be a finite number, got {value!r}")
    if not _is_reporting_process():
        return
    path = os.environ.get(RESULT_ENV)
    if path is None:
        print("metrics: " + ", ".join(f"{k}={v:.6g}" for k, v in metrics.items()), file=sys.stderr)
        return
    with open(path + ".tmp", "w") as out:
        json.dump({k: float(v) for k, v in metrics.items()}, out)
    os.replace(path + ".tmp", path)  # the runner never reads a half-written file
