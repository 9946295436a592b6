"""The example ViT training loop, swept by the demo on CPU."""

import pytest

from nki_ops.tune.demo import run_demo_sweep
from nki_ops.tune.study import no_effect_reasons

pytestmark = pytest.mark.slow


def test_demo_sweeps_the_vit_example_and_says_whether_neuron_flags_take_effect():
    report = run_demo_sweep(progress=False)
    lines = report.splitlines()
    assert lines[0] == "study vit-demo: 3 completed, 0 failed (samples_per_sec, maximize)"
    batch_sizes = {line.split()[1] for line in lines[3:6]}
    assert batch_sizes == {"4", "16", "48"}
    assert "1.00x (default)" in report
    footnote = "no effect on this host (passed to every trial, but nothing here reads it): model-type, target"
    neuron_host = not no_effect_reasons(["neuron_cc_flags.target"])
    assert (footnote in report) != neuron_host
