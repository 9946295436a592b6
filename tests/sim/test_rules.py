"""Kernels the NeuronCore or the NKI compiler would reject: the simulator rejects them too, with a
message naming the rule and the kernel's own file and line."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from nki_ops.sim import (
    CapacityError,
    KernelUsageError,
    MemorySpaceError,
    OutOfBoundsError,
    SimConfig,
    SimulatorError,
    SimulatorWarning,
    TileLimitError,
    UnsupportedError,
    configure,
    nisa,
    nki,
    nl,
    simulate,
)

pytestmark = pytest.mark.simulation

X = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)


def run(body, *arrays, **config):
    """Run ``body`` as a kernel on ``arrays`` (default: X) with an optional SimConfig."""
    return simulate(nki.jit(body), *(arrays or (X,)), config=SimConfig(**config))


def line_of(snippet: str, func) -> str:
    """``file:line`` of the line of ``func``'s source containing ``snippet``."""
    lines, first = inspect.getsourcelines(func)
    offset = next(i for i, text in enumerate(lines) if snippet in text)
    return f"{inspect.getsourcefile(func)}:{first + offset}"


# ------------------------------------------------------------------------------ memory spaces

def test_compute_on_hbm_tensor_is_rejected_with_site():
    def kernel(x):
        return nl.exp(x)

    with pytest.raises(MemorySpaceError) as error:
        run(kernel)
    assert "Expected operand 'x' of 'nl.exp' to be in address space 'psum|sbuf', but got a tile in 'hbm'" in str(
        error.value)
    assert str(error.value).startswith(line_of("nl.exp(x)", kernel) + ": ")


def test_load_reads_only_hbm():
    def kernel(x):
        tile = nl.load(x)
        nl.load(tile)

    with pytest.raises(MemorySpaceError, match="operand 'src' of 'load' to be in address space 'hbm', but got a "
                                               "tile in 'sbuf'"):
        run(kernel)


def test_store_writes_only_hbm():
    def kernel(x):
        tile = nl.load(x)
        nl.store(nl.ndarray((128, 64), nl.float32), tile)

    with pytest.raises(MemorySpaceError, match="operand 'dst' of 'store' to be in address space 'hbm'"):
        run(kernel)


def test_assignment_into_hbm_is_rejected():
    def kernel(x):
        x[0:128, :] = nl.load(x)

    with pytest.raises(MemorySpaceError, match="cannot assign into HBM tensor 'x'.*nl.store"):
        run(kernel)


def test_matmul_reads_on_chip_only():
    def kernel(x):
        nisa.nc_matmul(nl.load(x), x)

    with pytest.raises(MemorySpaceError, match="operand 'moving' of 'nc_matmul' to be in address space "
                                               "'psum|sbuf', but got a tile in 'hbm'"):
        run(kernel)


def test_matmul_writes_fp32_psum():
    def kernel(x):
        result = nisa.nc_matmul(nl.load(x, dtype=nl.bfloat16), nl.load(x, dtype=nl.bfloat16))
        assert result.buffer is nl.psum and result.dtype == nl.float32

    run(kernel)


def test_gpsimd_cannot_touch_psum():
    def kernel(x):
        acc = nl.zeros((128, 64), nl.float32, buffer=nl.psum)
        nisa.tensor_copy(acc, engine=nisa.gpsimd_engine)

    with pytest.raises(MemorySpaceError, match="GpSimd engine cannot access PSUM"):
        run(kernel)


def test_tensor_tensor_operands_not_both_in_psum():
    def kernel(x):
        a = nl.zeros((128, 64), nl.float32, buffer=nl.psum)
        b = nl.zeros((128, 64), nl.float32, buffer=nl.psum)
        nisa.tensor_tensor(a, b, op=nl.add)

    with pytest.raises(MemorySpaceError, match="cannot both be in PSUM"):
        run(kernel)


# --------------------------------------------------------------------------------- tile rules

def test_partition_dimension_over_128_is_rejected():
    def kernel(x):
        nl.ndarray((256, 4), nl.float32, buffer=nl.sbuf)

    with pytest.raises(TileLimitError, match="Size of partition dimension 256 exceeds architecture limitation "
                                             "of 128"):
        run(kernel)


def test_load_of_more_than_128_partitions_is_rejected():
    def kernel(x):
        nl.load(x)

    with pytest.raises(TileLimitError, match="partition dimension 200"):
        run(kernel, np.zeros((200, 4), np.float32))


def test_psum_tile_above_one_bank_is_rejected():
    def kernel(x):
        nl.zeros((128, 513), nl.float32, buffer=nl.psum)

    with pytest.raises(TileLimitError, match=r"PSUM tile .* needs 2052 bytes per partition, above one PSUM bank"):
        run(kernel)


