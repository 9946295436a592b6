"""examples/llm_train.py: a Llama-style decoder built from nki-ops ops (RMSNorm, RoPE, GQA causal
attention, SwiGLU, fused linear cross-entropy) learns, and follows the torch reference's loss curve on
the simulated NKI kernels."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llm_train.py"


def _example():
    spec = importlib.util.spec_from_file_location("llm_train", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example():
    return _example()


@pytest.fixture(scope="module")
def reference_losses(example) -> list[float]:
    return example.train("torch", log=lambda _line: None)


def test_the_decoder_learns(reference_losses):
    assert len(reference_losses) == 20
    assert reference_losses[-1] < 0.75 * reference_losses[0]


@pytest.mark.simulation
def test_the_nki_kernels_follow_the_reference_curve(example, reference_losses):
    # fp32 kernels against fp32 torch: one step agrees to rounding; Adam amplifies the differences a
    # little each step, well inside these bounds over 20 steps.
    losses = example.train("nki", log=lambda _line: None)
    assert losses == pytest.approx(reference_losses, rel=1e-3, abs=1e-4)
