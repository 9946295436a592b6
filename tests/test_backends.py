"""The backend registry: explicit requests never fall back; auto picks what can run."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import nki_ops
from nki_ops import _backends


@pytest.fixture
def toy_op():
    name = "toy_op_for_registry_test"
    _backends.register(name, "torch", lambda: "torch")
    _backends.register(name, "cpp", lambda: "cpp", unavailable_reason=lambda: "the C++ library is not built")
    yield name
    _backends._REGISTRY.pop(name)


def test_explicit_unavailable_backend_names_backend_reason_and_alternatives(toy_op):
    with pytest.raises(nki_ops.BackendUnavailableError,
                       match=r"backend 'cpp' is unavailable: the C\+\+ library is not built\. Available: \['torch'\]"):
        _backends.resolve(toy_op, "cpp")
    with pytest.raises(nki_ops.BackendUnavailableError, match=r"toy_op_for_registry_test has no nki implementation"):
        _backends.resolve(toy_op, "nki")


def test_auto_skips_unavailable_backends(toy_op):
    assert _backends.resolve(toy_op, "auto", torch.device("cpu"))() == "torch"


def test_default_backend_env_overrides_auto(toy_op, monkeypatch):
    monkeypatch.setenv("NKI_OPS_DEFAULT_BACKEND", "cpp")
    with pytest.raises(nki_ops.BackendUnavailableError, match="not built"):
        _backends.resolve(toy_op, "auto")


def test_unknown_backend_is_a_value_error():
    with pytest.raises(ValueError, match=r"backend must be one of .*got 'cuda'"):
        nki_ops.giou(torch.rand(1, 4), torch.rand(1, 4), backend="cuda")


def test_every_defined_op_is_public_and_has_a_torch_backend():
    from nki_ops.ops._define import OPS
    assert {"attention", "giou", "giou_loss", "box_iou", "nms", "rms_norm"} <= set(OPS)
    assert set(OPS) == set(_backends._REGISTRY) - {"toy_op_for_registry_test"}
    for name, op in OPS.items():
        assert getattr(nki_ops, name) is op.function and name in nki_ops.__all__
        assert nki_ops.availability(name)["torch"] is None


def test_import_stays_light():
    # The CLI and every tuning trial import nki_ops: it must not pull in torch's compiler stack.
    code = "import sys, nki_ops; print('torch._dynamo' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
