"""One trial = one fresh subprocess of the user's command (compiler and XLA settings are read at start)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field

from .protocol import PARAMS_ENV, RESULT_ENV

TAIL_LINES = 30
# how neuronx-cc and the torch-neuronx wrapper announce a failed compile
COMPILE_FAILURE = re.compile(r"neuronx-cc.*(error|failed)|compilation failed", re.IGNORECASE)


@dataclass
class TrialResult:
    metrics: dict[str, float] = field(default_factory=dict)
    failure: str | None = None  # None when the command succeeded and reported
    output_tail: str = ""
    seconds: float = 0.0


def _tail(path: str) -> str:
    with open(path, errors="replace") as f:
        return "".join(deque(f, maxlen=TAIL_LINES))


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # torchrun and DataLoader workers go with it
    except ProcessLookupError:
        pass
    process.wait()


def run_trial(command: list[str], env: dict[str, str], params: dict, timeout: float,
              cwd: str | None = None) -> TrialResult:
    """Run ``command`` with ``env`` on top of this process's environment and ``params`` for the script."""
    with tempfile.TemporaryDirectory(prefix="nki-ops-trial-") as scratch:
        result_path = os.path.join(scratch, "result.json")
        log_path = os.path.join(scratch, "output.log")
        child_env = {**os.environ, **env, PARAMS_ENV: json.dumps(params), RESULT_ENV: result_path}
        start = time.perf_counter()
        with open(log_path, "wb") as log:
            try:
                process = subprocess.Popen(command, env=child_env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as error:
                return TrialResult(failure=f"could not start {command[0]!r}: {error}")
            try:
                code = process.wait(timeout=timeout)
                failure = None
            except subprocess.TimeoutExpired:
                failure = f"timed out after {timeout:g} s"
            finally:
                _kill_group(process)  # also reaps children left behind by a finished command
        seconds = time.perf_counter() - start
        tail = _tail(log_path)
        if failure is None and code != 0:
            failure = (f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}")
            if COMPILE_FAILURE.search(tail):
                failure += " (compilation failed)"
        metrics = {}
        if failure is None:
            try:
                with open(result_path) as f:
                    metrics = json.load(f)
            except FileNotFoundError:
                failure = "finished without calling nki_ops.tune.report()"
        return TrialResult(metrics, failure, tail, seconds)
