"""One kernel written in both NKI dialects, legacy ``neuronxcc.nki`` (tiles returned by the ISA calls)
and current ``nki`` (destination passing), gives bit-identical results on the simulator: the two
front ends share one instruction core, so the same operations on the same data must agree to the bit,
rounding included (bf16 inputs, fp32 intermediates, a bf16 output)."""

from __future__ import annotations

import numpy as np
import pytest

from nki_ops.sim.frontends import current, legacy

pytestmark = pytest.mark.simulation

lnl, lnisa = legacy.language, legacy.isa
cnl, cnisa = current.language, current.isa


@legacy.jit
def legacy_kernel(a, b):
    """out = exp(-1 / max(a * b + 1.5, 0.25)) in a's dtype, its row sums, and its column sums (a matmul)."""
    rows, cols = a.shape
    out = lnl.ndarray((rows, cols), dtype=a.dtype, buffer=lnl.shared_hbm)
    row_sums = lnl.ndarray((rows, 1), dtype=lnl.float32, buffer=lnl.shared_hbm)
    col_sums = lnl.ndarray((cols, 1), dtype=lnl.float32, buffer=lnl.shared_hbm)
    col_acc = lnl.zeros((cols, 1), dtype=lnl.float32, buffer=lnl.sbuf)
    for start in range(0, rows, 128):
        size = min(128, rows - start)
        x = lnl.load(a[start:start + size, :])
        y = lnl.load(b[start:start + size, :])
        p = lnisa.tensor_tensor(x, y, op=lnl.multiply, dtype=lnl.float32)
        q = lnisa.tensor_scalar(p, op0=lnl.add, operand0=1.5, op1=lnl.maximum, operand1=0.25, dtype=lnl.float32)
        r = lnisa.reciprocal(q, dtype=lnl.float32)
        e = lnisa.activation(op=lnl.exp, data=r, scale=-1.0, dtype=lnl.float32)
        lnl.store(row_sums[start:start + size, :],
                  lnisa.tensor_reduce(lnl.add, e, axis=(1,), keepdims=True, dtype=lnl.float32))
        ones = lnl.ones((size, 1), dtype=lnl.float32)
        col_acc[...] = lnl.add(col_acc, lnisa.nc_matmul(e, ones), dtype=lnl.float32)
        lnl.store(out[start:start + size, :], lnisa.tensor_copy(e, dtype=a.dtype))
    lnl.store(col_sums, col_acc)
    return out, row_sums, col_sums


