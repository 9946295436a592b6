"""RMSNorm's tuned tiling parameter: correct values for every searched chunk, the recorded choice is the
study's, the op takes the target's choice, and the bench shows default against tuned estimates."""

from __future__ import annotations

import importlib

import pytest
import torch

from nki_ops.ops._tuned import TARGETS, Tuned
from nki_ops.ops.retune import retune
from nki_ops.ops.rms_norm import tuning
from nki_ops.ops.rms_norm.nki_kernel import rms_norm_backward_kernel, rms_norm_kernel
from nki_ops.ops.rms_norm.reference import rms_norm_reference
from nki_ops.sim import configure

pytestmark = pytest.mark.simulation

CHUNKS = tuning.SPACE["chunk"]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_every_searched_chunk_gives_the_reference_values(chunk):
    tuning.check_forward(chunk)  # 130 x 1000 fp32 against float64: tail rows and a tail chunk
    tuning.check_backward(chunk)


@pytest.mark.parametrize("chunk", [1, 100, 129])
def test_forward_takes_any_chunk_up_to_one_psum_bank(chunk):
    x, weight = torch.randn(129, 300).to(torch.bfloat16), torch.randn(1, 300).to(torch.bfloat16)
    got = rms_norm_kernel(x, weight, 1e-6, chunk)
    expected = rms_norm_reference(x.double(), weight[0].double(), 1e-6).to(torch.bfloat16)
    torch.testing.assert_close(got.float(), expected.float(), rtol=2.0 ** -7, atol=0.0)


def test_chunks_the_kernels_cannot_take_are_refused():
    x, weight = torch.randn(4, 600), torch.randn(1, 600)
    with pytest.raises(AssertionError, match="chunk must be 1 to 512"):
        rms_norm_kernel(x, weight, 1e-6, 1024)
    with pytest.raises(AssertionError, match="chunk must be 128, 256, 384 or 512"):
        rms_norm_backward_kernel(x, x, weight, 1e-6, 200)


def test_recorded_choices_are_the_studies_best():
    for kernel, tuned in tuning.TUNED.items():
        assert set(tuned.per_target) == set(TARGETS)
        assert all(params["chunk"] in tuned.space["chunk"] for params in tuned.per_target.values())
    results = retune("rms_norm", targets=("trn2",), jobs=2)
    for kernel, by_target in results.items():
        result = by_target["trn2"]
        assert [row.status for row in result.rows] == ["ok"] * len(CHUNKS)
        assert result.best == tuning.TUNED[kernel].per_target["trn2"]


def test_the_op_takes_the_configured_targets_parameters():
    tuned = Tuned("k", {"chunk": 512}, {"chunk": [512, 256]},
                  {"trn1": {"chunk": 256}, "trn2": {"chunk": 512}, "trn3": {"chunk": 256}}, "test")
    for target in TARGETS:
        with configure(target=target):
            assert tuned.params() == tuned.per_target[target]
    with configure(target="inf2"):
        assert tuned.params() == {"chunk": 256}  # inf2 is trn1's NeuronCore-v2


def test_bench_shows_default_and_tuned_estimates():
    harness = importlib.import_module("benchmarks.harness")
    rows = importlib.import_module("benchmarks.rms_norm").tuned()
    assert [(r.kernel, r.target) for r in rows] == [(k, t) for k in ("forward", "backward") for t in TARGETS]
    for r in rows:
        assert r.tuned == tuning.TUNED[r.kernel].per_target[r.target] and 0 < r.tuned_us <= r.default_us
    table = harness.format_tuned(rows)
    assert "not a measurement" in table and "chunk=512" in table and "1.000x" in table
