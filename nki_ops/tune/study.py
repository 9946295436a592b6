"""The sweep engine on Optuna: every trial a fresh subprocess, the default configuration first.

Grid mode (all points, when ``trials`` is None or covers the grid): every valid point is enqueued once,
default first, by whichever worker creates the study; workers pop them atomically from the storage, so
concurrent workers on one study never run a point twice. TPE mode (``trials`` below the grid size): the
default is enqueued, then Optuna's TPE proposes; a proposal that is invalid or already ran is pruned
without running. Interrupting and rerunning the same command resumes: finished trials stay, a trial that
was running when its worker died is recorded as interrupted and runs again: at once when the worker ran on
this host, and, with a database storage, from any host once the worker's heartbeat has stopped for
``2 * HEARTBEAT_SECONDS`` (Optuna's heartbeat, stale-trial failing and retry callback).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import importlib.metadata
import importlib.util
import json
import math
import os
import socket
import tempfile
import time
import uuid
import warnings
from datetime import datetime
from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.storages._heartbeat import get_heartbeat_thread
from optuna.trial import TrialState

from .runner import kill_leftovers, run_trial
from .space import Space, trial_settings

STATE_DIR = Path(".nki-ops") / "tune"
LOADER_PARAMS = ("batches_per_execution", "loader_prefetch_size", "device_prefetch_size",
                 "host_to_device_transfer_threads")
READY_WAIT_SECONDS = 60
# A journal lock unchanged this long was left by a worker killed while holding it, and is taken over.
STALE_LOCK_SECONDS = 30
MAX_CONSECUTIVE_REPEATS = 50
# Database storages: a running trial whose worker has not written a heartbeat for twice this is failed and
# queued again by whichever worker looks next, on any host.
HEARTBEAT_SECONDS = 60
# A worker records itself on a trial right after Optuna's ask; a running trial without a worker this long
# after it started was asked for by a worker killed in between.
OWNERLESS_SECONDS = 60
RDB_SCHEMES = ("postgresql", "postgres", "mysql", "sqlite")
# the named lock that serialises Optuna's table setup between workers; any fixed number, chosen once
SCHEMA_LOCK_KEY = 0x6E6B696F7073


class SweepError(RuntimeError):
    """A sweep that cannot start or continue; the message says why and what to do."""


def check_study_name(name: str) -> None:
    """A study name is also a file name (the default journal): one non-empty path component."""
    if not name.strip() or name in (".", "..") or any(sep in name for sep in "/\\") or not name.isprintable():
        raise SweepError(f"invalid study name {name!r}: give a non-empty name without path separators "
                         f"or control characters, e.g. --study vit-flags")


def open_storage(study_name: str, storage: str | None, *, write: bool = True):
    """Default: a journal file under .nki-ops/tune/ in the working directory. A URL (postgresql://,
    mysql://, sqlite:///) uses Optuna's RDB storage; any other text is a journal file path.
    ``write``: the sweep will add trials, so the journal's folder must take its lock file."""
    check_study_name(study_name)
    if storage and "://" in storage:
        import sqlalchemy.engine
        import sqlalchemy.exc

        scheme = storage.split("://", 1)[0].split("+", 1)[0]
        if scheme not in RDB_SCHEMES:
            raise SweepError(f"unsupported storage URL {storage.split('://', 1)[0] + '://'!r}: use postgresql://, "
                             f"mysql:// or sqlite:///, or a journal file path")
        try:
            shown = sqlalchemy.engine.make_url(storage).render_as_string(hide_password=True)
        except (sqlalchemy.exc.ArgumentError, ValueError) as error:
            raise SweepError(f"invalid storage URL: {error}") from None
        if storage.startswith(("postgresql://", "postgres://")):
            # the driver the tune extra installs (psycopg 3), whatever SQLAlchemy's default for the scheme
            storage = "postgresql+psycopg://" + storage.split("://", 1)[1]
        return _rdb_storage(storage, shown)
    # Absolute: Optuna's lock is a symlink to this path, and it recognises a stale lock (left by a worker
    # killed while holding it) by stat-ing through the link, which a relative target breaks for good.
    path = (Path(storage) if storage else STATE_DIR / f"{study_name}.journal").absolute()
    if path.is_dir():
        raise SweepError(f"storage {str(path)!r} is a folder; give a journal file path, "
                         f"e.g. {str(path / (study_name + '.journal'))!r}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if write:
            tempfile.TemporaryFile(dir=path.parent).close()  # the lock is a new file there, at every write
        journal = optuna.storages.journal
        lock = journal.JournalFileSymlinkLock(str(path), grace_period=STALE_LOCK_SECONDS)
        return optuna.storages.JournalStorage(journal.JournalFileBackend(str(path), lock_obj=lock))
    except OSError as error:
        raise SweepError(f"cannot use {str(path)!r} as the study journal: {error.strerror or error}") from None


def quiet_optuna() -> None:
    """The sweep prints its own progress and report; Optuna's per-trial log lines would repeat them."""
    import warnings

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def _rdb_storage(url: str, shown: str):
    """Optuna's RDB storage with heartbeats; ``shown`` is the URL without its password, for errors."""
    import sqlalchemy.exc

    try:
        with _schema_lock(url), warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeat_interval
            return optuna.storages.RDBStorage(
                url, heartbeat_interval=HEARTBEAT_SECONDS,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback())
    except (sqlalchemy.exc.SQLAlchemyError, ImportError) as error:
        reason = str(getattr(error, "orig", None) or error).strip().splitlines()[0]
        raise SweepError(f"cannot open storage {shown}: {reason}") from None


@contextlib.contextmanager
def _schema_lock(url: str):
    """Held while Optuna sets up its tables. Workers starting together on an empty database would otherwise
    race through its several setup steps (enum types, tables, the alembic stamp, the version row), and the
    loser fails with "already exists" at whichever step it lost. Server databases serialise with their own
    named lock, which the server releases if the worker dies; SQLite files with a lock on the file itself."""
    import sqlalchemy

    dialect = url.split("://", 1)[0].split("+", 1)[0]
    if dialect == "sqlite":
        database = sqlalchemy.engine.make_url(url).database
        if not database or database == ":memory:" or not Path(database).parent.is_dir():  # SQLite says why
            yield
            return
        with open(database, "ab") as handle:  # SQLite's own locks are fcntl ranges; flock does not touch them
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        return
    acquire, release = {"postgresql": ("SELECT pg_advisory_lock(:key)", "SELECT pg_advisory_unlock(:key)"),
                        "mysql": ("SELECT GET_LOCK(:key, -1)", "SELECT RELEASE_LOCK(:key)")}[dialect]
    key = SCHEMA_LOCK_KEY if dialect == "postgresql" else str(SCHEMA_LOCK_KEY)
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text(acquire), {"key": key})
            try:
                yield
            finally:
                connection.execute(sqlalchemy.text(release), {"key": key})
    finally:
        engine.dispose()


def no_effect_reasons(axes) -> dict[str, str]:
    """Settings that reach the trial but that nothing on this host reads."""
    neuron = importlib.util.find_spec("torch_neuronx") is not None and bool(glob.glob("/dev/neuron*"))
    xla = importlib.util.find_spec("torch_xla") is not None
    reasons = {}
    for axis in axes:
        table, name = axis.split(".", 1)
        if not neuron and (table == "neuron_cc_flags" or (table == "env" and name.startswith("NEURON_"))):
            reasons[axis] = "no Neuron device/SDK on this host"
        elif not xla and ((table == "env" and name.startswith("XLA_"))
                         or (table == "params" and name in LOADER_PARAMS)):
            reasons[axis] = "torch-xla is not installed on this host"
    return reasons


def _complete_params(space: Space, config: dict) -> dict:
    # settings a point drops as no-effect still need a value for Optuna's per-axis distributions
    return {axis: config.get(axis, values[0]) for axis, values in space.axes.items()}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def counted(trial) -> bool:
    """Trials that count toward the sweep: completed, or failed with a recorded reason."""
    return trial.state == TrialState.COMPLETE or (trial.state == TrialState.FAIL and "failure" in trial.user_attrs)


def open_study(study_name: str, space: Space, storage, metric: str, direction: str, trials: int | None,
               extra: dict | None = None):
    """Create the study (enqueueing its points) or join/resume it after checking it is the same sweep
    (same space, metric, direction and ``extra`` settings, such as a kernel sweep's target)."""
    sampler = optuna.samplers.TPESampler(seed=None)
    settings = {"space": space.fingerprint, "metric": metric, "direction": direction, **(extra or {})}
    try:
        study = optuna.create_study(study_name=study_name, storage=storage, direction=direction, sampler=sampler)
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=study_name, storage=storage, sampler=sampler)
        deadline = time.monotonic() + READY_WAIT_SECONDS
        while "grid" not in study.user_attrs:  # the creating worker is still enqueueing
            if time.monotonic() > deadline:
                raise SweepError(f"study {study_name!r} exists but its points were never enqueued "
                                 f"(its creator stopped early); delete it or use another --study name") from None
            time.sleep(0.5)
        for name, value in settings.items():
            if study.user_attrs.get(name) != value:
                what = {"space": "search space", "kind": "kind of sweep"}.get(name, name)
                raise SweepError(f"study {study_name!r} was run with a different {what} "
                                 f"({study.user_attrs.get(name)!r}, now {value!r}); use another --study name") from None
        return study
    for name, value in settings.items():
        study.set_user_attr(name, value)
    study.set_user_attr("baseline", space.key(space.baseline))
    study.set_user_attr("trials", trials)  # the budget a resume without --trials keeps
    grid = trials is None or trials >= len(space.points)
    for config in (space.points if grid else space.points[:1]):
        study.enqueue_trial(_complete_params(space, config), user_attrs={"point": space.key(config)})
    study.set_user_attr("grid", grid)  # last: other workers wait for it
    return study


