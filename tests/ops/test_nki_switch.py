"""``nki_ops.nki_api``, the switch that gives the project's kernels the current ``nki`` API: the Neuron SDK's
``nki`` package when importable, the simulator's current front end otherwise or when forced, and a
clear refusal on a host whose SDK has only the legacy ``neuronxcc.nki``.

Each case runs in a fresh interpreter, with stand-in SDK packages on PYTHONPATH where it needs one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.simulation

# A stand-in for the SDK's `nki` package: enough for the kernel modules to import (the attributes
# they read at import time), nothing that could run a kernel.
FAKE_NKI = {
    "nki/__init__.py": """
        def jit(fn=None, **kwargs):
            return fn
    """,
    "nki/language.py": """
        class tile_size:
            pmax = 128
            psum_bank_fmax = 512

        def __getattr__(name):
            return name
    """,
    "nki/isa.py": """
        def __getattr__(name):
            return name
    """,
}
# A stand-in for a legacy SDK: `neuronxcc.nki` imports, `nki` does not.
FAKE_LEGACY_SDK = {"neuronxcc/__init__.py": "", "neuronxcc/nki/__init__.py": ""}


def _python(tmp_path, code: str, packages: dict[str, str] | None = None, **env) -> str:
    for path, text in (packages or {}).items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(textwrap.dedent(text))
    environ = {key: value for key, value in os.environ.items() if key != "NKI_OPS_BACKEND"}
    environ["PYTHONPATH"] = os.pathsep.join([str(tmp_path), os.getcwd()])
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            env={**environ, **env}, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_without_an_sdk_the_kernels_get_the_simulators_current_front_end(tmp_path):
    code = """
        from nki_ops.nki_api import nki, nl, nisa, SIMULATED, UNAVAILABLE
        from nki_ops.sim.frontends import current
        assert SIMULATED and UNAVAILABLE is None
        assert nki is current and nl is current.language and nisa is current.isa
        print("ok")
    """
    assert _python(tmp_path, code) == "ok"


def test_the_sdks_nki_package_is_chosen_when_importable_unless_the_simulator_is_forced(tmp_path):
    code = """
        import nki_ops
        from nki_ops.nki_api import nki, SIMULATED, UNAVAILABLE
        from nki_ops.ops import _nki_backend
        print(nki.__name__, SIMULATED, UNAVAILABLE, _nki_backend.label())
    """
    assert _python(tmp_path, code, FAKE_NKI) == "nki False None nki"
    forced = _python(tmp_path, code, FAKE_NKI, NKI_OPS_BACKEND="sim")
    assert forced == "nki_ops.sim.frontends.current True None nki (simulated on CPU)"


def test_a_legacy_only_sdk_makes_the_nki_backend_unavailable_saying_which_sdk_is_needed(tmp_path):
    code = """
        import torch
        import nki_ops
        boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
        try:
            nki_ops.giou(boxes, boxes, backend="nki")
        except nki_ops.BackendUnavailableError as error:
            print(error)
        print(nki_ops.giou(boxes, boxes, backend="torch").item())
    """
    refused, fallback = _python(tmp_path, code, FAKE_LEGACY_SDK).splitlines()
    assert "SDK >= 2.27" in refused and "neuronxcc.nki" in refused and "NKI_OPS_BACKEND=sim" in refused
    assert fallback == "1.0"
    forced = """
        import torch
        import nki_ops
        boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
        print(nki_ops.giou(boxes, boxes, backend="nki").item())
    """
    assert _python(tmp_path, forced, FAKE_LEGACY_SDK, NKI_OPS_BACKEND="sim") == "1.0"
