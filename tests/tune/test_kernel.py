"""Kernel tuning on the cost model: the API, refused/wrong/timed-out candidates, resume, the CLI, report/best."""

import json
import sys
from pathlib import Path

import optuna
import pytest
import torch

from nki_ops.cli import main
from nki_ops.sim import profile
from nki_ops.tune import kernel as kernel_module
from nki_ops.tune import tune_kernel
from nki_ops.tune.results import format_best, format_report, load_results
from nki_ops.tune.study import SweepError

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
import tiny_kernel  # noqa: E402

# chunk=1024 is the fastest correct candidate; rows=256 is refused; drop_tail=True does less work (a faster
# estimate than any correct candidate) and leaves the last chunk unwritten
SPACE = {"chunk": [512, 128, 1024], "rows": [128, 256], "drop_tail": [False, True]}


def _estimate(**params):
    kernel, args = tiny_kernel.build(**params)
    return profile(kernel, target="trn2", timing_only=True)(*args).estimate.microseconds


def test_the_fastest_correct_candidate_is_best_and_refused_or_wrong_ones_never_are():
    result = tune_kernel(tiny_kernel.build, SPACE, target="trn2", check=tiny_kernel.check, jobs=2)
    assert len(result.rows) == 12
    by_params = {json.dumps(r.params, sort_keys=True): r for r in result.rows}
    assert result.best == {"chunk": 1024, "rows": 128, "drop_tail": False}
    assert result.rows[0].status == "ok" and result.rows[0].speedup > 1
    default = result.default
    assert default.params == {"chunk": 512, "rows": 128, "drop_tail": False} and default.speedup == 1.0
    # the estimate is exactly what profile() reports for the candidate
    assert result.rows[0].estimate_us == _estimate(chunk=1024, rows=128, drop_tail=False)
    assert default.estimate_us / result.rows[0].estimate_us == pytest.approx(result.rows[0].speedup)

    refused = [r for r in result.rows if r.params["rows"] == 256]
    assert len(refused) == 6 and all(r.estimate_us is None and r.speedup is None for r in refused)
    assert all(r.status.startswith("refused: tiny_kernel.py:") and "partition dimension 256 exceeds maximum 128"
               in r.status for r in refused)
    wrong = by_params[json.dumps({"chunk": 512, "drop_tail": True, "rows": 128}, sort_keys=True)]
    assert wrong.status.startswith("wrong values: ") and wrong.speedup is None
    # faster than the best on the cost model, which is why it has to be checked
    assert wrong.estimate_us < result.rows[0].estimate_us
    assert [r.status for r in result.rows[:3]] == ["ok"] * 3 and result.rows[3].status != "ok"


def test_a_candidate_past_its_timeout_is_stopped():
    # 8 s: room for the quick candidate on a loaded machine; the slow one sleeps far past it.
    result = tune_kernel(tiny_kernel.build, {"sleep": [0.0, 60.0]}, timeout=8)
    statuses = {r.params["sleep"]: r.status for r in result.rows}
    assert statuses == {0.0: "ok", 60.0: "timeout"}
    assert result.best == {"sleep": 0.0}


def test_no_best_when_every_candidate_is_refused():
    result = tune_kernel(tiny_kernel.build, {"rows": [256, 512]})
    assert result.best is None and all(r.status.startswith("refused: ") for r in result.rows)


def test_an_interrupted_sweep_resumes_from_its_storage(tmp_path, monkeypatch):
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    finish, finished = kernel_module._finish, []

    def interrupt_after_two(study, running, outcome, target):
        if len(finished) == 2:
            raise KeyboardInterrupt  # as Ctrl-C would, with a candidate still running
        finished.append(running.params)
        finish(study, running, outcome, target)

    monkeypatch.setattr(kernel_module, "_finish", interrupt_after_two)
    space = {"chunk": [512, 128, 1024, 256]}
    with pytest.raises(KeyboardInterrupt):
        tune_kernel(tiny_kernel.build, space, study="resume", storage=storage)
    monkeypatch.setattr(kernel_module, "_finish", finish)
    result = tune_kernel(tiny_kernel.build, space, study="resume", storage=storage)
    assert sorted(r.params["chunk"] for r in result.rows) == [128, 256, 512, 1024]  # each exactly once
    trials = optuna.load_study(study_name="resume", storage=storage).get_trials()
    costed = [t.user_attrs["params"]["chunk"] for t in trials if "status" in t.user_attrs]
    assert sorted(costed) == [128, 256, 512, 1024]  # the two finished before the interruption did not run again
    assert result.best == {"chunk": 1024}
    with pytest.raises(SweepError, match="different target"):
        tune_kernel(tiny_kernel.build, space, target="trn1", study="resume", storage=storage)


