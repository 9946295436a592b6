"""Races between program instances that share HBM (``core/races.py``): the two programs of an LNC2
launch and the instances of a legacy SPMD grid touching the same bytes, one writing, with nothing
ordering them, are reported with both sites; a barrier or a sendrecv orders them; disjoint work,
shared reads and atomic accumulations are not races."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from nki_ops.sim import RaceError, SimConfig, SimulatorWarning, configure
from nki_ops.sim import nki as legacy_nki
from nki_ops.sim import nl as legacy_nl
from nki_ops.sim.frontends import current as nki

from .current_tiles import load

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation
ROWS, COLS = 4, 8


def _race_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, SimulatorWarning) and "HBM race" in str(w.message)]


def run_and_collect(kernel, *args):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = kernel(*args)
    return out, _race_warnings(record)


# ----------------------------------------------------------------------------------- LNC2 (current API)

def lnc2_kernel(order: str):
    """Program 0 writes row block 0 of ``out``; program 1 reads it back into row block 1. ``order``:
    "none" (a race), "barrier" (core_barrier between), "sendrecv" (a sendrecv pair between)."""
    def kernel(x):
        out = nl.ndarray((2 * ROWS, COLS), dtype=x.dtype, buffer=nl.shared_hbm)
        pid = nl.program_id(0)
        if pid == 0:
            nisa.dma_copy(dst=out[0:ROWS, :], src=load(x))
        if order == "barrier":
            nisa.core_barrier(data=out, cores=(0, 1))
        elif order == "sendrecv":
            token = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=token, value=1.0)
            back = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.sendrecv(dst=back, src=token, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)
        if pid == 1:
            copy = nl.ndarray((ROWS, COLS), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=copy, src=out[0:ROWS, :])
            nisa.dma_copy(dst=out[ROWS:2 * ROWS, :], src=copy)
        return out
    return nki.jit(kernel, platform_target="trn2")[2]


def test_lnc2_programs_touching_the_same_hbm_unordered_race():
    x = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
    _, reports = run_and_collect(lnc2_kernel("none"), x)
    assert len(reports) == 1
    report = reports[0]
    assert "HBM race on 'ndarray@test_races.py:" in report and "program 0 of the LNC2 launch" in report
    assert "program 1 of the LNC2 launch" in report and "nisa.dma_copy" in report
    # Both sites: the access that found the race, first, and the earlier one it races with.
    assert re.match(r".*test_races\.py:\d+: HBM race", report)
    assert re.search(r"the same bytes at .*test_races\.py:\d+ \(nisa\.dma_copy\)", report)


@pytest.mark.parametrize("order", ["barrier", "sendrecv"])
def test_a_barrier_or_sendrecv_orders_the_programs(order):
    x = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
    out, reports = run_and_collect(lnc2_kernel(order), x)
    assert reports == []
    np.testing.assert_array_equal(out, np.concatenate([x, x]))


def test_strict_races_raise_with_both_sites():
    x = np.ones((ROWS, COLS), np.float32)
    with configure(races="error"), pytest.raises(RaceError, match="HBM race on .*test_races.py:\\d+"):
        lnc2_kernel("none")(x)


def test_races_off_checks_nothing():
    with configure(races="off"):
        _, reports = run_and_collect(lnc2_kernel("none"), np.ones((ROWS, COLS), np.float32))
    assert reports == []


def test_lnc2_programs_on_disjoint_rows_and_shared_inputs_do_not_race():
    @nki.jit(platform_target="trn2")
    def halves(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        pid = nl.program_id(0)
        whole = load(x)  # both programs read all of x: reads never race
        nisa.dma_copy(dst=out[pid * ROWS:(pid + 1) * ROWS, :], src=whole[pid * ROWS:(pid + 1) * ROWS, :])
        return out

    x = np.arange(2 * ROWS * COLS, dtype=np.float32).reshape(2 * ROWS, COLS)
    out, reports = run_and_collect(halves[2], x)
    assert reports == []
    np.testing.assert_array_equal(out, x)


def test_interleaved_strided_halves_are_checked_element_by_element():
    """Even and odd columns: their bounding boxes overlap, their bytes do not."""
    @nki.jit(platform_target="trn2")
    def strided(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        pid = nl.program_id(0)
        tile = nl.ndarray((ROWS, COLS // 2), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x[:, pid:COLS:2])
        nisa.dma_copy(dst=out[:, pid:COLS:2], src=tile)
        return out

    x = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
    out, reports = run_and_collect(strided[2], x)
    assert reports == []
    np.testing.assert_array_equal(out, x)


def test_identical_writes_are_still_reported():
    @nki.jit(platform_target="trn2")
    def both_write(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=load(x))
        return out

    _, reports = run_and_collect(both_write[2], np.ones((ROWS, COLS), np.float32))
    assert len(reports) == 1 and "writes it here" in reports[0] and "writes the same bytes" in reports[0]


# ----------------------------------------------------------------------------------- legacy SPMD grid

def grid_kernel(overlap: int):
    """Each instance stores a block of ``ROWS`` rows, starting ``ROWS - overlap`` rows after the last one's."""
    @legacy_nki.jit
    def kernel(x):
        out = legacy_nl.ndarray((2 * ROWS, COLS), dtype=x.dtype, buffer=legacy_nl.shared_hbm)
        start = legacy_nl.program_id(0) * (ROWS - overlap)
        tile = legacy_nl.load(x[0:ROWS, :])
        legacy_nl.store(out[start:start + ROWS, :], value=tile)
        return out
    return kernel[2]


def test_grid_instances_writing_overlapping_rows_race():
    x = np.ones((ROWS, COLS), np.float32)
    _, reports = run_and_collect(grid_kernel(overlap=1), x)
    assert len(reports) == 1
    assert "grid instance (1,)" in reports[0] and "grid instance (0,)" in reports[0]


