"""Random-number instructions of the current API (``nisa.rng``, ``rand2``, ``dropout``, ``set_rng_seed``,
``rand_set_state``, ``rand_get_state``): statistics with fixed seeds, reproducibility, state round trips
and the documented operand, engine and architecture errors."""

from __future__ import annotations

import numpy as np
import pytest

from nki_ops.sim.core.errors import KernelUsageError, MemorySpaceError
from nki_ops.sim.frontends import current as nki

from .current_tiles import load, store

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation


def _seed(value):
    seed = nl.ndarray((1, 1), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.memset(dst=seed, value=value)
    nisa.set_rng_seed(src_seeds=seed)


@nki.jit
def rng_kernel(like, seed):
    _seed(seed)
    bits = nl.ndarray(like.shape, dtype=like.dtype, buffer=nl.sbuf)
    nisa.rng(dst=bits)
    return store(bits)


@nki.jit
def rand2_kernel(low, high, shape):
    _seed(5)
    values = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.rand2(dst=values, min=low, max=high)
    return store(values)


@nki.jit
def dropout_kernel(data, prob, seed):
    _seed(seed)
    src = load(data)
    out = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.sbuf)
    nisa.dropout(dst=out, data=src, prob=load(prob) if hasattr(prob, "shape") else prob)
    return store(out)


@nki.jit
def state_kernel(engine, words):
    """Save the state, draw a tile, restore, draw again: both tiles must be equal."""
    state = nl.ndarray((128, words), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.rand_get_state(dst=state, engine=engine)
    first = nl.ndarray((128, 64), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.rng(dst=first, engine=engine)
    nisa.rand_set_state(src_seeds=state, engine=engine)
    second = nl.ndarray((128, 64), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.rng(dst=second, engine=engine)
    return store(state), store(first), store(second)


def test_rng_bits_are_uniform_reproducible_and_differ_per_lane():
    bits = rng_kernel(np.zeros((128, 256), np.uint32), 11).astype(np.uint64)
    assert np.array_equal(bits, rng_kernel(np.zeros((128, 256), np.uint32), 11))
    assert not np.array_equal(bits, rng_kernel(np.zeros((128, 256), np.uint32), 12))
    assert len({row.tobytes() for row in bits}) == 128
    for bit in (0, 15, 31):  # each bit is set about half the time
        assert abs(((bits >> np.uint64(bit)) & np.uint64(1)).mean() - 0.5) < 0.01
    assert abs(bits.mean() / 2.0 ** 32 - 0.5) < 0.01


def test_rng_truncates_to_the_low_bits_of_narrow_dtypes():
    wide = rng_kernel(np.zeros((4, 32), np.uint32), 3)
    narrow = rng_kernel(np.zeros((4, 32), np.uint16), 3)
    signed = rng_kernel(np.zeros((4, 32), np.int8), 3)
    np.testing.assert_array_equal(narrow, (wide & 0xFFFF).astype(np.uint16))
    np.testing.assert_array_equal(signed, (wide & 0xFF).astype(np.uint8).view(np.int8))


def test_rand2_is_uniform_in_range_with_per_partition_bounds():
    values = rand2_kernel(-2.0, 6.0, (128, 512))
    assert values.min() >= -2.0 and values.max() < 6.0
    assert abs(values.mean() - 2.0) < 0.05 and abs(values.std() - 8 / 12 ** 0.5) < 0.05
    low = np.arange(4, dtype=np.float32).reshape(4, 1)
    per_row = rand2_kernel_tiles(low, low + 1)
    assert (per_row >= low).all() and (per_row < low + 1).all()
    assert np.allclose(per_row.mean(axis=1), low[:, 0] + 0.5, atol=0.05)


@nki.jit
def rand2_kernel_tiles(low, high):
    values = nl.ndarray((low.shape[0], 1024), dtype=nl.float32, buffer=nl.sbuf)
    nisa.rand2(dst=values, min=load(low), max=load(high))
    return store(values)


@pytest.mark.parametrize("prob", [0.0, 0.3, 1.0])
def test_dropout_keeps_about_one_minus_prob_unscaled(prob):
    data = np.random.default_rng(1).uniform(1, 2, (128, 256)).astype(np.float32)
    out = dropout_kernel(data, prob, 9)
    kept = out != 0
    assert abs(kept.mean() - (1 - prob)) < 0.01
    np.testing.assert_array_equal(out[kept], data[kept])
    np.testing.assert_array_equal(out, dropout_kernel(data, prob, 9))


def test_dropout_per_partition_prob_and_integer_data():
    data = np.arange(1, 4 * 2048 + 1, dtype=np.int32).reshape(4, 2048)
    prob = np.array([[0.0], [0.25], [0.75], [1.0]], np.float32)
    out = dropout_kernel(data, prob, 2)
    assert np.allclose((out != 0).mean(axis=1), 1 - prob[:, 0], atol=0.03)
    np.testing.assert_array_equal(out[out != 0], data[out != 0])


@pytest.mark.parametrize("engine,words", [(nisa.engine.gpsimd, 6), (nisa.engine.vector, 24)])
def test_state_round_trip_replays_the_sequence(engine, words):
    state, first, second = state_kernel(engine, words)
    np.testing.assert_array_equal(first, second)
    assert state.shape == (128, words) and len({row.tobytes() for row in state}) == 128


@nki.jit
def bad_kernel(case):
    t = nl.ndarray((8, 24), dtype=nl.uint32, buffer=nl.sbuf)
    if case == "float_rng":
        nisa.rng(dst=nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.sbuf))
    elif case == "gpsimd_psum":
        nisa.rng(dst=nl.ndarray((8, 8), dtype=nl.uint32, buffer=nl.psum), engine=nisa.engine.gpsimd)
    elif case == "scalar_rng":
        nisa.rng(dst=t, engine=nisa.engine.scalar)
    elif case == "state_words":
        nisa.rand_set_state(src_seeds=t, engine=nisa.engine.gpsimd)
    elif case == "state_dtype":
        nisa.rand_get_state(dst=nl.ndarray((8, 6), dtype=nl.int32, buffer=nl.sbuf))
    elif case == "seed_shape":
        nisa.set_rng_seed(src_seeds=t)
    elif case == "min_max":
        nisa.rand2(dst=nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.sbuf), min=1.0, max=1.0)
    elif case == "dropout_dtype":
        nisa.dropout(dst=nl.ndarray((8, 24), dtype=nl.float32, buffer=nl.sbuf), data=t, prob=0.5)
    elif case == "unknown_kwarg":
        nisa.rng(dst=t, seed=3)
    elif case == "rand2_v3":
        nisa.rand2(dst=nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.sbuf), min=0.0, max=1.0)
    elif case == "vector_state_v3":
        nisa.rand_get_state(dst=t, engine=nisa.engine.vector)
    elif case == "state_v2":
        nisa.rand_get_state(dst=nl.ndarray((8, 6), dtype=nl.uint32, buffer=nl.sbuf))
    elif case == "gpsimd_rng_v2":
        nisa.rng(dst=t, engine=nisa.engine.gpsimd)
    return store(t)


