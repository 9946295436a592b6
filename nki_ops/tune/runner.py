"""One trial = one fresh subprocess of the user's command (compiler and XLA settings are read at start)."""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field

from .protocol import PARAMS_ENV, RESULT_ENV

TAIL_LINES = 30
# how neuronx-cc and the torch-neuronx wrapper announce a failed compile
COMPILE_FAILURE = re.compile(r"neuronx-cc.*(error|failed)|compilation failed", re.IGNORECASE)
# In every trial process's environment, and inherited by its children: how a resumed sweep finds what
# a killed sweep's trial left running.
TRIAL_ENV = "NKI_OPS_TUNE_TRIAL"
PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None).prctl if sys.platform.startswith("linux") else None  # libc's, already loaded


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


def _die_with_parent(parent: int):
    """A ``preexec_fn`` (Linux): the trial gets SIGKILL when the thread that started it dies, even by kill -9,
    instead of running on, reparented to init, for up to its whole timeout."""
    def set_parent_death_signal() -> None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the sweep died before the signal was set
            os._exit(1)
    return set_parent_death_signal if _prctl is not None else None


def kill_leftovers(token: str) -> int:
    """SIGKILL this host's processes left by the trial started with ``token`` (the children of a trial whose
    sweep was killed: the parent-death signal reaches the trial's own process only); returns how many."""
    marker = f"{TRIAL_ENV}={token}".encode()
    killed = 0
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:  # no /proc (not Linux)
        return 0
    for pid in entries:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    os.kill(int(pid), signal.SIGKILL)
                    killed += 1
        except OSError:  # gone meanwhile, or another user's
            continue
    return killed


def run_trial(command: list[str], env: dict[str, str], params: dict, timeout: float,
              cwd: str | None = None, token: str = "") -> TrialResult:
    """Run ``command`` with ``env`` on top of this process's environment and ``params`` for the script;
    ``token`` marks its processes for :func:`kill_leftovers`."""
    with tempfile.TemporaryDirectory(prefix="nki-ops-trial-") as scratch:
        result_path = os.path.join(scratch, "result.json")
        log_path = os.path.join(scratch, "output.log")
        child_env = {**os.environ, **env, PARAMS_ENV: json.dumps(params), RESULT_ENV: result_path,
                     TRIAL_ENV: token}
        start = time.perf_counter()
        with open(log_path, "wb") as log:
            try:
                process = subprocess.Popen(command, env=child_env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True,
                                           # safe with the heartbeat thread running: it takes no lock
                                           preexec_fn=_die_with_parent(os.getpid()))  # noqa: PLW1509
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