def test_grid_instances_writing_their_own_rows_do_not_race():
    x = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
    out, reports = run_and_collect(grid_kernel(overlap=0), x)
    assert reports == []
    np.testing.assert_array_equal(out, np.concatenate([x, x]))


def test_grid_instances_reading_what_another_wrote_race():
    @legacy_nki.jit
    def kernel(x):
        out = legacy_nl.ndarray((ROWS, COLS), dtype=x.dtype, buffer=legacy_nl.shared_hbm)
        if legacy_nl.program_id(0) == 0:
            legacy_nl.store(out, value=legacy_nl.load(x))
        else:
            legacy_nl.store(x, value=legacy_nl.load(out))  # reads out, which instance 0 writes
        return out

    with configure(SimConfig(races="error")), pytest.raises(RaceError, match="reads it here"):
        kernel[2](np.ones((ROWS, COLS), np.float32))


@pytest.mark.parametrize("row", [0, 2])
def test_lnc2_programs_scattering_into_the_same_row_race(row):
    """Both programs scatter one element through ``.ap(vector_offset=...)`` to the first column of the row
    ``rows`` names: row 0 (the tensor's first address alone) as well as any other."""
    @nki.jit(platform_target="trn2")
    def scatter(x, rows):
        out = nl.ndarray((ROWS, COLS), dtype=x.dtype, buffer=nl.shared_hbm)
        target = out.ap(pattern=[[COLS, 1], [1, 1]], vector_offset=load(rows), indirect_dim=0)
        nisa.dma_copy(dst=target, src=load(x))
        return out

    x = np.full((1, 1), 3.0, np.float32)
    out, reports = run_and_collect(scatter[2], x, np.array([[row]], np.int32))
    assert len(reports) == 1 and "nisa.dma_copy" in reports[0]
    assert out[row, 0] == 3.0


@pytest.mark.parametrize("second", ["slice", "ap"])
def test_a_write_through_an_access_pattern_races_with_the_other_programs_write(second):
    """Program 0 writes row 0 of ``out`` through ``.ap()``; program 1 writes it through a slice or another
    ``.ap()``: the same bytes, in order on neither; program 1 writing row 1 instead is no race."""
    def kernel(x, row):
        out = nl.ndarray((ROWS, COLS), dtype=x.dtype, buffer=nl.shared_hbm)
        if nl.program_id(0) == 0:
            nisa.dma_copy(dst=out.ap(pattern=[[COLS, 1], [1, COLS]]), src=load(x))
        elif second == "ap":
            nisa.dma_copy(dst=out.ap(pattern=[[COLS, 1], [1, COLS]], offset=row * COLS), src=load(x))
        else:
            nisa.dma_copy(dst=out[row:row + 1, :], src=load(x))
        return out

    x = np.ones((1, COLS), np.float32)
    _, reports = run_and_collect(nki.jit(kernel, platform_target="trn2")[2], x, 0)
    assert len(reports) == 1 and "writes the same bytes" in reports[0]
    _, reports = run_and_collect(nki.jit(kernel, platform_target="trn2")[2], x, 1)
    assert reports == []


def test_atomic_accumulations_do_not_race_with_each_other():
    """Both instances ``nl.atomic_rmw`` into the same rows of ``acc``; one plain store into them races."""
    def kernel(acc, rows, value, plain):
        legacy_nl.atomic_rmw(acc[legacy_nl.load(rows), legacy_nl.arange(COLS)[None, :]], value=legacy_nl.load(value),
                             op=np.add)
        if plain and legacy_nl.program_id(0) == 1:
            legacy_nl.store(acc[0:ROWS, :], value=legacy_nl.load(value))
        return acc

    acc = np.zeros((ROWS, COLS), np.float32)
    rows = np.arange(ROWS, dtype=np.int32).reshape(ROWS, 1)
    value = np.ones((ROWS, COLS), np.float32)
    out, reports = run_and_collect(legacy_nki.jit(kernel)[2], acc, rows, value, False)
    assert reports == []
    np.testing.assert_array_equal(out, 2 * value)
    _, reports = run_and_collect(legacy_nki.jit(kernel)[2], np.zeros_like(acc), rows, value, True)
    assert len(reports) == 1 and "nl.atomic_rmw" in reports[0] and "nl.store" in reports[0]


def test_masked_gathers_are_checked_only_where_the_mask_and_the_tensor_reach():
    """A masked legacy gather whose masked-off indices fall outside the table (the public resize kernels'
    pattern) runs in a grid; two instances gathering rows of one table and storing disjoint rows do not race."""
    @legacy_nki.jit
    def gather_rows(table, rows):
        out = legacy_nl.ndarray((2 * ROWS, COLS), dtype=table.dtype, buffer=legacy_nl.shared_hbm)
        pid = legacy_nl.program_id(0)
        i_p, i_f = legacy_nl.mgrid[0:ROWS, 0:COLS]
        index = legacy_nl.load(rows[i_p, legacy_nl.arange(1)[None, :]])
        valid = i_p < ROWS - 1  # the last index is out of the table: masked off
        tile = legacy_nl.load(table[index, i_f], mask=valid)
        legacy_nl.store(out[pid * ROWS + i_p, i_f], value=tile, mask=valid)
        return out

    table = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
    rows = np.array([[2], [0], [3], [ROWS + 5]], np.int32)
    with configure(races="error"):
        out = gather_rows[2](table, rows)
    for pid in range(2):
        np.testing.assert_array_equal(out[pid * ROWS:pid * ROWS + ROWS - 1], table[rows[:ROWS - 1, 0]])
