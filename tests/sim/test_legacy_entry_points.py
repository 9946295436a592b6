"""The legacy entry points beyond jit: nki.benchmark and nki.profile decorate and run in the
simulator, nl.nc / nl.spmd_dim grids, `nki-ops simulate` imports a script's neighbours,
install() undone in any order, and torch arguments left untouched unless the kernel writes them."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

from nki_ops.sim import (
    KernelUsageError,
    SimConfig,
    configure,
    install,
    nki,
    nl,
)

pytestmark = pytest.mark.simulation

A = np.arange(256 * 8, dtype=np.float32).reshape(256, 8)
T = A[:128]


def add_one(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), 1.0))
    return out


def add_one_per_tile(a):
    """Instance i of a 1-D grid handles rows [128 i, 128 i + 128)."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    i = nl.program_id(0)
    nl.store(out[i * 128:(i + 1) * 128, :], nl.add(nl.load(a[i * 128:(i + 1) * 128, :]), 1.0))
    return out


# ----------------------------------------------------------------------------- benchmark, profile

def test_benchmark_decorates_and_runs_the_kernel():
    bench = nki.benchmark(warmup=5, iters=10, save_neff_name="file.neff")(add_one)
    np.testing.assert_array_equal(bench(T), T + 1)
    np.testing.assert_array_equal(nki.benchmark(add_one)(T), T + 1)


def test_benchmark_with_a_grid_and_simulate_kernel():
    bench = nki.benchmark(warmup=1, iters=1)(add_one_per_tile)
    np.testing.assert_array_equal(bench[2](A), A + 1)
    np.testing.assert_array_equal(nki.simulate_kernel(bench[2], A), A + 1)


def test_benchmark_latency_is_the_cost_model_estimate_and_grid_instances_run_one_after_another():
    bench = nki.benchmark(warmup=1, iters=1)(add_one)
    with pytest.raises(KernelUsageError, match="call the kernel first"):
        bench.benchmark_result.nc_latency
    bench(T)
    latency = bench.benchmark_result.nc_latency
    one = latency.get_latency_percentile(50)
    assert one > 0 and latency.get_latency_percentile(99) == one
    assert "estimate for trn1" in repr(latency)
    gridded = nki.benchmark(warmup=1, iters=1)(add_one_per_tile)[2]
    gridded(A)
    two = gridded.benchmark_result.nc_latency.get_latency_percentile(50)
    single = nki.benchmark(warmup=1, iters=1)(add_one_per_tile)[1]
    single(A)
    assert two == pytest.approx(2 * single.benchmark_result.nc_latency.get_latency_percentile(50))


def test_profile_decorates_and_runs_the_kernel(tmp_path):
    profiled = nki.profile(working_directory=str(tmp_path), save_neff_name="k.neff", overwrite=False,
                           save_trace_name="p.ntff", num_execs=2, profile_nth=1)(add_one)
    np.testing.assert_array_equal(profiled(T), T + 1)


def test_entry_points_refuse_unknown_keywords():
    with pytest.raises(KernelUsageError, match=r"nki.benchmark\(\) got unexpected keyword argument\(s\) warmpu"):
        nki.benchmark(warmpu=5)
    with pytest.raises(KernelUsageError, match=r"nki.jit\(\) got unexpected keyword argument\(s\) grid"):
        nki.jit(add_one, grid=2)
    with pytest.raises(KernelUsageError, match="working_directory"):
        nki.profile(save_neff_name="k.neff")


# ----------------------------------------------------------------------------------- nl.nc grids

def test_nc_grid_spreads_instances_over_cores_on_trn2():
    kernel = nki.jit(add_one_per_tile)
    with configure(target="trn2"):
        np.testing.assert_array_equal(kernel[nl.nc(2)](A), A + 1)
        np.testing.assert_array_equal(kernel[nl.spmd_dim(1, nl.nc(2))](A), A + 1)
        np.testing.assert_array_equal(kernel[nl.nc(2) * 1](A), A + 1)


def test_spmd_dim_size_is_the_product_and_program_id_counts_along_it():
    def kernel(a):
        out = nl.ndarray((8, 2), nl.int32, buffer=nl.shared_hbm)
        i, j = nl.program_id(0), nl.program_id(1)
        ids = nl.full((1, 2), i, nl.int32)
        ids[0, 1] = nl.full((1, 1), nl.num_programs(0) * 10 + j, nl.int32)
        nl.store(out[i * 2 + j:i * 2 + j + 1, :], ids)
        return out

    out = nki.simulate_kernel(nki.jit(kernel, platform_target="trn2")[nl.spmd_dim(2, nl.nc(2)), 2], A)
    np.testing.assert_array_equal(out[:, 0], np.repeat(np.arange(4), 2))
    np.testing.assert_array_equal(out[:, 1], 40 + np.tile([0, 1], 4))


