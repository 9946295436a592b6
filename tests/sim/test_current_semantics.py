"""The current ``nki`` API: semantics the public kernel library relies on, each in a small kernel
written here and checked against NumPy (or the error it must raise)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from nki_ops.sim.core.errors import OutOfBoundsError
from nki_ops.sim.frontends import current as nki

from .current_tiles import load

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation
RNG = np.random.default_rng(12)


@nki.jit
def matmul_into_ap_view_kernel(a_t, b):
    """Two matmuls into halves of one PSUM tile, each through an .ap() view that names the
    allocation's own dtype: the first write to fresh PSUM overwrites its (NaN) contents."""
    k, m = a_t.shape
    n = b.shape[1]
    acc = nl.ndarray((m, 2 * n), dtype=nl.float32, buffer=nl.psum)
    for half in range(2):
        view = acc.ap(pattern=[[2 * n, m], [1, n]], offset=half * n, dtype=nl.float32)
        nisa.nc_matmul(dst=view, stationary=load(a_t), moving=load(b))
    result = nl.ndarray((m, 2 * n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=result, src=acc)
    out = nl.ndarray((m, 2 * n), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=result)
    return out


def test_matmul_into_ap_view_with_explicit_dtype_overwrites_fresh_psum():
    a_t = RNG.standard_normal((64, 32)).astype(np.float32)
    b = RNG.standard_normal((64, 16)).astype(np.float32)
    out = matmul_into_ap_view_kernel(a_t, b)
    expected = a_t.T @ b
    np.testing.assert_allclose(out, np.concatenate([expected, expected], axis=1), rtol=1e-5, atol=1e-5)


def scatter_rows_kernel(table, rows, starts, skip):
    """Each row of ``rows`` goes to ``table`` at a runtime row offset (a 1x1 tile), as a scatter whose
    start address the DMA checks when it runs."""
    out = nl.ndarray(table.shape, dtype=table.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=table)
    for i in range(rows.shape[0]):
        start = load(starts[i:i + 1, :])
        nisa.dma_copy(dst=out.ap(pattern=[[table.shape[1], 1], [1, table.shape[1]]], scalar_offset=start,
                                 indirect_dim=0),
                      src=load(rows[i:i + 1, :]), oob_mode=nisa.oob_mode.skip if skip else nisa.oob_mode.error)
    return out


def test_dma_skips_a_transfer_whose_runtime_start_leaves_the_tensor():
    table = RNG.standard_normal((6, 4)).astype(np.float32)
    rows = RNG.standard_normal((3, 4)).astype(np.float32)
    starts = np.array([[2], [-1000000], [5]], np.int32)
    expected = table.copy()
    expected[2], expected[5] = rows[0], rows[2]
    np.testing.assert_array_equal(nki.jit(scatter_rows_kernel)(table, rows, starts, True), expected)


def test_dma_refuses_a_runtime_start_outside_the_tensor_by_default():
    table = np.zeros((6, 4), np.float32)
    rows = np.ones((1, 4), np.float32)
    with pytest.raises(OutOfBoundsError, match="oob_mode.skip"):
        nki.jit(scatter_rows_kernel)(table, rows, np.array([[6]], np.int32), False)


@dataclasses.dataclass
class Section(nl.NKIObject):
    """Fields as plain class values, under @dataclass: the guide's classes compile the same either way."""

    index = None
    offset = 0

    def __post_init__(self):
        self.end = self.offset + 4


@nki.jit
def sections_kernel(x):
    """Copies x's 4-column sections in reverse order, each described by a Section."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    count = x.shape[1] // 4
    for i in range(count):
        section = Section(index=i, offset=4 * i)
        target = Section(count - 1 - i, 4 * (count - 1 - i))
        nisa.dma_copy(dst=out[:, target.offset:target.end], src=load(x[:, section.offset:section.end]))
    return out


def test_nki_object_class_values_are_fields_with_or_without_dataclass():
    x = RNG.standard_normal((8, 12)).astype(np.float32)
    expected = np.concatenate([x[:, 8:12], x[:, 4:8], x[:, 0:4]], axis=1)
    np.testing.assert_array_equal(sections_kernel(x), expected)
    assert Section().index is None and Section(offset=8).end == 12


def strided_columns_kernel(x, extra):
    """Column j of each group of ``groups`` columns: the view for j = groups reaches outside the tile;
    it is made every time, but used only when ``extra`` says so."""
    parts, width = x.shape
    groups = 4
    t = load(x)
    out = nl.ndarray((parts, groups * (width // groups)), dtype=x.dtype, buffer=nl.shared_hbm)
    for j in range(groups + 1):
        column = t.ap(pattern=[[width, parts], [groups, width // groups]], offset=j)
        if j < groups or extra:
            got = nl.ndarray((parts, width // groups), dtype=x.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=got, src=column)
            nisa.dma_copy(dst=out[:, nl.ds(j * (width // groups), width // groups)], src=got)
    return out


def test_an_out_of_bounds_ap_view_is_an_error_only_when_used():
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    expected = np.concatenate([x[:, j::4] for j in range(4)], axis=1)
    np.testing.assert_array_equal(nki.jit(strided_columns_kernel)(x, 0), expected)  # unused: fine
    with pytest.raises(OutOfBoundsError, match=r"free offsets \[4, 16\] outside its 16 elements per partition "
                                               r"\(view made at .*test_current_semantics.py:\d+\)"):
        nki.jit(strided_columns_kernel)(x, 1)


@nki.jit
def reversed_kernel(x, shift):
    """The tile's columns and the HBM tensor's rows walked backwards, by negative steps in ``.ap()``;
    ``shift`` moves the columns' start, which must stay within the row."""
    rows, width = x.shape
    t = load(x)
    flipped = nl.ndarray((rows, width), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=flipped, src=t.ap(pattern=[[width, rows], [-1, width]], offset=width - 1 - shift))
    out = nl.ndarray((rows, width), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out.ap(pattern=[[-width, rows], [1, width]], offset=(rows - 1) * width), src=flipped)
    return out


def test_ap_views_walk_backwards_with_negative_steps_and_stay_within_the_row():
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    np.testing.assert_array_equal(reversed_kernel(x, 0), x[::-1, ::-1])
    with pytest.raises(OutOfBoundsError, match=r"free offsets \[-1, 14\] outside its 16 elements per partition"):
        reversed_kernel(x, 1)


@nki.jit
def row_squares_kernel(x):
    """An activation_reduce whose dst is a zero-step access pattern over one element per row (the library's
    RMSNorm keeps only the row sums): every value still enters the sum."""
    rows, width = x.shape
    scratch = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    total = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=scratch.ap(pattern=[[1, rows], [0, width]]), op=nl.square, data=load(x),
                           reduce_op=nl.add, reduce_res=total)
    out = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=total)
    return out


def test_an_activation_into_a_zero_step_view_sums_all_its_values():
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    np.testing.assert_allclose(row_squares_kernel(x), np.square(x).sum(axis=1, keepdims=True), rtol=1e-5)
