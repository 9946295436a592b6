"""The script side: trial_params and report, inside and outside a sweep."""

import json

import pytest

from nki_ops.tune import report, trial_params
from nki_ops.tune.protocol import PARAMS_ENV, RESULT_ENV


def test_trial_params_overlay_the_defaults(monkeypatch):
    assert trial_params({"batch_size": 16}) == {"batch_size": 16}  # outside a sweep
    monkeypatch.setenv(PARAMS_ENV, json.dumps({"batch_size": 8}))
    assert trial_params({"batch_size": 16, "num_workers": 0}) == {"batch_size": 8, "num_workers": 0}
    assert trial_params() == {"batch_size": 8}


def test_a_param_the_script_does_not_read_is_refused(monkeypatch):
    monkeypatch.setenv(PARAMS_ENV, json.dumps({"batch_sise": 8}))
    with pytest.raises(KeyError, match=r"params \['batch_sise'\] this script does not read; it reads \['batch_size'\]"):
        trial_params({"batch_size": 16})


def test_report_writes_the_result_file_from_rank_zero_only(monkeypatch, tmp_path):
    result = tmp_path / "result.json"
    monkeypatch.setenv(RESULT_ENV, str(result))
    monkeypatch.setenv("RANK", "1")
    report(samples_per_sec=10.0)
    assert not result.exists()
    monkeypatch.setenv("RANK", "0")
    report(samples_per_sec=1093.25, step_ms=14)
    assert json.loads(result.read_text()) == {"samples_per_sec": 1093.25, "step_ms": 14.0}


def test_report_refuses_what_is_not_a_finite_number(capsys):
    with pytest.raises(ValueError, match="metric 'samples_per_sec' must be a finite number, got nan"):
        report(samples_per_sec=float("nan"))
    with pytest.raises(TypeError, match="needs at least one metric"):
        report()
    report(samples_per_sec=5)  # outside a sweep it prints
    assert "metrics: samples_per_sec=5" in capsys.readouterr().err


def test_report_stays_the_function_after_the_cli_has_shown_a_report(capsys):
    # The report table's module once was nki_ops/tune/report.py: importing it replaced the package's
    # report() with the module, so a script that ran `nki-ops tune report` in-process could not report.
    from nki_ops import tune
    from nki_ops.cli import main

    assert main(["tune", "report", "--study", "none"]) == 2
    assert tune.report is report and callable(tune.report)
