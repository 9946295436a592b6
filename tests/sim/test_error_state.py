"""NumPy's floating-point error state is "ignore" for the whole launch (set once, not per instruction):
inf and NaN results come silently even where the caller asked NumPy to raise, and the caller's state
is back when the kernel returns (also from the threads of an LNC2 launch)."""

from __future__ import annotations

import numpy as np
import pytest

from nki_ops.sim import nki as legacy_nki
from nki_ops.sim import nl as legacy_nl
from nki_ops.sim.frontends import current as nki

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation


@legacy_nki.jit
def legacy_divide(x, y):
    out = legacy_nl.ndarray(x.shape, dtype=x.dtype, buffer=legacy_nl.shared_hbm)
    legacy_nl.store(out, legacy_nl.reciprocal(legacy_nl.divide(legacy_nl.load(x), legacy_nl.load(y))))
    return out


@nki.jit
def current_divide(x, y):
    a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    b = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    nisa.dma_copy(dst=b, src=y)
    q = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.reciprocal(dst=q, data=b)  # no divide instruction: x * (1 / y)
    nisa.tensor_tensor(dst=q, data1=a, data2=q, op=nl.multiply)
    r = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.reciprocal(dst=r, data=q)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=r)
    return out


@pytest.mark.parametrize("launch", [lambda x, y: legacy_divide(x, y), lambda x, y: current_divide(x, y),
                                    lambda x, y: current_divide[2](x, y)], ids=["legacy", "current", "current-lnc2"])
def test_inf_and_nan_come_silently_and_the_caller_state_is_restored(launch):
    x = np.array([[1.0, 0.0, -1.0, 2.0]], np.float32)
    y = np.array([[0.0, 0.0, 0.0, 4.0]], np.float32)
    with np.errstate(all="raise"):
        got = launch(x, y)
        assert np.geterr()["divide"] == "raise" and np.geterr()["invalid"] == "raise"
    np.testing.assert_array_equal(got, np.array([[0.0, np.nan, -0.0, 2.0]], np.float32))  # 1 / (x / y)
