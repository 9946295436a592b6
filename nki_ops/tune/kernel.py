"""Tune an NKI kernel's parameters on the simulator's cost model: no device, every candidate checked.

``tune_kernel(build, space)`` costs each combination of ``space`` with
``nki_ops.sim.profile(kernel, target=target, timing_only=True)(*args)``, runs ``check`` on it, and keeps
the fastest candidate whose values are right. The sweep is an Optuna study like the flag sweeps
(:mod:`nki_ops.tune.study`): same storages, study names, resume, heartbeats and ``nki-ops tune
report/best``. Each candidate runs in a forked child process, ``jobs`` at a time, killed after
``timeout`` seconds.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import multiprocessing.connection
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.storages._heartbeat import get_heartbeat_thread
from optuna.trial import TrialState

from .flags import SpaceError
from .space import Space, parse_space, read_space_file
from .study import (
    MAX_CONSECUTIVE_REPEATS,
    SweepError,
    _fail_stale_trials,
    _progress_bar,
    check_study_name,
    counted,
    next_trial,
    open_storage,
    open_study,
    quiet_optuna,
    recover_interrupted,
)

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover - exercised on Python 3.10 only
    pass

METRIC = "estimate_us"
# trials=None tries every combination up to this many; a larger space gets this many TPE trials
GRID_LIMIT = 64
DEFAULT_TIMEOUT = 600.0
TARGETS = ("trn1", "trn2", "trn3", "inf2")


@dataclass
class Candidate:
    """One costed parameter combination (a row of :attr:`KernelTuneResult.rows`)."""

    params: dict
    estimate_us: float | None  # None when it did not run (a wrong-values candidate has one)
    status: str  # "ok", "wrong values: ...", "refused: ...", "timeout" or "failed: ..."
    speedup: float | None  # the default configuration's estimate over this one's (ok candidates only)
    warnings: list[str] = field(default_factory=list)  # the simulator's warnings (e.g. SBUF spills)
    trial: int | None = None


@dataclass
class KernelTuneResult:
    target: str
    rows: list[Candidate]  # ok rows fastest first, then the others in trial order
    default_params: dict
    study: optuna.Study

    @property
    def best(self) -> dict | None:
        """The fastest candidate whose status is ok (None when none is)."""
        return self.rows[0].params if self.rows and self.rows[0].status == "ok" else None

    @property
    def default(self) -> Candidate | None:
        return next((r for r in self.rows if r.params == self.default_params), None)


def _one_line(error) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _reason(error) -> str:
    """The simulator's one-line reason, its ``/path/file.py:line:`` prefix shortened to ``file.py:line:``."""
    where, colon, rest = _one_line(error).partition(": ")
    return f"{Path(where).name}{colon}{rest}" if colon and re.fullmatch(r".+\.py:\d+", where) else _one_line(error)


def cost_candidate(build, check, params: dict, target: str) -> dict:
    """Estimate one candidate and check its values, in this process: ``{"status", "estimate_us", "warnings"}``.
    A simulator error anywhere refuses the candidate; any other error in ``check`` means wrong values."""
    from nki_ops.sim import SimulatorError, SimulatorWarning, profile

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SimulatorWarning)
        try:
            kernel, args = build(**params)
            estimate = profile(kernel, target=target, timing_only=True)(*args).estimate.microseconds
        except SimulatorError as error:
            return {"status": f"refused: {_reason(error)}"}
        except Exception as error:  # noqa: BLE001 - the candidate fails, the sweep goes on
            return {"status": f"failed: {type(error).__name__}: {_one_line(error)}"}
        if check is not None:
            try:
                check(**params)
            except SimulatorError as error:
                return {"status": f"refused: {_reason(error)}"}
            except Exception as error:  # noqa: BLE001
                # its estimate is kept for the report; the candidate is never best
                return {"status": f"wrong values: {_one_line(error)}", "estimate_us": float(estimate)}
    notes = list(dict.fromkeys(_one_line(w.message) for w in caught if issubclass(w.category, SimulatorWarning)))
    return {"status": "ok", "estimate_us": float(estimate), "warnings": notes}


def _child(connection, build, check, params, target) -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        # a forked child cannot use the parent's OpenMP thread pool (its threads were not forked): one
        # thread, as torch's DataLoader workers do
        torch.set_num_threads(1)
    try:
        connection.send(cost_candidate(build, check, params, target))
    finally:
        connection.close()


@dataclass
class _Running:
    trial: optuna.trial.Trial
    params: dict
    process: multiprocessing.process.BaseProcess
    connection: multiprocessing.connection.Connection
    deadline: float
    started: float
    heartbeat: contextlib.ExitStack


def _context():
    # fork: build and check may be closures or come from a file loaded by path, and the child inherits
    # the imported simulator instead of importing it again
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return multiprocessing.get_context(method)


