"""Legacy-API instructions AWS's API example tests use (Neuron 2.26 docs and later): each a small
kernel of ours checked against NumPy or against the documented error. Their semantics are the
shared core instructions the current API uses too."""

from __future__ import annotations

import numpy as np
import pytest

from nki_ops.sim import KernelUsageError, OutOfBoundsError, SimConfig, nisa, nki, nl, simulate
from nki_ops.sim.frontends.legacy import internal

pytestmark = pytest.mark.simulation

RNG = np.random.default_rng(23)
FP32_MIN = np.finfo(np.float32).min


def run(body, *arrays, **config):
    return simulate(nki.jit(body), *arrays, config=SimConfig(**config))


def output(shape, dtype=nl.float32):
    return nl.ndarray(shape, dtype, buffer=nl.shared_hbm)


# ------------------------------------------------------------------------ nl.rand, max8, find/replace

def test_nl_rand_tile_feeds_max8():
    def kernel():
        data, top = output((16, 64)), output((16, 8))
        t = nl.rand((16, 64))
        nl.store(data, t)
        nl.store(top, nisa.max8(src=t))
        return data, top

    data, top = run(kernel)
    assert ((data >= 0) & (data < 1)).all() and len(np.unique(data)) > 1000
    np.testing.assert_array_equal(top, -np.sort(-data, axis=1)[:, :8])


def test_max8_under_a_mask_reads_only_the_selected_elements():
    x = RNG.standard_normal((32, 40)).astype(np.float32)

    def kernel(x):
        out = output((32, 8))
        i_p, i_f = nl.mgrid[0:32, 0:40]
        nl.store(out, nisa.max8(src=nl.load(x)[i_p, i_f], mask=(i_f < 20)))
        return out

    np.testing.assert_array_equal(run(kernel, x), -np.sort(-x[:, :20], axis=1)[:, :8])


def test_max8_needs_8_elements_per_partition():
    def kernel(x):
        nisa.max8(src=nl.load(x))

    with pytest.raises(Exception, match="4 elements read per partition, expected 8 to 16384"):
        run(kernel, np.zeros((4, 4), np.float32))


def test_nc_find_index8_pairs_duplicates_in_order_and_marks_absent_values():
    data = np.array([[5, 7, 5, 9, 5, 1, 2, 3, 4, 6]], np.float32)
    vals = np.array([[5, 5, 9, 42, 1, 5, 5, 3]], np.float32)

    def kernel(data, vals):
        out32, out16 = output((1, 8), nl.uint32), output((1, 8), nl.uint16)
        d, v = nl.load(data), nl.load(vals)
        nl.store(out32, nisa.nc_find_index8(data=d, vals=v))
        nl.store(out16, nisa.nc_find_index8(data=d, vals=v, dtype=nl.uint16))
        return out32, out16

    got32, got16 = run(kernel, data, vals)
    # The 5s pair with positions 0, 2, 4 in turn; the fourth 5 and 42 are not found (all ones).
    np.testing.assert_array_equal(got32[0], [0, 2, 3, 0xFFFFFFFF, 5, 4, 0xFFFFFFFF, 7])
    np.testing.assert_array_equal(got16[0], [0, 2, 3, 0xFFFF, 5, 4, 0xFFFF, 7])


def test_nc_match_replace8_replaces_the_top8_and_writes_their_positions():
    x = RNG.permutation(128 * 64).reshape(128, 64).astype(np.float32)

    def kernel(x):
        out, idx = output((128, 64)), output((128, 8), nl.uint32)
        t = nl.load(x)
        where = nl.ndarray((128, 8), dtype=nl.uint32)
        nl.store(out, nisa.nc_match_replace8(data=t, vals=nisa.max8(src=t), imm=-1.0, dst_idx=where))
        nl.store(idx, where)
        return out, idx

    got, idx = run(kernel, x)
    order = np.argsort(-x, axis=1)[:, :8]
    expected = x.copy()
    np.put_along_axis(expected, order, -1.0, axis=1)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(idx, order)


def test_nc_match_replace8_takes_vals_from_the_last_and_the_first_occurrence():
    # The API page's example: duplicate vals fill dst_idx slots in descending order ...
    data = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8], [6, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0]], np.float32)
    vals = np.array([[3, 8, 8, 8, 8, 8, 8, 8], [6, 9, 9, 9, 9, 9, 9, 9]], np.float32)

    def kernel(data, vals):
        out, idx = output((2, 11)), output((2, 8), nl.uint32)
        where = nl.ndarray((2, 8), dtype=nl.uint32)
        nl.store(out, nisa.nc_match_replace8(data=nl.load(data), vals=nl.load(vals), imm=-5.0, dst_idx=where))
        nl.store(idx, where)
        return out, idx

    got, idx = run(kernel, data, vals)
    np.testing.assert_array_equal(idx[0], [2, 10, 9, 8, 7, 6, 5, 4])
    # ... and a single value replaces its first occurrence; an absent one gives all ones.
    np.testing.assert_array_equal(idx[1], [0] + [0xFFFFFFFF] * 7)
    np.testing.assert_array_equal(got[1], [-5, 6] + [0] * 9)
    np.testing.assert_array_equal(got[0], [1, 2, -5, 4] + [-5] * 7)


