"""Current API pieces from the NkiTensor and nki.isa pages of the SDK's newest API reference:
dynamic ``select`` and ``vector_select`` (gathers and scatters through a DMA), ``reinterpret_cast``,
``tensor_scalar_reduce``'s ``reduce_init``/``reduce_res_negate``, the NeuronCore-v4 ALU operators
``nl.abs_max``/``nl.abs_min``, ``nl.DType`` and ``nisa.NkiValidationError``; each against NumPy
written from the pages, and the errors the pages' constraints call for."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from nki_ops.sim.core.errors import (
    CapacityError,
    KernelUsageError,
    MemorySpaceError,
    OutOfBoundsError,
    SimulatorWarning,
    TileLimitError,
    UnsupportedError,
)
from nki_ops.sim.frontends import current as nki

from .current_tiles import load, store

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation
RNG = np.random.default_rng(31)


def index_tile(value: int):
    """A (1, 1) int32 SBUF tile holding ``value`` (as kernels load a runtime index)."""
    tile = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=tile, value=value)
    return tile


# ------------------------------------------------------------------------------ dynamic select

@nki.jit
def select_gather_kernel(table, row, skip):
    """``table.select(0, <tile>)`` of an HBM (B, P, F) tensor into SBUF, then back out; ``skip``: the
    DMA drops an out-of-range row (the destination keeps the 7.0 it was set to)."""
    b, p, f = table.shape
    tile = nl.ndarray((p, f), dtype=table.dtype, buffer=nl.sbuf)
    nisa.memset(dst=tile, value=7.0)
    mode = nisa.oob_mode.skip if skip else nisa.oob_mode.error
    view = table.select(0, index_tile(row))
    assert view.is_indirect() and view.shape == (p, f)
    nisa.dma_copy(dst=tile, src=view, oob_mode=mode)
    return store(tile)


def test_dynamic_select_gathers_the_runtime_row():
    table = RNG.standard_normal((4, 16, 8)).astype(np.float32)
    np.testing.assert_array_equal(select_gather_kernel(table, 2, False), table[2])


def test_dynamic_select_out_of_range_is_the_dmas_to_refuse_or_skip():
    table = RNG.standard_normal((4, 16, 8)).astype(np.float32)
    with pytest.raises(OutOfBoundsError, match="has indices outside it; pass oob_mode=oob_mode.skip"):
        select_gather_kernel(table, 4, False)
    np.testing.assert_array_equal(select_gather_kernel(table, 4, True), np.full((16, 8), 7.0, np.float32))


@nki.jit
def select_scatter_kernel(src, out, row):
    """A DMA writes ``src`` into row ``row`` (a runtime index) of the kernel argument ``out``."""
    nisa.dma_copy(dst=out.select(1, index_tile(row)), src=load(src))
    return out


def test_dynamic_select_scatters_into_a_middle_dim():
    src = RNG.standard_normal((8, 5)).astype(np.float32)
    out = np.zeros((8, 3, 5), np.float32)
    expected = out.copy()
    expected[:, 1] = src
    np.testing.assert_array_equal(select_scatter_kernel(src, out, 1), expected)


@nki.jit
def select_on_chip_kernel(x, column_index):
    """Copy column block ``column_index`` of an SBUF (P, C, F) tile chosen at runtime."""
    p, c, f = x.shape
    tile = load(x)
    dst = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=dst, src=tile.select(1, index_tile(column_index)))
    return store(dst)


def test_dynamic_select_on_chip_reads_the_runtime_column():
    x = RNG.standard_normal((8, 4, 6)).astype(np.float32)
    np.testing.assert_array_equal(select_on_chip_kernel(x, 3), x[:, 3])
    with pytest.raises(OutOfBoundsError, match="on dimension 1"):
        select_on_chip_kernel(x, 4)


@nki.jit
def select_misuse_kernel(x, case):
    tile = load(x)
    index = index_tile(0)
    if case == "partition":
        tile.select(0, index)
    elif case == "chain":
        tile.select(1, index).select(1, index)
    elif case == "view":
        x.select(0, index).view(nl.int32)


@pytest.mark.parametrize("case, message", [
    ("partition", "the partition dim cannot be selected at runtime"),
    ("chain", "a tensor takes one dynamic select only"),
    ("view", r"indirect \(gather/scatter\) view: view\(dtype\) and .ap\(\) do not apply"),
])
def test_dynamic_select_rules(case, message):
    with pytest.raises(KernelUsageError, match=message):
        select_misuse_kernel(np.ones((4, 3, 2), np.float32), case)


# ------------------------------------------------------------------------------ vector_select

@nki.jit
def vector_select_kernel(table, rows, skip, columns):
    """Partition p gathers row rows[p] of the HBM (R, F) table; ``columns`` slices the gathered view."""
    p = rows.shape[0]
    f0, f1 = columns
    index = load(rows)
    tile = nl.ndarray((p, f1 - f0), dtype=table.dtype, buffer=nl.sbuf)
    nisa.memset(dst=tile, value=-1.0)
    mode = nisa.oob_mode.skip if skip else nisa.oob_mode.error
    nisa.dma_copy(dst=tile, src=table.vector_select(0, index)[:, f0:f1], oob_mode=mode)
    return store(tile)


def test_vector_select_gathers_a_row_per_partition():
    table = RNG.standard_normal((10, 12)).astype(np.float32)
    rows = np.array([[3], [0], [9], [3], [5]], np.int32)
    np.testing.assert_array_equal(vector_select_kernel(table, rows, False, (0, 12)), table[rows[:, 0]])
    np.testing.assert_array_equal(vector_select_kernel(table, rows, False, (4, 9)), table[rows[:, 0], 4:9])


def test_vector_select_rows_out_of_range_are_refused_or_skipped():
    table = RNG.standard_normal((10, 12)).astype(np.float32)
    rows = np.array([[1], [10], [2]], np.int32)
    with pytest.raises(OutOfBoundsError, match="has indices outside it"):
        vector_select_kernel(table, rows, False, (0, 12))
    got = vector_select_kernel(table, rows, True, (0, 12))
    np.testing.assert_array_equal(got[[0, 2]], table[[1, 2]])
    np.testing.assert_array_equal(got[1], np.full(12, -1.0, np.float32))


@nki.jit
def vector_scatter_kernel(src, rows, out):
    nisa.dma_copy(dst=out.vector_select(0, load(rows)), src=load(src))
    return out


def test_vector_select_scatters_rows():
    src = RNG.standard_normal((3, 4)).astype(np.float32)
    rows = np.array([[4], [0], [2]], np.int32)
    out = np.zeros((5, 4), np.float32)
    expected = out.copy()
    expected[rows[:, 0]] = src
    np.testing.assert_array_equal(vector_scatter_kernel(src, rows, out), expected)


@nki.jit
def vector_select_misuse_kernel(table, rows, case):
    index = load(rows)
    if case == "dim":
        table.vector_select(1, index)
    elif case == "on_chip":
        load(table).vector_select(0, index)
    elif case == "float rows":
        table.vector_select(0, load(table)[:, 0:1])


@pytest.mark.parametrize("case, message", [
    ("dim", "dim must be 0, got 1"),
    ("on_chip", "only HBM tensors can be selected per partition"),
    ("float rows", "vector_offset must hold integers, got float32"),
])
def test_vector_select_rules(case, message):
    with pytest.raises(KernelUsageError, match=message):
        vector_select_misuse_kernel(np.ones((4, 3), np.float32), np.zeros((4, 1), np.int32), case)


@nki.jit
def reinterpret_kernel(x):
    tile = load(x)
    return store(tile.reinterpret_cast(nl.int32)), store(tile.view(nl.uint8))


def test_reinterpret_cast_is_view():
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    as_int, as_bytes = reinterpret_kernel(x)
    np.testing.assert_array_equal(as_int, x.view(np.int32))
    np.testing.assert_array_equal(as_bytes, x.view(np.uint8))


# ------------------------------------------------------------------------ tensor_scalar_reduce

@nki.jit
def scalar_reduce_kernel(x, op, init, negate):
    """``x * 2`` with its free-axis ``op`` reduction; ``init`` (a (P, 1) HBM tensor or None) loads the
    Vector accumulators first."""
    p, f = x.shape
    dst = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
    cmd = nisa.reduce_cmd.reset_reduce if init is None else nisa.reduce_cmd.load_reduce
    nisa.tensor_scalar_reduce(dst=dst, data=load(x), op0=nl.multiply, operand0=2.0, reduce_op=op, reduce_res=res,
                              reduce_cmd=cmd, reduce_init=None if init is None else load(init),
                              reduce_res_negate=negate)
    return store(dst), store(res)


def test_tensor_scalar_reduce_loads_reduce_init_and_negates_the_result():
    x = RNG.standard_normal((6, 10)).astype(np.float32)
    init = RNG.standard_normal((6, 1)).astype(np.float32)
    dst, res = scalar_reduce_kernel(x, nl.add, init, True)
    np.testing.assert_array_equal(dst, x * 2)
    np.testing.assert_allclose(res[:, 0], -(init[:, 0] + (x * 2).sum(axis=1)), rtol=1e-5)
    _, res = scalar_reduce_kernel(x, nl.maximum, init, False)
    np.testing.assert_array_equal(res[:, 0], np.maximum(init[:, 0], (x * 2).max(axis=1)))


@pytest.mark.parametrize("op, init, message", [
    (nl.add, "load without init", "reduce_init must be given exactly when reduce_cmd is load_reduce"),
    (nl.subtract, None, "reduce_op must be one of nl.add, nl.multiply, nl.maximum, nl.minimum"),
])
def test_tensor_scalar_reduce_rules(op, init, message):
    @nki.jit
    def kernel(x):
        dst = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=dst, data=load(x), op0=nl.add, operand0=1.0, reduce_op=op,
                                  reduce_cmd=nisa.reduce_cmd.load_reduce if init else nisa.reduce_cmd.reset_reduce)

    with pytest.raises(KernelUsageError, match=message):
        kernel(np.ones((2, 2), np.float32))


# ------------------------------------------------------------------------------ abs_max / abs_min

@nki.jit
def magnitude_kernel(x, y):
    a, b = load(x), load(y)
    return store(nl.abs_max(a, b)), store(nl.abs_min(a, b)), store(nl.abs_max(a, -3.0))


def test_abs_max_abs_min_keep_the_sign_and_prefer_y_on_a_tie(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    x = np.array([[-5.0, 1.0, 2.0, -0.5]], np.float32)
    y = np.array([[3.0, -1.0, -4.0, 0.25]], np.float32)
    big, small, scalar = magnitude_kernel(x, y)
    np.testing.assert_array_equal(big, [[-5.0, -1.0, -4.0, -0.5]])
    np.testing.assert_array_equal(small, [[3.0, -1.0, 2.0, 0.25]])
    np.testing.assert_array_equal(scalar, [[-5.0, -3.0, -3.0, -3.0]])


def test_abs_max_needs_trn3(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    with pytest.raises(KernelUsageError, match=r"nl.abs_max is available only on NeuronCore-v4 \(trn3\) and newer; "
                                                r"target is trn2"):
        magnitude_kernel(np.ones((1, 2), np.float32), np.ones((1, 2), np.float32))


# ------------------------------------------------------------------------------ names

def test_dtype_and_validation_error_names():
    assert isinstance(nl.float32, nl.DType) and isinstance(nl.bfloat16, nl.DType)
    for error in (KernelUsageError, OutOfBoundsError, MemorySpaceError, TileLimitError, CapacityError):
        assert issubclass(error, nisa.NkiValidationError)
    assert not issubclass(UnsupportedError, nisa.NkiValidationError)  # a simulator limit, not a hardware one


def test_tensor_indirection_is_refused_by_name():
    @nki.jit
    def kernel(x):
        tile = load(x)
        tile.indirect(index_tile(0))

    with pytest.raises(UnsupportedError, match=r"not supported by the simulator: NkiTensor.indirect"):
        kernel(np.ones((2, 2), np.float32))


# ------------------------------------------------------------------------------ scheduling

@nki.jit
def scheduled_kernel(x):
    """Two independent named instructions and a third that joins them; returns their handles too."""
    tile = load(x)
    a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    b = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    c = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    first = nisa.reciprocal(dst=a, data=tile, name="recip")
    second = nisa.tensor_scalar(dst=b, data=tile, op0=nl.add, operand0=1.0, name="plus1")
    joined = nisa.tensor_tensor(dst=c, data1=a, data2=b, op=nl.add)
    assert joined.depends_on(first, second) is joined
    assert isinstance(second, nisa.NkiInstruction) and second.name == "plus1"
    return store(c)


def test_instructions_return_handles_and_with_schedule_keeps_the_result():
    x = RNG.uniform(1.0, 2.0, (4, 8)).astype(np.float32)
    expected = 1.0 / x + (x + 1.0)
    np.testing.assert_allclose(scheduled_kernel(x), expected, rtol=1e-6)
    scheduled = scheduled_kernel.with_schedule([("plus1", "recip")])
    np.testing.assert_allclose(scheduled(x), expected, rtol=1e-6)
    np.testing.assert_allclose(scheduled_kernel.with_schedule([("plus1", ["recip"])])[1](x), expected, rtol=1e-6)


def test_with_schedule_rejects_unknown_names_cycles_and_bad_edges():
    x = np.ones((2, 2), np.float32)
    with pytest.raises(KernelUsageError, match=r"never issued: \['times2'\] \(issued: \['plus1', 'recip'\]\)"):
        scheduled_kernel.with_schedule([("times2", "recip")])(x)
    with pytest.raises(KernelUsageError, match="cycle"):
        scheduled_kernel.with_schedule([("plus1", "recip"), ("recip", ["plus1"])])
    with pytest.raises(KernelUsageError, match="pairs"):
        scheduled_kernel.with_schedule(["plus1"])
    with pytest.raises(KernelUsageError, match="depends_on takes instructions"):
        @nki.jit
        def kernel(x):
            nisa.memset(dst=load(x), value=0.0).depends_on("recip")

        kernel(x)


# ------------------------------------------------------------------------------ assignment

@nki.jit
def assign_kernel(x):
    """``t[key] = value``: SBUF columns into an HBM output (a DMA, bf16 -> fp32), a tile into an SBUF
    view (an engine copy) and a number into an SBUF view (a fill)."""
    p, f = x.shape
    tile = load(x)
    out = nl.ndarray((p, 2 * f), dtype=nl.float32, buffer=nl.shared_hbm)
    out[:, 0:f] = tile
    staged = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
    staged[:, 0:2] = 3.0
    staged[:, 2:f] = tile[:, 0:f - 2]
    out[:, f:2 * f] = staged
    return out


def test_assignment_copies_into_the_view():
    x = RNG.standard_normal((4, 6)).astype(ml_dtypes.bfloat16)
    out = assign_kernel(x)
    wide = x.astype(np.float32)
    np.testing.assert_array_equal(out[:, :6], wide)
    np.testing.assert_array_equal(out[:, 6:8], np.full((4, 2), 3.0, np.float32))
    np.testing.assert_array_equal(out[:, 8:], wide[:, :4])


def test_assignment_rejects_what_no_instruction_moves():
    @nki.jit
    def kernel(x):
        x[0:2] = 1.0

    with pytest.raises(KernelUsageError, match="assign a tensor, or a number into an on-chip tensor"):
        kernel(np.ones((4, 2), np.float32))


# ------------------------------------------------------------------------------ target limits

@pytest.mark.parametrize("target, usable, total", [("trn1", 180224, 24 << 20), ("trn2", 212984, 28 << 20),
                                                   ("trn3", 245752, 32 << 20)])
def test_tile_size_sbuf_sizes_are_the_targets(monkeypatch, target, usable, total):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)

    @nki.jit
    def kernel(x):
        t = nl.tile_size
        sizes = nl.ndarray((1, 5), dtype=nl.int32, buffer=nl.sbuf)
        values = (t.total_available_sbuf_size, t.sbuf_fmax_bytes, t.sbuf_fmax, t.sbuf_size_bytes // 1024,
                  t.psum_num_banks)
        for i, value in enumerate(values):
            nisa.memset(dst=sizes[:, i:i + 1], value=value)
        return store(sizes)

    np.testing.assert_array_equal(kernel(np.ones((1, 1), np.float32))[0],
                                  [usable, usable, usable // 4, total // 1024, 8])


@pytest.mark.parametrize("call", [
    lambda t, d: nl.divide(t, t),
    lambda t, d: nl.mod(t, 2.0),
    lambda t, d: nisa.tensor_scalar(dst=d, data=t, op0=nl.divide, operand0=2.0),
    lambda t, d: nisa.tensor_tensor(dst=d, data1=t, data2=t, op=nl.fmod),
])
def test_divide_and_modulo_do_not_compile(call):
    @nki.jit
    def kernel(x):
        tile = load(x)
        call(tile, nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf))

    with pytest.raises(KernelUsageError, match=r"nl\.(divide|mod|fmod) does not compile for Trainium"):
        kernel(np.ones((2, 2), np.float32))


# ------------------------------------------------------------------------------ dma_transpose lowerings

@nki.jit
def gather_transpose_kernel(table, rows, skip):
    """Rows ``rows`` of the HBM (R, 4, D) table, gathered and transposed to (D, 4, 16) in one DMA."""
    d = table.shape[2]
    index = load(rows)
    dst = nl.ndarray((d, 4, 16), dtype=table.dtype, buffer=nl.sbuf)
    nisa.memset(dst=dst, value=-1.0)
    nisa.dma_transpose(dst=dst, src=table.vector_select(0, index),
                       oob_mode=nisa.oob_mode.skip if skip else nisa.oob_mode.error)
    return store(dst)


def test_gather_transpose_moves_the_selected_rows_and_skips_the_others():
    table = RNG.standard_normal((40, 4, 8)).astype(ml_dtypes.bfloat16)
    rows = RNG.permutation(40)[:16].reshape(16, 1).astype(np.int32)
    np.testing.assert_array_equal(gather_transpose_kernel(table, rows, False),
                                  table[rows[:, 0]].transpose(2, 1, 0))
    rows[5, 0] = 40
    with pytest.raises(OutOfBoundsError, match="has indices outside it"):
        gather_transpose_kernel(table, rows, False)
    got = gather_transpose_kernel(table, rows, True).astype(np.float32)
    np.testing.assert_array_equal(got[:, :, 5], np.full((8, 4), -1.0, np.float32))
    keep = [i for i in range(16) if i != 5]
    np.testing.assert_array_equal(got[:, :, keep],
                                  table[rows[keep, 0]].transpose(2, 1, 0).astype(np.float32))


@pytest.mark.parametrize("target, shape, dtype, message", [
    ("trn1", (16, 8), ml_dtypes.bfloat16, "dge_mode=hwdge needs NeuronCore-v3 or newer"),
    ("trn2", (32, 8), ml_dtypes.bfloat16, r"2-D src needs src.shape\[0\] == 16"),
    ("trn2", (16, 8), np.float32, "moves 2-byte elements"),
])
def test_hardware_dge_transpose_rules(monkeypatch, target, shape, dtype, message):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)

    @nki.jit
    def kernel(x):
        dst = nl.ndarray(x.shape[::-1], dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=dst, src=x, dge_mode=nisa.dge_mode.hwdge)

    with pytest.raises(KernelUsageError, match=message):
        kernel(np.ones(shape, dtype))


def test_engine_and_dtype_rules_of_the_pages(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")

    @nki.jit
    def scalar_subtract(x):
        dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=dst, data=load(x), op0=nl.multiply, operand0=2.0, op1=nl.add, operand1=1.0,
                           engine=nisa.scalar_engine)  # a pair the trn2 Scalar engine runs
        nisa.tensor_scalar(dst=dst, data=load(x), op0=nl.subtract, operand0=1.0, engine=nisa.scalar_engine)

    with pytest.raises(KernelUsageError, match="the Scalar engine on trn2 takes only"):
        scalar_subtract(np.ones((2, 2), np.float32))

    @nki.jit
    def int_matmul(x):
        dst = nl.ndarray((2, 2), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=dst, stationary=load(x), moving=load(x))

    with pytest.raises(KernelUsageError, match="stationary is int8; the Tensor engine multiplies float8"):
        int_matmul(np.ones((2, 2), np.int8))


def test_reading_accumulators_never_reset_is_reported():
    @nki.jit
    def kernel(x, first_cmd):
        tile = load(x)
        e = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=tile, reduce_op=nl.add, reduce_res=s, reduce_cmd=first_cmd)
        return store(s)

    x = RNG.standard_normal((4, 8)).astype(np.float32)
    with pytest.warns(SimulatorWarning, match=r"reads the scalar engine's accumulator registers \(reduce_cmd=idle\) "
                                              r"before any instruction of the kernel reset or loaded them"):
        kernel(x, nisa.reduce_cmd.idle)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SimulatorWarning)
        np.testing.assert_allclose(kernel(x, nisa.reduce_cmd.reset_reduce)[:, 0], np.exp(x).sum(axis=1), rtol=1e-5)


def test_subtract_reduction_is_named_as_not_modelled():
    @nki.jit
    def kernel(x):
        dst = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=dst, op=nl.subtract, data=load(x), axis=1)

    with pytest.raises(UnsupportedError, match="subtract reduction .*do not define its order"):
        kernel(np.ones((2, 4), np.float32))


def test_a_gather_view_reads_the_rows_when_the_dma_runs():
    @nki.jit
    def kernel(table, rows):
        view = table.vector_select(0, load(rows))  # made before the table is written
        nisa.dma_copy(dst=table, src=_doubled(table))
        dst = nl.ndarray(view.shape, dtype=table.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=dst, src=view)
        return store(dst)

    table = RNG.standard_normal((6, 4)).astype(np.float32)
    rows = np.array([[5], [1]], np.int32)
    np.testing.assert_array_equal(kernel(table.copy(), rows), 2 * table[[5, 1]])


def _doubled(table):
    tile = load(table)
    nisa.tensor_scalar(dst=tile, data=tile, op0=nl.multiply, operand0=2.0)
    return tile


@pytest.mark.parametrize("engine, exact", [(nisa.engine.unknown, True), (nisa.engine.vector, False)])
def test_int32_tensor_tensor_is_exact_on_gpsimd_and_fp32_on_vector(engine, exact):
    @nki.jit
    def kernel(a, b):
        dst = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=dst, data1=load(a), data2=load(b), op=nl.add, engine=engine)
        more = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=more, data1=load(a), data2=load(b), op=nl.multiply, engine=engine)
        return store(dst), store(more)

    a = np.array([[16777217, 2 ** 30 + 3, 2 ** 31 - 1]], np.int32)
    b = np.array([[2, 1, 1]], np.int32)
    total, product = kernel(a, b)
    wrapped = (a.astype(np.int64) + b).astype(np.uint32).view(np.int32)  # 2^31 - 1 + 1 wraps
    if exact:
        np.testing.assert_array_equal(total, wrapped)
        np.testing.assert_array_equal(product, (a.astype(np.int64) * b).astype(np.uint32).view(np.int32))
    else:  # through fp32: 16777219 is not a float32
        assert total[0, 0] != wrapped[0, 0]


@pytest.mark.parametrize("target, ok", [("trn2", False), ("trn3", True)])
def test_matmul_into_bfloat16_psum_needs_trn3(monkeypatch, target, ok):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)

    @nki.jit
    def kernel(x):
        dst = nl.ndarray((2, 2), dtype=nl.bfloat16, buffer=nl.psum)
        nisa.nc_matmul(dst=dst, stationary=load(x), moving=load(x))
        out = nl.ndarray((2, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out, src=dst)
        return store(out)

    x = np.ones((2, 2), ml_dtypes.bfloat16)
    if ok:
        np.testing.assert_array_equal(kernel(x), np.full((2, 2), 2.0, np.float32))
    else:
        with pytest.raises(KernelUsageError, match="lands in a float32 PSUM tile"):
            kernel(x)


@pytest.mark.parametrize("target, dtypes, message", [
    ("trn2", ("float8_e4m3fn", "float8_e4m3fn"), r"float8_e4m3fn \(OCP FP8\) operands need NeuronCore-v4"),
    ("trn3", ("float8_e4m3", "float8_e4m3fn"), "cannot be mixed in one matmul"),
    ("trn3", ("float8_e4m3fn", "float8_e5m2"), None),
])
def test_ocp_fp8_matmul_rules(monkeypatch, target, dtypes, message):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)

    @nki.jit
    def kernel(a, b):
        dst = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=dst, stationary=load(a), moving=load(b))
        out = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out, src=dst)
        return store(out)

    a, b = (np.ones((4, 4), getattr(ml_dtypes, name)) for name in dtypes)
    if message is None:
        np.testing.assert_array_equal(kernel(a, b), np.full((4, 4), 4.0, np.float32))
    else:
        with pytest.raises(KernelUsageError, match=message):
            kernel(a, b)


def test_integer_operand_tile_of_an_arithmetic_tensor_scalar_is_refused():
    @nki.jit
    def kernel(x, column_values, op):
        dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=dst, data=load(x), op0=op, operand0=load(column_values))
        return store(dst)

    x = np.arange(8, dtype=np.int32).reshape(2, 4)
    column_values = np.array([[1], [2]], np.int32)
    np.testing.assert_array_equal(kernel(x, column_values, nl.bitwise_and), x & column_values)
    with pytest.raises(KernelUsageError, match="operand0 of an arithmetic operator must be float32, got an int32"):
        kernel(x, column_values, nl.add)


def test_enum_values_are_the_apis():
    """Kernels pass raw values (the kernel library's ``_DGE_MODE_NONE = 3``): the numbering is the API's."""
    assert [int(m) for m in (nisa.dge_mode.unknown, nisa.dge_mode.swdge, nisa.dge_mode.hwdge,
                             nisa.dge_mode.none)] == [0, 1, 2, 3]
    assert [int(nisa.dma_engine.dma), int(nisa.dma_engine.gpsimd_dma)] == [1, 2]

    @nki.jit
    def kernel(x):
        dst = nl.ndarray((x.shape[3], 1, 1, x.shape[0]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=dst, src=x, dge_mode=3)  # no DGE: none of the hardware-DGE shape rules
        return store(dst)

    x = RNG.standard_normal((6, 1, 1, 8)).astype(np.float32)
    np.testing.assert_array_equal(kernel(x), x.transpose(3, 1, 2, 0))


def test_sbuf_size_bytes_is_the_targets_not_a_configured_budget(monkeypatch):
    from nki_ops.sim import configure

    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")

    @nki.jit
    def kernel(x):
        sizes = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=sizes, value=nl.tile_size.sbuf_size_bytes // 1024)
        return store(sizes)

    with configure(sbuf_budget_bytes=64 * 1024):
        assert kernel(np.ones((1, 1), np.float32))[0, 0] == 28 * 1024
