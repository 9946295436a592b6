"""A training-script stand-in whose throughput truly depends on its settings.

Each "step" costs a fixed overhead (a host sync) plus a per-sample cost, so larger batches run more
samples per second; TUNE_TEST_FAST=1 in the environment halves the per-step cost.
"""

import os
import subprocess
import sys
import time

from nki_ops.tune import report, trial_params

params = trial_params({"batch_size": 1, "samples": 32, "behaviour": "ok", "pid_file": ""})
if params["behaviour"] == "crash":
    raise RuntimeError("simulated crash in the training step")
if params["behaviour"] == "hang":
    if params["pid_file"]:  # with a child, as torchrun's workers or DataLoader workers would be
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        with open(params["pid_file"] + ".tmp", "w") as f:
            f.write(f"{os.getpid()} {child.pid}")
        os.replace(params["pid_file"] + ".tmp", params["pid_file"])
    time.sleep(3600)
if params["behaviour"] == "silent":
    raise SystemExit(0)  # finishes without reporting
step_seconds = 0.004 if os.environ.get("TUNE_TEST_FAST") == "1" else 0.008
start = time.perf_counter()
for _ in range(params["samples"] // params["batch_size"]):
    time.sleep(step_seconds)
report(samples_per_sec=params["samples"] / (time.perf_counter() - start))
