"""Legacy-API rules met running the public nki-samples kernels unmodified (issue 11, second pass):
each test is a small kernel of ours checked against NumPy, or against the documented error."""

from __future__ import annotations

import numpy as np
import pytest

from nki_ops.sim import KernelUsageError, OutOfBoundsError, SimConfig, UnsupportedError, nisa, nki, nl, simulate

pytestmark = pytest.mark.simulation

RNG = np.random.default_rng(17)


def run(body, *arrays, **config):
    return simulate(nki.jit(body), *arrays, config=SimConfig(**config))


def output(shape, dtype=nl.float32):
    return nl.ndarray(shape, dtype, buffer=nl.shared_hbm)


# ------------------------------------------------------------------------- tensor_tensor_scan

def test_tensor_tensor_scan_is_a_first_order_recurrence_per_partition():
    a = RNG.uniform(0.5, 1.0, (128, 40)).astype(np.float32)
    b = RNG.standard_normal((128, 40)).astype(np.float32)
    start = RNG.standard_normal((128, 1)).astype(np.float32)

    def kernel(a, b, start):
        out = output((2, 128, 40))
        ta, tb, ts = nl.load(a), nl.load(b), nl.load(start)
        nl.store(out[0], nisa.tensor_tensor_scan(ta, tb, initial=0, op0=np.multiply, op1=np.add))
        nl.store(out[1], nisa.tensor_tensor_scan(ta, tb, ts, nl.subtract, nl.add, reverse0=True))
        return out

    got = run(kernel, a, b, start)
    forward, reversed_ = np.empty_like(a), np.empty_like(a)
    r0, r1 = np.zeros((128,), np.float32), start[:, 0]
    for i in range(40):
        r0 = a[:, i] * r0 + b[:, i]
        r1 = (r1 - a[:, i]) + b[:, i]
        forward[:, i], reversed_[:, i] = r0, r1
    np.testing.assert_allclose(got[0], forward, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], reversed_, rtol=1e-5, atol=1e-5)


def test_tensor_tensor_scan_under_a_mask_and_a_mid_row_mask():
    a = RNG.standard_normal((128, 16)).astype(np.float32)

    def kernel(a):
        out = output((128, 16))
        t = nl.load(a)
        i_p, i_f = nl.mgrid[0:128, 0:16]
        d = nl.zeros((128, 16), nl.float32)
        d[...] = nisa.tensor_tensor_scan(t, t, 1.0, nl.add, nl.multiply, mask=(i_f < 8))
        nl.store(out, d)
        return out

    expected, r = np.zeros_like(a), np.ones((128,), np.float32)
    for i in range(8):
        r = (a[:, i] + r) * a[:, i]
        expected[:, i] = r
    np.testing.assert_allclose(run(kernel, a), expected, rtol=1e-5, atol=1e-6)

    def mid_row(a):
        t = nl.load(a)
        i_p, i_f = nl.mgrid[0:128, 0:16]
        nisa.tensor_tensor_scan(t, t, 0.0, nl.add, nl.add, mask=(i_f >= 8))

    with pytest.raises(UnsupportedError, match="tensor_tensor_scan with a mask"):
        run(mid_row, a)


# ---------------------------------------------------------------------------------- launch grid

def test_a_grid_dimension_of_zero_launches_one_instance():
    x = RNG.standard_normal((128, 8)).astype(np.float32)

    def kernel(x):
        out = output((2, 128, 8))
        t = nl.load(x)
        nl.store(out[nl.program_id(0)], nl.add(t, 1.0))
        nl.store(out[1], nl.full((128, 8), nl.num_programs(0), nl.float32))
        return out

    got = nki.jit(kernel)[0](x)
    np.testing.assert_array_equal(got[0], x + 1.0)
    np.testing.assert_array_equal(got[1], 1.0)


def test_nki_tensor_is_the_class_of_kernel_tensors():
    x = RNG.standard_normal((128, 8)).astype(np.float32)

    def kernel(x: nki.tensor) -> nki.tensor:
        assert isinstance(x, nki.tensor) and x.shape == (128, 8) and x.itemsize == 4
        out = output((128, 8))
        nl.store(out, nl.multiply(nl.load(x), 2.0))
        return out

    np.testing.assert_array_equal(run(kernel, x), 2.0 * x)