def test_multi_core_grid_is_refused_on_single_core_targets():
    with pytest.raises(KernelUsageError, match="SPMD grid with multi neuron cores is not supported on trn1"):
        nki.jit(add_one_per_tile)[nl.nc(2)](A)


def test_bad_grid_dimensions_are_refused():
    with pytest.raises(KernelUsageError, match="non-negative ints, nl.nc"):
        nki.jit(add_one)[-1]
    with pytest.raises(KernelUsageError, match="non-negative ints, nl.nc"):
        nki.jit(add_one)[2.0]
    with pytest.raises(KernelUsageError, match="nl.nc: sizes must be positive ints"):
        nl.nc(0)


# ------------------------------------------------------------------------------ nki-ops simulate

def test_simulate_cli_imports_the_scripts_neighbours(tmp_path, capsys):
    from nki_ops.cli import main
    (tmp_path / "neighbour_kernels.py").write_text(textwrap.dedent("""
        import neuronxcc.nki as nki
        import neuronxcc.nki.language as nl

        @nki.jit
        def double(a):
            out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
            nl.store(out, nl.multiply(nl.load(a), 2.0))
            return out
    """))
    (tmp_path / "script.py").write_text(textwrap.dedent("""
        import numpy as np
        from neighbour_kernels import double
        print("sum", double(np.ones((4, 4), np.float32)).sum())
    """))
    path_before = list(sys.path)
    try:
        assert main(["simulate", str(tmp_path / "script.py")]) == 0
    finally:
        sys.modules.pop("neighbour_kernels", None)
    assert "sum 32.0" in capsys.readouterr().out
    assert sys.path == path_before


# ---------------------------------------------------------------------------------------- install

def test_installs_undone_out_of_order_restore_the_original_modules():
    original = sys.modules.get("neuronxcc")
    first, second = install(force=True), install(force=True)
    assert sys.modules["neuronxcc.nki"] is nki
    first.uninstall()
    assert sys.modules["neuronxcc.nki"] is nki  # the second install is still active
    second.uninstall()
    assert sys.modules.get("neuronxcc") is original
    assert "neuronxcc.nki.compiler" not in sys.modules or original is not None


def test_install_provides_the_compiler_module():
    with install(force=True):
        import neuronxcc.nki.compiler as ncc
        assert ncc.sbuf.auto_alloc() is nl.sbuf


# ------------------------------------------------------------------------------- torch arguments

torch = pytest.importorskip("torch")


def test_non_contiguous_inputs_are_left_untouched():
    def kernel(a, b):
        out = nl.ndarray((128, 8), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.add(nl.load(a), nl.load(b)))
        return out

    base = torch.arange(8 * 128, dtype=torch.float32).reshape(8, 128)
    strided = base.t()  # (128, 8), not contiguous
    expanded = torch.ones(1, 8).expand(128, 8)  # stride 0 on the partition axis
    versions = strided._version, expanded._version
    out = nki.simulate_kernel(nki.jit(kernel), strided, expanded)
    torch.testing.assert_close(out, strided + 1)
    assert (strided._version, expanded._version) == versions
    torch.testing.assert_close(base, torch.arange(8 * 128, dtype=torch.float32).reshape(8, 128))


def test_a_written_non_contiguous_output_argument_gets_the_result():
    def kernel(a, out):
        nl.store(out, nl.multiply(nl.load(a), 3.0))

    a = torch.ones(128, 8)
    out = torch.zeros(8, 128).t()
    nki.simulate_kernel(nki.jit(kernel), a, out)
    torch.testing.assert_close(out, torch.full((128, 8), 3.0))


def test_writing_an_expanded_argument_is_refused_clearly():
    def kernel(a, out):
        nl.store(out, nl.load(a))

    with pytest.raises(KernelUsageError, match="kernel wrote argument 'out', an expanded torch tensor"):
        nki.simulate_kernel(nki.jit(kernel), torch.ones(128, 8), torch.zeros(1, 8).expand(128, 8))


def test_simulate_config_still_applies():
    with pytest.raises(KernelUsageError, match="not supported on inf2"):
        from nki_ops.sim import simulate
        simulate(nki.jit(add_one_per_tile)[nl.nc(2)], A, config=SimConfig(target="inf2"))
