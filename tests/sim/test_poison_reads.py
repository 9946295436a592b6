"""Reads of never-written memory that reach a kernel output: new SBUF/PSUM memory holds a NaN with a
tag that arithmetic and fp32/bf16/fp16 conversions keep; when an output the kernel returns holds it,
a SimulatorWarning names the allocations whose first read found it and the reading instructions'
file:line. A warning, not an error: reading uninitialised memory is no compile error (the device
returns whatever the memory held). Both front ends behave alike."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from nki_ops.sim import SimConfig, SimulatorWarning, configure
from nki_ops.sim import nki as legacy_nki
from nki_ops.sim import nl as legacy_nl
from nki_ops.sim.frontends import current as nki

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation

X = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)


def _line(marker: str) -> int:
    source = open(__file__).read().splitlines()
    return next(i for i, text in enumerate(source, 1) if text.rstrip().endswith(f"# {marker}"))


def _run(kernel, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SimulatorWarning)
        result = kernel(*args)
    return result, [str(w.message) for w in caught if issubclass(w.category, SimulatorWarning)]


def half_written(x):
    t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)  # line ALLOC
    nisa.dma_copy(dst=t[:, 0:32], src=x[:, 0:32])
    r = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=r, data=t, op0=nl.multiply, operand0=2.0)  # line READ
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_never_written_elements_reaching_the_output_are_reported_with_both_sites():
    result, messages = _run(nki.jit(half_written), X)
    assert np.isnan(result[:, 32:]).all() and (result[:, :32] == X[:, :32] * 2).all()
    assert len(messages) == 1
    assert messages[0].startswith(f"{__file__}:{_line('line READ')}: kernel output 'ndarray@test_poison_reads.py:")
    assert (f"'ndarray@test_poison_reads.py:{_line('line ALLOC')}' (allocated at {__file__}:{_line('line ALLOC')}) "
            f"read at {__file__}:{_line('line READ')}") in messages[0]


def stored_straight_from_a_half_written_tile(x):
    t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)  # line DMA_ALLOC
    nisa.dma_copy(dst=t[:, 0:32], src=x[:, 0:32])
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)  # line DMA_READ
    return out


def test_a_dma_reading_never_written_memory_into_the_output_is_reported():
    _, messages = _run(nki.jit(stored_straight_from_a_half_written_tile), X)
    assert len(messages) == 1
    assert f"(allocated at {__file__}:{_line('line DMA_ALLOC')}) read at {__file__}:{_line('line DMA_READ')}" \
        in messages[0]


def only_the_written_half_is_used(x):
    t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[:, 0:32], src=x[:, 0:32])
    out = nl.ndarray((128, 32), x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t[:, 0:32])
    return out


def nan_from_the_input(x):
    t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def nan_from_the_input_through_a_whole_view(x):
    t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[:, 0:64], src=x)  # the view fills t with the sentinel, then the DMA overwrites all of it
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_outputs_without_nan_or_nan_without_never_written_reads_are_not_reported():
    result, messages = _run(nki.jit(only_the_written_half_is_used), X)
    assert (result == X[:, :32]).all() and messages == []
    with_nan = X.copy()
    with_nan[3, 5] = np.nan
    for kernel in (nan_from_the_input, nan_from_the_input_through_a_whole_view):
        result, messages = _run(nki.jit(kernel), with_nan)
        assert np.isnan(result[3, 5]) and np.isnan(result).sum() == 1 and messages == []


def bf16_half_written(x):
    t = nl.ndarray((128, 64), nl.bfloat16, buffer=nl.sbuf)  # line BF16_ALLOC
    nisa.dma_copy(dst=t[:, 0:32], src=x[:, 0:32])
    r = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=r, data=t, op0=nl.multiply, operand0=3.0)  # line BF16_READ
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=r)
    return out


def test_the_tag_survives_bf16_storage_and_fp32_arithmetic():
    _, messages = _run(nki.jit(bf16_half_written), X)
    assert len(messages) == 1
    assert f"(allocated at {__file__}:{_line('line BF16_ALLOC')}) read at {__file__}:{_line('line BF16_READ')}" \
        in messages[0]


def unwritten_output_row_and_an_unrelated_never_written_read(x):
    t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[:, 0:32], src=x[:, 0:32])
    r = nl.ndarray((128, 32), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=r, src=t[:, 0:32])  # t's first read finds never-written elements (not these)
    out = nl.ndarray((129, 32), x.dtype, buffer=nl.shared_hbm)  # its last row is never written
    nisa.dma_copy(dst=out[0:128, :], src=r)
    return out


def test_nan_the_output_holds_for_another_reason_is_not_blamed_on_a_never_written_read():
    result, messages = _run(nki.jit(unwritten_output_row_and_an_unrelated_never_written_read), X)
    assert np.isnan(result[128]).all() and messages == []


def test_zero_filled_new_memory_has_nothing_to_report():
    with configure(SimConfig(uninitialized="zeros")):
        result, messages = _run(nki.jit(half_written), X)
    assert (result[:, 32:] == 0).all() and messages == []


@legacy_nki.jit
def legacy_half_written(x):
    t = legacy_nl.ndarray((128, 64), dtype=legacy_nl.float32, buffer=legacy_nl.sbuf)  # line LEGACY_ALLOC
    t[:, 0:32] = legacy_nl.load(x[:, 0:32])
    out = legacy_nl.ndarray(x.shape, dtype=x.dtype, buffer=legacy_nl.shared_hbm)
    legacy_nl.store(out, legacy_nl.multiply(t, 2.0))  # line LEGACY_READ
    return out


def test_the_legacy_front_end_reports_the_same_way():
    result, messages = _run(legacy_half_written, X)
    assert np.isnan(result[:, 32:]).all()
    assert len(messages) == 1
    assert messages[0].startswith(f"{__file__}:{_line('line LEGACY_READ')}: kernel output ")
    assert f"(allocated at {__file__}:{_line('line LEGACY_ALLOC')}) read at {__file__}:{_line('line LEGACY_READ')}" \
        in messages[0]


@legacy_nki.jit
def legacy_whole_tile_assigned(x):
    t = legacy_nl.ndarray((128, 64), dtype=legacy_nl.float32, buffer=legacy_nl.sbuf)
    t[...] = legacy_nl.load(x)  # every element written: nothing never-written left to read
    out = legacy_nl.ndarray(x.shape, dtype=x.dtype, buffer=legacy_nl.shared_hbm)
    legacy_nl.store(out, legacy_nl.multiply(t, 2.0))
    return out


def test_legacy_nan_from_the_input_in_a_wholly_assigned_tile_is_not_reported():
    with_nan = X.copy()
    with_nan[3, 5] = np.nan
    result, messages = _run(legacy_whole_tile_assigned, with_nan)
    assert np.isnan(result).sum() == 1 and messages == []
