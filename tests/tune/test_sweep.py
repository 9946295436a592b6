"""Real sweeps of a stand-in workload on CPU: best found, failures recorded, kill and resume, CLI output."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import optuna
import pytest
import torch
from optuna.trial import TrialState

from nki_ops.cli import main
from nki_ops.tune import study as study_module
from nki_ops.tune.results import format_best, format_report, load_results
from nki_ops.tune.space import load_space
from nki_ops.tune.study import open_storage, run_sweep

pytestmark = pytest.mark.slow


def _trials(study_name, storage=None):
    return optuna.load_study(study_name=study_name, storage=open_storage(study_name, storage)).get_trials()


def test_sweep_finds_the_best_configuration_and_reports_it(write_space, workload_command, tmp_path, capsys):
    space = load_space(write_space('[env]\nTUNE_TEST_FAST = ["0", "1"]\n[params]\nbatch_size = [1, 4, 16]\n'))
    run_sweep("speed", space, workload_command, timeout=60, progress=False)
    results = load_results("speed")
    assert len(results.completed) == 6 and not results.failed
    assert results.completed[0].config == {"env.TUNE_TEST_FAST": "1", "params.batch_size": 16}
    assert results.baseline.config == {"env.TUNE_TEST_FAST": "0", "params.batch_size": 1}
    first = _trials("speed")[0]
    assert first.user_attrs["point"] == json.dumps(results.baseline.config, sort_keys=True)
    assert first.user_attrs["versions"]["torch"].startswith(torch.__version__.split("+")[0])
    assert results.speedup(results.completed[0]) > 8  # 16x fewer steps, each half the cost

    assert main(["tune", "report", "--study", "speed", "--csv", "r.csv", "--plot", "r.png"]) == 0
    table = capsys.readouterr().out
    best_line = table.splitlines()[3]
    assert best_line.split()[1:3] == ["1", "16"] and best_line.endswith("x")
    assert "1.00x (default)" in table
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    assert len((tmp_path / "r.csv").read_text().splitlines()) == 7

    assert format_best(results, "env").splitlines() == [
        "export TUNE_TEST_FAST=1", """export NKI_OPS_TUNE_PARAMS='{"batch_size": 16}'"""]


def test_crashing_and_hanging_trials_are_recorded_as_failed(write_space, workload_command):
    space = load_space(write_space('[params]\nbehaviour = ["ok", "crash", "hang", "silent"]\n'
                                   'samples = [4]\n'))
    # The timeout is all the hanging trial costs; the others, which no longer import nki_ops, take a tenth of a second.
    run_sweep("faults", space, workload_command, timeout=5, progress=False)
    results = load_results("faults")
    failures = {row.config["params.behaviour"]: row for row in results.failed}
    assert [row.config["params.behaviour"] for row in results.completed] == ["ok"]
    assert failures["crash"].failure == "exited with code 1"
    assert "RuntimeError: simulated crash in the training step" in failures["crash"].output_tail
    assert failures["hang"].failure == "timed out after 5 s"
    assert failures["silent"].failure == "finished without calling nki_ops.tune.report()"
    report = format_report(results)
    assert "simulated crash" in report and "timed out after 5 s" in report


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT], ids=["kill", "ctrl-c"])
def test_a_stopped_sweep_resumes_without_losing_or_repeating_trials(stop, write_space, workload_command, tmp_path):
    space_file = write_space('[params]\nsamples = [8, 16, 24, 32]\n')
    command = [sys.executable, "-m", "nki_ops.cli", "tune", "run", "--study", "resume", "--space",
               str(space_file), "--no-progress", "--", *workload_command]
    # The sweep's first trial finishes and its second hangs (see the workload), so the stop lands while a trial
    # runs however slowly this process is scheduled; the resume below, without the variable, runs them all.
    env = {**os.environ, "TUNE_TEST_FIRST_ONLY": str(tmp_path / "first-trial")}
    # Ctrl-C as from a terminal. A test run started in the background (`make test &`) ignores SIGINT, and one
    # started by a supervisor may block it; the sweep would inherit either, and a blocked Ctrl-C stays pending
    # while the sweep runs to the end and exits 0.
    def terminal_sigint():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    output = open("sweep.log", "w+")  # read back if the sweep does not stop as expected
    sweep = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env,
                             preexec_fn=terminal_sigint)  # noqa: PLW1509
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        trials = _trials("resume") if os.path.exists(".nki-ops/tune/resume.journal") else []
        # "token" is recorded just before a trial's command starts: the stop lands while that command runs.
        if sum(t.state == TrialState.COMPLETE for t in trials) == 1 and any(
                t.state == TrialState.RUNNING and "token" in t.user_attrs for t in trials):
            break
        time.sleep(0.2)
    else:
        sweep.kill()
        pytest.fail("within 60 s the sweep never had one finished trial and one running")
    # SIGKILL leaves the running trial RUNNING for the resume to find; Ctrl-C stops it and queues it again
    seen = [t.state.name for t in trials]
    sweep.send_signal(stop)
    try:
        code = sweep.wait(timeout=30)
    except subprocess.TimeoutExpired:  # the stop did not take: the sweep waits on its hanging trial
        sweep.kill()
        code = None
    output.seek(0)
    printed = output.read()
    output.close()
    assert code == (-signal.SIGKILL if stop == signal.SIGKILL else 130), (
        f"stopped with trials {seen}; exit code {code}, trials now "
        f"{[(t.state.name, t.user_attrs.get('failure')) for t in _trials('resume')]}; output:\n{printed}")
    completed_before = {t.user_attrs["point"] for t in _trials("resume") if t.state == TrialState.COMPLETE}
    assert len(completed_before) == 1

    run_sweep("resume", load_space(space_file), workload_command, timeout=60, progress=False)
    trials = _trials("resume")
    completed = [t.user_attrs["point"] for t in trials if t.state == TrialState.COMPLETE]
    assert sorted(completed) == sorted(set(completed)) and len(completed) == 4  # each point exactly once
    assert completed_before <= set(completed)
    assert sum(t.state == TrialState.FAIL for t in trials) == 1  # the stopped one, queued again
    assert "1 interrupted trial(s) were queued again" in format_report(load_results("resume"))


def test_a_journal_lock_left_by_a_killed_worker_is_taken_over(write_space, workload_command, monkeypatch):
    # A worker killed while appending to the journal leaves Optuna's lock behind; the next worker
    # must take it over once it has gone stale, not wait for it forever.
    monkeypatch.setattr(study_module, "STALE_LOCK_SECONDS", 3)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from nki_ops.tune.study import open_storage; "
                               "open_storage('locked', None)._backend._lock.acquire(); print('held', flush=True); "
                               "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    holder.kill()
    holder.wait()
    assert os.path.islink(".nki-ops/tune/locked.journal.lock")

    space = load_space(write_space('[params]\nsamples = [4]\n'))
    sweep = threading.Thread(target=run_sweep, args=("locked", space, workload_command),
                             kwargs=dict(timeout=30, progress=False), daemon=True)
    sweep.start()
    sweep.join(timeout=60)
    assert not sweep.is_alive(), "the sweep still waits for the dead worker's journal lock after 60 s"
    assert [t.state for t in _trials("locked")] == [TrialState.COMPLETE]


def test_a_trial_asked_for_by_a_worker_killed_before_it_recorded_itself_runs_again(write_space, workload_command,
                                                                                    monkeypatch):
    # The window between Optuna's ask and the worker's "worker" attribute: a kill there leaves a running
    # trial that names no worker. Young, it may be another worker's ask in flight and is left alone.
    space = load_space(write_space('[params]\nsamples = [4, 8]\n'))
    storage = open_storage("ownerless", None)
    study = study_module.open_study("ownerless", space, storage, "samples_per_sec", "maximize", None)
    study_module._ask(study, {})  # pops a queued point, then the worker "dies"
    run_sweep("ownerless", space, workload_command, timeout=60, progress=False)
    assert sorted(t.state for t in _trials("ownerless")) == [TrialState.RUNNING, TrialState.COMPLETE]

    monkeypatch.setattr(study_module, "OWNERLESS_SECONDS", 0)
    run_sweep("ownerless", space, workload_command, timeout=60, progress=False)
    trials = _trials("ownerless")
    assert [t.state for t in trials].count(TrialState.COMPLETE) == 2
    assert trials[0].state == TrialState.FAIL and "failure" not in trials[0].user_attrs  # interrupted


def test_tpe_runs_the_default_first_and_stops_at_the_trial_budget(write_space, workload_command):
    space = load_space(write_space('[params]\nbatch_size = [1, 2, 4, 8, 16, 32]\nsamples = [32]\n'))
    run_sweep("tpe", space, workload_command, trials=3, timeout=60, progress=False)
    trials = _trials("tpe")
    ran = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(ran) == 3 and ran[0].number == 0 and ran[0].user_attrs["params"] == {"batch_size": 1, "samples": 32}
    assert len({t.user_attrs["point"] for t in ran}) == 3
    run_sweep("tpe", space, workload_command, progress=False)  # a resume keeps the budget: nothing more runs
    assert len(_trials("tpe")) == len(trials)


def test_cli_refuses_a_misspelled_flag_before_any_trial(write_space, capsys):
    space_file = write_space('[neuron_cc_flags]\nauto-cast = ["matmul"]\n')
    assert main(["tune", "run", "--study", "typo", "--space", str(space_file), "--", "false"]) == 2
    assert "did you mean 'matmult'?" in capsys.readouterr().err
    assert not os.path.exists(".nki-ops/tune/typo.journal")


def test_a_study_cannot_be_resumed_with_another_space(write_space, workload_command, capsys):
    run_sweep("one", load_space(write_space('[params]\nsamples = [4]\n')), workload_command, progress=False)
    space_file = write_space('[params]\nsamples = [8]\n')
    assert main(["tune", "run", "--study", "one", "--space", str(space_file), "--", *workload_command]) == 2
    assert "was run with a different search space" in capsys.readouterr().err