def _abandoned(trial, host: str) -> bool:
    """Whether a running trial's worker is known to be dead: a dead process on this host, or none recorded."""
    worker = trial.user_attrs.get("worker")
    if worker is None:  # Optuna's clock is naive local time
        return (datetime.now() - trial.datetime_start).total_seconds() > OWNERLESS_SECONDS
    worker_host, _, pid = worker.rpartition(":")
    return worker_host == host and pid.isdigit() and not _pid_alive(int(pid))


def recover_interrupted(study, space: Space) -> None:
    """Trials left running by a dead worker on this host, or by one killed before it recorded itself:
    record them as interrupted, kill what they left running, and queue their points again. (Database
    storages also recover them from any host by heartbeat.)"""
    host = socket.gethostname()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not _abandoned(trial, host):
            continue
        try:
            study.tell(trial.number, state=TrialState.FAIL)  # no "failure" attr: interrupted, not counted
        except (RuntimeError, ValueError):
            continue  # another worker recovered it first
        if "token" in trial.user_attrs:
            kill_leftovers(trial.user_attrs["token"])
        if "point" in trial.user_attrs:  # a TPE proposal killed before it had one is simply dropped
            config = json.loads(trial.user_attrs["point"])
            study.enqueue_trial(_complete_params(space, config), user_attrs={"point": trial.user_attrs["point"]})


