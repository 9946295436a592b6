"""The benchmark harness and the demo."""

from __future__ import annotations

import csv
import dataclasses
import importlib
import time

import pytest
import torch

from benchmarks import harness
from benchmarks.plot import plot_csv
from nki_ops import cli


def test_time_fn_reports_ordered_percentiles_of_real_time():
    timing = harness.time_fn(time.sleep, 0.002, warmup=1, repeats=5)
    assert timing.repeats == 5
    assert 2.0 <= timing.p20_ms <= timing.median_ms <= timing.p80_ms < 200


def test_time_fn_stops_a_slow_function_early():
    timing = harness.time_fn(time.sleep, 0.02, warmup=0, repeats=100, max_seconds=0.05)
    assert 3 <= timing.repeats < 10


def test_csv_appends_under_one_header_and_plots(tmp_path):
    ref = harness.Timing(2.0, 1.9, 2.2, 5)
    fast = harness.Timing(0.5, 0.4, 0.6, 5)
    rows = [harness.make_row("giou", "torch", (4, 4), torch.float32, ref, ref),
            harness.make_row("giou", "cpp", (4, 4), torch.float32, fast, ref)]
    path = tmp_path / "giou.csv"
    harness.append_csv(rows, path)
    harness.append_csv(rows[1:], path)
    with path.open() as f:
        table = list(csv.DictReader(f))
    assert [r["backend"] for r in table] == ["torch", "cpp", "cpp"]
    assert float(table[1]["speedup_vs_torch"]) == 4.0
    assert table[0]["threads"] == str(torch.get_num_threads()) and table[0]["package_version"]
    png = plot_csv(path)
    assert png.read_bytes().startswith(b"\x89PNG")


def test_the_plot_shows_only_the_latest_run(tmp_path, monkeypatch):
    ref = harness.Timing(2.0, 1.9, 2.2, 5)
    earlier = [harness.make_row("giou", name, (4, 4), torch.float32, ref, ref, note=f"load {i}")
               for i, name in enumerate(("torch", "cpp", "nki"))]
    later = [dataclasses.replace(r, timestamp="9999-01-01T00:00:00+00:00", note="load 0.3") for r in earlier[:2]]
    later[1] = dataclasses.replace(later[1], timestamp="9999-01-01T00:00:07+00:00")  # timed a few seconds on
    path = tmp_path / "giou.csv"
    harness.append_csv(earlier, path)
    harness.append_csv(later, path)
    with path.open() as f:
        assert {r["timestamp"] for r in list(csv.DictReader(f))[3:]} == {"9999-01-01T00:00:00+00:00"}
    import matplotlib.axes
    drawn, barh = [], matplotlib.axes.Axes.barh

    def spy(self, y, width, **kwargs):
        drawn.append(list(width))
        return barh(self, y, width, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "barh", spy)
    plot_csv(path)
    assert drawn == [[2.0, 2.0]]  # the two rows of the later run, not the five of both


def test_a_log_from_before_the_estimate_columns_is_rewritten_under_the_new_header(tmp_path):
    path = tmp_path / "giou.csv"
    old_columns = [f.name for f in dataclasses.fields(harness.Row) if not f.name.startswith("est_")]
    ref = harness.Timing(2.0, 1.9, 2.2, 5)
    old = harness.make_row("giou", "torch", (4, 4), torch.float32, ref, ref)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=old_columns)
        writer.writeheader()
        writer.writerow({k: v for k, v in dataclasses.asdict(old).items() if k in old_columns})
    nki = harness.make_row("giou", "nki (simulated on CPU)", (4, 4), torch.float32, ref, ref,
                           estimate={"trn1": 0.2114, "trn2": 0.1567})
    harness.append_csv([nki], path)
    with path.open() as f:
        reader = csv.DictReader(f)
        table = list(reader)
    assert reader.fieldnames == [f.name for f in dataclasses.fields(harness.Row)]
    assert [(r["backend"], r["est_trn1_ms"], r["est_trn2_ms"]) for r in table] == [
        ("torch", "", ""), ("nki (simulated on CPU)", "0.2114", "0.1567")]
    assert plot_csv(path).read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_demo_checks_and_times_every_available_backend(capsys):
    assert cli.main(["demo", "--repeats", "2", "--no-tune"]) == 0
    out = capsys.readouterr().out
    matrix = {line.split()[0]: line.split()[1:] for line in out.splitlines()
              if line.split()[:1] in (["giou"], ["giou_loss"], ["box_iou"], ["nms"], ["rms_norm"])}
    assert matrix == {"giou": ["reference", "agrees", "agrees"], "giou_loss": ["reference", "agrees", "agrees"],
                      "box_iou": ["reference", "agrees", "-"], "nms": ["reference", "-", "agrees"],
                      "rms_norm": ["reference", "agrees", "-"]}
    for row in ("torch (eager reference)", "torch.compile (reference)", "nki (simulated on CPU)",
                "cpp (emulated on CPU, checked)", "cpp (emulated on CPU, fast mode)"):
        assert f"\n{row} " in out
    assert "not device time" in out


@pytest.mark.parametrize("benchmark, sizes",
                         [("box_iou", dict(n=130, m=20)), ("rms_norm", dict(rows=130, features=64)),
                          ("rope", dict(q_heads=4, kv_heads=2, seq=130, dim=16)),
                          ("cross_entropy", dict(rows=130, vocab=600, fused_rows=130, hidden_size=40))])
def test_op_benchmarks_time_every_available_backend(benchmark, sizes):
    module = importlib.import_module(f"benchmarks.{benchmark}")
    rows = module.run(**sizes, repeats=2)
    assert [r.backend for r in rows][0] == "torch (eager reference)" and rows[0].speedup_vs_torch == 1.0
    assert "nki (simulated on CPU)" in [r.backend for r in rows]
    assert all(r.median_ms > 0 for r in rows)
    # The simulated NKI row carries the cost model's estimate on trn1 and trn2, labelled as such.
    for r in rows:
        simulated = r.backend == "nki (simulated on CPU)"
        assert (r.est_trn1_ms is not None and r.est_trn2_ms is not None) == simulated, r
        if simulated:
            assert 0 < r.est_trn2_ms and 0 < r.est_trn1_ms
    table = harness.format_table(rows)
    assert "est. device ms trn1/trn2" in table and "not a measurement" in table


def test_demo_fails_on_a_backend_that_disagrees(monkeypatch):
    from nki_ops import _backends, demo
    nki_giou = _backends._REGISTRY["giou"]["nki"]
    off_by_a_little = dataclasses.replace(nki_giou, fn=lambda boxes1, boxes2: nki_giou.fn(boxes1, boxes2) * 1.001)
    monkeypatch.setitem(_backends._REGISTRY["giou"], "nki", off_by_a_little)
    with pytest.raises(SystemExit, match="giou: backend 'nki' disagrees"):
        demo.check_all_ops()
