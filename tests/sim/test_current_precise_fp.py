"""``NKI_PRECISE_FP``: the real simulator's default (1) stores bfloat16/fp8 tensors in their dtype, as
this simulator always does; 0 (store them as float32) is refused rather than silently ignored."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nki_ops.sim.core.errors import UnsupportedError
from nki_ops.sim.frontends import current as nki

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation


@nki.jit
def round_trip_kernel(x):
    tile = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=tile)
    return out


def test_precise_fp_rounds_into_bfloat16(monkeypatch):
    monkeypatch.setenv("NKI_PRECISE_FP", "1")
    x = np.array([[1.0 + 2.0 ** -10, 3.0]], np.float32)
    np.testing.assert_array_equal(round_trip_kernel(x), x.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_precise_fp_off_is_refused(monkeypatch):
    monkeypatch.setenv("NKI_PRECISE_FP", "0")
    with pytest.raises(UnsupportedError, match="not supported by the simulator: NKI_PRECISE_FP=0"):
        round_trip_kernel(np.ones((1, 2), np.float32))