@pytest.mark.parametrize("stationary, moving, message", [
    ((128, 129), (128, 64), "stationary free size 129 exceeds the Tensor engine limit of 128"),
    ((128, 64), (128, 513), "moving free size 513 exceeds the Tensor engine limit of 512"),
    ((128, 64), (64, 64), r"contraction \(partition\) sizes differ"),
])
def test_matmul_size_rules(stationary, moving, message):
    def kernel(s, m):
        nisa.nc_matmul(nl.load(s), nl.load(m))

    with pytest.raises((TileLimitError, KernelUsageError), match=message):
        run(kernel, np.zeros(stationary, np.float32), np.zeros(moving, np.float32))


def test_rank1_on_chip_tensor_is_rejected():
    def kernel(x):
        nl.ndarray((128,), nl.float32)

    with pytest.raises(KernelUsageError, match="Insufficient rank"):
        run(kernel)


def test_transpose_limits():
    def kernel(x):
        nl.transpose(nl.load(x))

    with pytest.raises(TileLimitError, match="exceeds architecture limitation of 128"):
        run(kernel, np.zeros((128, 256), np.float32))


def test_reduction_along_partition_axis_is_rejected():
    def kernel(x):
        nl.sum(nl.load(x), axis=0)

    with pytest.raises(KernelUsageError, match="partition dimension"):
        run(kernel)


def test_tile_operators_do_not_broadcast_partitions():
    def kernel(x):
        tile = nl.load(x)
        tile + nl.load(x[0:1, :])

    with pytest.raises(KernelUsageError, match="do not broadcast along the partition dimension"):
        run(kernel)


def test_lenient_config_warns_instead():
    def kernel(x):
        nl.ndarray((256, 4), nl.float32, buffer=nl.sbuf)

    with pytest.warns(SimulatorWarning, match="partition dimension 256"):
        run(kernel, strict=False)


# ------------------------------------------------------------------------------------- indexing

def test_out_of_bounds_names_tensor_dimension_and_range():
    def kernel(x):
        nl.load(x[0:128, 32:96])

    with pytest.raises(OutOfBoundsError, match=r"tensor `x` on dimension 1: index range \[32, 95\] exceed "
                                               r"dimension size of 64"):
        run(kernel)


def test_out_of_bounds_advanced_index():
    def kernel(x):
        i_p, i_f = nl.mgrid[0:128, 0:32]
        tile = nl.load(x)
        nl.copy(tile[i_p, 2 * i_f + 1])  # reaches column 63: fine
        nl.copy(tile[i_p, 2 * i_f + 2])  # reaches column 64: out of bounds

    with pytest.raises(OutOfBoundsError, match=r"on dimension 1: index range \[2, 64\]"):
        run(kernel)


def test_out_of_range_indices_are_legal_under_a_false_mask():
    def kernel(x):
        out = nl.ndarray((100, 64), nl.float32, buffer=nl.shared_hbm)
        i_p, i_f = nl.arange(128)[:, None], nl.arange(64)[None, :]
        nl.store(out[i_p, i_f], nl.load(x[i_p, i_f]), mask=(i_p < 100))
        return out

    np.testing.assert_array_equal(run(kernel), X[:100])


def test_masked_store_leaves_other_elements_untouched():
    def kernel(x):
        i_p, i_f = nl.mgrid[0:128, 0:64]
        nl.store(x[i_p, i_f], nl.zeros((128, 64), nl.float32), mask=(i_p < 10) & (i_f >= 60))

    x = X.copy()
    run(kernel, x)
    expected = X.copy()
    expected[:10, 60:] = 0
    np.testing.assert_array_equal(x, expected)


def test_masked_compute_only_fills_the_predicate_region():
    def kernel(x):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:128, 0:64]
        nl.store(out, nl.square(nl.load(x), mask=(i_p < 64) & (i_f < 32)))
        return out

    out = run(kernel)
    np.testing.assert_array_equal(out[:64, :32], X[:64, :32] ** 2)
    assert np.isnan(out[64:]).all() and np.isnan(out[:, 32:]).all()


def test_one_dimensional_arange_index_is_rejected():
    def kernel(x):
        nl.load(x[nl.arange(128), 0])

    with pytest.raises(KernelUsageError, match="1-D nl.arange index on 'x' is not supported"):
        run(kernel)


def test_mixing_slices_and_arange_is_rejected():
    def kernel(x):
        nl.load(x[nl.arange(128)[:, None], 0:4])

    with pytest.raises(KernelUsageError, match="mixing basic .* and advanced"):
        run(kernel)


