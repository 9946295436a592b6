"""Current API: tensor_tensor and tensor_scalar compute an fp32 result straight into dst. The values
must be those of computing first and writing after: operands that overlap dst are read before any
element is written, and an instruction that fails leaves dst as it was. nc_matmul with
accumulate=None takes a shortcut when all of dst is written or all unwritten, and must still
overwrite exactly the unwritten elements of a partly written PSUM tile."""

from __future__ import annotations

import numpy as np
import pytest

from nki_ops.sim.core.errors import KernelUsageError, MemorySpaceError
from nki_ops.sim.frontends import current as nki

from .current_tiles import load, store

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation


@nki.jit
def overlapping_operands(x):
    t = load(x)
    nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.add)
    # dst shifted one column right of data1: every element must come from the values before the write.
    nisa.tensor_tensor(dst=t[:, 1:6], data1=t[:, 0:5], data2=t[:, 2:7], op=nl.subtract)
    nisa.tensor_scalar(dst=t[:, 0:4], data=t[:, 1:5], op0=nl.multiply, operand0=3.0, op1=nl.add, operand1=1.0)
    return store(t)


@nki.jit
def comparison_into_fp32(x, y):
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=t, data1=load(x), data2=load(y), op=nl.greater_equal)
    column = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=column, data1=load(x), data2=load(y)[:, 0:1], op=nl.maximum)
    return store(t), store(column)


@nki.jit
def failures_leave_dst(x):
    t = load(x)
    try:  # operand1 of the second operator has the wrong shape: checked before anything is written
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0, op1=nl.add,
                           operand1=nl.ndarray((2, 3), dtype=nl.float32, buffer=nl.sbuf))
    except KernelUsageError:
        pass
    acc = nl.ndarray((2, 8), dtype=nl.float32, buffer=nl.psum)
    nisa.memset(dst=acc, value=5.0)
    try:  # the GpSimd engine cannot write PSUM: refused after the values are computed
        nisa.tensor_tensor(dst=acc, data1=t, data2=t, op=nl.add, engine=nisa.engine.gpsimd)
    except MemorySpaceError:
        pass
    kept = nl.ndarray((2, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=kept, src=acc)
    return store(t), store(kept)


def test_operands_overlapping_dst_are_read_before_it_is_written():
    x = np.arange(16, dtype=np.float32).reshape(2, 8) ** 1.5
    expected = 2 * x
    expected[:, 1:6] = expected[:, 0:5] - expected[:, 2:7]
    expected[:, 0:4] = expected[:, 1:5] * 3 + 1
    np.testing.assert_array_equal(overlapping_operands(x), expected)


def test_comparisons_and_column_operands_into_fp32():
    x = np.array([[1, 2, np.nan, 4], [5, -1, 0, 2]], np.float32)
    y = np.array([[1, 3, 0, -4], [6, -1, np.nan, 1]], np.float32)
    ge, column = comparison_into_fp32(x, y)
    np.testing.assert_array_equal(ge, (x >= y).astype(np.float32))
    np.testing.assert_array_equal(column, np.maximum(x, y[:, 0:1]))


def test_failed_instructions_leave_dst_unchanged():
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    t, kept = failures_leave_dst(x)
    np.testing.assert_array_equal(t, x)
    np.testing.assert_array_equal(kept, 5.0)


@nki.jit
def partly_written_psum(a, b):
    s, m = load(a), load(b)
    acc = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc[:, 0:4], stationary=s, moving=m[:, 0:4])  # the left half only
    nisa.nc_matmul(dst=acc, stationary=s, moving=m)  # adds on the left, overwrites the right
    nisa.nc_matmul(dst=acc, stationary=s, moving=m)  # adds everywhere
    r = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=r, src=acc)
    return store(r)


def test_matmul_into_partly_written_psum_overwrites_only_unwritten_elements():
    a = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    b = np.arange(24, dtype=np.float32).reshape(3, 8) / 5
    product = a.T @ b
    expected = 2 * product
    expected[:, 0:4] += product[:, 0:4]
    np.testing.assert_allclose(partly_written_psum(a, b), expected, rtol=1e-6)


@nki.jit
def reciprocal_in_place(x):
    t = load(x)
    nisa.reciprocal(dst=t, data=t)
    half = nl.ndarray((2, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=half, data=load(x)[:, 0:4])
    return store(t), store(half)


def test_reciprocal_into_its_own_operand():
    x = np.array([[2.0, 0.0, -0.0, np.inf, np.nan, 3.0, 1e-40, 7.0]] * 2, np.float32)
    t, half = reciprocal_in_place(x)
    with np.errstate(all="ignore"):
        expected = np.float32(1.0) / x
    np.testing.assert_array_equal(t, expected)
    np.testing.assert_array_equal(half, expected[:, 0:4])


@nki.jit
def comparison_then_arithmetic(x, y):
    a, b = load(x), load(y)
    passed = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=passed, data=a, op0=nl.greater_equal, operand0=0.0, op1=nl.multiply, operand1=b)
    # dst is also operand1, and the first operator's result is a comparison (bool) into the fp32 multiply.
    nisa.scalar_tensor_tensor(dst=b, data=a, op0=nl.less, operand0=1.0, op1=nl.subtract, operand1=b,
                              reverse1=True)
    scaled = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=scaled, data=a, op0=nl.greater, operand0=0.5, op1=nl.multiply, operand1=3.0)
    return store(passed), store(b), store(scaled)


def test_comparison_results_feeding_fp32_operators():
    x = np.array([[-1.0, 0.0, 0.5, 2.0, np.nan, -0.0, 1.0, np.inf]] * 2, np.float32)
    y = np.array([[3.0, -2.0, np.inf, 0.25, 1.0, np.nan, 5.0, 7.0]] * 2, np.float32)
    passed, b, scaled = comparison_then_arithmetic(x, y)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(passed, (x >= 0) * y)
        np.testing.assert_array_equal(b, y - (x < 1))
        np.testing.assert_array_equal(scaled, (x > 0.5) * np.float32(3.0))
