"""Legacy-API semantics the public kernels rely on (issue 11): each test is a small kernel checked
against NumPy, or against the error the compiler gives."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nki_ops.sim import KernelUsageError, MemorySpaceError, SimConfig, UnsupportedError, nisa, nki, nl, simulate

pytestmark = pytest.mark.simulation

RNG = np.random.default_rng(11)
X = RNG.standard_normal((128, 64)).astype(np.float32)


def run(body, *arrays, **config):
    return simulate(nki.jit(body), *(arrays or (X,)), config=SimConfig(**config))


def output(shape, dtype=nl.float32):
    return nl.ndarray(shape, dtype, buffer=nl.shared_hbm)


# ------------------------------------------------------------- wrong answers with no error

def test_reduced_vector_broadcasts_per_partition():
    def kernel(x):
        out = output((128, 128))
        t = nl.load(x)
        total = nl.sum(t, axis=1)
        assert total.shape == (128,)
        nl.store(out, (1.0 / total).broadcast_to((128, 128)))
        return out

    expected = np.broadcast_to(1.0 / X.sum(axis=1, keepdims=True), (128, 128))
    np.testing.assert_allclose(run(kernel), expected, rtol=1e-5)


def test_nl_broadcast_to_of_a_reduced_vector_is_a_column():
    def kernel(x):
        out = output((128, 8))
        nl.store(out, nl.broadcast_to(nl.max(nl.load(x), axis=1), shape=(128, 8)))
        return out

    np.testing.assert_array_equal(run(kernel), np.broadcast_to(X.max(axis=1, keepdims=True), (128, 8)))


def test_a_whole_mgrid_grid_indexes_a_tensor():
    """``t[nl.mgrid[0:128, 0:64]]``, the grid not unpacked (the reciprocal API page's example)."""
    def kernel(x):
        out = output((128, 64))
        nl.store(out[nl.mgrid[0:128, 0:64]], value=nisa.reciprocal(nl.load(x[nl.mgrid[0:128, 0:64]])))
        return out

    np.testing.assert_allclose(run(kernel), np.reciprocal(X), rtol=1e-6)


def test_masked_result_assigned_writes_only_its_selected_elements():
    def kernel(x):
        out = output((128, 64))
        i_p, i_f = nl.mgrid[0:128, 0:64]
        t = nl.load(x)
        d = nl.zeros((128, 64), nl.float32)
        d[...] = nl.add(t, 1.0, mask=(i_f < 16))
        d[i_p, i_f] = nl.multiply(t, 2.0, mask=(i_p >= 100))
        nl.store(out, d)
        return out

    expected = np.zeros_like(X)
    expected[:, :16] = X[:, :16] + 1
    expected[100:] = X[100:] * 2
    np.testing.assert_array_equal(run(kernel), expected)


def test_mask_false_leaves_the_destination_unchanged():
    def kernel(x):
        out = output((128, 64))
        t = nl.load(x)
        d = nl.copy(t)
        d[...] = nl.exp(t, mask=False)
        nl.store(out, d)
        return out

    np.testing.assert_array_equal(run(kernel), X)


def test_masked_result_stored_without_mask_holds_poison_outside():
    def kernel(x):
        out = output((128, 64))
        i_f = nl.arange(64)[None, :]
        nl.store(out, nl.add(nl.load(x), 1.0, mask=(i_f < 8)))
        return out

    result = run(kernel)
    np.testing.assert_array_equal(result[:, :8], X[:, :8] + 1)
    assert np.isnan(result[:, 8:]).all()


def test_masked_bn_stats_counts_only_selected_elements():
    width = 100

    def kernel(x):
        out = output((128, 2))
        i_p = nl.arange(128)[:, None]
        j_f = nl.arange(128)[None, :]
        t = nl.load(x[i_p, j_f], mask=(j_f < width))
        stats = nisa.bn_stats(t[i_p, j_f], mask=(j_f < width))
        nl.store(out, nisa.bn_aggr(stats))
        return out

    x = RNG.standard_normal((128, width)).astype(np.float32)
    result = run(kernel, x)
    np.testing.assert_allclose(result[:, 0], x.mean(axis=1), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(result[:, 1], x.var(axis=1), rtol=1e-4)


def test_activation_of_a_rank1_tile_stays_per_partition():
    def kernel(x):
        out = output((128, 1))
        t = nl.load(x)
        total = nl.sum(t, axis=1)
        bias = nl.load(x[:, 0:1])
        result = nisa.activation(nl.exp, total, bias=bias, scale=0.5)
        assert result.shape == (128,)
        nl.store(out, result)
        return out

    expected = np.exp(X.sum(axis=1, keepdims=True) * 0.5 + X[:, 0:1])
    np.testing.assert_allclose(run(kernel), expected, rtol=1e-5)


def test_tensor_scalar_of_a_rank1_tile_stays_per_partition():
    def kernel(x):
        out = output((128, 1))
        total = nl.sum(nl.load(x), axis=1)
        nl.store(out, nisa.tensor_scalar(total, np.multiply, nl.load(x[:, 1:2]), op1=np.add, operand1=1.0))
        return out

    np.testing.assert_allclose(run(kernel), X.sum(axis=1, keepdims=True) * X[:, 1:2] + 1, rtol=1e-5)


# -------------------------------------------------------------------------- PSUM accumulation

def test_first_matmul_into_uninitialised_psum_overwrites():
    a = RNG.standard_normal((256, 32)).astype(np.float32)
    b = RNG.standard_normal((256, 48)).astype(np.float32)

    def kernel(a, b):
        out = output((32, 48))
        acc = nl.ndarray((32, 48), nl.float32, buffer=nl.psum)
        for k in nl.affine_range(2):
            acc += nisa.nc_matmul(nl.load(a[k * 128:(k + 1) * 128, :]), nl.load(b[k * 128:(k + 1) * 128, :]))
        nl.store(out, nl.copy(acc))
        return out

    np.testing.assert_allclose(run(kernel, a, b), a.T @ b, rtol=1e-4, atol=1e-4)


def test_first_indexed_matmul_into_uninitialised_psum_block_overwrites():
    a = RNG.standard_normal((128, 32)).astype(np.float32)

    def kernel(a):
        out = output((2, 32, 32))
        acc = nl.ndarray((2, nl.par_dim(32), 32), nl.float32, buffer=nl.psum)
        i_p, i_f = nl.mgrid[0:32, 0:32]
        t = nl.load(a)
        for i in nl.affine_range(2):
            acc[i, i_p, i_f] += nisa.nc_matmul(t, t)
            acc[i, :, :] += nl.matmul(t, t, transpose_x=True)
            nl.store(out[i], nl.copy(acc[i]))
        return out

    np.testing.assert_allclose(run(kernel, a), np.broadcast_to(2 * a.T @ a, (2, 32, 32)), rtol=1e-4, atol=1e-4)


def test_vector_add_into_uninitialised_psum_still_reads_poison():
    def kernel(x):
        out = output((128, 64))
        acc = nl.ndarray((128, 64), nl.float32, buffer=nl.psum)
        acc += nl.load(x)
        nl.store(out, nl.copy(acc))
        return out

    assert np.isnan(run(kernel)).all()


# ------------------------------------------------------------ operands the compiler accepts

def test_matmul_of_a_tensor_engine_transpose_reads_psum():
    a = RNG.standard_normal((64, 128)).astype(np.float32)

    def kernel(a):
        out = output((64, 64))
        t = nl.load(a)
        transposed = nisa.nc_transpose(t)
        assert transposed.buffer is nl.psum
        nl.store(out, nl.copy(nisa.nc_matmul(transposed, transposed)))
        return out

    np.testing.assert_allclose(run(kernel, a), a @ a.T, rtol=1e-4, atol=1e-4)


def test_matmul_operand_in_hbm_is_still_refused():
    def kernel(x):
        nisa.nc_matmul(x, nl.load(x))

    with pytest.raises(MemorySpaceError, match="operand 'stationary' of 'nc_matmul' to be in address space "
                                               "'psum|sbuf', but got a tile in 'hbm'"):
        run(kernel)


def test_affine_select_from_psum():
    def kernel(x):
        out = output((64, 64))
        i_p, i_f = nl.mgrid[0:64, 0:64]
        t = nl.load(x[0:64, :])
        scores = nisa.nc_matmul(t, t)
        nl.store(out, nisa.affine_select(i_p >= i_f, scores, -9984.0))
        return out

    scores = X[:64].T @ X[:64]
    expected = np.where(np.tril(np.ones((64, 64), bool)), scores, -9984.0)
    np.testing.assert_allclose(run(kernel), expected, rtol=1e-4, atol=1e-4)


def test_tensor_tensor_broadcasts_a_column_along_the_free_axis():
    def kernel(x):
        out = output((128, 64))
        t = nl.load(x)
        nl.store(out, nisa.tensor_tensor(t, t[:, 0:1], np.subtract))
        return out

    np.testing.assert_array_equal(run(kernel), X - X[:, 0:1])


def test_tensor_tensor_with_mismatched_free_sizes_is_refused():
    def kernel(x):
        t = nl.load(x)
        nisa.tensor_tensor(t, t[:, 0:2], np.add)

    with pytest.raises(KernelUsageError, match="same number of elements per partition"):
        run(kernel)


# -------------------------------------------------------------------------------- indexing

def test_integer_index_on_the_free_axis_loads_a_column():
    def kernel(x):
        out = output((128, 2))
        column = nl.load(x[0:128, 3])
        assert column.shape == (128,)
        t = nl.load(x)
        nl.store(out[:, 0:1], nl.multiply(t[:, 3][:, 0], column))
        nl.store(out[:, 1], nl.exp(column))
        return out

    result = run(kernel)
    np.testing.assert_allclose(result[:, 0], X[:, 3] ** 2, rtol=1e-6)
    np.testing.assert_allclose(result[:, 1], np.exp(X[:, 3]), rtol=1e-6)


def test_one_hbm_element_loads_and_stores():
    scalar = np.array(3.5, np.float32)

    def kernel(s, x):
        out = output((2, 2))
        value = nl.load(s)
        assert value.shape == (1, 1)
        nl.store(out[0, 0], value)
        nl.store(out[1, 1], nl.load(x[0, 1]))
        nl.store(out[0, 1], nl.load(x[1:2, 0:1]))
        nl.store(out[1, 0], value)
        return out

    np.testing.assert_array_equal(run(kernel, scalar, X), [[3.5, X[1, 0]], [3.5, X[0, 1]]])


def test_indirect_indices_on_the_partition_axis_after_block_indices():
    table = RNG.standard_normal((2, 50, 16)).astype(np.float32)
    rows = np.array([[7], [0], [49], [3]] * 8, np.int32)

    def kernel(table, rows):
        out = output((32, 16))
        i_f = nl.arange(16)[None, :]
        idx = nl.load(rows)
        nl.store(out, nl.load(table[1, idx, i_f]))
        return out

    np.testing.assert_array_equal(run(kernel, table, rows), table[1, rows[:, 0]])


def test_indirect_indices_on_a_free_axis_are_refused():
    table = np.zeros((4, 8), np.float32)
    cols = np.zeros((4, 1), np.int32)

    def kernel(table, cols):
        i_p = nl.arange(4)[:, None]
        nl.load(table[i_p, nl.load(cols)])

    with pytest.raises(KernelUsageError, match="indirect indices are only supported on the partition dimension"):
        run(kernel, table, cols)


# ------------------------------------------------------------------------------------ dtypes

def test_integer_division_truncates():
    positions = np.array([[2241], [37], [-7], [76]] * 32, np.int32)

    def kernel(p):
        out = output((128, 2), nl.int32)
        t = nl.load(p)
        nl.store(out[:, 0:1], t / 38)
        nl.store(out[:, 1:2], nl.divide(t, 38, dtype=nl.float32))
        return out

    result = run(kernel, positions)
    np.testing.assert_array_equal(result[:, 0], np.trunc(positions[:, 0] / 38))
    # A float result of integer operands is the true quotient, rounded half-even into int32 by the store.
    np.testing.assert_array_equal(result[:, 1], np.rint(positions[:, 0] / 38))


# ------------------------------------------------------------------------------ API surface

def test_hbm_reshape_by_keyword_and_tile_view_as_another_dtype():
    def kernel(x):
        out = output((64, 128))
        flat = x.reshape(shape=(64, 128))
        t = nl.load(flat)
        bits = t.view(nl.int32)
        assert bits.dtype == nl.int32 and bits.shape == t.shape
        nl.store(out, nl.copy(bits.view(nl.float32)))
        return out

    np.testing.assert_array_equal(run(kernel), X.reshape(64, 128))


def test_broadcast_to_of_an_indexed_access():
    def kernel(x):
        out = output((128, 32))
        t = nl.load(x)
        i_p = nl.arange(128)[:, None]
        nl.store(out, t[i_p, 5].broadcast_to((128, 32)))
        return out

    np.testing.assert_array_equal(run(kernel), np.broadcast_to(X[:, 5:6], (128, 32)))


def test_operand_masking_is_unsupported_not_a_type_error():
    def kernel(x):
        i_p, i_f = nl.mgrid[0:128, 0:64]
        nl.load(x)[i_p, i_f < 8]

    with pytest.raises(UnsupportedError, match="not supported by the simulator: operand masking"):
        run(kernel)


def test_finfo_and_iinfo():
    def kernel(x):
        assert nl.finfo(nl.bfloat16).max == float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
        assert nl.finfo(nl.float32).min == np.finfo(np.float32).min
        assert nl.iinfo(nl.int16).max == 32767

    run(kernel)


def test_loop_reduce_combines_into_its_destination():
    def kernel(x):
        out = output((128, 16))
        acc = nl.zeros((128, 16), nl.float32)
        best = nl.full((128, 16), -1e30, nl.float32)
        for i in nl.affine_range(4):
            tile = nl.load(x[:, i * 16:(i + 1) * 16])
            acc[...] = nl.loop_reduce(tile, op=np.add, loop_indices=[i])
            best[...] = nl.loop_reduce(tile, op=np.maximum, loop_indices=[i], name="max")
        nl.store(out, nl.subtract(acc, best))
        return out

    blocks = X.reshape(128, 4, 16)
    np.testing.assert_allclose(run(kernel), blocks.sum(axis=1) - blocks.max(axis=1), rtol=1e-5, atol=1e-5)


def test_loop_reduce_result_not_assigned_is_poison():
    def kernel(x):
        out = output((128, 64))
        nl.store(out, nl.loop_reduce(nl.load(x), np.add, loop_indices=[0]))
        return out

    assert np.isnan(run(kernel)).all()


# ----------------------------------------------------------------------------- nc_matmul options

def test_matmul_transpose_hint_pe_tiling_and_mask():
    a = RNG.standard_normal((64, 64)).astype(np.float32)

    def kernel(a):
        out = output((64, 64))
        t = nl.load(a)
        identity = nl.load(nl.shared_identity_matrix(64, dtype=nl.float32))
        transposed = nisa.nc_matmul(t, identity, is_transpose=True, is_moving_onezero=True, name="tp")
        tiled = nisa.nc_matmul(t, t, tile_position=(64, 0), tile_size=(64, 64))
        acc = nl.zeros((64, 64), nl.float32, buffer=nl.psum)
        acc += nisa.nc_matmul(t, t, mask=False)
        acc += nisa.nc_matmul(t, t, mask=True)
        nl.store(out, nl.add(nl.subtract(transposed, tiled), acc))
        return out

    np.testing.assert_allclose(run(kernel, a), a.T, rtol=1e-4, atol=1e-4)


def test_pe_tiling_rules_are_checked():
    def kernel(x):
        t = nl.load(x[0:64, 0:64])
        nisa.nc_matmul(t, t, tile_position=(0, 16), tile_size=(64, 64))

    with pytest.raises(KernelUsageError, match="starting at a multiple of its size"):
        run(kernel)


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_pe_tiles_are_the_array_splits_the_current_api_names(target):
    """The 128 x 128 PE array splits into 64s (and 32s from trn2), nothing else: a 96 x 96 tile, a multiple
    of 32, is refused in both generations (it was accepted here and refused by the current front end)."""
    def kernel(x):
        t = nl.load(x[0:64, 0:64])
        nisa.nc_matmul(t, t, tile_position=(0, 0), tile_size=(96, 96))

    with pytest.raises(KernelUsageError, match="a PE tile is"):
        run(kernel, target=target)


def test_double_row_fp8_matmul_contracts_over_the_pair_axis():
    s = RNG.standard_normal((128, 2, 32)).astype(ml_dtypes.float8_e4m3)
    m = RNG.standard_normal((128, 2, 64)).astype(ml_dtypes.float8_e4m3)

    def kernel(s, m):
        out = output((32, 64))
        product = nisa.nc_matmul(nl.load(s), nl.load(m), perf_mode="double_row_gen3")
        nl.store(out, nl.copy(product))
        return out

    expected = s.astype(np.float32).reshape(256, 32).T @ m.astype(np.float32).reshape(256, 64)
    np.testing.assert_allclose(run(kernel, s, m, target="trn2"), expected, rtol=1e-4, atol=1e-3)
    with pytest.raises(KernelUsageError, match="needs NeuronCore-v3"):
        run(kernel, s, m, target="trn1")


# ------------------------------------------------------------------------ operators and names

def test_np_copy_activation_and_abs_alu_operator():
    def kernel(x):
        out = output((128, 65))
        t = nl.load(x)
        nl.store(out[:, 0:64], nisa.activation(np.copy, t, scale=-2.0, name="neg2"))
        peak = nl.ndarray((128, 1), nl.float32)
        nisa.tensor_scalar_reduce(data=t, op0=nl.abs, operand0=0.0, reduce_op=nl.max, reduce_res=peak)
        nl.store(out[:, 64:65], peak)
        return out

    result = run(kernel)
    np.testing.assert_array_equal(result[:, :64], -2 * X)
    np.testing.assert_array_equal(result[:, 64], np.abs(X).max(axis=1))
