"""Current API: DMA and kernel-output rules the 2.32 API pages (and the NKI migration guide) state, each
refused where the page says the kernel is illegal, next to its legal neighbour, which still runs."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from nki_ops.sim.core.errors import KernelUsageError, SimulatorWarning
from nki_ops.sim.frontends import current as nki

from .current_tiles import load, on, store

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation
RNG = np.random.default_rng(23)


# ------------------------------------------------------------------------------ DMA priority

def copy_with_priority(x, priority):
    tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x, priority=priority)
    return store(tile)


def transpose_with_priority(x, priority):
    tile = nl.ndarray(x.shape[::-1], dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=tile, src=x, priority=priority)
    return store(tile)


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("kernel", [copy_with_priority, transpose_with_priority])
def test_dma_priority_before_neuroncore_v4_is_refused(target, kernel):
    """nki.isa.dma_copy and nki.isa.dma_transpose pages, ``priority``: "DMA quality-of-service priority
    level 0-3 where lower is higher priority (NeuronCore-v4+ only)"."""
    x = RNG.standard_normal((16, 8)).astype(np.float16)
    with pytest.raises(KernelUsageError, match=rf"NeuronCore-v4 \(trn3\) and newer.*target {target}.*priority=1"):
        on(target, kernel)(x, 1)


@pytest.mark.parametrize("kernel, expected", [(copy_with_priority, lambda x: x),
                                              (transpose_with_priority, lambda x: x.T)])
def test_dma_priority_on_trn3_and_no_priority_elsewhere_run(kernel, expected):
    x = RNG.standard_normal((16, 8)).astype(np.float16)
    np.testing.assert_array_equal(on("trn3", kernel)(x, 1), expected(x))
    np.testing.assert_array_equal(on("trn2", kernel)(x, None), expected(x))


# ------------------------------------------------------------------------------ hardware DGE

def hwdge_copy(x, dtype):
    tile = nl.ndarray(x.shape, dtype=dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x, dge_mode=nisa.dge_mode.hwdge)
    return store(tile)


def test_hwdge_dma_copy_on_trn1_warns():
    """nki.isa.dma_copy page, ``dge_mode``: "Hardware based DGE is only supported for NeuronCore-v3 or
    newer". A SimulatorWarning, not an error: AWS's kernel library passes dge_mode=hwdge unconditionally
    in mlp_tkg's gate/up projection, whose tests also run on trn1."""
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    with pytest.warns(SimulatorWarning, match=r"dge_mode=hwdge needs NeuronCore-v3 \(trn2\).*target is trn1"):
        np.testing.assert_array_equal(on("trn1", hwdge_copy)(x, nl.float32), x)


@pytest.mark.parametrize("target", ["trn2", "trn3"])
def test_hwdge_dma_copy_on_trn2_and_later_runs_without_warning(target):
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SimulatorWarning)
        np.testing.assert_array_equal(on(target, hwdge_copy)(x, nl.float32), x)


def test_hwdge_dma_copy_that_changes_dtype_is_refused():
    """NKI migration guide (NKI 0.3.0), "nisa.dma_copy — dge_mode type matching": "NKI 0.3.0 enforces
    that source and destination element types must match when using dge_mode=dge_mode.hwdge"."""
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    with pytest.raises(KernelUsageError, match=r"dge_mode=hwdge moves raw bytes.*got src float32 -> dst bfloat16"):
        on("trn2", hwdge_copy)(x, nl.bfloat16)


def test_dma_copy_casts_without_hwdge_and_hwdge_moves_a_reinterpreted_view():
    x = RNG.standard_normal((4, 8)).astype(np.float32)

    def casts(x, mode):
        tile = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x, dge_mode=mode)
        return store(tile)

    for mode in (nisa.dge_mode.unknown, nisa.dge_mode.swdge, nisa.dge_mode.none):
        np.testing.assert_array_equal(on("trn2", casts)(x, mode), x.astype(ml_dtypes.bfloat16))

    def reinterprets(x):
        tile = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x.view(nl.int32), dge_mode=nisa.dge_mode.hwdge)
        return store(tile)

    np.testing.assert_array_equal(on("trn2", reinterprets)(x), x.view(np.int32))


# ------------------------------------------------------------------------------ dma_transpose oob_mode

def test_dma_transpose_skip_without_an_indirect_source_is_refused():
    """nki.isa.dma_transpose page, ``oob_mode``: "oob_mode.skip: Silently skips any operations involving
    out-of-bounds indices. Only valid when src uses indirect indexing."."""
    def kernel(x):
        dst = nl.ndarray(x.shape[::-1], dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=dst, src=x[0:16, 0:8], oob_mode=nisa.oob_mode.skip)

    with pytest.raises(KernelUsageError, match=r"oob_mode=oob_mode.skip is valid only when src uses indirect "
                                               r"indexing.*static addresses"):
        on("trn2", kernel)(np.ones((16, 8), ml_dtypes.bfloat16))


