"""Legacy API: index expressions carry their arithmetic progression (start, step per axis), so an
access like ``t[i_p, 4 * i_f + 1]`` becomes a strided view without analysing index arrays. Every
form must read and write exactly the elements NumPy's advanced indexing selects."""

from __future__ import annotations

import numpy as np
import pytest

from nki_ops.sim import SimulatorError, nki, nl

pytestmark = pytest.mark.simulation

EXPRESSIONS = {
    "strided": lambda i_p, i_f: (i_p, 4 * i_f + 1),
    "offset partitions": lambda i_p, i_f: (i_p + 2, 3 + i_f * 2),
    "reversed free axis": lambda i_p, i_f: (i_p, 15 - i_f),
    "step zero": lambda i_p, i_f: (i_p, 0 * i_f + 5),
    "sum of expressions": lambda i_p, i_f: (i_p, i_f + i_f),
    "floor division": lambda i_p, i_f: (i_p, i_f // 2),
}


def _gather(name):
    @nki.jit
    def kernel(x):
        t = nl.load(x)
        i_p, i_f = nl.arange(4)[:, None], nl.arange(8)[None, :]
        out = nl.ndarray((4, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(t[EXPRESSIONS[name](i_p, i_f)]))
        return out
    return kernel


@pytest.mark.parametrize("name", EXPRESSIONS)
def test_reads_select_what_numpy_selects(name):
    x = np.arange(8 * 40, dtype=np.float32).reshape(8, 40)
    p, f = EXPRESSIONS[name](np.arange(4)[:, None], np.arange(8)[None, :])
    np.testing.assert_array_equal(_gather(name)(x), x[p, f])


@nki.jit
def grid_write(x):
    out = nl.ndarray((4, 24), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.zeros((4, 24), dtype=x.dtype)
    i_p, i_f = nl.mgrid[0:4, 1:24:3]
    t[i_p, i_f] = nl.load(x)
    nl.store(out, t)
    return out


def test_grid_with_a_step_writes_the_strided_elements():
    x = np.arange(32, dtype=np.float32).reshape(4, 8) + 1
    expected = np.zeros((4, 24), np.float32)
    expected[:, 1:24:3] = x
    np.testing.assert_array_equal(grid_write(x), expected)


@nki.jit
def strided_partitions(x):
    t = nl.load(x)
    out = nl.ndarray((4, 8), dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.copy(t[2 * nl.arange(4)[:, None], nl.arange(8)[None, :]]))
    return out


@nki.jit
def past_the_end(x):
    t = nl.load(x)
    out = nl.ndarray((4, 8), dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.copy(t[nl.arange(4)[:, None], 5 * nl.arange(8)[None, :] + 6]))
    return out


def test_partition_strides_and_out_of_range_progressions_are_refused():
    x = np.zeros((8, 40), np.float32)
    with pytest.raises(SimulatorError, match="partition dimension .* contiguous range"):
        strided_partitions(x)
    with pytest.raises(SimulatorError, match=r"Out-of-bound access .* dimension 1: index range \[6, 41\]"):
        past_the_end(x)
