"""A short sweep of the example ViT training loop on CPU, for ``nki-ops demo``."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from .space import parse_space

VIT_SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "vit_train.py"
DEMO_SPACE = {
    # passed to every trial, marked "no effect on this host" off a Neuron host
    "neuron_cc_flags": {"model-type": "transformer", "target": "inf2"},
    "params": {"batch_size": [4, 16, 48], "steps": 8},
}


def run_demo_sweep(progress: bool = True) -> str:
    """Sweep the ViT example's batch size on CPU (three fresh trials, ~15 s on 2 cores); returns the report."""
    from .results import format_report, load_results
    from .study import SweepError, quiet_optuna, run_sweep

    if not VIT_SCRIPT.exists():
        raise SweepError(f"the example workload {VIT_SCRIPT} is missing (it ships with the source tree, not the wheel)")
    quiet_optuna()
    with tempfile.TemporaryDirectory(prefix="nki-ops-tune-demo-") as scratch:
        storage = str(Path(scratch) / "demo.journal")
        run_sweep("vit-demo", parse_space(DEMO_SPACE), [sys.executable, str(VIT_SCRIPT)], storage=storage,
                  timeout=120, progress=progress)
        return format_report(load_results("vit-demo", storage))