def test_dma_transpose_skip_with_a_gathered_or_scalar_offset_source_runs():
    table = RNG.standard_normal((40, 8)).astype(ml_dtypes.bfloat16)
    rows = RNG.permutation(40)[:16].reshape(16, 1).astype(np.int32)

    def gathered(table, rows):
        dst = nl.ndarray((8, 16), dtype=table.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=dst, src=table.vector_select(0, load(rows)), oob_mode=nisa.oob_mode.skip)
        return store(dst)

    np.testing.assert_array_equal(on("trn2", gathered)(table, rows), table[rows[:, 0]].T)

    def scalar_offset(table, start):
        # An in-range scalar_offset leaves no trace on the view, so any .ap() view may use skip.
        dst = nl.ndarray((8, 16), dtype=table.dtype, buffer=nl.sbuf)
        src = table.ap(pattern=[[8, 16], [1, 8]], offset=0, scalar_offset=load(start), indirect_dim=0)
        nisa.dma_transpose(dst=dst, src=src, oob_mode=nisa.oob_mode.skip)
        return store(dst)

    np.testing.assert_array_equal(on("trn2", scalar_offset)(table, np.array([[3]], np.int32)), table[3:19].T)


# ------------------------------------------------------------------------------ dma_compute unique_indices

def scatter_add(table, rows, updates, unique):
    """table[rows[i]] += updates[i]: a scatter read-add-write through .ap(vector_offset=...)."""
    n, d = updates.shape
    target = table.ap(pattern=[[d, n], [1, d]], vector_offset=load(rows), indirect_dim=0)
    nisa.dma_compute(dst=target, srcs=[target, load(updates)], reduce_op=nl.add, unique_indices=unique)


def test_dma_compute_scatter_with_non_unique_indices_is_refused():
    """nki.isa.dma_compute page: scatter and gather read-modify-write "Both modes require: ...
    unique_indices must be True (non-unique indices not yet supported)"; ``unique_indices``: "Must be
    True when using vector_offset (non-unique not yet supported)"."""
    table, updates = RNG.standard_normal((6, 4)).astype(np.float32), RNG.standard_normal((3, 4)).astype(np.float32)
    with pytest.raises(KernelUsageError, match=r"unique_indices must be True with an indirect \(vector_offset\) "
                                               r"access.*got unique_indices=False"):
        on("trn2", scatter_add)(table, np.array([[1], [4], [1]], np.int32), updates, False)


def test_dma_compute_scatter_with_unique_indices_and_direct_sum_with_either_flag_run():
    table, updates = RNG.standard_normal((6, 4)).astype(np.float32), RNG.standard_normal((3, 4)).astype(np.float32)
    expected = table.copy()
    expected[[1, 4, 2]] += updates
    on("trn2", scatter_add)(table, np.array([[1], [4], [2]], np.int32), updates, True)
    np.testing.assert_allclose(table, expected, rtol=1e-6)

    def direct_sum(a, b, unique):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_compute(dst=out, srcs=[a, b], reduce_op=nl.add, unique_indices=unique)
        return out

    a, b = RNG.standard_normal((4, 8)).astype(np.float32), RNG.standard_normal((4, 8)).astype(np.float32)
    for unique in (True, False):
        np.testing.assert_allclose(on("trn2", direct_sum)(a, b, unique), a + b, rtol=1e-6)


# ------------------------------------------------------------------------------ kernel outputs

@pytest.mark.parametrize("buffer", ["hbm", "private_hbm"])
def test_returning_a_private_hbm_tensor_is_refused(buffer):
    """NKI migration guide (NKI 0.3.0), "Output tensors must use nl.shared_hbm": "All kernel output
    (return) tensors must be allocated with buffer=nl.shared_hbm. Using nl.hbm for output tensors will
    cause compilation failures." (nki.language.hbm page: "HBM - Alias of private_hbm".)"""
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=getattr(nl, buffer))
        nisa.dma_copy(dst=out, src=load(x))
        return out

    with pytest.raises(KernelUsageError, match=rf"kernel returned .* allocated in nl\.{buffer} .*must be allocated "
                                               r"with buffer=nl\.shared_hbm"):
        on("trn2", kernel)(np.ones((4, 8), np.float32))


def test_returning_shared_hbm_outputs_and_arguments_runs():
    x = RNG.standard_normal((4, 8)).astype(np.float32)

    def kernel(x, out):
        shared = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        scratch = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.hbm)  # private scratch, not returned
        nisa.dma_copy(dst=scratch, src=x)
        nisa.dma_copy(dst=shared, src=scratch)
        nisa.dma_copy(dst=out, src=load(x))
        return shared, out[0:2, :]

    out = np.zeros_like(x)
    shared, head = on("trn2", kernel)(x, out)
    np.testing.assert_array_equal(shared, x)
    np.testing.assert_array_equal(out, x)
    np.testing.assert_array_equal(head, x[0:2])
