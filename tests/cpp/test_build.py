"""build.py (rebuilds only what changed, reports errors with file:line and a non-zero exit) and the
hand-over of custom_op to torch-neuronx on a Neuron host."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch

import build
from nki_ops.cpp import custom_op
from nki_ops.cpp.operators import LIBRARIES, LibrarySpec

from .conftest import REPO_ROOT

pytestmark = pytest.mark.cpp


def test_unchanged_libraries_are_not_rebuilt(built_operators):
    result = subprocess.run([sys.executable, "build.py", "--target", "cpu"], capture_output=True, text=True,
                            cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("up to date") == len(LIBRARIES), result.stdout


def test_build_failure_prints_file_line_and_command_and_exits_non_zero(tmp_path, monkeypatch, capsys):
    source = tmp_path / "broken.cpp"
    source.write_text("#include <torch/torch.h>\n\ntorch::Tensor broken(const torch::Tensor& x) {\n  return x +;\n}\n")
    monkeypatch.setitem(build.LIBRARIES, "broken", LibrarySpec("broken", "broken_ops", (source,), (source,), False))
    monkeypatch.setenv("NKI_OPS_BUILD_DIR", str(tmp_path / "build"))
    assert build.main(["--target", "cpu", "--ops", "broken"]) == 1
    err = capsys.readouterr().err
    assert f"{source}:4:" in err and "error" in err
    assert "failing command:" in err and str(source) in err
    assert "build.py: failed: broken" in err


def test_neuron_target_needs_a_neuron_host(capsys):
    if custom_op.neuron_custom_op() is not None:
        pytest.skip("this host has torch-neuronx")
    assert build.main(["--target", "neuron"]) == 2
    assert "--target neuron needs a Neuron host" in capsys.readouterr().err


def test_custom_op_hands_over_to_torch_neuronx_when_present(monkeypatch):
    calls = []
    real = types.SimpleNamespace(load=lambda **kwargs: calls.append(("load", kwargs)),
                                 load_library=lambda path, verbose=False: calls.append(("load_library", path)))
    monkeypatch.setattr(custom_op, "neuron_custom_op", lambda: real)
    custom_op.load("relu", ["relu.cpp"], ["shape.cpp"], build_directory="/tmp/x", multicore=True)
    custom_op.load_library("librelu.so")
    assert calls == [("load", dict(name="relu", compute_srcs=["relu.cpp"], shape_srcs=["shape.cpp"], extra_cflags=[],
                                   extra_include_paths=[], build_directory="/tmp/x", multicore=True, verbose=False)),
                     ("load_library", "librelu.so")]


@pytest.mark.neuron
def test_giou_operator_on_a_neuron_device(tmp_path):
    import torch_xla.core.xla_model as xm

    from nki_ops.ops.giou.reference import giou_reference
    from nki_ops.workloads import giou_workload

    spec = LIBRARIES["giou"]
    custom_op.load("giou", [str(s) for s in spec.compute_srcs], [str(s) for s in spec.shape_srcs],
                   build_directory=str(tmp_path), multicore=True)
    boxes1, boxes2 = giou_workload(16, 256)
    device = xm.xla_device()
    got = torch.ops.nki_ops_giou.giou(boxes1.to(device), boxes2.to(device))
    xm.mark_step()
    torch.testing.assert_close(got.cpu(), giou_reference(boxes1, boxes2), rtol=1e-6, atol=1e-6)


def test_missing_build_says_what_to_run_and_auto_uses_torch(tmp_path, monkeypatch):
    import nki_ops
    from nki_ops._backends import BackendUnavailableError, availability

    monkeypatch.setenv("NKI_OPS_BUILD_DIR", str(tmp_path))
    assert "run `python build.py --ops giou`" in availability("giou")["cpp"]
    boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    assert nki_ops.giou(boxes, boxes).item() == 1.0
    with pytest.raises(BackendUnavailableError, match="the C\\+\\+ library giou is not built"):
        nki_ops.giou(boxes, boxes, backend="cpp")