def _start(study, trial, params, build, check, target, timeout) -> _Running:
    receive, send = multiprocessing.Pipe(duplex=False)
    process = _context().Process(target=_child, args=(send, build, check, params, target), daemon=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: the child only computes
        process.start()
    send.close()
    heartbeat = contextlib.ExitStack()
    heartbeat.enter_context(get_heartbeat_thread(trial._trial_id, study._storage))
    now = time.monotonic()
    return _Running(trial, params, process, receive, now + timeout, now, heartbeat)


def _stop(running: _Running) -> None:
    """Kill the candidate's process if it still runs and release its pipe and heartbeat (again: no-op)."""
    if running.process.is_alive():
        running.process.kill()
    running.process.join()
    running.connection.close()
    running.heartbeat.close()


def _finish(study, running: _Running, outcome: dict, target: str) -> None:
    trial = running.trial
    trial.set_user_attr("params", running.params)
    trial.set_user_attr("target", target)
    trial.set_user_attr("status", outcome["status"])
    trial.set_user_attr("warnings", outcome.get("warnings", []))
    trial.set_user_attr("estimate_us", outcome.get("estimate_us"))
    trial.set_user_attr("seconds", round(time.monotonic() - running.started, 3))
    if outcome["status"] == "ok":
        study.tell(trial, outcome["estimate_us"])
    else:
        trial.set_user_attr("failure", outcome["status"])
        study.tell(trial, state=TrialState.FAIL)


def _params(config: dict) -> dict:
    return {axis.split(".", 1)[1]: value for axis, value in config.items()}


def kernel_space(params: dict) -> Space:
    """The search space of ``tune_kernel``: each parameter's values, the first being the default."""
    if not isinstance(params, dict) or not params:
        raise SpaceError(f"space must map each kernel parameter to its list of values, got {params!r}")
    return parse_space({"params": params}, "space")


def run_kernel_sweep(study_name: str, space: Space, build, check=None, *, target: str = "trn2", storage=None,
                     trials: int | None = None, jobs: int = 1, timeout: float = DEFAULT_TIMEOUT,
                     progress: bool = True) -> optuna.Study:
    """Run (or resume, or join) the kernel sweep ``study_name``; ``storage`` is a URL, a journal path, None
    for the default journal, or an Optuna storage object. Returns the study."""
    check_study_name(study_name)
    if target not in TARGETS:
        raise SweepError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    if trials is not None and trials < 1:
        raise SweepError(f"trials must be at least 1, got {trials}")
    if jobs < 1:
        raise SweepError(f"jobs must be at least 1, got {jobs}")
    if not timeout > 0:
        raise SweepError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if trials is None and len(space.points) > GRID_LIMIT:
        trials = GRID_LIMIT
    storage_object = storage if isinstance(storage, optuna.storages.BaseStorage) else open_storage(study_name, storage)
    study = open_study(study_name, space, storage_object, METRIC, "minimize", trials,
                       extra={"kind": "kernel", "target": target})
    grid = study.user_attrs["grid"]
    budget = trials if trials is not None else study.user_attrs.get("trials")
    goal = len(space.points) if grid or budget is None else min(budget, len(space.points))
    recover_interrupted(study, space)
    distributions = {axis: CategoricalDistribution(values) for axis, values in space.axes.items()}
    bar = _progress_bar(study, goal, progress)
    running: list[_Running] = []
    repeats, asking = 0, True
    try:
        while True:
            done = sum(counted(t) for t in study.get_trials(deepcopy=False))
            while asking and len(running) < jobs and done + len(running) < goal:
                _fail_stale_trials(study)
                if grid and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                    asking = False  # the remaining points run on other workers
                    break
                trial, config = next_trial(study, space, distributions, grid)
                if config is None:
                    repeats += 1
                    asking = not grid and repeats < MAX_CONSECUTIVE_REPEATS
                    continue
                repeats = 0
                running.append(_start(study, trial, _params(config), build, check, target, timeout))
            if not running:
                break
            wait = max(0.0, min(r.deadline for r in running) - time.monotonic())
            ready = multiprocessing.connection.wait([r.connection for r in running], timeout=wait)
            now = time.monotonic()
            for item in list(running):
                if item.connection in ready:
                    try:
                        outcome = item.connection.recv()
                    except EOFError:
                        item.process.join()
                        outcome = {"status": f"failed: the candidate's process died (exit code "
                                             f"{item.process.exitcode})"}
                elif now >= item.deadline:
                    outcome = {"status": "timeout"}
                else:
                    continue
                _stop(item)
                _finish(study, item, outcome, target)
                running.remove(item)  # after telling, so that an interruption in between queues it again
            if bar is not None:
                bar.n = sum(counted(t) for t in study.get_trials(deepcopy=False))
                if study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
                    bar.set_postfix({METRIC: f"{study.best_value:.4g}"}, refresh=False)
                bar.refresh()
    except BaseException:  # Ctrl-C or SIGTERM: the running candidates did not finish; they run on resume
        for item in running:
            _stop(item)
            try:
                study.tell(item.trial, state=TrialState.FAIL)
            except (RuntimeError, ValueError):
                continue  # it was told its result already
            study.enqueue_trial(item.trial.params, user_attrs={"point": item.trial.user_attrs["point"]})
        raise
    finally:
        if bar is not None:
            bar.close()
    return study


def kernel_rows(study: optuna.Study) -> list[Candidate]:
    """The study's finished candidates: ok rows fastest first, then the others in trial order."""
    trials = [t for t in study.get_trials(deepcopy=False) if counted(t)]
    baseline = study.user_attrs.get("baseline")
    default = next((t.value for t in trials if t.user_attrs.get("point") == baseline
                    and t.state == TrialState.COMPLETE), None)
    rows = []
    for t in trials:
        estimate = t.user_attrs.get("estimate_us")
        speedup = default / estimate if default and estimate and t.state == TrialState.COMPLETE else None
        rows.append(Candidate(t.user_attrs["params"], estimate, t.user_attrs["status"], speedup,
                              t.user_attrs.get("warnings", []), t.number))
    ok = sorted((r for r in rows if r.status == "ok"), key=lambda r: r.estimate_us)
    return ok + [r for r in rows if r.status != "ok"]


def tune_kernel(build, space: dict, target: str = "trn2", check=None, trials: int | None = None,
                study: str | None = None, storage: str | None = None, *, jobs: int = 1,
                timeout: float = DEFAULT_TIMEOUT, progress: bool = False) -> KernelTuneResult:
    """Find the fastest parameters of a kernel on the cost model of ``target``, checking every candidate.

    Args:
        build: ``build(**params) -> (kernel, args)``: a simulated kernel (either API generation) and its
            arguments at the shape to tune for.
        space: each parameter's list of values; the first values together are the default configuration.
        target: the cost model's target, ``"trn1"``, ``"trn2"`` or ``"trn3"``.
        check: ``check(**params)`` runs the candidate at a size of its choosing in the simulator and raises
            when its values are wrong; a candidate that fails it is never best.
        trials: None tries every combination when there are at most 64, else 64; a number is the Optuna
            trial budget (TPE after the default when it is below the number of combinations).
        study, storage: a study name (and a storage URL or journal path, default
            ``.nki-ops/tune/STUDY.journal``) make the sweep resumable and shareable, as for flag sweeps;
            without a study name the sweep lives in memory.
        jobs: candidates costed at once, each in its own process.
        timeout: seconds before a candidate is stopped and recorded as ``"timeout"``.

    Returns:
        A :class:`KernelTuneResult`: ``best`` (the best parameter dict) and ``rows`` (one
        :class:`Candidate` per candidate: ``params``, ``estimate_us``, ``status``, ``speedup``).
    """
    quiet_optuna()
    parsed = kernel_space(space)
    if study is None:
        if storage is not None:
            raise SweepError("a storage needs a study name: tune_kernel(..., study='name', storage=...)")
        name, where = f"kernel-{target}", optuna.storages.InMemoryStorage()
    else:
        name, where = study, storage
    result = run_kernel_sweep(name, parsed, build, check, target=target, storage=where, trials=trials, jobs=jobs,
                              timeout=timeout, progress=progress)
    return KernelTuneResult(target, kernel_rows(result), _params(parsed.baseline), result)


def load_kernel_file(path: str | Path):
    """``(build, check)`` from a Python file (``check`` may be absent)."""
    path = Path(path)
    if not path.is_file():
        raise SpaceError(f"kernel file {str(path)!r} does not exist")
    spec = importlib.util.spec_from_file_location(f"nki_ops_tune_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))  # the file may import its neighbours
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    build = getattr(module, "build", None)
    if not callable(build):
        raise SpaceError(f"{path} must define build(**params) returning (kernel, args)")
    check = getattr(module, "check", None)
    if check is not None and not callable(check):
        raise SpaceError(f"{path}: check must be a function check(**params)")
    return build, check


@dataclass
class KernelSpaceFile:
    kernel: Path
    target: str | None
    space: Space


def load_kernel_space(path: str | Path) -> KernelSpaceFile:
    """A kernel space file: ``kernel = "file.py"`` (relative to the TOML file), optional ``target``, and
    ``[params]`` with each parameter's list of values, the default first."""
    path = Path(path)
    document = read_space_file(path)
    unknown = set(document) - {"kernel", "target", "params"}
    if unknown:
        raise SpaceError(f"{path}: unknown key(s) {sorted(unknown)}; a kernel space has kernel = \"file.py\", "
                         f"an optional target and a [params] table")
    if not isinstance(document.get("kernel"), str):
        raise SpaceError(f"{path}: name the Python file with build(**params) as kernel = \"file.py\"")
    target = document.get("target")
    if target is not None and target not in TARGETS:
        raise SpaceError(f"{path}: unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    if not isinstance(document.get("params"), dict) or not document["params"]:
        raise SpaceError(f"{path}: a [params] table with each kernel parameter's list of values is needed")
    space = parse_space({"params": document["params"]}, str(path))
    return KernelSpaceFile((path.parent / document["kernel"]).resolve(), target, space)