def test_current_api_nc_match_replace8_shares_the_order():
    from nki_ops.sim.frontends import current

    cnl, cnisa = current.language, current.isa
    data = np.array([[7, 7, 7, 1, 2, 3, 4, 5]], np.float32)
    vals = np.array([[7, 7, 1, 2, 3, 4, 5, 9]], np.float32)

    @current.jit
    def kernel(data, vals):
        out = cnl.ndarray((1, 8), dtype=cnl.uint32, buffer=cnl.shared_hbm)
        d = cnl.ndarray((1, 8), dtype=cnl.float32, buffer=cnl.sbuf)
        v = cnl.ndarray((1, 8), dtype=cnl.float32, buffer=cnl.sbuf)
        idx = cnl.ndarray((1, 8), dtype=cnl.uint32, buffer=cnl.sbuf)
        cnisa.dma_copy(dst=d, src=data)
        cnisa.dma_copy(dst=v, src=vals)
        cnisa.nc_match_replace8(dst=d, data=d, vals=v, imm=0.0, dst_idx=idx)
        cnisa.dma_copy(dst=out, src=idx)
        return out

    np.testing.assert_array_equal(current.simulate(kernel)(data, vals)[0], [1, 0, 3, 4, 5, 6, 7, 0xFFFFFFFF])


# ------------------------------------------------------------------------------- stream shuffle

def test_nc_stream_shuffle_rotates_each_quadrant_and_255_keeps_dst():
    x = RNG.standard_normal((64, 16)).astype(np.float32)
    mask = [(i - 1) % 32 for i in range(32)]
    mask[5] = 255

    def kernel(x):
        out = output((64, 16))
        t = nl.load(x)
        d = nl.full((64, 16), 3.0, nl.float32)
        nisa.nc_stream_shuffle(src=t, dst=d, shuffle_mask=mask)
        nl.store(out, d)
        return out

    expected = np.full_like(x, 3.0)
    for p in range(64):
        if mask[p % 32] != 255:
            expected[p] = x[p - p % 32 + mask[p % 32]]
    np.testing.assert_array_equal(run(kernel, x), expected)


def test_nc_stream_shuffle_broadcasts_one_partition_and_refuses_a_missing_one():
    x = RNG.standard_normal((1, 16)).astype(np.float32)

    def kernel(x, source):
        out = output((32, 16))
        d = nl.ndarray((32, 16), nl.float32)
        nisa.nc_stream_shuffle(src=nl.load(x), dst=d, shuffle_mask=[source] * 32)
        nl.store(out, d)
        return out

    np.testing.assert_array_equal(run(kernel, x, 0), np.repeat(x, 32, axis=0))
    with pytest.raises(OutOfBoundsError, match="partition 0 reads partition 1 of a 1-partition src"):
        run(kernel, x, 1)


# ----------------------------------------------------------------- range_select, select_reduce

def range_select_kernel(x, lo, hi, on_false=nl.fp32.min):
    out, acc = output((2, 16, 40)), output((16, 1))
    t, b0, b1 = nl.load(x), nl.load(lo), nl.load(hi)
    res = nl.ndarray((16, 1), nl.float32)
    nl.store(out[0], nisa.range_select(on_true_tile=t, comp_op0=np.greater_equal, comp_op1=np.less, bound0=b0,
                                       bound1=b1, reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=np.max,
                                       range_start=5, on_false_value=on_false))
    nl.store(out[1], nisa.range_select(on_true_tile=t, comp_op0=np.greater_equal, comp_op1=np.less, bound0=b0,
                                       bound1=b1, reduce_cmd=nisa.reduce_cmd.reduce, reduce_res=res,
                                       range_start=45))
    nl.store(acc, res)
    return out, acc


