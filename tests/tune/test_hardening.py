"""What a killed sweep leaves behind, workers on other hosts, and bad options, names, storages and output
(issue 15, finding 7)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from nki_ops.cli import main
from nki_ops.tune import study as study_module
from nki_ops.tune.flags import SpaceError
from nki_ops.tune.results import format_report, load_results
from nki_ops.tune.space import load_space, parse_space
from nki_ops.tune.study import run_sweep


def _alive(pid: int) -> bool:
    """Running, not a zombie (an orphan's zombie may wait a while for whoever reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_until(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"within {seconds:g} s, never {what}")
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal and /proc are Linux's")
def test_a_killed_sweeps_trial_dies_with_it_and_its_children_are_reaped_on_resume(write_space, workload_command,
                                                                                   tmp_path):
    pid_file = tmp_path / "pids"
    space_file = write_space(f'[params]\nbehaviour = ["hang"]\npid_file = ["{pid_file}"]\n')
    sweep = subprocess.Popen([sys.executable, "-m", "nki_ops.cli", "tune", "run", "--study", "orphans", "--space",
                              str(space_file), "--timeout", "600", "--no-progress", "--", *workload_command],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_until(pid_file.exists, 60, "the trial started")
    trial_pid, child_pid = map(int, pid_file.read_text().split())
    pid_file.unlink()
    sweep.kill()
    sweep.wait()
    try:
        _wait_until(lambda: not _alive(trial_pid), 10, "the trial died with its sweep (it would hang for 600 s)")
        # The trial's child outlives the kill -9: the resumed sweep finds and kills it before running the trial again.
        run_sweep("orphans", load_space(space_file), workload_command, timeout=3, progress=False)
        _wait_until(lambda: not _alive(child_pid), 10, "the resumed sweep killed the dead trial's child")
    finally:
        for pid in (trial_pid, child_pid):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    states = [t.state for t in optuna.load_study(study_name="orphans",
                                                 storage=study_module.open_storage("orphans", None)).get_trials()]
    assert states == [TrialState.FAIL, TrialState.FAIL]  # interrupted, then timed out on resume
    assert load_results("orphans").failed[0].failure == "timed out after 3 s"


@pytest.mark.slow
def test_a_trial_left_running_by_a_worker_on_another_host_runs_again_once_its_heartbeat_stops(
        write_space, workload_command, tmp_path, monkeypatch):
    # A 1 s heartbeat: a trial whose worker has been silent for 2 s is stale. The killed worker believes it
    # runs on another host, so only the heartbeat can tell that it died.
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    space_file = write_space('[params]\nsamples = [400]\n')
    worker = ("import socket, sys; socket.gethostname = lambda: 'elsewhere'; "
              "from nki_ops.tune import study; study.HEARTBEAT_SECONDS = 1; from nki_ops.cli import main; "
              "main(sys.argv[1:])")
    sweep = subprocess.Popen([sys.executable, "-c", worker, "tune", "run", "--study", "far", "--storage", storage,
                              "--space", str(space_file), "--no-progress", "--", *workload_command],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def rows(table: str) -> int:
        """Rows of ``table``, read-only (0 while the worker has not made it or holds the database's lock)."""
        try:
            with contextlib.closing(sqlite3.connect(f"file:{tmp_path / 'shared.db'}?mode=ro", uri=True)) as db:
                return db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        except sqlite3.Error:
            return 0

    def schema_ready() -> bool:
        """Whether the worker has finished creating the database's tables: opening the storage before then
        would create them too, and whichever process lost that race would fail."""
        return rows("alembic_version") > 0

    def trials():
        if not schema_ready():
            return []
        try:
            return optuna.load_study(study_name="far", storage=storage).get_trials()
        except KeyError:  # the worker has created the database but not yet the study
            return []

    # Killed once its command runs under a heartbeat: "token" is the last thing recorded before it starts, and
    # Optuna never counts a trial without a heartbeat as stale (a fixed wait for the first one lost on a busy
    # machine).
    _wait_until(lambda: os.path.exists(tmp_path / "shared.db") and any(
        t.state == TrialState.RUNNING and "token" in t.user_attrs for t in trials()), 60, "the trial started")
    _wait_until(lambda: rows("trial_heartbeats") > 0, 60, "the trial's first heartbeat")
    sweep.kill()
    sweep.wait()
    assert trials()[0].user_attrs["worker"].startswith("elsewhere:")
    time.sleep(4)  # two heartbeats missed (SQLite's clock has 1 s steps)

    monkeypatch.setattr(study_module, "HEARTBEAT_SECONDS", 1)
    run_sweep("far", load_space(space_file), workload_command, storage=storage, timeout=60, progress=False)
    first, retried = trials()
    assert first.state == TrialState.FAIL and "failure" not in first.user_attrs  # interrupted, not failed
    assert retried.state == TrialState.COMPLETE and retried.system_attrs["failed_trial"] == first.number
    assert retried.user_attrs["point"] == first.user_attrs["point"]


def test_env_names_a_shell_cannot_export_are_refused():
    for name in ("BAD-NAME", "1ST", "A B", "", "X=Y"):
        with pytest.raises(SpaceError, match=rf"\[env\] name {name!r} is not an environment variable name"):
            parse_space({"env": {name: ["1"]}})
    with pytest.raises(SpaceError, match="NUL character"):
        parse_space({"env": {"OK": ["a\0b"]}})


def _cli_error(argv, capsys) -> str:
    """Run the CLI expecting a refusal: exit code 2 and one line on stderr, which is returned."""
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's own refusals
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if not line.startswith("usage:")]
    assert len(lines) == 1, err
    return lines[0]


def _run_argv(space_file, *options):
    return ["tune", "run", "--study", "s", "--space", str(space_file), *options, "--", "true"]


@pytest.mark.parametrize("timeout", ["0", "-5", "nan", "inf"])
def test_a_timeout_that_is_not_a_positive_number_of_seconds_is_refused(timeout, write_space, capsys):
    error = _cli_error(_run_argv(write_space('[params]\nsamples = [4]\n'), "--timeout", timeout), capsys)
    assert error == f"nki-ops tune: error: --timeout must be a positive number of seconds, got {float(timeout)!r}"
    assert not os.path.exists(".nki-ops")


@pytest.mark.parametrize("name", ["", " ", "a/b", "../up", "..", "a\\b", "new\nline"])
@pytest.mark.parametrize("command", ["run", "report", "best"])
def test_a_study_name_that_is_not_one_file_name_is_refused(name, command, write_space, capsys):
    argv = ["tune", command, "--study", name]
    if command == "run":
        argv += ["--space", str(write_space('[params]\nsamples = [4]\n')), "--", "true"]
    assert _cli_error(argv, capsys).startswith(f"nki-ops tune: error: invalid study name {name!r}")
    assert not os.path.exists(".nki-ops")


@pytest.mark.parametrize("storage, message", [
    ("redis://localhost/0", "unsupported storage URL 'redis://': use postgresql://, mysql:// or sqlite:///"),
    ("postgresql://user:secret@127.0.0.1:1/db",
     "cannot open storage postgresql://user:***@127.0.0.1:1/db: connection failed"),
    ("postgresql://user@127.0.0.1:notaport/db", "invalid storage URL"),
    ("sqlite:////no/such/folder/study.db", "cannot open storage sqlite:////no/such/folder/study.db: unable to open"),
])
def test_a_storage_url_that_cannot_be_opened_gets_one_line(storage, message, write_space, capsys):
    error = _cli_error(_run_argv(write_space('[params]\nsamples = [4]\n'), "--storage", storage), capsys)
    assert error.startswith(f"nki-ops tune: error: {message}")
    assert "secret" not in error


def test_a_storage_path_that_is_a_folder_gets_one_line(write_space, tmp_path, capsys):
    space_file = write_space('[params]\nsamples = [4]\n')
    error = _cli_error(_run_argv(space_file, "--storage", str(tmp_path)), capsys)
    assert error == (f"nki-ops tune: error: storage {str(tmp_path)!r} is a folder; give a journal file path, "
                     f"e.g. {str(tmp_path / 's.journal')!r}")
    assert _cli_error(["tune", "report", "--study", "s", "--storage", str(tmp_path)], capsys) == error


@pytest.fixture
def read_only_folder():
    """A folder nobody may write to, and the user who meets it: root writes anywhere, so a root test
    process takes the unprivileged user "nobody"'s identity (effective uid) until the test ends."""
    folder = Path(tempfile.mkdtemp(prefix="nki-ops-read-only-"))
    (folder / "space.toml").write_text('[params]\nsamples = [4]\n')
    folder.chmod(0o555)
    as_root = os.geteuid() == 0
    if as_root:
        os.seteuid(65534)
    try:
        yield folder
    finally:
        if as_root:
            os.seteuid(0)
        folder.chmod(0o755)
        shutil.rmtree(folder)


@pytest.mark.parametrize("journal", ["s.journal", "new/s.journal"])
def test_a_read_only_storage_folder_gets_one_line(journal, read_only_folder, capsys):
    path = read_only_folder / journal
    error = _cli_error(_run_argv(read_only_folder / "space.toml", "--storage", str(path)), capsys)
    assert error == f"nki-ops tune: error: cannot use {str(path)!r} as the study journal: Permission denied"


def test_a_read_only_journal_folder_is_refused_even_when_the_journal_itself_is_writable(tmp_path, capsys):
    # Optuna's journal lock is a new file next to the journal at every write: found out mid-sweep otherwise.
    if os.geteuid() != 0:
        pytest.skip("needs root to hand the journal to the unprivileged user")
    folder = Path(tempfile.mkdtemp(prefix="nki-ops-read-only-"))
    (folder / "space.toml").write_text('[params]\nsamples = [4]\n')
    (folder / "s.journal").touch()
    os.chown(folder / "s.journal", 65534, 65534)
    folder.chmod(0o555)
    os.seteuid(65534)
    try:
        error = _cli_error(_run_argv(folder / "space.toml", "--storage", str(folder / "s.journal")), capsys)
    finally:
        os.seteuid(0)
        shutil.rmtree(folder)
    assert error.endswith("as the study journal: Permission denied")


@pytest.mark.parametrize("argv, message", [
    (["--studdy", "x", "--study", "s"], "unknown option '--studdy'; did you mean '--study'?"),
    (["--study", "s", "--timout=5"], "unknown option '--timout=5'; did you mean '--timeout'?"),
    (["--study", "s", "python"], "unexpected argument 'python'; give the training command after --"),
])
def test_a_misspelled_option_is_reported_not_swallowed_into_the_command(argv, message, write_space, capsys):
    space_file = write_space('[params]\nsamples = [4]\n')
    error = _cli_error(["tune", "run", *argv, "--space", str(space_file), "--", "true"], capsys)
    assert error == f"nki-ops tune run: error: {message}"


def test_options_after_the_double_dash_belong_to_the_command(write_space, workload_command, capsys):
    space_file = write_space('[params]\nsamples = [4]\n')
    assert main(["tune", "run", "--study", "s", "--space", str(space_file), "--no-progress", "--",
                 *workload_command, "--study", "--", "x"]) == 0
    assert "study s: 1 completed, 0 failed" in capsys.readouterr().out


def test_control_characters_in_a_trials_output_are_escaped_in_the_report(write_space, capsys):
    space = load_space(write_space('[params]\nsamples = ["\\u001b[8m"]\n'))
    command = ["sh", "-c", r"printf 'fine\nclear \033[2J\033[31mred \342\200\256txt.exe\r\n'; exit 3"]
    run_sweep("ctrl", space, command, timeout=30, progress=False)
    assert main(["tune", "report", "--study", "ctrl"]) == 0
    report = capsys.readouterr().out
    assert report == format_report(load_results("ctrl")) + "\n"
    assert r"#0 samples=\x1b[8m: exited with code 3" in report
    assert r"last output: clear \x1b[2J\x1b[31mred \u202etxt.exe" in report
    assert all(c.isprintable() for c in report.replace("\n", ""))
