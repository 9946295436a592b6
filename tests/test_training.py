"""The README's training example: a model calling rms_norm, attention and giou_loss, compiled with
fullgraph=True, trains on every backend and follows the same loss curve as the torch reference."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
BACKEND_LINE = 'BACKEND = "nki"'


def training_example() -> str:
    section = README.read_text().split("## Training with the ops", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert BACKEND_LINE in code
    return code


def train(backend: str) -> list[float]:
    torch._dynamo.reset()
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(training_example().replace(BACKEND_LINE, f'BACKEND = "{backend}"'), str(README), "exec"),
             namespace)
    return namespace["losses"]


@pytest.fixture(scope="module")
def reference_losses() -> list[float]:
    return train("torch")


def test_the_example_learns(reference_losses):
    assert reference_losses[-1] < 0.5 * reference_losses[0]


@pytest.mark.simulation
@pytest.mark.parametrize("backend", ["nki", "auto"])
def test_compiled_training_follows_the_reference(backend, reference_losses):
    # fp32 kernels against the fp32 reference. One step's gradients of the NKI attention are as close
    # to float64 as SDPA's (~4e-7 relative on the example's shape), but Adam (lr 3e-2) amplifies rounding
    # differences about 3x a step once the loss flattens: the curves agree to 4e-5 for 20 steps and drift
    # to ~1e-2 by step 24. Hence 20 steps.
    torch.testing.assert_close(train(backend), reference_losses, rtol=1e-3, atol=1e-4)