# ---------------------------------------------------------------------------------- loop_reduce

def test_loop_reduce_of_a_reduced_vector_accumulates_a_column():
    # A (P,) reduction result is a (P, 1) column: loop_reduce accumulates it into one column of
    # a (P, N) tile (the flash-attention backward kernel's sink gradient).
    x = RNG.standard_normal((128, 4, 2, 32)).astype(np.float32)

    def kernel(x):
        out = output((128, 4))
        acc = nl.zeros((128, 4), nl.float32)
        for i in nl.affine_range(4):
            for j in nl.affine_range(2):
                rows = nisa.tensor_reduce(np.add, nl.load(x[:, i, j, :]), axis=(1,))
                assert rows.shape == (128,)
                acc[:, i] = nl.loop_reduce(rows, op=np.add, loop_indices=(j,), dtype=nl.float32)
        nl.store(out, acc)
        return out

    np.testing.assert_allclose(run(kernel, x), x.sum(axis=(2, 3)), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ dma_copy oob_mode

TABLE = RNG.standard_normal((10, 8)).astype(np.float32)
ROWS = np.array([3, -1, 9, 10, 0, 42, 5, 2], np.int32).reshape(8, 1)   # 3 of 8 out of range


def test_dma_copy_skip_gathers_only_in_range_rows():
    def kernel(table, rows):
        out = output((8, 8))
        idx = nl.load(rows)
        i_p, i_f = nl.mgrid[0:8, 0:8]
        t = nl.full((8, 8), 7.0, nl.float32)
        nisa.dma_copy(dst=t, src=table[idx[i_p, 0], i_f], oob_mode=nisa.oob_mode.skip)
        nl.store(out, t)
        return out

    valid = (ROWS[:, 0] >= 0) & (ROWS[:, 0] < 10)
    expected = np.where(valid[:, None], TABLE[np.clip(ROWS[:, 0], 0, 9)], 7.0)
    np.testing.assert_array_equal(run(kernel, TABLE, ROWS), expected)


def test_dma_copy_skip_scatters_only_in_range_rows():
    src = RNG.standard_normal((8, 8)).astype(np.float32)

    def kernel(src, rows, out):
        idx = nl.load(rows)
        i_p, i_f = nl.mgrid[0:8, 0:8]
        nisa.dma_copy(dst=out[idx[i_p, 0], i_f], src=nl.load(src), oob_mode=nisa.oob_mode.skip)
        return out

    got = run(kernel, src, ROWS, np.zeros((10, 8), np.float32))
    expected = np.zeros((10, 8), np.float32)
    for p, r in enumerate(ROWS[:, 0]):
        if 0 <= r < 10:
            expected[r] = src[p]
    np.testing.assert_array_equal(got, expected)


def test_dma_copy_out_of_range_rows_raise_by_default_and_skip_refuses_rmw():
    def kernel(table, rows, rmw):
        idx = nl.load(rows)
        i_p, i_f = nl.mgrid[0:8, 0:8]
        t = nl.zeros((8, 8), nl.float32)
        if rmw:
            nisa.dma_copy(dst=t, src=table[idx[i_p, 0], i_f], dst_rmw_op=np.add, oob_mode=nisa.oob_mode.skip)
        nisa.dma_copy(dst=t, src=table[idx[i_p, 0], i_f])

    with pytest.raises(OutOfBoundsError, match="Out-of-bound access for tensor `table` on dimension 0"):
        run(kernel, TABLE, ROWS, False)
    with pytest.raises(KernelUsageError, match="with dst_rmw_op only oob_mode=oob_mode.error is allowed"):
        run(kernel, TABLE, ROWS, True)


# ---------------------------------------------------------------------------------- nl.transpose

def test_nl_transpose_is_the_tensor_engine_transpose_up_to_128_by_128():
    # Beyond the Vector engine's 32 x 32 in both directions: nl.transpose lowers to the Tensor
    # engine's identity matmul (its docs show the result in PSUM), 128 x 128 at most.
    tall = RNG.standard_normal((128, 96)).astype(np.float32)
    wide = RNG.standard_normal((40, 128)).astype(np.float32)

    def kernel(tall, wide):
        out = output((2, 128, 128))
        nl.store(out[0, 0:96, 0:128], nl.transpose(nl.load(tall)))
        nl.store(out[1, 0:128, 0:40], nl.transpose(nl.load(wide), dtype=nl.bfloat16))
        return out

    got = run(kernel, tall, wide)
    np.testing.assert_array_equal(got[0, :96, :], tall.T)
    np.testing.assert_array_equal(got[1, :, :40], wide.T.astype(nl.bfloat16).astype(np.float32))


# ---------------------------------------------------------------------------------- operand masking

def test_operand_masking_restricts_the_matmul_result_to_selected_rows_and_columns():
    # "nl.matmul(lhs_T[i_lhs_f <= 64], rhs[i_rhs_f <= 256], transpose_x=True)": each operand's free
    # axis is restricted; the masked-off part of an operand may even lie out of bounds.
    a = RNG.standard_normal((128, 96)).astype(np.float32)
    b = RNG.standard_normal((128, 300)).astype(np.float32)

    def kernel(a, b):
        out = output((2, 96, 512))
        ta, tb = nl.load(a), nl.load(b)
        i_p, i_m = nl.mgrid[0:128, 0:96]
        j_p, j_n = nl.mgrid[0:128, 0:512]
        acc = nl.zeros((96, 512), nl.float32, buffer=nl.psum)
        acc[...] = nisa.nc_matmul(ta[i_p, i_m][i_m < 64], tb[j_p, j_n][j_n < 300])  # columns 300+ out of bounds
        nl.store(out[0], nl.copy(acc))
        other = nl.full((96, 300), -1.0, nl.float32)
        other[...] = nl.matmul(ta[i_m < 90], tb, transpose_x=True)  # writes rows 0-89 only
        nl.store(out[1, :, 0:300], other)
        return out

    got = run(kernel, a, b)
    product = a.T @ b
    np.testing.assert_allclose(got[0, :64, :300], product[:64], rtol=1e-4, atol=1e-4)
    assert (got[0, 64:] == 0).all() and (got[0, :, 300:] == 0).all()
    np.testing.assert_allclose(got[1, :90, :300], product[:90], rtol=1e-4, atol=1e-4)
    assert (got[1, 90:, :300] == -1.0).all()


def test_operand_masking_elsewhere_or_on_the_contraction_axis_is_unsupported():
    a = RNG.standard_normal((128, 64)).astype(np.float32)

    def on_partitions(a):
        i_p, i_f = nl.mgrid[0:128, 0:64]
        t = nl.load(a)
        nisa.nc_matmul(t[i_p < 64], t)

    def in_exp(a):
        i_p, i_f = nl.mgrid[0:128, 0:64]
        nl.exp(nl.load(a)[i_f < 8])

    with pytest.raises(UnsupportedError, match="operand mask on the contraction"):
        run(on_partitions, a)
    with pytest.raises(UnsupportedError, match="operand masking"):
        run(in_exp, a)


def test_a_redecorated_kernel_keeps_its_platform_target():
    # The double-row matmul reference is @nki.jit(platform_target='trn2'); its test wraps it in
    # nki.baremetal(...), which must still simulate trn2.
    def kernel(x):
        out = output((1, 1), nl.int32)
        nl.store(out, nl.full((1, 1), int(nisa.get_nc_version()), nl.int32))
        return out

    x = np.zeros((1, 1), np.float32)
    assert nki.baremetal(nki.jit(kernel, platform_target="trn2"))(x)[0, 0] == 3
    assert nki.baremetal(nki.jit(kernel))(x)[0, 0] == 2
    assert nki.baremetal(platform_target="trn1")(nki.jit(kernel, platform_target="trn2"))(x)[0, 0] == 2
