"""Replay (``core/replay.py``): a kernel called again with the same shapes replays the instructions of its
recorded call. It must be invisible except in speed: bit-identical outputs, the same warnings and reports,
and a full run whenever something could differ between calls."""

from __future__ import annotations

import gc
import threading
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nki_ops.sim.core import outputs, replay
from nki_ops.sim.core.config import SimConfig, _from_environment, configure
from nki_ops.sim.core.errors import SimulatorWarning
from nki_ops.sim.frontends import current as nki
from nki_ops.sim.frontends import legacy as lnki

from .current_tiles import load, store

nl, nisa = nki.language, nki.isa
lnl, lnisa = lnki.language, lnki.isa

pytestmark = pytest.mark.simulation
RNG = np.random.default_rng(7)
SCALE = 2.0  # read by scaled_kernel: a global a kernel names is part of what a replay must match


def rand(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def calls(kernel, make_args, n: int = 5) -> tuple[list, list, int]:
    """``kernel`` called ``n`` times on fresh arguments, then the same calls with replay off; returns both
    lists of outputs and how many of the first calls were replays."""
    replay.clear()
    args = [make_args() for _ in range(n)]
    copies = [[a.copy() if isinstance(a, np.ndarray) else a for a in call] for call in args]
    before = replay.replayed
    got = [kernel(*call) for call in args]
    replays = replay.replayed - before
    with configure(replay=False):
        want = [kernel(*call) for call in copies]
    return got, want, replays


def assert_bit_identical(got, want) -> None:
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype
        assert g.view(np.uint8).tobytes() == w.view(np.uint8).tobytes()


# ------------------------------------------------------------------------------------- replayed kernels

@nki.jit
def chain_kernel(x, w):
    """Per 32-row tile: a load, a PSUM matmul, activations and a store, through views of the inputs."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    wt = load(w)
    for t in nl.affine_range(x.shape[0] // 32):
        rows = nl.ndarray((32, x.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=x[t * 32:(t + 1) * 32, :])
        acc = nl.ndarray((x.shape[1], 32), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=rows, moving=wt)
        act = nl.ndarray((x.shape[1], 32), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.activation(dst=act, op=nl.exp, data=acc, scale=0.01)
        flipped = nl.ndarray((32, x.shape[1]), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.nc_transpose(dst=flipped, data=act, engine=nisa.vector_engine)
        back = nl.ndarray((32, x.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=back, data1=flipped, data2=rows, op=nl.subtract)
        nisa.dma_copy(dst=out[t * 32:(t + 1) * 32, :], src=back)
    return out


@lnki.jit
def legacy_chain_kernel(x):
    out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
    for t in lnl.affine_range(x.shape[0] // 32):
        tile = lnl.load(x[t * 32:(t + 1) * 32, :])
        acc = lnl.zeros((32, x.shape[1]), dtype=lnl.float32, buffer=lnl.psum)
        acc += lnisa.nc_matmul(tile[:, 0:32], tile)
        lnl.store(out[t * 32:(t + 1) * 32, :], lnl.maximum(lnl.exp(tile * 0.5) - acc * 0.01, 0.0))
    return out


def test_a_current_kernel_called_again_replays_bit_identically():
    got, want, replays = calls(chain_kernel, lambda: (rand(96, 32), rand(32, 32)))
    assert replays == 5 - replay.RECORD_AT  # calls before RECORD_AT run in full, it is recorded, later ones replayed
    assert_bit_identical(got, want)


def test_a_legacy_kernel_called_again_replays_bit_identically():
    got, want, replays = calls(legacy_chain_kernel, lambda: (rand(96, 32),))
    assert replays == 5 - replay.RECORD_AT
    assert_bit_identical(got, want)


def test_replayed_outputs_are_new_arrays_and_arguments_the_new_calls():
    kernel = chain_kernel
    replay.clear()
    x, w = rand(64, 32), rand(32, 32)
    outs = [kernel(x * (i + 1), w) for i in range(5)]
    assert replay.replayed >= 2
    assert len({id(o) for o in outs}) == 5 and not any(np.shares_memory(outs[3], o) for o in outs[:3] + outs[4:])
    with configure(replay=False):
        assert_bit_identical([outs[3], outs[4]], [kernel(x * 4, w), kernel(x * 5, w)])


@nki.jit
def add_into_kernel(acc, x):
    """``acc += x`` written into the argument (an output passed in)."""
    a, b = load(acc), load(x)
    nisa.tensor_tensor(dst=a, data1=a, data2=b, op=nl.add)
    nisa.dma_copy(dst=acc, src=a)
    return acc


def test_arguments_a_replayed_kernel_writes_are_written():
    replay.clear()
    accs = [np.full((8, 4), float(i), np.float32) for i in range(5)]
    x = np.ones((8, 4), np.float32)
    before = replay.replayed
    for acc in accs:
        add_into_kernel(acc, x)
    assert replay.replayed - before == 5 - replay.RECORD_AT
    for i, acc in enumerate(accs):
        np.testing.assert_array_equal(acc, np.full((8, 4), i + 1.0, np.float32))


def test_other_shapes_and_other_scalar_arguments_are_other_recordings():
    @nki.jit
    def scale(x, factor):
        t = load(x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=factor)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    replay.clear()
    x = rand(8, 8)
    before = replay.replayed
    for _ in range(replay.RECORD_AT + 1):
        np.testing.assert_array_equal(scale(x, 2.0), x * np.float32(2.0))
    assert replay.replayed == before + 1  # recorded with factor 2.0 and an 8 x 8 x, and replayed once
    np.testing.assert_array_equal(scale(x, 3.0), x * np.float32(3.0))
    np.testing.assert_array_equal(scale(x[:4], 2.0), x[:4] * np.float32(2.0))
    assert replay.replayed == before + 1


def test_replay_off_by_config_and_by_environment(monkeypatch):
    replay.clear()
    before = replay.replayed
    with configure(replay=False):
        for _ in range(4):
            chain_kernel(rand(32, 32), rand(32, 32))
    assert replay.replayed == before
    monkeypatch.setenv("NKI_OPS_SIM_REPLAY", "0")
    assert _from_environment().replay is False
    monkeypatch.setenv("NKI_OPS_SIM_REPLAY", "yes")
    with pytest.raises(ValueError, match="NKI_OPS_SIM_REPLAY must be 0 or 1"):
        _from_environment()
    assert SimConfig().replay is True


def test_threads_calling_one_kernel_get_their_own_results():
    replay.clear()
    w = rand(32, 32)
    for _ in range(replay.RECORD_AT):
        chain_kernel(rand(64, 32), w)
    inputs = [rand(64, 32) for _ in range(8)]
    results = [None] * 8

    def work(i):
        results[i] = chain_kernel(inputs[i], w)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with configure(replay=False):
        assert_bit_identical(results, [chain_kernel(x, w) for x in inputs])


# --------------------------------------------------------------------------------- compiled replays

@nki.jit
def array_ops_kernel(x, scale):
    """Row tiles through instructions a replay runs as array operations: DMAs (one casting to bfloat16),
    ``tensor_scalar`` with a per-partition operand, ``activation`` with a bias, a ``tensor_tensor`` rounded
    into bfloat16."""
    out = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    s = load(scale)
    shape = (32, x.shape[1])
    for t in nl.affine_range(x.shape[0] // 32):
        rows = nl.ndarray(shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=x[t * 32:(t + 1) * 32, :])
        scaled = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=scaled, data=rows, op0=nl.multiply, operand0=s, op1=nl.add, operand1=0.5)
        grown = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=grown, op=nl.exp, data=scaled, scale=0.25, bias=s)
        both = nl.ndarray(shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=both, data1=grown, data2=rows, op=nl.subtract)
        nisa.dma_copy(dst=out[t * 32:(t + 1) * 32, :], src=both)
    return out


@nki.jit
def more_array_ops_kernel(x, scale):
    """The other instructions with an array form: ``memset``, ``nc_matmul`` overwriting then adding in PSUM,
    ``nc_transpose`` on the Tensor engine, ``tensor_copy``, ``reciprocal``, ``tensor_reduce``,
    ``scalar_tensor_tensor``, ``affine_select`` and ``activation`` summing rows into its registers."""
    out = nl.ndarray((x.shape[0] // 32, 32, 32), dtype=nl.float32, buffer=nl.shared_hbm)
    s = load(scale)
    shape = (32, 32)
    for t in nl.affine_range(x.shape[0] // 32):
        rows = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=x[t * 32:(t + 1) * 32, :])
        acc = nl.ndarray(shape, dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=rows, moving=rows)
        nisa.nc_matmul(dst=acc, stationary=rows, moving=rows)
        flipped = nl.ndarray(shape, dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=flipped, data=rows, engine=nisa.tensor_engine)
        copied = nl.ndarray(shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_copy(dst=copied, src=flipped)
        inverse = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inverse, data=acc)
        peak = nl.ndarray((32, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=peak, op=nl.maximum, data=inverse, axis=1)
        mixed = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=mixed, data=copied, op0=nl.multiply, operand0=peak, op1=nl.add,
                                  operand1=inverse)
        kept = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.affine_select(dst=kept, pattern=[[-1, 32]], channel_multiplier=1, on_true_tile=mixed,
                           on_false_value=-3.0, cmp_op=nl.greater_equal)
        sums = nl.ndarray((32, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=sums, value=0.0)
        grown = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=grown, op=nl.tanh, data=kept, scale=s, reduce_op=nl.add, reduce_res=sums,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.tensor_tensor(dst=grown, data1=grown, data2=sums.ap([[1, 32], [0, 32]]), op=nl.add)
        nisa.dma_copy(dst=out[t], src=grown)
    return out


def last_recording():
    return next(reversed(replay._cache.values()))


@pytest.mark.parametrize("kernel, rows, columns, copied", [(array_ops_kernel, 96, 16, True),
                                                            (array_ops_kernel, 4096, 64, False),
                                                            (more_array_ops_kernel, 64, 32, True)])
def test_a_kernel_of_array_operations_replays_them_bit_identically(kernel, rows, columns, copied):
    # Arguments small for the views the steps make of them are copied into arrays of the recording's own;
    # a large one's views are made again on each call's array.
    got, want, replays = calls(kernel, lambda: (rand(rows, columns), rand(32, 1)))
    assert replays == 5 - replay.RECORD_AT
    assert_bit_identical(got, want)
    compiled = last_recording().compiled
    assert compiled is not None and (0 in compiled.own) == copied and bool(compiled.rebinds) == (not copied)


@nki.jit
def mixed_kernel(x):
    """Array-form steps around ``tensor_tensor_scan``, which has no array form, and a PSUM tile that a
    ``tensor_copy`` writes before a matmul adds into it (its unwritten-element flags must follow)."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    for t in nl.affine_range(x.shape[0] // 32):
        rows = nl.ndarray((32, x.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=x[t * 32:(t + 1) * 32, :])
        ones = nl.ndarray(rows.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=ones, value=1.0)
        scanned = nl.ndarray(rows.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(dst=scanned, data0=ones, data1=rows, initial=0.0, op0=nl.multiply, op1=nl.add)
        acc = nl.ndarray(rows.shape, dtype=nl.float32, buffer=nl.psum)
        nisa.tensor_copy(dst=acc[:, 0:16], src=scanned[:, 0:16])
        nisa.nc_matmul(dst=acc, stationary=rows[:, 0:32], moving=scanned)
        total = nl.ndarray(rows.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=total, data1=acc, data2=rows, op=nl.add)
        nisa.dma_copy(dst=out[t * 32:(t + 1) * 32, :], src=total)
    return out


def test_a_kernel_with_steps_of_no_array_form_replays_them_beside_the_others():
    got, want, replays = calls(mixed_kernel, lambda: (rand(64, 32),))
    assert replays == 5 - replay.RECORD_AT
    assert_bit_identical(got, want)
    compiled = last_recording().compiled
    assert compiled is not None and compiled.steps is not None and compiled.ops
    ops = {fn for fn, _ in compiled.ops}
    steps = {getattr(fn, "__name__", fn) for fn, *_ in compiled.steps if fn not in ops}
    # The scan runs as recorded; so do the PSUM copy, whose write must clear the flags the matmul reads.
    assert "tensor_tensor_scan" in steps and "tensor_copy" in steps


@nki.jit
def halves_kernel(a_t, b):
    """Two matmuls into the interleaved halves of one PSUM tile through access patterns (views that name no
    NumPy base), then the whole tile read back: one storage, however its views reach it."""
    acc = nl.ndarray((a_t.shape[1], 2 * b.shape[1]), dtype=nl.float32, buffer=nl.psum)
    for half in range(2):
        view = acc.ap(pattern=[[2 * b.shape[1], a_t.shape[1]], [1, b.shape[1]]], offset=half * b.shape[1],
                      dtype=nl.float32)
        nisa.nc_matmul(dst=view, stationary=load(a_t), moving=load(b))
    result = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=result, src=acc)
    return store(result)


def test_tiles_whose_uses_do_not_overlap_share_storage_in_a_compiled_replay():
    # 8 row tiles of 4 tiles each: the replay's memory is what is live at once, as in the kernel's own run.
    got, want, _ = calls(array_ops_kernel, lambda: (rand(32 * 8, 16), rand(32, 1)))
    assert_bit_identical(got, want)
    written = {id(replay._base(args[0])) for _, args in last_recording().compiled.ops}
    assert len(written) <= 8  # 32 tiles, the scale tile and the output
    got, want, _ = calls(halves_kernel, lambda: (rand(64, 32), rand(64, 16)))
    assert_bit_identical(got, want)


def test_a_legacy_kernel_replays_its_loads_stores_and_arithmetic_as_array_operations():
    got, want, _ = calls(legacy_chain_kernel, lambda: (rand(64, 32),))
    assert_bit_identical(got, want)
    compiled = last_recording().compiled
    ops = {fn for fn, _ in compiled.ops}
    steps = {getattr(fn, "__name__", fn) for fn, *_ in compiled.steps if fn not in ops}
    assert len(compiled.ops) == 2 * 7 and steps == {"nc_matmul", "_reset", "assign", "inplace_result"}


@nki.jit
def planes_kernel(x):
    """Columns of alternate parity as strided views (*planes*) of tiles: read from a loaded tile, written into
    the planes of another that is then stored whole."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    rows, half = x.shape[0], x.shape[1] // 2
    tile = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    both = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=both[:, 0::2], data1=tile[:, 1::2], data2=tile[:, 0::2], op=nl.subtract)
    nisa.tensor_tensor(dst=both[:, 1::2], data1=tile[:, 1::2], data2=tile[:, 0::2], op=nl.maximum)
    summed = nl.ndarray((rows, half), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=summed, data1=both[:, 0::2], data2=both[:, 1::2], op=nl.add)
    nisa.tensor_copy(dst=both[:, 1::2], src=summed)
    nisa.dma_copy(dst=out, src=both)
    return out


@nki.jit
def overlapping_planes_kernel(x):
    """Planes of one tile that overlap (every second and every fourth column), and a tile stored whole of
    which a plane covers half."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    tile = load(x)
    halves = nl.ndarray((x.shape[0], x.shape[1] // 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=halves[:, 0:x.shape[1] // 4], data1=tile[:, 0::4], data2=tile[:, 2::4], op=nl.add)
    nisa.tensor_tensor(dst=halves[:, x.shape[1] // 4:], data1=tile[:, 0::4], data2=tile[:, 1::4], op=nl.maximum)
    part = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=part, value=0.5)
    nisa.tensor_copy(dst=part[:, 0::2], src=halves)
    nisa.tensor_tensor(dst=part[:, 0::2], data1=part[:, 0::2], data2=tile[:, 0::2], op=nl.multiply)
    nisa.dma_copy(dst=out, src=part)
    return out


def _computed_on(compiled):
    """The arrays the compiled operations other than element-wise copies compute on."""
    return [array for fn, args in compiled.ops if replay._copy_sides(fn, args) is None
            for array in replay._arrays_in(args)]


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_tiles_read_and_written_through_strided_planes_replay_on_contiguous_arrays(dtype):
    # Signed zeros and NaNs too: NumPy's maximum must give them the same way on contiguous arrays.
    special = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1.0, -1.0], np.float32)
    got, want, replays = calls(planes_kernel, lambda: (RNG.choice(special, (32, 64)).astype(dtype),))
    assert replays == 5 - replay.RECORD_AT
    assert_bit_identical(got, want)
    computed = _computed_on(last_recording().compiled)
    assert computed and all(array.flags.c_contiguous for array in computed)


def test_overlapping_planes_and_a_partly_covered_tile_read_whole_keep_their_layout():
    got, want, _ = calls(overlapping_planes_kernel, lambda: (rand(32, 64),))
    assert_bit_identical(got, want)
    computed = _computed_on(last_recording().compiled)
    strided = {array.strides for array in computed if not array.flags.c_contiguous}
    # The loaded tile's overlapping planes, the half-covered tile's, and the halves tile's (copied into a tile
    # that is not split: the copy would cut across its planes).
    assert strided == {(256, 16), (256, 8), (128, 4)}


def _plane_maps_by_element(holder, planes, covered):
    """``replay._plane_maps`` by definition: every element's multi-index, counted."""
    counts = np.zeros(holder.size, np.int64)
    index = np.arange(holder.size).reshape(holder.shape)
    found = []
    for plane in planes.values():
        offset = plane.__array_interface__["data"][0] - holder.__array_interface__["data"][0]
        flat = np.lib.stride_tricks.as_strided(index.reshape(-1)[offset // holder.itemsize:], plane.shape,
                                               [s // holder.itemsize * index.itemsize for s in plane.strides])
        np.add.at(counts, flat.reshape(-1), 1)
        at = np.stack(np.unravel_index(flat, holder.shape), axis=-1)  # plane index -> holder multi-index
        start = at[(0,) * plane.ndim]
        steps = [at[tuple(int(d == e and n > 1) for e in range(plane.ndim))] - start for d, n in enumerate(plane.shape)]
        if not np.array_equal(at, start + sum(np.multiply.outer(np.arange(n), step).reshape(
                (1,) * d + (n,) + (1,) * (plane.ndim - d - 1) + (-1,)) for d, (n, step)
                in enumerate(zip(plane.shape, steps)))):
            return None
        found.append((start.tolist(), [step.tolist() for step in steps]))
    if counts.max() > 1 or (covered and counts.min() < 1):
        return None
    return found


@st.composite
def views_of_a_tile(draw):
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    holder = np.zeros(shape, np.float32)
    planes = {}
    for _ in range(draw(st.integers(1, 3))):
        view = holder[tuple(slice(draw(st.integers(0, n - 1)), None, draw(st.sampled_from([1, 2, 3, -1, -2])))
                            for n in shape)]
        if draw(st.booleans()):
            view = view.transpose()
        if draw(st.booleans()):  # a run of the flat elements, across rows: affine in the holder's indices or not
            view = holder.reshape(-1)[draw(st.integers(0, holder.size - 1))::draw(st.integers(1, 4))]
        offset = view.__array_interface__["data"][0] - holder.__array_interface__["data"][0]
        planes.setdefault((offset, view.shape, view.strides), view)
    return holder, planes


@settings(max_examples=300, deadline=None)
@given(views_of_a_tile(), st.booleans())
def test_plane_maps_match_every_elements_multi_index(views, covered):
    holder, planes = views
    got = replay._plane_maps(holder, planes, covered)
    want = _plane_maps_by_element(holder, planes, covered)
    assert (got is None) == (want is None)
    if got is not None:
        assert [(start, steps) for _, start, steps in got] == want


@nki.jit
def broadcast_row_kernel(row):
    """A row copied to every partition by a ones-row matmul into a new PSUM tile, which it overwrites."""
    ones = nl.ndarray((1, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    acc = nl.ndarray((128, row.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=ones, moving=load(row))
    copied = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=copied, src=acc)
    return store(copied)


def test_a_fill_that_nothing_reads_is_not_replayed():
    # The PSUM tile was viewed (so filled) on the recorded call; the matmul then overwrites all of it.
    got, want, _ = calls(broadcast_row_kernel, lambda: (rand(1, 64),))
    assert_bit_identical(got, want)
    ops = last_recording().compiled.ops
    products = [args[0] for fn, args in ops if fn is replay.into and args[1] is outputs.shaped_product]
    assert len(products) == 1
    filled = [args[0] for fn, args in ops if fn is replay.fill]
    assert not any(np.shares_memory(array, products[0]) for array in filled)


@nki.jit
def select_kernel(x, y):
    """``select_reduce`` (no reduction, a scalar on_false) and ``tensor_copy_predicated`` with a tile's predicate."""
    a, b = load(x), load(y)
    take = nl.ndarray(x.shape, dtype=nl.uint8, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=take, data1=a, data2=b, op=nl.greater_equal)
    picked = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst=picked, predicate=take, on_true=a, on_false=-0.5, reverse_pred=True)
    nisa.tensor_copy_predicated(dst=b, src=picked, predicate=take)
    return store(b)


def test_selects_and_predicated_copies_replay_as_array_operations():
    special = np.array([0.0, -0.0, np.nan, 1.0, -1.0, 2.0], np.float32)
    got, want, replays = calls(select_kernel, lambda: tuple(RNG.choice(special, (32, 48)) for _ in range(2)))
    assert replays == 5 - replay.RECORD_AT
    assert_bit_identical(got, want)
    assert last_recording().compiled.steps is None  # every step has its array form


@nki.jit
def small_tiles_kernel(a, b):
    """One-row tiles: loads, a ``tensor_tensor`` computed into fp32 dst, a store (per-call overhead, no math)."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(a.shape[0]):
        x = nl.ndarray((1, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        y = nl.ndarray((1, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a[i:i + 1, :])
        nisa.dma_copy(dst=y, src=b[i:i + 1, :])
        nisa.tensor_tensor(dst=x, data1=x, data2=y, op=nl.maximum)
        nisa.dma_copy(dst=out[i:i + 1, :], src=x)
    return out


@lnki.jit
def legacy_small_tiles_kernel(a, b):
    out = lnl.ndarray(a.shape, dtype=a.dtype, buffer=lnl.shared_hbm)
    for i in lnl.affine_range(a.shape[0]):
        lnl.store(out[i:i + 1, :], lnl.maximum(lnl.load(a[i:i + 1, :]), lnl.load(b[i:i + 1, :])))
    return out


@pytest.mark.parametrize("kernel", [small_tiles_kernel, legacy_small_tiles_kernel])
def test_copies_and_binary_ufuncs_replay_as_single_numpy_calls(kernel):
    special = np.array([0.0, -0.0, np.nan, 1.0, -1.0], np.float32)
    got, want, _ = calls(kernel, lambda: tuple(RNG.choice(special, (16, 4)).astype(np.float32) for _ in range(2)))
    assert_bit_identical(got, want)
    ops = last_recording().compiled.ops
    assert {fn for fn, _ in ops} == {replay.fill, replay.binary}  # no ``into`` and no form's Python around them


@nki.jit
def scalar_stages_kernel(x, column):
    """``tensor_scalar`` in each form its compiled replay may take: one stage, reversed, a maximum with a constant
    (an array of it), a tile's per-partition column, two stages, a comparison then a product; and two stages
    whose second operand is a column of the tile they write, which stays a form of its own."""
    out = nl.ndarray((7,) + x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    t, c = load(x), load(column)
    stages = [dict(op0=nl.multiply, operand0=3.0),
              dict(op0=nl.subtract, operand0=1.5, reverse0=True),
              dict(op0=nl.maximum, operand0=-0.0),
              dict(op0=nl.add, operand0=c),
              dict(op0=nl.multiply, operand0=c, op1=nl.add, operand1=0.25),
              dict(op0=nl.greater_equal, operand0=0.0, op1=nl.multiply, operand1=c)]
    for i, stage in enumerate(stages):
        r = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=r, data=t, **stage)
        nisa.dma_copy(dst=out[i], src=r)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0, op1=nl.subtract, operand1=t[:, 0:1])
    nisa.dma_copy(dst=out[6], src=t)
    return out


def test_tensor_scalars_replay_as_ufunc_calls_bit_identically():
    special = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1.0, -1.0, 3e38], np.float32)
    got, want, replays = calls(scalar_stages_kernel, lambda: (RNG.choice(special, (32, 64)),
                                                              RNG.choice(special, (32, 1))))
    assert replays == 5 - replay.RECORD_AT
    assert_bit_identical(got, want)
    forms = [getattr(fn, "__name__", fn) for fn, _ in last_recording().compiled.ops]
    assert forms.count("binary") == 4 and forms.count("_two_stages") == 2 and forms.count("into") == 1


@nki.jit
def row_loop_kernel(a, b):
    """Per row: ``(a - b) * a + b`` through one-row tiles each iteration makes anew, and every second row also
    into a running sum (a value carried from one iteration to the next) and into the row below's output."""
    out = nl.ndarray((a.shape[0] + 1, a.shape[1]), dtype=a.dtype, buffer=nl.shared_hbm)
    total = nl.ndarray((1, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
    nisa.memset(dst=total, value=0.0)
    for i in nl.affine_range(a.shape[0]):
        x = nl.ndarray((1, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        y = nl.ndarray((1, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a[i:i + 1, :])
        nisa.dma_copy(dst=y, src=b[i:i + 1, :])
        r = nl.ndarray((1, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=r, data1=x, data2=y, op=nl.subtract)
        nisa.tensor_tensor(dst=r, data1=r, data2=x, op=nl.multiply)
        nisa.tensor_tensor(dst=r, data1=r, data2=y, op=nl.add)
        nisa.dma_copy(dst=out[i:i + 1, :], src=r)
    for i in nl.sequential_range(a.shape[0] // 2):
        x = nl.ndarray((1, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a[2 * i:2 * i + 1, :])
        nisa.tensor_tensor(dst=total, data1=total, data2=x, op=nl.add)
        nisa.dma_copy(dst=out[2 * i + 1:2 * i + 3, :], src=a[2 * i:2 * i + 2, :])  # overlaps the next iteration's
    nisa.dma_copy(dst=out[0:1, :], src=total)
    return out


def test_a_loops_iterations_of_arithmetic_replay_as_one_operation_each_bit_identically():
    special = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1.0, -3.0, 1e-40, 3e38], np.float32)
    got, want, replays = calls(row_loop_kernel, lambda: tuple(RNG.choice(special, (64, 8)) for _ in range(2)))
    assert replays == 5 - replay.RECORD_AT
    assert_bit_identical(got, want)
    ops = last_recording().compiled.ops
    # The first loop's 64 iterations are its 6 operations (and a copy back per reused tile); the second
    # loop's, which carry a sum and write overlapping rows, stay apart.
    batched = [args[0].shape[0] for _, args in ops if isinstance(args[0], np.ndarray) and args[0].shape[:1] == (64,)]
    assert len(batched) >= 6
    assert len(ops) < 64 + 3 * 32


def test_a_compiled_replay_that_fails_runs_the_call_in_full():
    replay.clear()
    x, scale = rand(64, 64), rand(32, 1)
    for _ in range(replay.RECORD_AT + 1):
        array_ops_kernel(x, scale)
    rec = last_recording()

    def broken(*args):
        raise ValueError("a compiled replay that goes wrong")

    rec.compiled.ops[-1] = (broken, [])
    before = replay.replayed
    got = array_ops_kernel(x * 2, scale)
    assert replay.replayed == before and rec.reason.startswith("replaying it raised ValueError")
    with configure(replay=False):
        assert_bit_identical([got], [array_ops_kernel(x * 2, scale)])


# ------------------------------------------------------------------------------ what always runs in full

def test_a_register_loaded_from_a_tensor_runs_in_full():
    @nki.jit
    def repeat(x, count):
        acc = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        xs = load(x)
        bound = nisa.register_alloc()
        nisa.register_load(bound, load(count))
        nl.fori_loop(0, bound, lambda i: nisa.tensor_tensor(dst=acc, data1=acc, data2=xs, op=nl.add))
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=acc)
        return out

    replay.clear()
    x = rand(4, 4)
    before = replay.replayed
    for n in (1, 2, 3, 4, 5):  # the loop's trip count comes from the tensor: every call differs
        np.testing.assert_allclose(repeat(x, np.array([[n]], np.int32)), n * x, rtol=1e-6)
    assert replay.replayed == before


@nki.jit
def gather_kernel(table, rows):
    n = rows.shape[0]
    got = nl.ndarray((n, table.shape[1]), dtype=table.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=got, src=table.ap(pattern=[[table.shape[1], n], [1, table.shape[1]]], vector_offset=load(rows),
                                        indirect_dim=0))
    out = nl.ndarray((n, table.shape[1]), dtype=table.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=got)
    return out


def test_addresses_taken_from_a_tile_run_in_full():
    replay.clear()
    table = rand(16, 4)
    before = replay.replayed
    for shift in range(4):
        rows = ((np.arange(4) + shift) % 16).astype(np.int32).reshape(4, 1)
        np.testing.assert_array_equal(gather_kernel(table, rows), table[rows[:, 0]])
    assert replay.replayed == before


def test_random_numbers_and_device_print_run_in_full(capsys):
    @nki.jit
    def noisy(x):
        t = load(x)
        nl.device_print("t", t)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    @lnki.jit
    def drawn(x):
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        lnl.store(out, lnl.add(lnl.load(x), lnl.rand(x.shape)))
        return out

    replay.clear()
    before = replay.replayed
    for _ in range(3):
        noisy(rand(2, 2))
    assert capsys.readouterr().out.count("t [[") == 3  # printed by every call
    x = rand(4, 4)
    outs = [drawn(x) for _ in range(3)]
    with configure(replay=False):
        assert_bit_identical(outs, [drawn(x) for _ in range(3)])
    assert replay.replayed == before


def test_python_state_the_kernel_names_is_part_of_the_key(monkeypatch):
    @nki.jit
    def scaled_kernel(x):
        t = load(x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=SCALE)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    replay.clear()
    x = rand(4, 4)
    for _ in range(replay.RECORD_AT + 1):
        np.testing.assert_array_equal(scaled_kernel(x), x * np.float32(2.0))
    monkeypatch.setitem(globals(), "SCALE", 5.0)
    np.testing.assert_array_equal(scaled_kernel(x), x * np.float32(5.0))  # a global changed
    spied = []
    original = nisa.tensor_scalar

    def spy(*args, **kwargs):
        spied.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(nisa, "tensor_scalar", spy)  # an attribute of a module the kernel names
    np.testing.assert_array_equal(scaled_kernel(x), x * np.float32(5.0))
    assert spied == [1]


def test_state_a_helper_reaches_is_part_of_the_key_however_often_the_kernel_ran(monkeypatch):
    factor = 2.0

    def scale(t, offset=0.0):  # a helper: its closure cell, its default and the global SCALE
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=factor, op1=nl.add, operand1=offset)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=SCALE)

    @nki.jit
    def helped_kernel(x):
        t = load(x)
        scale(t)
        return store(t)

    replay.clear()
    x = rand(4, 4)

    def expect(f, offset, s):
        before = replay.replayed
        for _ in range(replay.RECORD_AT + 1):  # the first call with a changed state runs in full, later ones replay
            np.testing.assert_array_equal(helped_kernel(x), (x * np.float32(f) + np.float32(offset)) * np.float32(s))
        assert replay.replayed > before

    expect(2.0, 0.0, 2.0)
    factor = 3.0  # the helper's closure cell
    expect(3.0, 0.0, 2.0)
    scale.__defaults__ = (1.0,)
    expect(3.0, 1.0, 2.0)
    monkeypatch.setitem(globals(), "SCALE", 4.0)
    expect(3.0, 1.0, 4.0)
    factor = 2.0  # back to the first state: its recording replays at once
    scale.__defaults__ = (0.0,)
    monkeypatch.setitem(globals(), "SCALE", 2.0)
    before = replay.replayed
    np.testing.assert_array_equal(helped_kernel(x), x * np.float32(2.0) * np.float32(2.0))
    assert replay.replayed == before + 1


def test_warnings_and_poison_reports_come_with_every_call():
    @nki.jit
    def half_scale(x, scale):
        t, s = load(x), load(scale)  # a bfloat16 operand0: a warning the page calls for
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=s)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    @nki.jit
    def uninitialised(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        u = load(x)
        nisa.tensor_tensor(dst=u, data1=u, data2=t, op=nl.add)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=u)
        return out

    replay.clear()
    x, scale = rand(4, 4), np.ones((4, 1), ml_dtypes.bfloat16)
    before = replay.replayed
    for _ in range(5):
        with pytest.warns(SimulatorWarning, match="must be a float32 tile"):
            half_scale(x, scale)
    assert replay.replayed == before  # a call that warns is not recorded
    for _ in range(5):  # the report of an output holding never-written memory comes from replays too
        with pytest.warns(SimulatorWarning, match="holds NaN computed from memory no instruction had written"):
            uninitialised(x)
    assert replay.replayed == before + 5 - replay.RECORD_AT


def test_an_observed_call_runs_in_full():
    from nki_ops.sim import profile

    replay.clear()
    x, w = rand(64, 32), rand(32, 32)
    for _ in range(replay.RECORD_AT + 1):
        chain_kernel(x, w)
    before = replay.replayed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = profile(chain_kernel)(x, w)
    assert replay.replayed == before and report.launches and report.seconds > 0


def test_a_replay_starts_from_fresh_memory():
    @nki.jit
    def running_sum(x):
        acc = nl.zeros((x.shape[1], x.shape[1]), dtype=nl.float32, buffer=nl.psum)  # filled on first use
        part = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        for t in nl.sequential_range(2):
            nisa.dma_copy(dst=part, src=x)
            nisa.nc_matmul(dst=acc, stationary=part, moving=part, accumulate=True)
        total = nl.ndarray(acc.shape, dtype=acc.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=total, src=acc)
        out = nl.ndarray(acc.shape, dtype=acc.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=total)
        return out

    got, want, replays = calls(running_sum, lambda: (rand(8, 4),))
    assert replays == 5 - replay.RECORD_AT
    assert_bit_identical(got, want)


def test_a_replay_that_fails_runs_the_call_in_full():
    replay.clear()
    x = rand(64, 32)
    for _ in range(replay.RECORD_AT + 1):
        legacy_chain_kernel(x)
    rec = next(r for r in replay._cache.values() if r.reason is None)

    def broken(*args, **kwargs):
        raise ValueError("a replay that goes wrong")

    rec.compiled.steps[-1] = (broken, *rec.compiled.steps[-1][1:])  # a step replayed as recorded
    before = replay.replayed
    got = legacy_chain_kernel(x * 2)
    assert replay.replayed == before and rec.reason.startswith("replaying it raised ValueError")
    with configure(replay=False):
        assert_bit_identical([got], [legacy_chain_kernel(x * 2)])


def test_a_kernel_that_returns_nothing_writes_its_arguments_once():
    @nki.jit
    def scale_in_place(x):
        t = load(x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=3.0)
        nisa.dma_copy(dst=x, src=t)

    replay.clear()
    before = replay.replayed
    for _ in range(5):
        x = np.arange(12, dtype=np.float32).reshape(4, 3)
        assert scale_in_place(x) is None
        np.testing.assert_array_equal(x, 3 * np.arange(12, dtype=np.float32).reshape(4, 3))
    assert replay.replayed - before == 5 - replay.RECORD_AT


def test_a_legacy_psum_tile_is_unwritten_again_on_every_replay():
    @lnki.jit
    def first_matmul_overwrites(x):
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        tile = lnl.load(x)
        acc = lnl.ndarray(x.shape, dtype=lnl.float32, buffer=lnl.psum)  # poison: the first matmul overwrites
        acc += lnisa.nc_matmul(tile[:, 0:32], tile)
        lnl.store(out, lnl.copy(acc))
        return out

    got, want, replays = calls(first_matmul_overwrites, lambda: (rand(32, 32),))
    assert replays == 5 - replay.RECORD_AT
    assert_bit_identical(got, want)


@nki.jit
def copy_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=load(x))
    return out


def test_the_recorded_call_holds_the_garbage_collector_and_gives_it_back_as_it_found_it(monkeypatch):
    """A recording keeps every object it makes; the collector waits while it grows, then runs as before."""
    during = []
    finish = replay.finish
    monkeypatch.setattr(replay, "finish", lambda *args: (during.append(gc.isenabled()), finish(*args)))
    x = rand(4, 8)
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            replay.clear()
            for _ in range(replay.RECORD_AT):
                copy_kernel(x)
            assert gc.isenabled() == enabled  # as it was before the recorded call
        finally:
            gc.enable()
    assert during == [False, False]  # one recorded call each time, the collector held in both