def test_range_select_keeps_a_window_and_chains_its_max():
    x = RNG.standard_normal((16, 40)).astype(np.float32)
    lo = RNG.integers(0, 40, (16, 1)).astype(np.float32)
    hi = lo + RNG.integers(1, 60, (16, 1)).astype(np.float32)
    out, acc = run(range_select_kernel, x, lo, hi, target="trn2")
    expected = [np.where((lo <= start + np.arange(40)) & (start + np.arange(40) < hi), x, FP32_MIN)
                for start in (5, 45)]
    np.testing.assert_array_equal(out, np.stack(expected))
    np.testing.assert_array_equal(acc, np.maximum(expected[0].max(1, keepdims=True),
                                                  expected[1].max(1, keepdims=True)))


def test_range_select_rules():
    arrays = [np.zeros((16, 40), np.float32), np.zeros((16, 1), np.float32), np.ones((16, 1), np.float32)]
    with pytest.raises(KernelUsageError, match="range_select needs NeuronCore-v3"):
        run(range_select_kernel, *arrays, target="trn1")
    with pytest.raises(KernelUsageError, match="on_false_value must be FP32_MIN"):
        run(range_select_kernel, *arrays, -1e30, target="trn2")


def test_select_reduce_with_a_column_on_false_and_the_max():
    x = RNG.standard_normal((32, 24)).astype(np.float32)
    pred = RNG.integers(0, 2, (32, 24)).astype(np.uint8)
    other = RNG.standard_normal((32, 1)).astype(np.float32)

    def kernel(x, pred, other, reverse):
        out, acc = output((32, 24)), output((32, 1))
        d, r = nl.ndarray((32, 24), nl.float32), nl.ndarray((32, 1), nl.float32)
        nisa.select_reduce(dst=d, predicate=nl.load(pred), on_true=nl.load(x), on_false=nl.load(other),
                           reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=r, reduce_op=nl.max,
                           reverse_pred=reverse)
        nl.store(out, d)
        nl.store(acc, r)
        return out, acc

    for reverse in (False, True):
        out, acc = run(kernel, x, pred, other, reverse)
        expected = np.where((pred != 0) != reverse, x, other)
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(acc, expected.max(1, keepdims=True))
    with pytest.raises(KernelUsageError, match="predicate must be int8, uint8, int16, uint16, bool, got float32"):
        run(kernel, x, pred.astype(np.float32), other, False)


def test_tensor_copy_predicated_with_a_bool_predicate_and_a_scalar():
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    pred = x > 0

    def kernel(x, pred):
        out = output((2, 8, 16))
        t, p = nl.load(x), nl.load(pred)
        a, b = nl.zeros((8, 16), nl.float32), nl.full((8, 16), 2.0, nl.float32)
        nisa.tensor_copy_predicated(src=t, dst=a, predicate=p)
        nisa.tensor_copy_predicated(src=7.0, dst=b, predicate=p, reverse_pred=True)
        nl.store(out[0], a)
        nl.store(out[1], b)
        return out

    got = run(kernel, x, pred)
    np.testing.assert_array_equal(got[0], np.where(pred, x, 0))
    np.testing.assert_array_equal(got[1], np.where(pred, 2.0, 7.0))


# ------------------------------------------------------------------- tensor_scalar_cumulative

