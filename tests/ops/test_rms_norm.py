"""rms_norm (torch backend) against the slow loop reference, with gradcheck."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import strategies as st

import nki_ops
from tests.slow_reference import rms_norm_loop

# Relative tolerances: half types are normalised in fp32 and rounded once on output.
TOLERANCE = {torch.float16: (1e-3, 1e-3), torch.bfloat16: (8e-3, 1e-2), torch.float32: (1e-5, 1e-6),
             torch.float64: (1e-12, 1e-12)}


@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("shape", [(3, 64), (2, 5, 130), (1, 1)])
def test_matches_loop_reference(dtype, shape):
    x = torch.randn(shape).to(dtype)
    weight = torch.randn(shape[-1]).to(dtype)
    got = nki_ops.rms_norm(x, weight, 1e-6, backend="torch")
    assert got.dtype == dtype and got.shape == x.shape
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(got.double(), rms_norm_loop(x, weight, 1e-6), rtol=rtol, atol=atol)


def test_zero_rows_stay_finite():
    got = nki_ops.rms_norm(torch.zeros(2, 8), torch.ones(8), backend="torch")
    assert torch.equal(got, torch.zeros(2, 8))


def test_gradcheck():
    x = torch.randn(4, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(16, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, w: nki_ops.rms_norm(a, w, 1e-5, backend="torch"), (x, weight))


# ------------------------------------------------------------------------ conformance strategy

# (rtol, atol) against the reference on the conformance suite's values, up to 1e4 with NaN/inf mixed in.
CONFORMANCE_TOL = {torch.float64: (1e-12, 1e-12), torch.float32: (2e-5, 1e-6), torch.float16: (2.0 ** -9, 2.0 ** -20),
                   torch.bfloat16: (2.0 ** -6, 2.0 ** -60)}


@st.composite
def conformance_case(draw):
    """Random rms_norm inputs for tests/ops/test_conformance.py, with eps values the op must refuse."""
    from tests.ops.test_conformance import DTYPES, Case, _batch_shape, _values

    dtype = draw(st.sampled_from(DTYPES))
    d = draw(st.sampled_from([1, 2, 3, 7, 64, 129, 513]))
    batch = _batch_shape(draw)
    if math.prod(batch) * d > 20000:
        batch = [s % 8 for s in batch]
    finite = st.floats(-1e4, 1e4, allow_subnormal=False, width=16)
    x = _values(draw, (*batch, d), finite, 0.2).to(dtype)
    weight = _values(draw, (d,), finite, 0.1).to(dtype)
    eps = draw(st.sampled_from([1e-6, 1e-5, 0.1, 0.0]) | st.sampled_from([-1e-6, math.nan, math.inf]))
    rtol, atol = CONFORMANCE_TOL[dtype]
    return Case([x, weight], {"eps": eps}, atol=atol, rtol=rtol)
