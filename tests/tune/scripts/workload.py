"""A training-script stand-in whose throughput truly depends on its settings.

Each "step" costs a fixed overhead (a host sync) plus a per-sample cost, so larger batches run more
samples per second; TUNE_TEST_FAST=1 in the environment halves the per-step cost.
"""

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

# The trial protocol alone, without the nki_ops package, whose import (torch and every op, about 2 s of CPU) would
# be most of each trial's cost; examples/vit_train.py, which test_example sweeps, imports it from nki_ops.tune.
_protocol = Path(importlib.util.find_spec("nki_ops").origin).parent / "tune" / "protocol.py"
_spec = importlib.util.spec_from_file_location("nki_ops_tune_protocol", _protocol)
protocol = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(protocol)
report, trial_params = protocol.report, protocol.trial_params

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
marker = os.environ.get("TUNE_TEST_FIRST_ONLY")
if marker:  # the first trial (the one that makes the marker file) runs; later ones hang until the sweep is stopped
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        time.sleep(3600)
step_seconds = 0.004 if os.environ.get("TUNE_TEST_FAST") == "1" else 0.008
start = time.perf_counter()
for _ in range(params["samples"] // params["batch_size"]):
    time.sleep(step_seconds)
report(samples_per_sec=params["samples"] / (time.perf_counter() - start))
