"""pytest options for running a test suite's NKI kernels on the simulator.

``pytest --nki-sim`` makes ``neuronxcc.nki`` and ``nki`` imports resolve to the simulator for the
whole session (when the Neuron SDK is absent, or always with ``--nki-sim-force``), from before the
suite's conftest.py files load;
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


def _activate(options) -> None:
    if _ACTIVE or not (options.nki_sim or options.nki_sim_force):
        return
    # Installed before collection so test modules' `import neuronxcc.nki` / `import nki` find the simulator.
    installed = install(force=options.nki_sim_force)
    settings = configure(seed=options.nki_sim_seed, target=options.nki_sim_target)
    settings.__enter__()
    _ACTIVE.extend([installed, settings])


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    # A suite's conftest.py may import nki at module level, before pytest_configure runs.
    _activate(early_config.known_args_namespace)


def pytest_configure(config: pytest.Config) -> None:
    _activate(config.option)


def pytest_unconfigure(config: pytest.Config) -> None:
    while _ACTIVE:
        context = _ACTIVE.pop()
        context.__exit__(None, None, None)


def pytest_report_header(config: pytest.Config) -> str | None:
    if _ACTIVE:
        return (f"nki-ops simulator: neuronxcc.nki simulated={_ACTIVE[0].active}, "
                f"nki simulated={_ACTIVE[0].current_active}")
    return None
