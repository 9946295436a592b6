"""pytest plugin to run AWS's public nki-library test harness (aws-neuron/nki-library @d2ad3a5) in
``--test-mode simulation`` on the nki-ops simulator.

The public harness does not run as published, on any simulator: it imports two modules the
repository does not ship (``test/utils/perf_analysis_private.py``, ``test/utils/scripts/
remote_lock_scripts.py``; both serve profiling and remote hosts only), and in simulation mode its
``Orchestrator`` reads ``_compiled_kernel``, which only compilation sets. This plugin supplies empty
stand-ins for those three things and nothing else; kernels, references and tolerances are the
library's own. Use it from the library's work tree:

    PYTHONPATH=src:.:/path/to/nki-ops/benchmarks python -m pytest test/integration \\
        -p nki_library_shim --nki-sim --test-mode simulation -m fast
"""

from __future__ import annotations

import enum
import sys
import types


class LockStatus(enum.Enum):
    """Remote core-lock states (only named at import time in simulation)."""

    ALLOCATED, NO_CORES, DRAINING, DRAINED, UNDRAINED, RELEASED, ERROR, FLOCK_TIMEOUT = range(8)

    @property
    def exit_code(self) -> int:
        return self.value

    @classmethod
    def from_exit_code(cls, code: int) -> "LockStatus":
        return cls(code)


class LockResult:
    def __init__(self, status: LockStatus, **fields):
        self.status = status
        self.__dict__.update(fields)


def analyze_trace(*_args, **_kwargs):
    raise NotImplementedError("profile analysis is not part of the public nki-library")


def _module(name: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name, "stand-in registered by nki_library_shim")
    module.__dict__.update(attributes)
    return module


sys.modules.setdefault("test.utils.perf_analysis_private",
                       _module("test.utils.perf_analysis_private", analyze_trace=analyze_trace))
sys.modules.setdefault("test.utils.scripts", _module("test.utils.scripts", __path__=[]))
sys.modules.setdefault("test.utils.scripts.remote_lock_scripts",
                       _module("test.utils.scripts.remote_lock_scripts", LockStatus=LockStatus, LockResult=LockResult))


def pytest_configure(config) -> None:
    orchestrator = sys.modules.get("test.utils.test_orchestrator")
    if orchestrator is not None and not hasattr(orchestrator.Orchestrator, "_compiled_kernel"):
        orchestrator.Orchestrator._compiled_kernel = None  # set only by compilation, read after simulation too
