"""Input the kernels cannot take is refused up front, the same on every backend (issue 15, findings 4 and 8)."""

from __future__ import annotations

import math

import pytest
import torch

import nki_ops
from nki_ops._backends import availability
from nki_ops.cli import main

BOXES = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 3.0, 4.0]])
ON_META = torch.empty(2, 4, device="meta")

# One call per op, each with a second tensor on the meta device: the kernels would read its raw memory.
MIXED_DEVICES = {
    "giou": lambda backend: nki_ops.giou(BOXES, ON_META, backend=backend),
    "giou_loss": lambda backend: nki_ops.giou_loss(BOXES, ON_META, backend=backend),
    "box_iou": lambda backend: nki_ops.box_iou(BOXES, ON_META, backend=backend),
    "rms_norm": lambda backend: nki_ops.rms_norm(torch.ones(2, 4), torch.ones(4, device="meta"), backend=backend),
    "nms": lambda backend: nki_ops.nms(BOXES, torch.ones(2, device="meta"), 0.5, backend=backend),
}


def _backends(op):
    return ["auto"] + [b for b, why in availability(op).items() if why is None]


@pytest.mark.parametrize("op, backend", [(op, b) for op in MIXED_DEVICES for b in _backends(op)])
def test_inputs_on_different_devices_are_refused(op, backend):
    with pytest.raises(ValueError, match=r"must be on the same device, got cpu and meta"):
        MIXED_DEVICES[op](backend)


def test_batched_nms_refuses_categories_on_another_device():
    with pytest.raises(ValueError, match=r"boxes and idxs must be on the same device, got cpu and meta"):
        nki_ops.batched_nms(BOXES, torch.ones(2), torch.zeros(2, dtype=torch.int64, device="meta"), 0.5)


@pytest.mark.parametrize("threshold", [True, False, math.nan, math.inf, "0.5", None])
def test_nms_refuses_a_threshold_that_is_not_a_number_in_0_1(threshold):
    with pytest.raises(ValueError, match=rf"iou_threshold must be a finite number in \[0, 1\], got {threshold!r}"):
        nki_ops.nms(BOXES, torch.ones(2), threshold)


@pytest.mark.parametrize("eps", [math.nan, math.inf, -1e-6, True])
def test_rms_norm_refuses_an_eps_that_is_not_a_finite_non_negative_number(eps):
    with pytest.raises(ValueError, match=rf"eps must be a finite number >= 0, got {eps!r}"):
        nki_ops.rms_norm(torch.ones(2, 4), torch.ones(4), eps)


@pytest.mark.parametrize("what, make", [("does not exist", lambda tmp: tmp / "missing.py"),
                                        ("is a folder, not a Python script", lambda tmp: tmp)])
def test_simulate_names_a_script_it_cannot_run_in_one_line(what, make, tmp_path, capsys):
    script = make(tmp_path)
    assert main(["simulate", str(script)]) == 2
    assert capsys.readouterr().err == f"nki-ops simulate: error: {str(script)!r} {what}\n"


# The giou_loss backends that run here besides the torch reference.
KERNEL_BACKENDS = [b for b, why in availability("giou_loss").items() if why is None and b != "torch"]


def _giou_loss_grads(backend, boxes1, boxes2):
    a, b = boxes1.clone().requires_grad_(), boxes2.clone().requires_grad_()
    nki_ops.giou_loss(a, b, "sum", backend=backend).backward()
    return a.grad, b.grad


# With the NaN in boxes1, the reference's clamps and max/min (torch.where, comparisons with NaN false)
# pass no gradient through the NaN union, so that coordinate's own gradient stays finite.
@pytest.mark.parametrize("backend, side, coordinate", [
    (backend, side, coordinate) for backend in KERNEL_BACKENDS for side in (0, 1) for coordinate in range(4)])
def test_giou_loss_gradient_with_a_nan_coordinate_matches_the_reference(backend, side, coordinate):
    boxes = [BOXES.clone(), BOXES.flip(0).clone()]
    boxes[side][0, coordinate] = math.nan
    expected = _giou_loss_grads("torch", *boxes)
    got = _giou_loss_grads(backend, *boxes)
    for want, have in zip(expected, got):
        torch.testing.assert_close(have, want, equal_nan=True)
    assert expected[1 - side][1].isfinite().all()  # the box pair without NaN keeps finite gradients


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_giou_loss_gradient_nan_pattern_matches_the_reference_with_ties_and_nans(backend):
    # Integer coordinates in 0..4 make ties at every max/min common; ~8% NaN coordinates on both sides.
    generator = torch.Generator().manual_seed(0)
    boxes = [torch.randint(0, 5, (600, 4), generator=generator).float() for _ in range(2)]
    for b in boxes:
        b[torch.rand(b.shape, generator=generator) < 0.08] = math.nan
    expected = _giou_loss_grads("torch", *boxes)
    got = _giou_loss_grads(backend, *boxes)
    for want, have in zip(expected, got):
        assert want.isnan().any() and not want.isnan().all()
        torch.testing.assert_close(have, want, equal_nan=True)
