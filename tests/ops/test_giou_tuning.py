"""GIoU's tuned tiling parameter: correct values for every searched max_cols, the recorded choice is the
study's, the op lays boxes out with the configured target's choice, and the bench shows both estimates."""

from __future__ import annotations

import importlib

import pytest
import torch

from nki_ops.ops.giou import nki_op, tuning
from nki_ops.ops.retune import retune
from nki_ops.sim import configure
from nki_ops.workloads import giou_workload

pytestmark = pytest.mark.simulation


@pytest.mark.parametrize("max_cols", tuning.SPACE["max_cols"])
def test_every_searched_max_cols_gives_the_reference_values(max_cols):
    tuning.check_forward(max_cols)  # 129 * max_cols + 5 boxes: full-width rows, a tail tile, a padded row
    tuning.check_backward(max_cols)


def test_recorded_choices_are_the_studies_best():
    results = retune("giou", targets=("trn1",), jobs=2)
    for kernel, by_target in results.items():
        assert all(row.status == "ok" for row in by_target["trn1"].rows)
        assert by_target["trn1"].best == tuning.TUNED[kernel].per_target["trn1"]


def test_the_op_lays_boxes_out_with_the_targets_choice(monkeypatch):
    widths = []

    def recording(layout1, layout2):
        widths.append(layout1.shape[1] // 4)
        return kernel(layout1, layout2)

    kernel = nki_op.giou_kernel
    monkeypatch.setattr(nki_op, "giou_kernel", recording)
    boxes1, boxes2 = giou_workload(1, 128 * 300, seed=5)
    expected = {}
    for target in ("trn1", "trn2"):
        with configure(target=target):
            expected[target] = torch.ops.nki_ops.giou_nki(boxes1[0], boxes2[0])
    assert widths == [256, 300]  # trn1's tuned max_cols is 256; trn2 keeps 512, so all 300 columns fit
    assert torch.equal(expected["trn1"], expected["trn2"])


def test_bench_shows_default_and_tuned_estimates():
    rows = importlib.import_module("benchmarks.giou").tuned()
    trn1_forward = next(r for r in rows if (r.kernel, r.target) == ("forward", "trn1"))
    assert trn1_forward.default == {"max_cols": 512} and trn1_forward.tuned == {"max_cols": 256}
    assert trn1_forward.tuned_us < trn1_forward.default_us
    assert all(r.tuned_us <= r.default_us for r in rows)