@current.jit
def current_kernel(a, b):
    """The same operations as ``legacy_kernel``, in destination-passing style."""
    rows, cols = a.shape
    out = cnl.ndarray((rows, cols), dtype=a.dtype, buffer=cnl.shared_hbm)
    row_sums = cnl.ndarray((rows, 1), dtype=cnl.float32, buffer=cnl.shared_hbm)
    col_sums = cnl.ndarray((cols, 1), dtype=cnl.float32, buffer=cnl.shared_hbm)
    col_acc = cnl.ndarray((cols, 1), dtype=cnl.float32, buffer=cnl.sbuf)
    cnisa.memset(dst=col_acc, value=0.0)
    for start in range(0, rows, 128):
        size = min(128, rows - start)
        x = cnl.ndarray((size, cols), dtype=a.dtype, buffer=cnl.sbuf)
        cnisa.dma_copy(dst=x, src=a[start:start + size, :])
        y = cnl.ndarray((size, cols), dtype=b.dtype, buffer=cnl.sbuf)
        cnisa.dma_copy(dst=y, src=b[start:start + size, :])
        p = cnl.ndarray((size, cols), dtype=cnl.float32, buffer=cnl.sbuf)
        cnisa.tensor_tensor(dst=p, data1=x, data2=y, op=cnl.multiply)
        q = cnl.ndarray((size, cols), dtype=cnl.float32, buffer=cnl.sbuf)
        cnisa.tensor_scalar(dst=q, data=p, op0=cnl.add, operand0=1.5, op1=cnl.maximum, operand1=0.25)
        r = cnl.ndarray((size, cols), dtype=cnl.float32, buffer=cnl.sbuf)
        cnisa.reciprocal(dst=r, data=q)
        e = cnl.ndarray((size, cols), dtype=cnl.float32, buffer=cnl.sbuf)
        cnisa.activation(dst=e, op=cnl.exp, data=r, scale=-1.0)
        s = cnl.ndarray((size, 1), dtype=cnl.float32, buffer=cnl.sbuf)
        cnisa.tensor_reduce(dst=s, op=cnl.add, data=e, axis=1, keepdims=True)
        cnisa.dma_copy(dst=row_sums[start:start + size, :], src=s)
        ones = cnl.ndarray((size, 1), dtype=cnl.float32, buffer=cnl.sbuf)
        cnisa.memset(dst=ones, value=1.0)
        partial = cnl.ndarray((cols, 1), dtype=cnl.float32, buffer=cnl.psum)
        cnisa.nc_matmul(dst=partial, stationary=e, moving=ones)
        cnisa.tensor_tensor(dst=col_acc, data1=col_acc, data2=partial, op=cnl.add)
        rounded = cnl.ndarray((size, cols), dtype=a.dtype, buffer=cnl.sbuf)
        cnisa.tensor_copy(dst=rounded, src=e)
        cnisa.dma_copy(dst=out[start:start + size, :], src=rounded)
    cnisa.dma_copy(dst=col_sums, src=col_acc)
    return out, row_sums, col_sums


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_the_same_kernel_in_both_dialects_is_bit_identical(dtype):
    import ml_dtypes

    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(0)
    # 200 rows: a full 128-row tile and a 72-row tail; values around the max() clamp at 0.25.
    a = rng.normal(size=(200, 96)).astype(np_dtype)
    b = rng.normal(size=(200, 96)).astype(np_dtype)
    legacy_results = legacy_kernel(a, b)
    current_results = current_kernel(a, b)
    for got_legacy, got_current in zip(legacy_results, current_results):
        got_legacy, got_current = np.asarray(got_legacy), np.asarray(got_current)
        assert got_legacy.dtype == got_current.dtype and got_legacy.shape == got_current.shape
        assert np.array_equal(got_legacy.view(np.uint8), got_current.view(np.uint8))
    # And both are right: the output against NumPy in fp32, rounded once.
    expected = np.exp(-1 / np.maximum(a.astype(np.float32) * b.astype(np.float32) + 1.5, 0.25))
    np.testing.assert_allclose(np.asarray(current_results[0]).astype(np.float32), expected, rtol=2 ** -7)


# ------------------------------------------------ one instruction, one meaning in both generations

def test_activation_accumulator_registers_follow_reduce_cmd_in_both_generations():
    """reset_reduce then reduce sums both instructions (8 + 8 over a row of ones); the legacy front end
    ignored reduce_cmd and gave 8. Both pages describe the same Scalar-engine registers."""
    ones = np.ones((4, 8), np.float32)

    @legacy.jit
    def legacy_sums(x):
        out = lnl.ndarray((4, 1), dtype=lnl.float32, buffer=lnl.shared_hbm)
        acc = lnl.ndarray((4, 1), dtype=lnl.float32, buffer=lnl.sbuf)
        t = lnl.load(x)
        lnisa.activation(op=lnl.copy, data=t, reduce_op=lnl.add, reduce_cmd=lnisa.reduce_cmd.reset_reduce)
        lnisa.activation(op=lnl.copy, data=t, reduce_op=lnl.add, reduce_res=acc, reduce_cmd=lnisa.reduce_cmd.reduce)
        lnl.store(out, acc)
        return out

    @current.jit
    def current_sums(x):
        out = cnl.ndarray((4, 1), dtype=cnl.float32, buffer=cnl.shared_hbm)
        t = cnl.ndarray((4, 8), dtype=cnl.float32, buffer=cnl.sbuf)
        cnisa.dma_copy(dst=t, src=x)
        act = cnl.ndarray((4, 8), dtype=cnl.float32, buffer=cnl.sbuf)
        acc = cnl.ndarray((4, 1), dtype=cnl.float32, buffer=cnl.sbuf)
        cnisa.activation(dst=act, op=cnl.copy, data=t, reduce_op=cnl.add, reduce_cmd=cnisa.reduce_cmd.reset_reduce)
        cnisa.activation(dst=act, op=cnl.copy, data=t, reduce_op=cnl.add, reduce_res=acc,
                         reduce_cmd=cnisa.reduce_cmd.reduce)
        cnisa.dma_copy(dst=out, src=acc)
        return out

    for kernel in (legacy_sums, current_sums):
        np.testing.assert_array_equal(np.asarray(kernel(ones)), np.full((4, 1), 16.0, np.float32))