def test_tpe_budget_below_the_grid_runs_the_default_first():
    result = tune_kernel(tiny_kernel.build, {"chunk": [512, 128, 256, 1024, 64]}, trials=3)
    assert len(result.rows) == 3 and result.default is not None
    assert min(r.trial for r in result.rows if r.params == {"chunk": 512}) == 0


def test_cli_tunes_the_kernel_a_space_file_names_then_report_and_best(tmp_path, capsys):
    space = tmp_path / "tiny.toml"
    space.write_text(f'kernel = "{SCRIPTS / "tiny_kernel.py"}"\ntarget = "trn1"\n'
                     '[params]\nchunk = [512, 1024]\ndrop_tail = [false, true]\n')
    assert main(["tune", "kernel", "--space", str(space), "--no-progress", "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    assert "4 candidate(s) of tiny_kernel.py on the trn1 cost model" in out
    assert "study tiny-trn1: 2 ok, 2 refused, wrong or failed" in out
    assert "1.00x (default)" in out and "wrong values: " in out

    estimates = {chunk: _estimate_trn1(chunk=chunk) for chunk in (512, 1024)}
    fastest = min(estimates, key=estimates.get)
    assert main(["tune", "report", "--study", "tiny-trn1", "--csv", "k.csv", "--plot", "k.png"]) == 0
    assert capsys.readouterr().out.splitlines()[3].split()[1:3] == [str(fastest), "False"]  # best row first
    assert (tmp_path / "k.png").read_bytes()[:4] == b"\x89PNG"
    assert len((tmp_path / "k.csv").read_text().splitlines()) == 5
    assert main(["tune", "best", "--study", "tiny-trn1"]) == 0
    best = json.loads(capsys.readouterr().out)
    assert best["params"] == {"chunk": fastest, "drop_tail": False} and best["target"] == "trn1"
    assert best["estimate_us"] == estimates[fastest]

    results = load_results("tiny-trn1")
    assert results.kernel and format_best(results) == json.dumps(best, indent=2)
    assert "estimated trn1 device time" in format_report(results)


def _estimate_trn1(**params):
    kernel, args = tiny_kernel.build(**params)
    return profile(kernel, target="trn1", timing_only=True)(*args).estimate.microseconds


def test_cli_refuses_a_space_file_without_a_kernel_or_build(tmp_path, capsys):
    space = tmp_path / "bad.toml"
    space.write_text('[params]\nchunk = [512]\n')
    assert main(["tune", "kernel", "--space", str(space)]) == 2
    assert 'kernel = "file.py"' in capsys.readouterr().err
    (tmp_path / "nobuild.py").write_text("x = 1\n")
    space.write_text('kernel = "nobuild.py"\n[params]\nchunk = [512]\n')
    assert main(["tune", "kernel", "--space", str(space)]) == 2
    assert "must define build(**params)" in capsys.readouterr().err


def test_the_documented_example_gives_its_table(tmp_path, capsys):
    """examples/tune/tiled_matmul.toml, as docs/tune.md runs it, from another working directory."""
    example = Path(__file__).parents[2] / "examples" / "tune" / "tiled_matmul.toml"
    assert main(["tune", "kernel", "--space", str(example), "--jobs", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "study tiled_matmul-trn2: 12 ok, 4 refused" in out
    best = [line.split() for line in out.splitlines() if line.startswith("#")][0]
    assert best[1:4] == ["128", "128", "512"]  # full 128 x 512 output tiles
    # The table docs/tune.md and the README show is the one the current cost model gives.
    for doc in ("docs/tune.md", "README.md"):
        text = (Path(__file__).parents[2] / doc).read_text()
        shown = [line.split() for line in text.split("study tiled_matmul-trn2:", 1)[1].splitlines()
                 if line.startswith("#")][0]
        assert shown == best, doc
    assert out.count("moving free size 1024 exceeds the Tensor engine limit of 512") == 4


def _torch_check(chunk):
    x = torch.randn(300, 300)
    assert torch.allclose(x @ torch.eye(300), x)  # an OpenMP-parallel op in the forked child


def test_a_check_using_torch_after_the_parent_used_its_threads():
    x = torch.randn(1000, 1000)
    (x @ x).sum()  # the parent's OpenMP pool is now running
    result = tune_kernel(tiny_kernel.build, {"chunk": [512, 1024]}, check=_torch_check, timeout=60)
    assert [r.status for r in result.rows] == ["ok", "ok"]
