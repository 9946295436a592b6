"""``neuronxcc.nki.compiler``: direct allocation places every logical tile at the address the
kernel gives; tiles sharing addresses must not be live together; addresses obey the ISA rules;
the kernel decorators and scheduling directives are accepted."""

from __future__ import annotations

import numpy as np
import pytest

from nki_ops.sim import CapacityError, KernelUsageError, SimConfig, nisa, nki, nl, simulate
from nki_ops.sim.frontends.legacy import compiler as ncc

pytestmark = pytest.mark.simulation

X = np.arange(8 * 128 * 512, dtype=np.float32).reshape(8 * 128, 512) / 1000


def run(body, *arrays, **config):
    return simulate(nki.jit(body), *(arrays or (X,)), config=SimConfig(**config))


def double_buffered(x, tiles=2):
    """Load eight row tiles through ``tiles`` physical buffers, exp each right after its load."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    buf = nl.ndarray((8, nl.par_dim(128), 512), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0,
                                                                                      num_free_tiles=(tiles,)))
    res = nl.ndarray((8, nl.par_dim(128), 512), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=tiles * 2048,
                                                                                      num_free_tiles=(tiles,)))
    for i in nl.affine_range(8):
        buf[i] = nl.load(x[i * 128:(i + 1) * 128, :])
        res[i] = nl.exp(buf[i])
        nl.store(out[i * 128:(i + 1) * 128, :], res[i])
    return out


def test_modulo_allocation_reusing_dead_tiles_runs():
    np.testing.assert_allclose(run(double_buffered), np.exp(X), rtol=1e-6)
    np.testing.assert_allclose(run(lambda x: double_buffered(x, 1)), np.exp(X), rtol=1e-6)


def test_too_few_physical_tiles_for_the_live_logical_tiles_is_an_error():
    # The guide's lifetime conflict: eight tiles loaded, then all read, with two physical tiles.
    def kernel(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        buf = nl.ndarray((8, nl.par_dim(128), 512), nl.float32, name="t1",
                         buffer=ncc.sbuf.mod_alloc(base_addr=0, num_free_tiles=(2,)))
        for i in nl.affine_range(8):
            buf[i] = nl.load(x[i * 128:(i + 1) * 128, :])
        for i in nl.affine_range(8):
            nl.store(out[i * 128:(i + 1) * 128, :], nl.exp(buf[i]))
        return out

    with pytest.raises(CapacityError, match=r"SBUF tile 't1' \(allocated at .*test_direct_allocation.py:\d+, "
                                            r"bytes \[0, 2048\) partitions \[0, 128\)\) is used after 't1'"):
        run(kernel)


def test_two_tensors_on_overlapping_addresses_live_together_name_both_sites():
    def kernel(x):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        a = nl.ndarray((nl.par_dim(128), 512), nl.float32, name="a", buffer=ncc.sbuf.mod_alloc(base_addr=0))
        b = nl.ndarray((nl.par_dim(128), 512), nl.float32, name="b", buffer=ncc.sbuf.mod_alloc(base_addr=1024))
        a[...] = nl.load(x[0:128, :])
        b[...] = nl.load(x[128:256, :])  # bytes [1024, 3072) overlap a's [0, 2048)
        nl.store(out, nl.add(a, b))
        return out

    with pytest.raises(CapacityError) as error:
        run(kernel)
    message = str(error.value)
    assert "tile 'a' (allocated at" in message and "after 'b' (allocated at" in message
    assert message.count("test_direct_allocation.py:") >= 3  # the use and both allocation sites


def test_psum_banks_shared_by_tensors_used_in_turn():
    def kernel(x):
        out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
        ident = nl.ndarray((nl.par_dim(128), 128), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0))
        ident[...] = nl.load(nl.shared_identity_matrix(128, nl.float32))
        first = nl.ndarray((4, nl.par_dim(128), 128), nl.float32,
                           buffer=ncc.psum.mod_alloc(base_bank=0, num_bank_tiles=(4,)))
        second = nl.ndarray((4, nl.par_dim(128), 128), nl.float32,
                            buffer=ncc.psum.alloc(lambda idx, pdim_size, fdim_size: (idx[0] % 4, 0, 0)))
        total = nl.ndarray((nl.par_dim(128), 128), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=512))
        total[...] = nl.zeros((128, 128), nl.float32)
        for i in nl.affine_range(4):
            first[i] = nisa.nc_matmul(ident, ident)
            total[...] = nl.add(total, first[i])
        for i in nl.affine_range(4):
            second[i] = nisa.nc_matmul(ident, ident)
            total[...] = nl.add(total, second[i])
        nl.store(out, total)
        return out

    np.testing.assert_array_equal(run(kernel), 8 * np.eye(128))


def test_addresses_outside_the_isa_rules_are_errors():
    def sbuf_end(x):
        nl.ndarray((nl.par_dim(128), 512), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=180224 - 1024))

    with pytest.raises(CapacityError, match=r"bytes \[179200, 181248\) of each partition; SBUF allocations must lie "
                                            r"in \[0, 180224\) on trn1"):
        run(sbuf_end)
    run(sbuf_end, target="trn2")  # 212984 usable bytes per partition on trn2

    def partition_start(x):
        nl.ndarray((nl.par_dim(64), 8), nl.float32, buffer=ncc.sbuf.alloc(lambda idx, pdim_size, fdim_size: (32, 0)))

    with pytest.raises(CapacityError, match="has 64 partitions and starts at partition 32; it must start at one "
                                            r"of \[0, 64\]"):
        run(partition_start)

    def bank_nine(x):
        nl.ndarray((2, nl.par_dim(128), 512), nl.float32, buffer=ncc.psum.mod_alloc(base_bank=7, num_bank_tiles=(2,)))

    with pytest.raises(CapacityError, match="placed in PSUM bank 8; banks are 0-7"):
        run(bank_nine)

    def bad_function(x):
        nl.ndarray((nl.par_dim(128), 8), nl.float32, buffer=ncc.sbuf.alloc(lambda idx, pdim_size, fdim_size: 0))

    with pytest.raises(KernelUsageError, match=r"must return \(start_partition, byte_addr\) as ints, got 0"):
        run(bad_function)


def test_allocation_in_a_loop_body_keeps_its_first_placement():
    # The compiler traces a loop body once, so a running address counter advances once: here the
    # simulator's real iterations would otherwise walk off the end of SBUF.
    def kernel(x):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        addr = 0
        for i in nl.affine_range(100):
            t = nl.ndarray((nl.par_dim(128), 512), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=addr))
            addr += 2048
            t[...] = nl.load(x[0:128, :])
            nl.store(out, t)
        return out

    np.testing.assert_array_equal(run(kernel), X[:128])


def test_static_range_iterations_are_separate_allocations():
    def kernel(x):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        tiles = []
        for i in nl.static_range(2):  # unrolled: two allocations, both live below
            t = nl.ndarray((nl.par_dim(128), 512), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=i * 2048))
            t[...] = nl.load(x[i * 128:(i + 1) * 128, :])
            tiles.append(t)
        nl.store(out, nl.add(tiles[0], tiles[1]))
        return out

    np.testing.assert_array_equal(run(kernel), X[:128] + X[128:256])


def test_force_auto_alloc_ignores_direct_placements():
    def kernel(x):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        a = nl.ndarray((nl.par_dim(128), 512), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0))
        b = nl.ndarray((nl.par_dim(128), 512), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0))
        a[...] = nl.load(x[0:128, :])
        b[...] = nl.load(x[128:256, :])
        nl.store(out, nl.add(a, b))
        return out

    with pytest.raises(CapacityError):
        run(kernel)
    forced = ncc.force_auto_alloc(nki.jit(kernel))
    np.testing.assert_array_equal(simulate(forced, X), X[:128] + X[128:256])


def test_decorators_and_directives_are_accepted():
    @ncc.enable_stack_allocator(log_level=20)
    @ncc.skip_middle_end_transformations
    @nki.jit
    def kernel(x):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        for i in nl.sequential_range(2, directives=ncc.no_reorder()):
            nl.store(out, nl.load(x[0:128, :]))
        with ncc.multi_buffer(2):
            pass
        return out

    np.testing.assert_array_equal(simulate(kernel, X), X[:128])
    with pytest.raises(KernelUsageError, match="unexpected keyword argument"):
        ncc.skip_middle_end_transformations(kernel, level=2)
