"""A training-script stand-in whose throughput truly depends on its settings.

Each "step" costs a fixed overhead (a host sync) plus a per-sample cost, so larger batches run more
samples per second; TUNE_TEST_FAST=1 in the environment halves the per-step cost.
"""

import os
import time

from nki_ops.tune import report, trial_params

params = trial_params({"batch_size": 1, "samples": 32, "behaviour": "ok"})
if params["behaviour"] == "crash":
    raise RuntimeError("simulated crash in the training step")
if params["behaviour"] == "hang":
    time.sleep(3600)
if params["behaviour"] == "silent":
    raise SystemExit(0)  # finishes without reporting
step_seconds = 0.004 if os.environ.get("TUNE_TEST_FAST") == "1" else 0.008
start = time.perf_counter()
for _ in range(params["samples"] // params["batch_size"]):
    time.sleep(step_seconds)
report(samples_per_sec=params["samples"] / (time.perf_counter() - start))
