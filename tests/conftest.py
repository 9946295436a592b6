"""Shared fixtures: every test is seeded, and `neuron` tests skip (saying why) off a Neuron host."""

from __future__ import annotations

import glob
import importlib.util

import pytest
import torch


def neuron_unavailable_reason() -> str | None:
    if importlib.util.find_spec("torch_neuronx") is None:
        return "needs torch-neuronx (Neuron package repository) on a trn1/inf2 host; not installed here"
    if not glob.glob("/dev/neuron*"):
        return "needs a Neuron device (/dev/neuron*); none on this host"
    return None


def pytest_collection_modifyitems(config, items):
    reason = neuron_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "neuron" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
