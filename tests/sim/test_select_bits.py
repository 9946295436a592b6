"""Selects (select_reduce, tensor_copy_predicated) copy the chosen values bit for bit: NaN payloads,
-0.0 and inf come through unchanged, and a predicate value other than 0/1 counts as true."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nki_ops.sim import SimulatorError
from nki_ops.sim.frontends import current as nki

from .current_tiles import load

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation
RNG = np.random.default_rng(11)


def special(shape, dtype):
    """Random values with a NaN carrying a payload, -0.0, +-inf and a negative NaN mixed in."""
    x = RNG.standard_normal(shape).astype(np.float32)
    bits = x.view(np.uint32)
    bits.flat[0::5] = 0x7FC12345  # NaN with a payload
    bits.flat[1::5] = 0x80000000  # -0.0
    bits.flat[2::7] = 0xFF800000  # -inf
    bits.flat[3::7] = 0xFFC00001  # negative NaN
    return x.astype(dtype)


@nki.jit
def select_kernel(x, predicate, column, reverse):
    out = nl.ndarray((2,) + x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    res = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    pred, values = load(predicate), load(x)
    nisa.select_reduce(dst=res, predicate=pred, on_true=values, on_false=0.0, reverse_pred=reverse)
    nisa.dma_copy(dst=out[0], src=res)
    nisa.select_reduce(dst=res, predicate=pred, on_true=values, on_false=load(column), reverse_pred=reverse)
    nisa.dma_copy(dst=out[1], src=res)
    return out


@pytest.mark.parametrize("reverse", [False, True])
def test_select_reduce_keeps_the_chosen_bits(reverse):
    x = special((16, 40), np.float32)
    predicate = RNG.integers(0, 3, x.shape).astype(np.uint8)  # 2 is true too
    column = np.full((16, 1), -0.0, np.float32)
    take = (predicate != 0) != reverse
    out = select_kernel(x, predicate, column, reverse)
    for got, other in zip(out, (np.float32(0.0), column)):
        np.testing.assert_array_equal(got.view(np.uint32), np.where(take, x, other).view(np.uint32))


@nki.jit
def copy_predicated_kernel(dst_init, src, predicate):
    out = nl.ndarray(dst_init.shape, dtype=dst_init.dtype, buffer=nl.shared_hbm)
    dst = load(dst_init)
    nisa.tensor_copy_predicated(dst=dst, src=load(src), predicate=load(predicate))
    nisa.dma_copy(dst=out, src=dst)
    return out


@pytest.mark.parametrize("dtype, bits", [(np.float32, np.uint32), (ml_dtypes.bfloat16, np.uint16)])
def test_tensor_copy_predicated_keeps_the_chosen_bits(dtype, bits):
    dst, src = special((8, 24), dtype), special((8, 24), dtype)[:, ::-1].copy()
    predicate = RNG.integers(0, 2, dst.shape).astype(np.uint8)
    got = copy_predicated_kernel(dst, src, predicate)
    np.testing.assert_array_equal(got.view(bits), np.where(predicate != 0, src, dst).view(bits))


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_a_predicate_of_a_dtype_the_isa_does_not_list_is_refused(dtype):
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    predicate = np.ones((4, 8), dtype)
    with pytest.raises(SimulatorError, match="select_reduce: predicate must be int8, uint8, int16, uint16"):
        select_kernel(x, predicate, np.zeros((4, 1), np.float32), False)
