"""One trial subprocess: the environment it gets, and how its failures read."""

import sys

from nki_ops.tune.protocol import PARAMS_ENV, RESULT_ENV
from nki_ops.tune.runner import run_trial


def test_the_trial_sees_its_settings_and_its_report_is_read():
    script = ("import json, os; p = json.loads(os.environ['%s']);"
              "json.dump({'samples_per_sec': p['batch_size'] * float(os.environ['XLA_USE_BF16'])},"
              " open(os.environ['%s'], 'w'))" % (PARAMS_ENV, RESULT_ENV))
    result = run_trial([sys.executable, "-c", script], {"XLA_USE_BF16": "3"}, {"batch_size": 8}, timeout=30)
    assert result.failure is None and result.metrics == {"samples_per_sec": 24.0}


def test_a_failed_compile_is_named_and_the_output_tail_kept():
    lines = "; ".join(f"echo line {i}" for i in range(40))
    command = ["sh", "-c", f"{lines}; echo 'ERROR 70 [neuronx-cc]: Failed to compile'; exit 70"]
    result = run_trial(command, {}, {}, timeout=30)
    assert result.failure == "exited with code 70 (compilation failed)"
    tail = result.output_tail.splitlines()
    assert len(tail) == 30 and tail[-1] == "ERROR 70 [neuronx-cc]: Failed to compile" and tail[0] == "line 11"


def test_a_signal_and_a_missing_program_read_plainly():
    assert run_trial(["sh", "-c", "kill -SEGV $$"], {}, {}, timeout=30).failure == "killed by SIGSEGV"
    assert run_trial(["no-such-program-xyz"], {}, {}, timeout=30).failure.startswith(
        "could not start 'no-such-program-xyz':")
