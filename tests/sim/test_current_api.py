"""The current ``nki`` API (NKI 0.6) on the simulator: kernels written here, checked against NumPy."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

from nki_ops.sim import SimulatorError, SimulatorWarning
from nki_ops.sim.core.errors import KernelUsageError, MemorySpaceError, OutOfBoundsError, UnsupportedError
from nki_ops.sim.frontends import current as nki

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation
RNG = np.random.default_rng(7)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def load(src, dtype=None):
    """An SBUF copy of an HBM region (the destination-passing way)."""
    tile = nl.ndarray(src.shape, dtype=dtype or src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=src)
    return tile


@nki.jit
def add_kernel(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    result = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=result, data1=load(a), data2=load(b), op=nl.add)
    nisa.dma_copy(dst=out, src=result)
    return out


def test_tensor_tensor_add_numpy_in_out():
    a, b = rand(128, 96), rand(128, 96)
    out = add_kernel(a, b)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, a + b)


@nki.jit
def matmul_kernel(a_t, b):
    """out = a_t.T @ b with K accumulated in PSUM over 128-row tiles."""
    k, m = a_t.shape
    n = b.shape[1]
    out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    for kt in range(k // 128):
        nisa.nc_matmul(dst=acc, stationary=load(a_t[kt * 128:(kt + 1) * 128, :]),
                       moving=load(b[nl.ds(kt * 128, 128), :]))
    result = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=result, src=acc)
    nisa.dma_copy(dst=out, src=result)
    return out


def test_tiled_matmul_accumulates_in_psum():
    a_t, b = rand(384, 64), rand(384, 200)
    np.testing.assert_allclose(matmul_kernel(a_t, b), a_t.T @ b, rtol=1e-4, atol=1e-4)


@nki.jit
def scalar_ops_kernel(x, col):
    p, f = x.shape
    out = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.shared_hbm)
    sums = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    xs, cs = load(x), load(col)
    scaled = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    # (col - x) * 2: reverse0 puts the operand first.
    nisa.tensor_scalar(dst=scaled, data=xs, op0=nl.subtract, operand0=cs, reverse0=True, op1=nl.multiply,
                       operand1=2.0)
    act = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    total = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=act, op=nl.exp, data=scaled, scale=0.5, bias=cs, reduce_op=nl.add, reduce_res=total,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.dma_copy(dst=out, src=act)
    nisa.dma_copy(dst=sums, src=total)
    return out, sums


def test_tensor_scalar_and_activation_with_reduce():
    x, col = rand(64, 32), rand(64, 1)
    out, sums = scalar_ops_kernel(x, col)
    expected = np.exp((col - x) * 2 * 0.5 + col)
    np.testing.assert_allclose(out, expected, rtol=1e-5)
    np.testing.assert_allclose(sums, expected.sum(axis=1, keepdims=True), rtol=1e-5)


@nki.jit
def reduce_iota_memset_kernel(x):
    p, f = x.shape
    out = nl.ndarray((p, 3), dtype=nl.float32, buffer=nl.shared_hbm)
    res = nl.ndarray((p, 3), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=res[:, 0:1], op=nl.maximum, data=load(x), axis=1)
    ids = nl.ndarray((p, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.iota(dst=ids, pattern=[[0, 1]], offset=5, channel_multiplier=2)
    nisa.tensor_copy(dst=res[:, 1:2], src=ids)
    nisa.memset(dst=res[:, 2:3], value=-1.5)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_tensor_reduce_iota_memset():
    x = rand(32, 50)
    out = reduce_iota_memset_kernel(x)
    np.testing.assert_array_equal(out[:, 0], x.max(axis=1))
    np.testing.assert_array_equal(out[:, 1], 5 + 2 * np.arange(32))
    np.testing.assert_array_equal(out[:, 2], -1.5)


@nki.jit
def wrappers_kernel(x, y):
    out = nl.ndarray((x.shape[0], 1), dtype=x.dtype, buffer=nl.shared_hbm)
    s = nl.sum(nl.exp(nl.add(nl.load(x), nl.load(y))), axis=1)
    nl.store(out, s)
    return out


def test_nl_wrappers_load_store_elementwise_reduce():
    x, y = rand(16, 8), rand(16, 8)
    np.testing.assert_allclose(wrappers_kernel(x, y), np.exp(x + y).sum(axis=1, keepdims=True), rtol=1e-5)


@nki.jit
def scan_kernel(x):
    p, f = x.shape
    out = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.shared_hbm)
    ones = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    result = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor_scan(dst=result, data0=ones, data1=load(x), initial=0.0, op0=nl.multiply, op1=nl.add)
    nisa.dma_copy(dst=out, src=result)
    return out


def test_cumulative_sum_with_tensor_tensor_scan():
    x = rand(8, 40)
    np.testing.assert_allclose(scan_kernel(x), np.cumsum(x, axis=1), rtol=1e-5, atol=1e-5)


@nki.jit
def scale_in_place(x):
    t = load(x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=3.0)
    nisa.dma_copy(dst=x, src=t)


def test_torch_inputs_written_in_place():
    torch = pytest.importorskip("torch")
    x = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    expected = x * 3
    assert scale_in_place(x) is None
    assert torch.equal(x, expected)
    y = torch.ones(3, 4, dtype=torch.bfloat16).t()  # non-contiguous: written back after the run
    scale_in_place(y)
    assert torch.equal(y, torch.full((4, 3), 3.0, dtype=torch.bfloat16))


@nki.jit
def torch_out_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=load(x))
    return out


def test_torch_in_torch_out_bfloat16():
    torch = pytest.importorskip("torch")
    x = torch.randn(8, 16).to(torch.bfloat16)
    out = torch_out_kernel(x)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    assert torch.equal(out, x)


@nki.jit
def uninitialised_kernel(x):
    out = nl.ndarray((2, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    ints = nl.ndarray((2, 4), dtype=nl.int32, buffer=nl.shared_hbm)
    t = nl.ndarray((2, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[:, 0:2], src=x)
    nisa.dma_copy(dst=out, src=t)
    i = nl.ndarray((2, 4), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=ints, src=i)
    return out, ints


def test_new_memory_holds_documented_sentinels():
    out, ints = uninitialised_kernel(np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(out[:, :2], 1.0)
    assert np.isnan(out[:, 2:]).all()
    np.testing.assert_array_equal(ints, 4)


@nki.jit
def views_kernel(x):
    out = nl.ndarray((4, 6), dtype=x.dtype, buffer=nl.shared_hbm)
    t = load(x)  # (4, 3, 6) in SBUF
    assert t[:, 0, 2].shape == (4, 1)  # on chip: at least 2-D, the last index keeps size 1
    assert t[1].shape == (1, 3, 6)  # an int on the partition dim keeps it
    assert x[1].shape == (3, 6)  # HBM indexes like NumPy
    flat = t.reshape((4, 18))
    nisa.memset(dst=flat[:, ::6], value=0.0)  # the first column of every row of t, through a view
    nisa.dma_copy(dst=out, src=t[:, -1, :])
    return out


def test_views_share_storage_and_keep_on_chip_rank():
    x = rand(4, 3, 6)
    out = views_kernel(x)
    expected = x[:, -1, :].copy()
    expected[:, 0] = 0
    np.testing.assert_array_equal(out, expected)


def test_tensors_have_no_arithmetic_operators():
    @nki.jit
    def kernel(x):
        t = load(x)
        return t + t

    with pytest.raises(TypeError, match="does not overload arithmetic"):
        kernel(rand(4, 4))


def test_out_of_bounds_slice_names_the_kernel_line():
    @nki.jit
    def kernel(x):
        return load(x[0:130, :])

    with pytest.raises(OutOfBoundsError, match=r"test_current_api\.py:\d+: .*dimension 0: index range \[0, 129\]"):
        kernel(rand(128, 4))


def test_matmul_operand_in_psum_is_rejected():
    @nki.jit
    def kernel(x):
        ps = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=load(x), moving=load(x))
        nisa.nc_matmul(dst=ps, stationary=ps, moving=load(x))

    with pytest.raises(MemorySpaceError, match="'stationary' of 'nisa.nc_matmul' to be in address space 'sbuf'"):
        kernel(rand(128, 128))


def test_unknown_keyword_argument_is_an_error():
    @nki.jit
    def kernel(x):
        t = load(x)
        nisa.tensor_copy(dst=t, src=t, mask=None)

    with pytest.raises(TypeError, match="mask"):
        kernel(rand(4, 4))


def test_unimplemented_instruction_says_so():
    @nki.jit
    def kernel(x):
        nisa.no_such_instruction(x)

    with pytest.raises(UnsupportedError, match="not supported by the simulator: nki.isa.no_such_instruction"):
        kernel(rand(4, 4))


def test_partition_limit_is_checked():
    @nki.jit
    def kernel(x):
        nl.ndarray((256, 4), dtype=nl.float32, buffer=nl.sbuf)

    with pytest.raises(SimulatorError, match="partition dimension 256 exceeds maximum 128"):
        kernel(rand(4, 4))


@nki.jit
def lnc2_kernel(x):
    """Each program doubles its half, then the two swap halves with sendrecv."""
    half = x.shape[0] // 2
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    me = nl.program_id(0)
    other = 1 - me
    mine = load(x[me * half:(me + 1) * half, :])
    nisa.tensor_scalar(dst=mine, data=mine, op0=nl.multiply, operand0=2.0)
    theirs = nl.ndarray(mine.shape, dtype=mine.dtype, buffer=nl.sbuf)
    nisa.sendrecv(dst=theirs, src=mine, send_to_rank=other, recv_from_rank=other, pipe_id=0)
    nisa.core_barrier(data=out, cores=(0, 1))
    nisa.dma_copy(dst=out[me * half:(me + 1) * half, :], src=theirs)
    return out


def test_lnc2_programs_split_work_and_exchange_with_sendrecv():
    x = rand(8, 5)
    out = lnc2_kernel[2](x)
    expected = np.concatenate([2 * x[4:], 2 * x[:4]])
    np.testing.assert_array_equal(out, expected)
    assert nl.num_programs.__name__ == "num_programs"


@nki.jit
def fori_kernel(x, count):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    acc = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    xs = load(x)
    bound = nisa.register_alloc()
    nisa.register_load(bound, load(count))

    def body(i):
        nisa.tensor_tensor(dst=acc, data1=acc, data2=xs, op=nl.add)

    nl.fori_loop(0, bound, body)
    nisa.dma_copy(dst=out, src=acc)
    return out


def test_fori_loop_with_a_register_bound():
    x = rand(4, 4)
    np.testing.assert_allclose(fori_kernel(x, np.array([[3]], np.int32)), 3 * x, rtol=1e-6)


def test_simulate_and_cpu_simulate_entry_points():
    a, b = rand(8, 8), rand(8, 8)
    np.testing.assert_array_equal(nki.simulate(add_kernel)(a, b), a + b)
    np.testing.assert_array_equal(nki.cpu_simulate(add_kernel.func)[1](a=a, b=b), a + b)


def test_lnc_bracket_takes_one_number():
    with pytest.raises(KernelUsageError, match="LNC"):
        add_kernel[2, 2]


def test_install_routes_import_nki():
    from nki_ops.sim.install import install

    with install() as installed:
        if not installed.current_active:
            pytest.skip("the real nki package is installed")
        import nki as routed
        import nki.isa.constants as constants
        import nki.language as routed_nl
        assert routed is nki and routed_nl is nl and constants is nki.isa.constants
        assert sys.modules["nki.dtype"] is nki.dtypes


@nki.jit
def gather_kernel(table, rows):
    """out[i] = table[rows[i]]; an index outside the table is skipped (out keeps -1 there)."""
    n = rows.shape[0]
    out = nl.ndarray((n, table.shape[1]), dtype=table.dtype, buffer=nl.shared_hbm)
    idx = load(rows)
    got = nl.ndarray((n, table.shape[1]), dtype=table.dtype, buffer=nl.sbuf)
    nisa.memset(dst=got, value=-1.0)
    nisa.dma_copy(dst=got, src=table.ap(pattern=[[table.shape[1], n], [1, table.shape[1]]], vector_offset=idx,
                                        indirect_dim=0), oob_mode=nisa.oob_mode.skip)
    nisa.dma_copy(dst=out, src=got)
    return out


def test_gather_through_ap_vector_offset_skips_out_of_range_rows():
    table = rand(10, 4)
    out = gather_kernel(table, np.array([[2], [7], [0], [12]], np.int32))
    np.testing.assert_array_equal(out[:3], table[[2, 7, 0]])
    np.testing.assert_array_equal(out[3], -1.0)


def test_gather_out_of_range_without_skip_is_an_error():
    @nki.jit
    def kernel(table, rows):
        got = nl.ndarray((2, 4), dtype=table.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=got, src=table.ap(pattern=[[4, 2], [1, 4]], vector_offset=load(rows), indirect_dim=0))

    with pytest.raises(OutOfBoundsError, match="indices outside it; pass oob_mode=oob_mode.skip"):
        kernel(rand(3, 4), np.array([[1], [3]], np.int32))


@nki.jit
def topk_kernel(x):
    """The 8 largest values per row and their first indices."""
    p = x.shape[0]
    vals = nl.ndarray((p, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    idx = nl.ndarray((p, 8), dtype=nl.uint32, buffer=nl.shared_hbm)
    xs = load(x)
    top = nl.ndarray((p, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.max8(dst=top, src=xs)
    where = nl.ndarray((p, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=where, data=xs, vals=top)
    nisa.dma_copy(dst=vals, src=top)
    nisa.dma_copy(dst=idx, src=where)
    return vals, idx


def test_top8_with_max8_and_nc_find_index8():
    x = rand(16, 100)
    vals, idx = topk_kernel(x)
    order = np.argsort(-x, axis=1, kind="stable")[:, :8]
    np.testing.assert_array_equal(vals, np.take_along_axis(x, order, axis=1))
    np.testing.assert_array_equal(idx, order)


@nki.jit
def softmax_kernel(x):
    p, f = x.shape
    out = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.shared_hbm)
    xs = load(x)
    row_max = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=row_max, op=nl.maximum, data=xs, axis=1, negate=True)
    exps = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    total = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=exps, op=nl.exp, data=xs, bias=row_max, reduce_op=nl.add, reduce_res=total,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    inv = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=inv, data=total)
    result = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=result, data=exps, op0=nl.multiply, operand0=inv)
    nisa.dma_copy(dst=out, src=result)
    return out


def test_softmax():
    x = rand(128, 300)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(softmax_kernel(x), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


@nki.jit
def rmsnorm_kernel(x, w, eps):
    """x / sqrt(mean(x^2) + eps) * w over 128-row tiles, any number of rows (the last tile narrower)."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    weight = nl.ndarray((128, d), dtype=nl.float32, buffer=nl.sbuf)
    for p in range(128):  # the (1, d) weight row on every partition
        nisa.dma_copy(dst=weight[p:p + 1, :], src=w)
    for start in range(0, n, 128):
        rows = min(128, n - start)
        xs = load(x[start:start + rows, :])
        squares = nl.ndarray((rows, d), dtype=nl.float32, buffer=nl.sbuf)
        ss = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=squares, op=nl.square, data=xs, reduce_op=nl.add, reduce_res=ss)
        rstd = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=rstd, data=ss, op0=nl.multiply, operand0=1.0 / d, op1=nl.add, operand1=eps)
        nisa.activation(dst=rstd, op=nl.rsqrt, data=rstd)
        normed = nl.ndarray((rows, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=normed, data=xs, op0=nl.multiply, operand0=rstd, op1=nl.multiply,
                                  operand1=weight[:rows, :])
        nisa.dma_copy(dst=out[start:start + rows, :], src=normed)
    return out


def test_rmsnorm_with_a_ragged_last_tile():
    x, w = rand(200, 64), rand(1, 64)
    expected = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(rmsnorm_kernel(x, w, 1e-6), expected, rtol=1e-5, atol=1e-6)


def test_same_kernel_in_both_dialects_is_bit_identical():
    from nki_ops.sim import nisa as legacy_nisa
    from nki_ops.sim import nki as legacy_nki
    from nki_ops.sim import nl as legacy_nl

    @legacy_nki.jit
    def legacy(x, col):
        out = legacy_nl.ndarray(x.shape, dtype=x.dtype, buffer=legacy_nl.shared_hbm)
        t = legacy_nl.load(x)
        c = legacy_nl.load(col)
        y = legacy_nisa.activation(op=legacy_nl.exp, data=t, bias=c, scale=0.5)
        y = legacy_nisa.tensor_scalar(y, op0=legacy_nl.multiply, operand0=c, op1=legacy_nl.add, operand1=1.5)
        legacy_nl.store(out, legacy_nisa.tensor_tensor(y, t, op=legacy_nl.subtract))
        return out

    @nki.jit
    def current(x, col):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t, c = load(x), load(col)
        y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.activation(dst=y, op=nl.exp, data=t, bias=c, scale=0.5)
        nisa.tensor_scalar(dst=y, data=y, op0=nl.multiply, operand0=c, op1=nl.add, operand1=1.5)
        nisa.tensor_tensor(dst=y, data1=y, data2=t, op=nl.subtract)
        nisa.dma_copy(dst=out, src=y)
        return out

    x, col = rand(64, 48, dtype=nl.bfloat16), rand(64, 1)
    np.testing.assert_array_equal(current(x, col).view(np.uint16), legacy(x, col).view(np.uint16))


@nki.jit
def accumulate_kernel(x):
    """Row sums of two tiles accumulated in the Scalar engine's registers: reset_reduce, then reduce."""
    p, f = x.shape
    out = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    xs = load(x)
    junk = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    total = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=junk, op=nl.copy, data=xs, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.activation(dst=junk, op=nl.exp, data=xs, reduce_op=nl.add, reduce_res=total,
                    reduce_cmd=nisa.reduce_cmd.reduce)
    nisa.dma_copy(dst=out, src=total)
    return out


def test_activation_accumulator_registers_follow_reduce_cmd():
    x = rand(32, 16)
    expected = (x + np.exp(x)).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(accumulate_kernel(x), expected, rtol=1e-5)


@nki.jit
def shuffle_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    xs = load(x)
    moved = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=moved, value=-7.0)
    nisa.nc_stream_shuffle(dst=moved, src=xs, shuffle_mask=[31 - i for i in range(31)] + [255])
    nisa.dma_copy(dst=out, src=moved)
    return out


