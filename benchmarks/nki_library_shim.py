"""pytest plugin to run AWS's public nki-library test harness (aws-neuron/nki-library @d2ad3a5) in
``--test-mode simulation`` on the nki-ops simulator.

The public harness does not run as published, on any simulator: it imports two modules the
repository does not ship (``test/utils/perf_analysis_private.py``, ``test/utils/scripts/
remote_lock_scripts.py``; both serve profiling and remote hosts only), and in simulation mode its
``Orchestrator`` reads ``_compiled_kernel``, which only compilation sets. This plugin supplies empty
stand-ins for those three things; and, since the harness's simulation path runs one rank only, it
runs collective tests (``collective_ranks > 1``) as that many ranks with ``nki.simulate_ranks``
(``_run_ranks_inference``). Kernels, inputs, references, tolerances and validation are the
library's own. Use it from the library's work tree:

    PYTHONPATH=src:.:/path/to/nki-ops/benchmarks python -m pytest test/integration \\
        -p nki_library_shim --nki-sim --test-mode simulation -m fast
"""

from __future__ import annotations

import enum
import os
import sys
import types

import numpy as np


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


def _run_ranks_inference(self, kernel_under_test):
    """Simulation of a collective test (``collective_ranks > 1``) as that many ranks, each rank's outputs
    dumped to ``output_worker_<rank>/`` as the hardware path lays them out, so that the harness's own
    ``OutputValidator`` checks every rank against its golden. The published harness runs one rank with
    one input dict (``PerRankLazyInputGenerator`` inputs fail on ``.items()``) and then looks for those
    per-rank directories, so no simulator could pass its collective tests as published."""
    ranks = kernel_under_test.inference_args.collective_ranks
    if ranks <= 1:
        return _single_rank_inference(self, kernel_under_test)
    import nki  # the simulator, installed by the harness's setup_simulation_mode

    dataclasses = sys.modules["test.utils.common_dataclasses"]
    exceptions = sys.modules["test.utils.exceptions"]
    os.environ["NKI_NC_VERSION"] = kernel_under_test.compiler_input.platform_target.get_nc_gen()
    inputs = kernel_under_test.kernel_input or {}
    per_rank = [inputs.for_rank(r) if isinstance(inputs, dataclasses.PerRankLazyInputGenerator) else inputs
                for r in range(ranks)]
    per_rank = [{k.removesuffix(".must_alias_input"): v for k, v in i.items()} for i in per_rank]
    try:
        results = nki.simulate_ranks(kernel_under_test.kernel_func, ranks, per_rank,
                                     lnc=kernel_under_test.compiler_input.logical_nc_config)
        out_dir = os.path.join(self.fs_config.artifacts_output_directory_path, dataclasses.INF_ARTIFACT_DIR_NAME)
        for rank, result in enumerate(results):
            golden = dataclasses.normalize_golden_output(kernel_under_test.validation_args.golden_output, rank)
            outputs = [] if result is None else list(result) if isinstance(result, (list, tuple)) else [result]
            if len(outputs) != len(golden):
                raise RuntimeError(f"rank {rank}: kernel returned {len(outputs)} outputs, expected {list(golden)}")
            tensors = {name: np.asarray(out, dtype=g.dtype) for name, out, g in zip(golden, outputs, golden.values())}
            self.__dump_tensors__(os.path.join(out_dir, f"output_worker_{rank}"), tensors, lambda name: name)
        return out_dir
    except Exception as error:
        raise exceptions.InferenceException(str(error)) from error


_single_rank_inference = None


def pytest_configure(config) -> None:
    global _single_rank_inference
    orchestrator = sys.modules.get("test.utils.test_orchestrator")
    if orchestrator is not None and not hasattr(orchestrator.Orchestrator, "_compiled_kernel"):
        orchestrator.Orchestrator._compiled_kernel = None  # set only by compilation, read after simulation too
    if orchestrator is not None and _single_rank_inference is None:
        _single_rank_inference = orchestrator.Orchestrator._run_simulator_inference
        orchestrator.Orchestrator._run_simulator_inference = _run_ranks_inference
