"""Attention's tuned tiling parameter (the forward's key block): correct values for every searched and
odd block, the recorded choice is the study's, and the bench shows default against tuned estimates."""

from __future__ import annotations

import importlib

import pytest
import torch

from nki_ops.ops._tuned import TARGETS
from nki_ops.ops.attention import tuning
from nki_ops.ops.attention.nki_kernel import flash_attention_kernel
from nki_ops.ops.attention.reference import attention_reference
from nki_ops.ops.retune import retune

pytestmark = pytest.mark.simulation


@pytest.mark.parametrize("kv_block", tuning.SPACE["kv_block"])
def test_every_searched_block_gives_the_reference_values(kv_block):
    tuning.check_forward(kv_block)  # S=300 causal and windowed: partial and masked blocks


@pytest.mark.parametrize("kv_block", [1, 100])
def test_odd_blocks_with_grouped_heads_and_lengths_give_the_reference_values(kv_block):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 37, 16, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(2, 2, 130, 16, generator=g).to(torch.bfloat16) for _ in range(2))
    lengths = torch.tensor([130, 51])
    out, _ = flash_attention_kernel(tuning._transposed(q), tuning._transposed(k), v,
                                    lengths.float().reshape(-1, 1), 0.25, False, 0, 0.0, kv_block)
    expected = attention_reference(q.double(), k.double(), v.double(), scale=0.25, seq_lens=lengths)
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_a_block_wider_than_a_psum_bank_is_refused():
    q = torch.randn(1, 1, 8, 16)
    with pytest.raises(AssertionError, match="kv_block must be 1 to 512"):
        flash_attention_kernel(q.transpose(2, 3).contiguous(), q.transpose(2, 3).contiguous(), q, None, 1.0,
                               False, 0, 0.0, 1024)


def test_recorded_choice_is_the_studys_best():
    result = retune("attention", targets=("trn2",), jobs=2)["forward"]["trn2"]
    assert [row.status for row in result.rows] == ["ok"] * len(tuning.SPACE["kv_block"])
    assert result.best == tuning.TUNED["forward"].per_target["trn2"]
    assert set(tuning.TUNED["forward"].per_target) == set(TARGETS)


def test_bench_shows_default_and_tuned_estimates():
    rows = importlib.import_module("benchmarks.attention").tuned()
    assert [(r.kernel, r.target) for r in rows] == [("forward", t) for t in TARGETS]
    assert all(r.tuned == tuning.TUNED["forward"].per_target[r.target] and r.tuned_us <= r.default_us
               for r in rows)
