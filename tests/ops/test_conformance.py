"""Every op on every backend that runs here gives the torch reference's answer, or the same ValueError,
and leaves its inputs alone, for random shapes (empty, odd, past one 128-partition tile), dtypes, memory
layouts and adversarial values (NaN, inf, inverted and zero-area boxes). Property-based, with Hypothesis.

Ops and backends come from the registry. Each op's strategy lives in its own test file, as
``conformance_case`` (``conformance_cases[op]`` when a folder defines several ops), built from the
shared pieces here (``Case``, ``_values``, ``_boxes``, ...); a test checks every op has one.
``make test`` runs a bounded, derandomized profile; ``HYPOTHESIS_PROFILE=long`` a longer random one.
"""

from __future__ import annotations

import importlib
import math
import os
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import nki_ops
from nki_ops._backends import _REGISTRY, BackendUnavailableError, availability
from nki_ops.ops._define import OPS

# make test: the same examples every run, and a failure reported as found (shrinking it can take minutes
# on the simulator; the long profile shrinks).
settings.register_profile("nki-ops-default", max_examples=12, deadline=None, derandomize=True, database=None,
                          phases=[Phase.explicit, Phase.generate],
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("long", max_examples=400, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROFILE = settings.get_profile("long" if os.environ.get("HYPOTHESIS_PROFILE") == "long" else "nki-ops-default")

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# Sizes that hit the kernels' edges: empty, one, odd, and one past a 128-partition tile.
SIZES = st.sampled_from([0, 1, 2, 3, 5, 7, 128, 129])
SPECIALS = st.sampled_from([math.nan, math.inf, -math.inf])
# Box coordinates on a half-integer grid: exact in every dtype, and products and sums of them exact in
# float32, so backends that order the arithmetic differently still agree to rounding of the quotients.
GRID = st.integers(-8, 24).map(lambda k: k / 2)
# Outputs in [-2, 2] differ by at most a few roundings of the output dtype.
BOX_ATOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 2.0 ** -9, torch.bfloat16: 2.0 ** -6}
# Two units in the last place: a kernel's reciprocal-and-multiply against the reference's quotient, for
# results far from 1 (GIoU of inverted boxes divides by the clamped area and reaches ~1e12).
BOX_RTOL = {torch.float64: 2.0 ** -51, torch.float32: 2.0 ** -22, torch.float16: 2.0 ** -9, torch.bfloat16: 2.0 ** -6}


@dataclass
class Case:
    tensors: list[torch.Tensor]  # the op's tensor arguments, in order
    options: dict = field(default_factory=dict)  # the rest, by keyword
    atol: float = 0.0
    rtol: float = 0.0

    def call(self, op, tensors, backend):
        return getattr(nki_ops, op)(*tensors, **self.options, backend=backend)


def _values(draw, shape, elements, special_share: float):
    """A float64 tensor of ``shape``; with probability ``special_share`` some entries are NaN or +-inf."""
    values = draw(arrays(np.float64, shape, elements=elements))
    if values.size and draw(st.floats(0, 1)) < special_share:
        where = draw(arrays(np.bool_, shape))
        values = np.where(where, draw(SPECIALS), values)
    return torch.from_numpy(values)


def _boxes(draw, batch_shape):
    """xyxy boxes (x1, y1, x1 + w, y1 + h): w and h may be negative (inverted) or zero (zero-area)."""
    corner = _values(draw, (*batch_shape, 2), GRID, 0.0)
    size = _values(draw, (*batch_shape, 2), st.integers(-2, 12).map(lambda k: k / 2), 0.0)
    boxes = torch.cat([corner, corner + size], dim=-1)
    if boxes.numel() and draw(st.floats(0, 1)) < 0.3:
        mask = torch.from_numpy(draw(arrays(np.bool_, tuple(boxes.shape))))
        boxes = torch.where(mask, draw(SPECIALS), boxes)
    return boxes


def _batch_shape(draw, max_dims=2):
    shape = draw(st.lists(SIZES, min_size=0, max_size=max_dims))
    return shape if math.prod(shape) <= 2048 else [s % 8 for s in shape]  # keep the simulator quick


def strategy(op):
    """The op's strategy, from the test file of the op's folder (``tests/ops/test_<folder>.py``):
    its ``conformance_case``, or ``conformance_cases[op]`` when the folder defines several ops."""
    folder = OPS[op].function.__module__.rsplit(".", 1)[-1]
    module = importlib.import_module(f"tests.ops.test_{folder}")
    cases = getattr(module, "conformance_cases", None)
    return cases[op] if cases is not None else module.conformance_case


# Layouts an input may come in, each holding the same values as the contiguous tensor it is made from.
LAYOUTS = ("contiguous", "offset", "strided", "expanded")


def _lay_out(draw, t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "offset":  # contiguous, but not at the start of its storage
        skip = draw(st.integers(1, 3))
        storage = torch.full((t.numel() + skip,), 7.0, dtype=t.dtype)
        view = storage[skip:].view(t.shape)
        view.copy_(t)
        return view
    dims = [d for d in range(t.dim()) if t.shape[d] > 1]
    if layout == "contiguous" or not dims:
        return t.clone()
    dim = draw(st.sampled_from(dims))
    if layout == "expanded":  # stride 0: every row along ``dim`` is the first one
        return t.narrow(dim, 0, 1).clone().expand(t.shape)
    # strided: every other element of a larger tensor whose gaps hold a value no input has
    shape = list(t.shape)
    shape[dim] *= 2
    index = [slice(None)] * t.dim()
    index[dim] = slice(0, None, 2)
    view = torch.full(shape, 1234.5, dtype=t.dtype)[tuple(index)]
    view.copy_(t)
    return view


def _backends(op):
    return ["auto"] + [b for b, why in availability(op).items() if why is None]


def _inputs_unchanged(tensors, saved):
    for t, (values, version) in zip(tensors, saved):
        assert t._version == version, "the op wrote into its input (its version counter moved)"
        torch.testing.assert_close(t, values, rtol=0, atol=0, equal_nan=True, msg="the op changed its input")


def _check(op, backend, case: Case, tensors):
    """``backend`` on ``tensors`` (some laid out non-contiguously) against the reference on contiguous copies."""
    try:
        expected = case.call(op, [t.contiguous() for t in tensors], "torch")
    except ValueError as error:
        with pytest.raises(ValueError) as raised:
            case.call(op, tensors, backend)
        assert str(raised.value) == str(error)
        return
    saved = [(t.clone(), t._version) for t in tensors]
    try:
        got = case.call(op, tensors, backend)
    except BackendUnavailableError as refusal:
        # An explicit backend may refuse inputs it does not take (float64 on the kernels), saying which.
        assert backend != "auto" and "does not take these inputs" in str(refusal)
        assert any(str(t.dtype) in str(refusal) or str(t.device) in str(refusal) for t in tensors), refusal
        return
    _inputs_unchanged(tensors, saved)
    if not isinstance(expected, tuple):  # one output; rope returns two
        got, expected = (got,), (expected,)
    assert isinstance(got, tuple) and len(got) == len(expected)
    for got, expected in zip(got, expected):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        if got.dtype == torch.int64:  # nms: the kept indices, in order
            assert got.tolist() == expected.tolist()
        else:
            torch.testing.assert_close(got, expected, rtol=case.rtol, atol=case.atol, equal_nan=True)


BACKEND_MARKS = {"nki": pytest.mark.simulation, "cpp": pytest.mark.cpp}


def _cases():
    for op in sorted(_REGISTRY):
        for backend in _backends(op):
            # auto runs one of the others: once, on contiguous inputs, is enough
            for layout in LAYOUTS if backend != "auto" else LAYOUTS[:1]:
                marks = [BACKEND_MARKS[backend]] if backend in BACKEND_MARKS else []
                yield pytest.param(op, backend, layout, marks=marks)


@pytest.mark.parametrize("op, backend, layout", list(_cases()))
@settings(PROFILE)
@given(data=st.data())
def test_conforms_to_the_reference(op, backend, layout, data):
    case = data.draw(strategy(op)(), label="case")
    # The first tensor always in ``layout``; the others in it or contiguous.
    layouts = [layout] + [data.draw(st.sampled_from([layout, "contiguous"])) for _ in case.tensors[1:]]
    tensors = [_lay_out(data.draw, t, how) for t, how in zip(case.tensors, layouts)]
    _check(op, backend, case, tensors)


def test_every_registered_op_has_a_strategy():
    for op in _REGISTRY:
        assert callable(strategy(op)), op