def test_tensor_scalar_cumulative_reset_reduce_and_load_reduce():
    x = RNG.standard_normal((16, 12)).astype(np.float32)
    start = RNG.standard_normal((16, 1)).astype(np.float32)

    def kernel(x, start):
        out = output((4, 16, 12))
        t = nl.load(x)
        d = nl.ndarray((4, 16, 12), nl.float32)
        nisa.tensor_scalar_cumulative(src=t, dst=d[0], op0=nl.multiply, op1=nl.add, imm0=2.0)
        nisa.tensor_scalar_cumulative(src=t, dst=d[1], op0=nl.add, op1=nl.add, imm0=0.0,
                                      reduce_cmd=nisa.reduce_cmd.reduce)
        nisa.tensor_scalar_cumulative(src=t, dst=d[2], op0=nl.add, op1=nl.maximum, imm0=1.0, imm1=nl.load(start),
                                      reduce_cmd=nisa.reduce_cmd.load_reduce)
        nisa.tensor_scalar_cumulative(src=t, dst=d[3], op0=nl.add, op1=nl.subtract, imm0=0.0)
        for i in nl.static_range(4):
            nl.store(out[i], d[i])
        return out

    got = run(kernel, x, start)
    first = np.cumsum(2 * x, axis=1, dtype=np.float32)
    np.testing.assert_allclose(got[0], first, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], first[:, -1:] + np.cumsum(x, axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[2], np.maximum.accumulate(np.concatenate([start, x + 1], 1), axis=1)[:, 1:])
    # As the API page writes it: acc = op1(step, acc), so subtract alternates x[i] - acc.
    acc, alternating = np.zeros(16, np.float32), np.empty_like(x)
    for i in range(12):
        acc = x[:, i] - acc
        alternating[:, i] = acc
    np.testing.assert_allclose(got[3], alternating, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------- dropout

def test_dropout_probability_per_partition():
    x = RNG.uniform(1, 2, (4, 2000)).astype(np.float32)
    prob = np.array([[0.0], [1.0], [0.25], [0.75]], np.float32)

    def kernel(x, prob):
        out = output((2, 4, 2000))
        t = nl.load(x)
        nl.store(out[0], nisa.dropout(t, prob=nl.load(prob)))
        nl.store(out[1], nisa.dropout(t, prob=1.0))
        return out

    got = run(kernel, x, prob)
    dropped = (got[0] == 0).mean(axis=1)
    np.testing.assert_array_equal(got[0][got[0] != 0], x[got[0] != 0])
    assert dropped[0] == 0 and dropped[1] == 1 and abs(dropped[2] - 0.25) < 0.05 and abs(dropped[3] - 0.75) < 0.05
    assert not got[1].any()


# --------------------------------------------------------------------------- GpSimd, DMA, gathers

def test_local_gather_and_sequence_bounds():
    src = RNG.standard_normal((32, 64)).astype(np.float32)
    index = RNG.integers(0, 31, (32, 2)).astype(np.uint16)
    ids = np.array([[0, 3, 3, 5, 5, 5, 0, 2]], np.float32)

    def kernel(src, index, ids):
        gathered, bounds = output((32, 24)), output((1, 2, 8))
        nl.store(gathered, nisa.local_gather(nl.load(src), nl.load(index), num_elem_per_idx=2,
                                             num_valid_indices=12))
        nl.store(bounds, nisa.sequence_bounds(segment_ids=nl.load(ids)))
        return gathered, bounds

    gathered, bounds = run(kernel, src, index, ids)
    for core in range(2):
        rows = slice(16 * core, 16 * core + 16)
        offsets = index[rows].flatten(order="F")[:12]
        where = (offsets[:, None] + np.arange(2)).reshape(-1)
        np.testing.assert_array_equal(gathered[rows], src[rows][:, where])
    np.testing.assert_array_equal(bounds[0], [[8, 1, 1, 3, 3, 3, 8, 7], [-1, 3, 3, 6, 6, 6, -1, 8]])


def test_dma_transpose_from_hbm_and_sbuf_and_the_isa_constants_module():
    x = RNG.standard_normal((6, 4, 3)).astype(np.float32)

    def kernel(x):
        out2, out3 = output((4, 6)), output((3, 4, 6))
        nl.store(out2, nisa.dma_transpose(x[:, :, 0]))
        nl.store(out3, nisa.dma_transpose(nl.load(x), axes=(2, 1, 0)))
        return out2, out3

    two, three = run(kernel, x)
    np.testing.assert_array_equal(two, x[:, :, 0].T)
    np.testing.assert_array_equal(three, x.transpose(2, 1, 0))
    assert internal.MODULES["neuronxcc.nki.isa.constants"].dge_mode is nisa.dge_mode

    def bad(x):
        nisa.dma_transpose(nl.load(x), axes=(0, 2, 1))

    with pytest.raises(KernelUsageError, match=r"axes must be \(1, 0\), \(2, 1, 0\) or \(3, 1, 2, 0\)"):
        run(bad, x)


def test_gather_flattened_and_its_bounds():
    data = RNG.standard_normal((8, 4, 5)).astype(np.float32)
    indices = RNG.integers(0, 20, (8, 7)).astype(np.uint32)

    def kernel(data, indices):
        out = output((8, 7))
        nl.store(out, nl.gather_flattened(data=nl.load(data), indices=nl.load(indices)))
        return out

    np.testing.assert_array_equal(run(kernel, data, indices), np.take_along_axis(data.reshape(8, -1), indices, 1))
    with pytest.raises(OutOfBoundsError, match=r"indices \[.*, 20\] outside the 20 elements per partition"):
        run(kernel, data, np.full((8, 7), 20, np.uint32))


def test_atomic_rmw_adds_every_repeated_index():
    base = RNG.standard_normal((16, 8)).astype(np.float32)
    rows = RNG.integers(0, 4, (16, 1)).astype(np.int32)
    value = RNG.standard_normal((16, 8)).astype(np.float32)

    def kernel(base, rows, value):
        out = output((16, 8))
        nl.store(out, nl.load(base))
        nl.atomic_rmw(out[nl.load(rows), nl.arange(8)[None, :]], value=nl.load(value), op=np.add)
        return out

    expected = base.copy()
    np.add.at(expected, rows[:, 0], value)
    np.testing.assert_allclose(run(kernel, base, rows, value), expected, rtol=1e-6, atol=1e-6)
