"""On-chip capacity by liveness: a tile occupies SBUF or PSUM from its first use to its last use,
whatever Python still references. PSUM beyond its 8 banks is an error; SBUF beyond the budget is
a warning naming the live tiles (the legacy compiler spills to HBM); one tile larger than a
partition is an error before any memory is taken."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from nki_ops.sim import CapacityError, SimConfig, SimulatorWarning, TileLimitError, nki, nl, simulate

pytestmark = pytest.mark.simulation

X = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)


def run(body, *arrays, **config):
    return simulate(nki.jit(body), *(arrays or (X,)), config=SimConfig(**config))


def no_warnings(body, *arrays, **config):
    with warnings.catch_warnings():
        warnings.simplefilter("error", SimulatorWarning)
        return run(body, *arrays, **config)


def test_a_tile_rebound_in_a_loop_counts_once():
    # Two 120 KB tiles: together above the 192 KiB budget, but the first is dead before the second exists.
    def kernel(x):
        out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        for i in nl.affine_range(2):
            a = nl.zeros((128, 30000), nl.float32)
            nl.store(out, nl.sum(a, axis=1, keepdims=True))
        return out

    np.testing.assert_array_equal(no_warnings(kernel), 0)


def test_a_dead_tile_still_referenced_takes_no_memory():
    def kernel(x):
        out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        first = nl.full((128, 30000), 1.0, nl.float32)
        total = nl.sum(first, axis=1, keepdims=True)  # last use of `first`; the name still holds it
        second = nl.full((128, 30000), 2.0, nl.float32)
        nl.store(out, nl.add(total, nl.sum(second, axis=1, keepdims=True)))
        return out

    np.testing.assert_array_equal(no_warnings(kernel), 90000.0)


def test_sbuf_over_budget_is_a_spill_warning_naming_the_live_tiles():
    def kernel(x):
        out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        a = nl.full((128, 20000), 1.0, nl.float32, name="first")
        b = nl.full((128, 20000), 2.0, nl.float32, name="second")
        nl.store(out, nl.sum(nl.add(a, b), axis=1, keepdims=True))  # a, b and their sum live at once
        return out

    with pytest.warns(SimulatorWarning) as record:
        out = run(kernel)
    np.testing.assert_array_equal(out, 60000.0)  # the kernel still runs: the compiler spills
    message = str(record[0].message)
    assert "SBUF capacity exceeded: 240000 bytes per partition are live at once" in message
    assert "above the trn1 budget of 196608" in message
    assert "'first' 80000 B at" in message and "'second' 80000 B at" in message
    assert "spills the excess to HBM" in message
    no_warnings(kernel, target="trn2", sbuf_budget_bytes=240000)


def test_psum_tiles_dead_after_last_use_are_not_counted():
    # Nine bank-sized accumulators in turn: at most one is live at a time.
    def kernel(x):
        out = nl.ndarray((128, 9), nl.float32, buffer=nl.shared_hbm)
        for i in nl.affine_range(9):
            acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
            acc += nl.full((128, 512), float(i), nl.float32)
            nl.store(out[:, i:i + 1], nl.max(acc, axis=1, keepdims=True))
        return out

    np.testing.assert_array_equal(run(kernel)[0], np.arange(9))


def test_psum_beyond_eight_banks_live_at_once_warns_the_compiler_spills():
    def kernel(x):
        out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        banks = [nl.zeros((128, 512), nl.float32, buffer=nl.psum, name=f"bank{i}") for i in range(9)]
        for bank in banks:
            bank += nl.full((128, 512), 1.0, nl.float32)
        total = nl.zeros((128, 1), nl.float32)
        for bank in banks:  # every bank is read after all were written: nine live together
            total[...] = nl.add(total, nl.max(bank, axis=1, keepdims=True))
        nl.store(out, total)
        return out

    # "the Neuron compiler inserts the necessary spills or refills" for any on-chip memory (legacy
    # programming model): the values are right, the warning names the live tiles.
    with pytest.warns(SimulatorWarning, match=r"PSUM capacity exceeded: 18432 bytes per partition are live at once, "
                                              r"above the trn1 budget of 16384 .*'bank\d' 2048 B at .*spills the "
                                              r"excess to SBUF"):
        np.testing.assert_array_equal(run(kernel), 9.0)


def test_blocks_of_a_psum_tensor_are_live_separately():
    # A (16, 128, 512) fp32 PSUM tensor is 16 banks of logical tiles; used one block at a time it needs one.
    def kernel(x):
        out = nl.ndarray((128, 16), nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((16, nl.par_dim(128), 512), nl.float32, buffer=nl.psum)
        for i in nl.affine_range(16):
            acc[i] = nl.full((128, 512), float(i), nl.float32)
            nl.store(out[:, i:i + 1], nl.max(acc[i], axis=1, keepdims=True))
        return out

    np.testing.assert_array_equal(run(kernel)[0], np.arange(16))


def test_untouched_tiles_take_no_memory():
    def kernel(x):
        spare = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(20)]
        return spare[0].shape[0] - 128  # referenced, never written or read

    run(kernel)


def test_a_single_tile_beyond_a_partition_is_an_error_before_allocation():
    # 9.5 GiB: must fail on the budget, not by exhausting host memory.
    def kernel(x):
        nl.ndarray((128, 20_000_000), nl.float32, name="huge")

    with pytest.raises(CapacityError, match=r"tile 'huge' of shape \[128, 20000000\] float32 needs 80000000 bytes "
                                            r"per partition, above the trn1 SBUF budget of 196608"):
        run(kernel)


def test_a_psum_tile_beyond_a_bank_is_a_tile_limit_error():
    def kernel(x):
        nl.ndarray((128, 513), nl.float32, buffer=nl.psum)

    with pytest.raises(TileLimitError, match="above one PSUM bank"):
        run(kernel)


def test_capacity_is_checked_per_grid_instance():
    # Each instance's tiles are its own: two instances of 120 KB each never share SBUF.
    def kernel(x):
        out = nl.ndarray((2, 128, 1), nl.float32, buffer=nl.shared_hbm)
        i = nl.program_id(0)
        a = nl.full((128, 30000), 1.0, nl.float32)
        nl.store(out[i], nl.sum(a, axis=1, keepdims=True))
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("error", SimulatorWarning)
        out = nki.simulate_kernel(nki.jit(kernel)[2], X)
    np.testing.assert_array_equal(out, 30000.0)