def _fail_stale_trials(study) -> None:
    """Fail the trials whose worker's heartbeat stopped, on any host; the storage's
    RetryHeartbeatStaleTrialCallback queues each again (a no-op for journal storages, which have no heartbeat)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def _ask(study, distributions):
    with warnings.catch_warnings():
        # Optuna expects heartbeats under Study.optimize; _run_one records them around each trial itself
        warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used with Study.optimize")
        return study.ask(distributions)


def next_trial(study, space: Space, distributions, grid: bool):
    """The study's next trial on this worker and its configuration; None for a point already run, which is
    pruned with the reason."""
    trial = _ask(study, distributions)
    trial.set_user_attr("worker", _worker_id())
    config, skip = _propose(study, space, trial, grid)
    if config is None:
        trial.set_user_attr("skipped", skip)
        study.tell(trial, state=TrialState.PRUNED)
    return trial, config


def _propose(study, space: Space, trial, grid: bool) -> tuple[dict | None, str | None]:
    """The configuration to run for a freshly asked trial, or None and why it must not run."""
    if "point" in trial.user_attrs:  # popped from the queue
        return json.loads(trial.user_attrs["point"]), None
    if grid:
        return None, "grid exhausted"
    config, reason = space.canonical(trial.params)
    if config is None:
        return None, f"invalid: {reason}"
    key = space.key(config)
    for other in study.get_trials(deepcopy=False):
        if other.number != trial.number and other.user_attrs.get("point") == key and \
                (other.state in (TrialState.RUNNING, TrialState.WAITING) or counted(other)):
            return None, f"repeats trial {other.number}"
    trial.set_user_attr("point", key)
    return config, None


def check_sweep_options(study_name: str, command: list[str], trials: int | None, timeout: float) -> None:
    check_study_name(study_name)
    if not command:
        raise SweepError("no command to tune: give it after --, e.g. nki-ops tune run ... -- python train.py")
    if trials is not None and trials < 1:
        raise SweepError(f"--trials must be at least 1, got {trials}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not (math.isfinite(timeout) and timeout > 0):
        raise SweepError(f"--timeout must be a positive number of seconds, got {timeout!r}")


def run_sweep(study_name: str, space: Space, command: list[str], *, storage: str | None = None,
              metric: str = "samples_per_sec", direction: str = "maximize", trials: int | None = None,
              timeout: float = 3600.0, progress: bool = True, cwd: str | None = None):
    """Run (or resume, or join) a sweep of ``command`` over ``space``; returns the Optuna study."""
    check_sweep_options(study_name, command, trials, timeout)
    storage_object = open_storage(study_name, storage)
    study = open_study(study_name, space, storage_object, metric, direction, trials)
    grid = study.user_attrs["grid"]
    budget = trials if trials is not None else study.user_attrs.get("trials")
    target = len(space.points) if grid or budget is None else min(budget, len(space.points))
    recover_interrupted(study, space)
    distributions = {axis: CategoricalDistribution(values) for axis, values in space.axes.items()}
    no_effect = no_effect_reasons(space.axes)
    bar = _progress_bar(study, target, progress)
    repeats = 0
    try:
        while sum(counted(t) for t in study.get_trials(deepcopy=False)) < target:
            _fail_stale_trials(study)
            if grid and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                break  # the remaining points are running on other workers (or were, until a heartbeat ago)
            trial, config = next_trial(study, space, distributions, grid)
            if config is None:
                repeats += 1
                if grid or repeats >= MAX_CONSECUTIVE_REPEATS:
                    break
                continue
            repeats = 0
            _run_one(study, trial, config, command, metric, timeout, cwd, no_effect)
            if bar is not None:
                bar.n = sum(counted(t) for t in study.get_trials(deepcopy=False))
                if study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
                    bar.set_postfix({metric: f"{study.best_value:.4g}"}, refresh=False)
                bar.refresh()
    finally:
        if bar is not None:
            bar.close()
    return study


def _versions() -> dict[str, str]:
    """Versions that change what a configuration does (a torch-xla release alone can move throughput 10%)."""
    found = {}
    for package in ("torch", "torch-xla", "torch-neuronx", "neuronx-cc", "libneuronxla"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def _run_one(study, trial, config: dict, command, metric: str, timeout: float, cwd, no_effect) -> None:
    env, params = trial_settings(config)
    trial.set_user_attr("env", env)
    trial.set_user_attr("params", params)
    trial.set_user_attr("no_effect", sorted(a for a in config if a in no_effect))
    trial.set_user_attr("versions", _versions())
    trial.set_user_attr("token", uuid.uuid4().hex)
    try:
        # what Study.optimize runs around each trial, for database storages (this sweep asks and tells itself)
        with get_heartbeat_thread(trial._trial_id, study._storage):
            result = run_trial(command, env, params, timeout, cwd, token=trial.user_attrs["token"])
    except BaseException:  # Ctrl-C or SIGTERM: the trial did not finish, so it runs again on resume
        study.tell(trial, state=TrialState.FAIL)
        study.enqueue_trial(trial.params, user_attrs={"point": trial.user_attrs["point"]})
        raise
    trial.set_user_attr("seconds", round(result.seconds, 3))
    failure = result.failure
    if failure is None and metric not in result.metrics:
        failure = f"reported {sorted(result.metrics)} but not {metric!r}"
    if failure is not None:
        trial.set_user_attr("failure", failure)
        trial.set_user_attr("output_tail", result.output_tail)
        study.tell(trial, state=TrialState.FAIL)
        return
    trial.set_user_attr("metrics", result.metrics)
    study.tell(trial, result.metrics[metric])


def _progress_bar(study, target: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    done = sum(counted(t) for t in study.get_trials(deepcopy=False))
    return tqdm(total=target, initial=done, desc=f"tune {study.study_name}", unit="trial")

