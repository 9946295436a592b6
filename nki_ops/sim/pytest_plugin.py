"""pytest options for running a test suite's NKI kernels on the simulator.

``pytest --nki-sim`` makes ``neuronxcc.nki`` imports resolve to the simulator for the whole
session (when the Neuron SDK is absent, or always with ``--nki-sim-force``);
``--nki-sim-seed N`` shuffles ``affine_range`` and grid order; ``--nki-sim-target`` picks the
target. Loaded automatically through the ``pytest11`` entry point, or with
``-p nki_ops.sim.pytest_plugin``.
"""

from __future__ import annotations

import pytest

from .core.config import TARGETS, configure
from .install import install

_ACTIVE: list = []


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nki-sim", "NKI simulator (nki-ops)")
    group.addoption("--nki-sim", action="store_true", help="run neuronxcc.nki kernels on the nki-ops simulator")
    group.addoption("--nki-sim-force", action="store_true", help="simulate even when the Neuron SDK is installed")
    group.addoption("--nki-sim-seed", type=int, default=None,
                    help="shuffle affine_range iterations and SPMD grid order with this seed")
    group.addoption("--nki-sim-target", choices=sorted(TARGETS), default="trn1", help="simulated target")


def pytest_configure(config: pytest.Config) -> None:
    if not (config.getoption("--nki-sim") or config.getoption("--nki-sim-force")):
        return
    # Installed before collection so test modules' `import neuronxcc.nki` finds the simulator.
    installed = install(force=config.getoption("--nki-sim-force"))
    settings = configure(seed=config.getoption("--nki-sim-seed"), target=config.getoption("--nki-sim-target"))
    settings.__enter__()
    _ACTIVE.extend([installed, settings])


def pytest_unconfigure(config: pytest.Config) -> None:
    while _ACTIVE:
        context = _ACTIVE.pop()
        context.__exit__(None, None, None)


def pytest_report_header(config: pytest.Config) -> str | None:
    if _ACTIVE:
        return f"nki-ops simulator: neuronxcc.nki simulated={_ACTIVE[0].active}"
    return None