def test_nc_stream_shuffle_reverses_within_each_quadrant():
    x = rand(64, 3)
    out = shuffle_kernel(x)
    for q in (0, 32):
        np.testing.assert_array_equal(out[q:q + 31], x[q + 31:q:-1])
        np.testing.assert_array_equal(out[q + 31], -7.0)


class Sizes(nl.NKIObject):
    rows: int
    cols: int = 4


@nki.jit
def constants_kernel(path, sizes):
    out = nl.ndarray((sizes.cols, sizes.rows), dtype=nl.float32, buffer=nl.shared_hbm)
    const = load(nl.shared_constant(path))
    identity = load(nl.shared_identity_matrix(sizes.rows, dtype=nl.float32))
    flipped = nl.ndarray((sizes.cols, sizes.rows), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=flipped, stationary=const, moving=identity, is_transpose=True)
    copy = nl.ndarray((sizes.cols, sizes.rows), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=copy, src=flipped)
    nisa.dma_copy(dst=out, src=copy)
    return out


def test_shared_constant_from_npy_nki_object_config_and_pe_transpose(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    values = rand(8, 4)
    values[1, 2] = np.nan
    np.save(tmp_path / "c.npy", values)
    out = constants_kernel(str(tmp_path / "c.npy"), Sizes(rows=8))
    np.testing.assert_array_equal(out, values.T)  # bit-exact: the NaN passes through


@nki.jit
def double_row_kernel(a, b):
    """out = a.reshape(256, M).T @ b.reshape(256, N) from [128, 2, F] fp8 operands."""
    out = nl.ndarray((a.shape[2], b.shape[2]), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((a.shape[2], b.shape[2]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=load(a), moving=load(b), perf_mode=nisa.matmul_perf_mode.double_row)
    res = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_fp8_double_row_matmul(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    a = rand(128, 2, 32).astype(nl.float8_e4m3)
    b = rand(128, 2, 48).astype(nl.float8_e4m3)
    expected = a.astype(np.float32).reshape(256, 32).T @ b.astype(np.float32).reshape(256, 48)
    np.testing.assert_allclose(double_row_kernel(a, b), expected, rtol=1e-5, atol=1e-4)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    with pytest.raises(KernelUsageError, match="double_row needs trn2 or later"):
        double_row_kernel(a, b)


@nki.jit
def nonzero_kernel(x):
    out = nl.ndarray((x.shape[0], x.shape[1] + 1), dtype=nl.int32, buffer=nl.shared_hbm)
    res = nl.ndarray((x.shape[0], x.shape[1] + 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=res, value=9)
    nisa.nonzero_with_count(dst=res, src=load(x), index_offset=100, padding_val=-1)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_nonzero_with_count_on_the_gpsimd_core_partitions(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    x = np.zeros((32, 6), np.float32)
    x[0, [1, 4]] = 1.0
    x[16, 5] = -2.0
    x[3, 0] = 1.0  # not a GpSimd core's partition: ignored
    out = nonzero_kernel(x)
    np.testing.assert_array_equal(out[0], [101, 104, -1, -1, -1, -1, 2])
    np.testing.assert_array_equal(out[16], [105, -1, -1, -1, -1, -1, 1])
    np.testing.assert_array_equal(out[3], 9)


def test_cli_simulate_runs_a_script_that_imports_nki(tmp_path, capsys):
    from nki_ops.cli import main as cli_main

    script = tmp_path / "script.py"
    script.write_text(
        "import numpy as np\n"
        "import nki\n"
        "import nki.isa as nisa\n"
        "import nki.language as nl\n\n\n"
        "@nki.jit\n"
        "def double(x):\n"
        "    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)\n"
        "    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)\n"
        "    nisa.dma_copy(dst=t, src=x)\n"
        "    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)\n"
        "    nisa.dma_copy(dst=out, src=t)\n"
        "    return out\n\n\n"
        "print('sum', nki.simulate(double)(np.arange(8, dtype=np.float32).reshape(2, 4)).sum())\n")
    assert cli_main(["simulate", str(script)]) == 0
    assert "sum 56.0" in capsys.readouterr().out


@nki.jit
def range_select_kernel(x, lo, hi):
    p, f = x.shape
    out = nl.ndarray((p, f + 1), dtype=nl.float32, buffer=nl.shared_hbm)
    res = nl.ndarray((p, f + 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.range_select(dst=res[:, 0:f], on_true_tile=load(x), comp_op0=nl.greater_equal, comp_op1=nl.less,
                      bound0=load(lo), bound1=load(hi), reduce_op=nl.maximum, reduce_res=res[:, f:f + 1],
                      range_start=10)  # the fill is FP32_MIN: the only value the hardware allows
    nisa.dma_copy(dst=out, src=res)
    return out


def test_range_select_keeps_a_per_partition_window_and_its_max(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    x = rand(4, 8)
    lo = np.array([[10], [12], [14], [0]], np.float32)
    hi = np.array([[13], [18], [15], [11]], np.float32)
    out = range_select_kernel(x, lo, hi)
    position = np.arange(8) + 10
    keep = (position >= lo) & (position < hi)
    expected = np.where(keep, x, np.finfo(np.float32).min)
    np.testing.assert_array_equal(out[:, :8], expected)
    np.testing.assert_array_equal(out[:, 8], expected.max(axis=1))


@nki.jit
def select_reduce_kernel(x, mask):
    p, f = x.shape
    out = nl.ndarray((p, f + 1), dtype=nl.float32, buffer=nl.shared_hbm)
    res = nl.ndarray((p, f + 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst=res[:, 0:f], predicate=load(mask), on_true=load(x), on_false=-5.0,
                       reduce_res=res[:, f:f + 1], reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=nl.maximum)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_select_reduce():
    x = rand(8, 6)
    mask = (RNG.random((8, 6)) > 0.5).astype(np.uint8)
    out = select_reduce_kernel(x, mask)
    expected = np.where(mask != 0, x, -5.0)
    np.testing.assert_array_equal(out[:, :6], expected)
    np.testing.assert_array_equal(out[:, 6], expected.max(axis=1))


@nki.jit
def n_gather_kernel(x, idx):
    out = nl.ndarray(idx.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    got = nl.ndarray(idx.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.nc_n_gather(dst=got, data=load(x), indices=load(idx))
    nisa.dma_copy(dst=out, src=got)
    return out


def test_nc_n_gather_per_partition():
    x = rand(4, 3, 5)
    idx = RNG.integers(0, 15, (4, 6)).astype(np.uint32)
    np.testing.assert_array_equal(n_gather_kernel(x, idx), np.take_along_axis(x.reshape(4, 15), idx, axis=1))


def test_nki_object_subclasses_take_their_fields_and_stay_dataclass_compatible():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Frozen(nl.NKIObject):
        k: int = 8

    assert Sizes(rows=3, cols=5).cols == 5 and Sizes(rows=2).cols == 4
    assert Frozen().k == 8 and Frozen(3) == Frozen(k=3)
    # The language guide's generated initializer: __init__(self, rows=None, cols=4).
    assert Sizes().rows is None and Sizes(3).rows == 3
    with pytest.raises(TypeError, match="unexpected or repeated argument 'depth'"):
        Sizes(depth=1)


@nki.jit
def broadcast_row_kernel(x):
    """Partition 0 of x copied to 40 partitions by stream shuffles (one per quadrant)."""
    out = nl.ndarray((40, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    xs = load(x)
    wide = nl.ndarray((40, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    for q in range(2):
        rows = min(32, 40 - 32 * q)
        nisa.nc_stream_shuffle(dst=wide[32 * q:32 * q + rows, :], src=xs[0:1, :], shuffle_mask=[0] * 32)
    nisa.dma_copy(dst=out, src=wide)
    return out


def test_nc_stream_shuffle_from_a_single_partition():
    x = rand(3, 5)
    np.testing.assert_array_equal(broadcast_row_kernel(x), np.broadcast_to(x[0], (40, 5)))


@nki.jit
def three_d_kernel(x, col):
    """Per-partition scale, bias and operands against a (P, A, B) tile."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    xs, cs = load(x), load(col)
    y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.activation(dst=y, op=nl.copy, data=xs, bias=cs, scale=cs)
    nisa.tensor_scalar(dst=y, data=y, op0=nl.subtract, operand0=cs)
    nisa.dma_copy(dst=out, src=y)
    return out


def test_per_partition_operands_broadcast_over_several_free_dims():
    x, col = rand(16, 3, 5), rand(16, 1)
    np.testing.assert_allclose(three_d_kernel(x, col), x * col[:, :, None] + col[:, :, None] - col[:, :, None],
                               rtol=1e-6, atol=1e-6)


@nki.jit
def scalar_offset_kernel(row, start):
    """Four elements of a 1-D HBM tensor from a runtime offset, through a (1, N) view's .ap()."""
    out = nl.ndarray((1, 4), dtype=row.dtype, buffer=nl.shared_hbm)
    at = nisa.register_alloc()
    nisa.register_load(at, load(start))
    got = nl.ndarray((1, 4), dtype=row.dtype, buffer=nl.sbuf)
    view = row.reshape((1, row.shape[0]))
    nisa.dma_copy(dst=got, src=view.ap(pattern=[[row.shape[0], 1], [1, 4]], offset=1, scalar_offset=at,
                                       indirect_dim=1))
    nisa.dma_copy(dst=out, src=got)
    return out


def test_ap_scalar_offset_counts_the_indirect_dim_of_the_view():
    row = rand(20)
    np.testing.assert_array_equal(scalar_offset_kernel(row, np.array([[6]], np.int32))[0], row[7:11])


def test_lnc2_reports_the_failing_program_not_its_partner():
    @nki.jit
    def kernel(x):
        t = load(x)
        if nl.program_id(0) == 1:
            nisa.no_such_instruction(t)
        nisa.sendrecv(dst=t, src=t, send_to_rank=1 - nl.program_id(0), recv_from_rank=1 - nl.program_id(0),
                      pipe_id=0)

    with pytest.raises(UnsupportedError, match="nki.isa.no_such_instruction"):
        kernel[2](rand(4, 4))


@nki.jit
def dma_transpose_kernel(x):
    out = nl.ndarray((x.shape[3], x.shape[1], x.shape[2], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(out.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=t, src=x)  # rank 4: the documented (3, 1, 2, 0)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_dma_transpose_defaults_to_the_documented_axes_of_its_rank():
    x = rand(4, 1, 2, 8)
    np.testing.assert_array_equal(dma_transpose_kernel(x), np.transpose(x, (3, 1, 2, 0)))


@nki.jit
def zero_then_write_kernel(x):
    """Both programs zero the shared output, then each writes its half: run in lockstep, the zeroing of
    one does not wipe the other's half. The device does not promise that order (nothing orders the two
    programs' writes), so the launch reports the race."""
    n = x.shape[0]
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    zeros = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=zeros, value=0.0)
    nisa.dma_copy(dst=out, src=zeros)
    me, half = nl.program_id(0), n // 2
    nisa.dma_copy(dst=out[me * half:(me + 1) * half, :], src=load(x[me * half:(me + 1) * half, :]))
    return out


def test_lnc2_programs_run_in_lockstep():
    x = rand(8, 3)
    for _ in range(3):
        with pytest.warns(SimulatorWarning, match="HBM race"):
            np.testing.assert_array_equal(zero_then_write_kernel[2](x), x)


@nki.jit
def late_first_write_kernel(x):
    """Program 0 writes the shared output at its first instruction, after a pause; program 1 writes it at
    its 30th, after 29 instructions on its own SBUF. In lockstep order program 1's write comes last."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    if nl.program_id(0) == 0:
        time.sleep(0.3)
        nisa.dma_copy(dst=out, src=x)
    else:
        for _ in range(29):
            nisa.memset(dst=t, value=2.0)
        nisa.dma_copy(dst=out, src=t)
    return out


def test_lnc2_shared_accesses_keep_their_lockstep_order_when_a_program_is_ahead_in_time():
    x = rand(4, 3)
    with pytest.warns(SimulatorWarning, match="HBM race"):
        np.testing.assert_array_equal(late_first_write_kernel[2](x), np.full_like(x, 2.0))


def test_lnc2_raises_the_error_first_in_lockstep_order_not_first_in_time():
    @nki.jit
    def kernel(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        if nl.program_id(0) == 1:
            time.sleep(0.3)
            nisa.memset(dst=t, value=1.0)
            nisa.tensor_tensor(dst=t, data1=t, data2=x, op=nl.add)  # its 2nd instruction: x is in HBM
        for _ in range(9):
            nisa.memset(dst=t, value=0.0)
        nisa.tensor_copy(dst=t, src=x)  # program 0's 10th: x is in HBM

    with pytest.raises(MemorySpaceError, match="tensor_tensor"):
        kernel[2](rand(4, 3))


def test_a_tensor_is_truthy_as_a_compile_time_object():
    @nki.jit
    def kernel(x, maybe=None):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        source = maybe if maybe else x  # kernels test optional tensors this way
        nisa.dma_copy(dst=out, src=load(source))
        return out

    x, y = rand(2, 3), rand(2, 3)
    np.testing.assert_array_equal(kernel(x), x)
    np.testing.assert_array_equal(kernel(x, y), y)