@pytest.mark.parametrize("case,target,error,message", [
    ("float_rng", "trn3", KernelUsageError, r"nisa.rng: 'dst' dtype must be one of .*got float32"),
    ("gpsimd_psum", "trn3", MemorySpaceError, r"GpSimd engine cannot access PSUM"),
    ("scalar_rng", "trn3", KernelUsageError, r"nisa.rng: engine must be vector or gpsimd, got scalar"),
    ("state_words", "trn3", KernelUsageError, r"\[lanes, 6\] on the gpsimd engine .*got \[8, 24\]"),
    ("state_dtype", "trn3", KernelUsageError, r"'dst' dtype must be one of uint32, got int32"),
    ("seed_shape", "trn3", KernelUsageError, r"src_seeds must be a \[1, 1\] tensor, got \[8, 24\]"),
    ("min_max", "trn3", KernelUsageError, r"min must be less than max"),
    ("dropout_dtype", "trn3", KernelUsageError, r"dst dtype float32 must match data dtype uint32"),
    ("unknown_kwarg", "trn3", TypeError, r"seed"),
    ("rand2_v3", "trn2", KernelUsageError, r"nisa.rand2 is available only on NeuronCore-v4 and newer; target is trn2"),
    ("vector_state_v3", "trn2", KernelUsageError, r"on the vector engine needs NeuronCore-v4 or newer; target is trn2"),
    ("state_v2", "trn1", KernelUsageError, r"nisa.rand_get_state is available only on NeuronCore-v3"),
    ("gpsimd_rng_v2", "trn1", KernelUsageError, r"nisa.rng on the gpsimd engine needs NeuronCore-v3"),
])
def test_errors(monkeypatch, case, target, error, message):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)
    with pytest.raises(error, match=message):
        bad_kernel(case)


@nki.jit
def nl_random_kernel(data, rate):
    seed = nl.full((1, 1), 42, dtype=nl.int32, buffer=nl.sbuf)
    nl.random_seed(seed)
    a = nl.rand((128, 512), dtype=nl.float32)
    nl.random_seed(seed)
    b = nl.rand((128, 512), dtype=nl.float32)
    dropped = nl.dropout(load(data), rate, dtype=nl.float32)
    return store(a), store(b), store(dropped)


def test_nl_rand_random_seed_and_dropout():
    data = np.full((128, 256), 3, np.int32)
    a, b, dropped = nl_random_kernel(data, 0.25)
    np.testing.assert_array_equal(a, b)  # the API page's example: same seed, same values
    assert a.min() >= 0 and a.max() < 1 and abs(a.mean() - 0.5) < 0.01
    assert dropped.dtype == np.float32 and set(np.unique(dropped)) <= {0.0, 3.0}
    assert abs((dropped == 0).mean() - 0.25) < 0.01


@nki.jit
def nl_seed_error_kernel():
    nl.random_seed(nl.full((2, 1), 1, dtype=nl.int32, buffer=nl.sbuf))
    return store(nl.rand((1, 1), dtype=nl.float32))


def test_nl_random_seed_needs_a_1x1_tensor():
    with pytest.raises(KernelUsageError, match=r"nl.random_seed: src_seeds must be a \[1, 1\] tensor, got \[2, 1\]"):
        nl_seed_error_kernel()