@pytest.mark.parametrize("size, accepted", [((96, 96), False), ((64, 128), True), ((32, 32), True)])
def test_pe_tiling_has_one_rule_in_both_generations(size, accepted):
    """trn2's PE array splits into 128, 64 or 32 rows and columns; a 96 x 96 tile (a multiple of 32, which
    the legacy front end accepted) is refused by both."""
    from nki_ops.sim.core.errors import KernelUsageError

    from .test_differential import on_target

    a = np.ones((32, 32), np.float32)

    @legacy.jit
    def legacy_tiled(x):
        out = lnl.ndarray((32, 32), dtype=lnl.float32, buffer=lnl.shared_hbm)
        t = lnl.load(x)
        lnl.store(out, lnl.copy(lnisa.nc_matmul(t, t, tile_position=(0, 0), tile_size=size)))
        return out

    @current.jit
    def current_tiled(x):
        out = cnl.ndarray((32, 32), dtype=cnl.float32, buffer=cnl.shared_hbm)
        t = cnl.ndarray((32, 32), dtype=cnl.float32, buffer=cnl.sbuf)
        cnisa.dma_copy(dst=t, src=x)
        acc = cnl.ndarray((32, 32), dtype=cnl.float32, buffer=cnl.psum)
        cnisa.nc_matmul(acc, t, t, tile_position=(0, 0), tile_size=size)
        res = cnl.ndarray((32, 32), dtype=cnl.float32, buffer=cnl.sbuf)
        cnisa.tensor_copy(dst=res, src=acc)
        cnisa.dma_copy(dst=out, src=res)
        return out

    with on_target("trn2"):
        for kernel in (legacy_tiled, current_tiled):
            if accepted:
                np.testing.assert_allclose(np.asarray(kernel(a)), a.T @ a)
            else:
                with pytest.raises(KernelUsageError, match="a PE tile is"):
                    kernel(a)


BIG = 16777217  # 2**24 + 1: the first int32 that fp32 cannot hold


@current.jit
def _int32_wrappers(a, b):
    """nl.add / nl.maximum / nl.equal, nl.where and affine_select on int32 tiles."""
    out = cnl.ndarray((4, 2, 8), dtype=cnl.int32, buffer=cnl.shared_hbm)
    x = cnl.ndarray((2, 8), dtype=cnl.int32, buffer=cnl.sbuf)
    cnisa.dma_copy(dst=x, src=a)
    y = cnl.ndarray((2, 8), dtype=cnl.int32, buffer=cnl.sbuf)
    cnisa.dma_copy(dst=y, src=b)
    total = cnl.add(x, y)
    cnisa.dma_copy(dst=out[0], src=total)
    cnisa.dma_copy(dst=out[1], src=cnl.where(cnl.equal(x, y), total, cnl.maximum(x, y)))
    kept = cnl.ndarray((2, 8), dtype=cnl.int32, buffer=cnl.sbuf)
    cnisa.affine_select(dst=kept, pattern=[[1, 8]], channel_multiplier=0, on_true_tile=x, on_false_value=-1,
                        cmp_op=cnl.greater_equal, offset=-4)
    cnisa.dma_copy(dst=out[2], src=kept)
    same = cnl.ndarray((2, 8), dtype=cnl.int32, buffer=cnl.sbuf)
    cnisa.tensor_tensor(dst=same, data1=x, data2=y, op=cnl.add)
    cnisa.dma_copy(dst=out[3], src=same)
    return out


def test_current_nl_wrappers_on_int32_follow_tensor_tensor_exact_integers():
    """The current API's nl element-wise calls lower to nisa.tensor_tensor, whose page makes int32/uint32
    tiles GpSimd's exact integer arithmetic; nl.where and affine_select copy values. All went through fp32
    (16777217 + 1 gave 16777216). The legacy tensor_tensor page computes arithmetic in fp32: not changed."""
    a = np.full((2, 8), BIG, np.int32)
    b = np.ones((2, 8), np.int32)
    out = np.asarray(_int32_wrappers(a, b))
    np.testing.assert_array_equal(out[0], a.astype(np.int64) + 1)
    np.testing.assert_array_equal(out[1], a)  # not equal: the maximum, BIG exactly
    np.testing.assert_array_equal(out[2], np.where(np.arange(8) >= 4, BIG, -1) * np.ones((2, 1), np.int64))
    np.testing.assert_array_equal(out[3], out[0])  # nl.add and nisa.tensor_tensor agree
    np.testing.assert_array_equal(np.asarray(_int32_wrappers(a, a))[1], 2 * a.astype(np.int64))