@pytest.mark.parametrize("access", [
    lambda t, i_p, i_f: t[0:128:2, :],
    lambda t, i_p, i_f: t[2 * i_p, i_f],
    lambda t, i_p, i_f: t[i_f, i_p],
])
def test_partition_dimension_is_accessed_contiguously(access):
    def kernel(x):
        tile = nl.load(x[:, 0:64])
        i_p, i_f = nl.arange(64)[:, None], nl.arange(64)[None, :]
        nl.copy(access(tile, i_p, i_f))

    with pytest.raises(KernelUsageError, match="partition dimension of on-chip tensor .* contiguous range"):
        run(kernel)


def test_index_expressions_are_read_only_and_not_control_flow():
    def assign(x):
        i = nl.arange(4)[None, :]
        i[0] = 1

    def branch(x):
        if nl.arange(4)[None, :] < 2:
            pass

    with pytest.raises(KernelUsageError, match="cannot assign to an index expression"):
        run(assign)
    with pytest.raises(KernelUsageError, match="'&', '|' and '~'"):
        run(branch)


def test_tensor_truth_value_is_ambiguous():
    def kernel(x):
        if nl.load(x):
            pass

    with pytest.raises(KernelUsageError, match="truth value of a tensor is ambiguous"):
        run(kernel)


# -------------------------------------------------------------------------- memory and capacity

def test_uninitialised_sbuf_and_psum_read_as_nan_and_int_poison():
    def kernel(x):
        out = nl.ndarray((128, 3), nl.float32, buffer=nl.shared_hbm)
        ints = nl.ndarray((128, 3), nl.int32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:1], nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf))
        nl.store(out[:, 1:2], nl.ndarray((128, 1), nl.float32, buffer=nl.psum))
        nl.store(ints, nl.ndarray((128, 3), nl.int32))
        return out, ints

    out, ints = run(kernel)
    assert np.isnan(out).all()  # column 2 was never written: HBM outputs start as NaN too
    assert (ints == SimConfig().int_poison).all()
    out, ints = run(kernel, uninitialized="zeros")
    assert (out == 0).all() and (ints == 0).all()


def test_hbm_tensor_with_init_value_is_rejected():
    def kernel(x):
        nl.zeros((128, 4), nl.float32, buffer=nl.shared_hbm)

    with pytest.raises(KernelUsageError, match="HBM tensors created in a kernel cannot be initialised"):
        run(kernel)


# ------------------------------------------------------------------------------ loops and misc

def test_seed_shuffles_affine_range_to_expose_loop_carried_dependency():
    def kernel(x):
        out = nl.ndarray((128, 8), nl.float32, buffer=nl.shared_hbm)
        running = nl.zeros((128, 1), nl.float32)
        for i in nl.affine_range(8):  # wrong: a loop-carried dependency needs sequential_range
            running[...] = nl.add(running, 1.0)
            nl.store(out[:, i:i + 1], running)
        return out

    in_order = run(kernel)
    np.testing.assert_array_equal(in_order[0], np.arange(1, 9))
    assert any(not np.array_equal(run(kernel, seed=seed)[0], in_order[0]) for seed in range(3))


def test_unsupported_api_names_itself():
    def kernel(x):
        nisa.tensor_copy_dynamic_dst(dst=nl.load(x), src=nl.load(x))

    with pytest.raises(UnsupportedError, match="not supported by the simulator: nki.isa.tensor_copy_dynamic_dst"):
        run(kernel)
    with pytest.raises(UnsupportedError, match="not supported by the simulator: nki.language.all_reduce"):
        nl.all_reduce


def test_numpy_errors_inside_the_simulator_point_at_the_kernel_line():
    def kernel(x):
        a = nl.load(x)
        nl.where(a, a, nl.load(x[0:128, 0:8]))

    with pytest.raises(SimulatorError) as error:
        run(kernel)
    assert str(error.value).startswith(line_of("nl.where(a", kernel) + ": ")


def test_api_outside_a_kernel_is_rejected():
    with pytest.raises(KernelUsageError, match="can only be called inside a kernel"):
        nl.ndarray((128, 4), nl.float32)


def test_configure_context_applies_to_calls_inside():
    def kernel(x):
        nl.ndarray((128, 16384), nl.float32)

    with configure(sbuf_budget_bytes=1024), pytest.raises(CapacityError, match="budget of 1024"):
        nki.simulate_kernel(kernel, X)
    nki.simulate_kernel(kernel, X)


def test_kernel_own_exceptions_pass_through_unchanged():
    def kernel(x):
        raise ValueError("the kernel's own check")

    with pytest.raises(ValueError, match="the kernel's own check") as error:
        run(kernel)
    assert not isinstance(error.value, SimulatorError)


def test_assignment_source_larger_than_destination_is_rejected():
    def kernel(x):
        small = nl.ndarray((128, 8), nl.float32)
        small[...] = nl.load(x)

    with pytest.raises(KernelUsageError, match=r"value of shape \[128, 64\] does not fit destination .* "
                                               r"\[128, 8\]"):
        run(kernel)
