"""Current API: a new allocation is filled with its poison only when first used, unless an instruction
overwrites all of it first. Whatever the order, never-written elements read as the sentinel."""

from __future__ import annotations

import numpy as np
import pytest

from nki_ops.sim.core.errors import KernelUsageError
from nki_ops.sim.frontends import current as nki

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation


def _dirty_memory(shape):
    """Leave freed storage holding 5.0 where the next allocation of ``shape`` is likely to land, so
    unfilled storage could not pass for poison by chance."""
    scratch = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=scratch, value=5.0)


def _out(t):
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def whole_then_read(x):
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    doubled = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=doubled, data1=t, data2=t, op=nl.add)
    return _out(doubled)


@nki.jit
def reads_own_fresh_dst(x):
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    _dirty_memory(x.shape)
    acc = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
    return _out(acc)


@nki.jit
def stride_zero_view(x):
    # A view as large as the tile that repeats one column: writing it leaves the other columns unwritten.
    _dirty_memory((2, 4))
    t = nl.ndarray((2, 4), dtype=nl.float32, buffer=nl.sbuf)
    src = nl.ndarray((2, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=x)
    nisa.tensor_copy(dst=t.ap(pattern=[[4, 2], [0, 4]]), src=src)
    return _out(t)


@nki.jit
def filled_then_partly_written(x):
    zeros = nl.zeros((2, 4), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=zeros[:, 1:2], src=x)
    halves = nl.full((2, 4), 2.7, dtype=nl.int32, buffer=nl.sbuf)
    return _out(zeros), _out(halves)


@nki.jit
def failed_write_keeps_poison(x):
    _dirty_memory((2, 4))
    t = nl.ndarray((2, 4), dtype=nl.float32, buffer=nl.sbuf)
    wrong = nl.ndarray((2, 3), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=wrong, value=1.0)
    try:
        nisa.tensor_copy(dst=t, src=wrong)
    except KernelUsageError:
        pass
    return _out(t)


def test_an_instruction_writing_the_whole_tile_defines_it():
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(whole_then_read(x), 2 * x)


def test_an_instruction_reading_its_fresh_destination_sees_nan():
    assert np.isnan(reads_own_fresh_dst(np.ones((2, 4), np.float32))).all()


def test_a_tile_sized_view_that_repeats_elements_leaves_the_others_poisoned():
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = stride_zero_view(x)
    np.testing.assert_array_equal(out[:, 0], x[:, 3])  # the last write to the repeated element wins
    assert np.isnan(out[:, 1:]).all()


def test_filled_allocations_keep_their_value_where_not_written():
    zeros, halves = filled_then_partly_written(np.full((2, 1), 7, np.int32))
    np.testing.assert_array_equal(zeros, [[0, 7, 0, 0], [0, 7, 0, 0]])
    np.testing.assert_array_equal(halves, np.full((2, 4), 2.7).astype(np.int32))


def test_an_instruction_that_fails_writes_nothing():
    assert np.isnan(failed_write_keeps_poison(np.ones((2, 4), np.float32))).all()
