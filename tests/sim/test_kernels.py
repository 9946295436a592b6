"""Whole kernels in the legacy NKI API run on the simulator and compared with NumPy."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

from nki_ops.cli import main as cli_main
from nki_ops.sim import nki, nl
from nki_ops.sim.examples import giou_kernel

from . import kernels, numpy_refs

pytestmark = pytest.mark.simulation

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "published_giou.py"


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def test_elementwise_add_over_spmd_grid(rng):
    a, b = rng.standard_normal((2, 512, 96), dtype=np.float32)
    out = kernels.add_kernel[4](a, b)
    np.testing.assert_array_equal(out, a + b)


def test_add_grid_too_small_leaves_poison(rng):
    a, b = rng.standard_normal((2, 512, 96), dtype=np.float32)
    out = kernels.add_kernel[3](a, b)  # the last 128 rows are never written
    np.testing.assert_array_equal(out[:384], (a + b)[:384])
    assert np.isnan(out[384:]).all()


@pytest.mark.parametrize("kernel", [kernels.matmul_isa_kernel, kernels.matmul_nl_kernel],
                         ids=["nisa.nc_matmul", "nl.matmul_transpose_x"])
def test_tiled_matmul_accumulates_over_k_in_psum(kernel, rng):
    a_t = rng.standard_normal((384, 96), dtype=np.float32)
    b = rng.standard_normal((384, 200), dtype=np.float32)
    out = kernel(a_t, b)
    np.testing.assert_allclose(out, a_t.astype(np.float64).T @ b, rtol=1e-4, atol=1e-4)


def test_softmax_along_free_axis(rng):
    x = rng.standard_normal((256, 300), dtype=np.float32) * 4
    np.testing.assert_allclose(kernels.softmax_kernel(x), numpy_refs.softmax(x), rtol=1e-5, atol=1e-7)


def test_rms_norm_broadcasts_reduced_vector_per_partition(rng):
    x = rng.standard_normal((256, 64), dtype=np.float32)
    w = rng.standard_normal(64, dtype=np.float32)
    expected = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(kernels.rms_norm_kernel(x, w, 1e-6), expected, rtol=1e-5, atol=1e-6)


def test_transpose(rng):
    x = rng.standard_normal((96, 128), dtype=np.float32)
    np.testing.assert_array_equal(kernels.transpose_kernel(x), x.T)


def test_masked_ragged_last_tile_writes_only_valid_rows(rng):
    x = rng.standard_normal((300, 40), dtype=np.float32)  # 2 full tiles and one of 44 rows
    out = np.full((300, 40), -7.0, np.float32)
    kernels.ragged_scale_kernel(x, out)
    np.testing.assert_array_equal(out, 2 * x)


def test_bf16_store_rounds_to_nearest_even(rng):
    x = rng.standard_normal((128, 64), dtype=np.float32)
    out = kernels.bf16_store_kernel(x)
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.astype(np.float32), x.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert not np.array_equal(out.astype(np.float32), x)  # rounding really happened


def test_giou_kernel_by_reference(rng):
    boxes1, boxes2 = numpy_refs.random_boxes(rng, (256, 64)), numpy_refs.random_boxes(rng, (256, 64))
    out = np.empty((256, 64), np.float32)
    result = giou_kernel(boxes1.reshape(256, -1), boxes2.reshape(256, -1), out)
    assert result is None
    np.testing.assert_allclose(out, numpy_refs.giou(boxes1, boxes2, 1e-7), rtol=1e-5, atol=1e-5)


def test_torch_cpu_tensors_in_and_out(rng):
    a, b = (torch.from_numpy(v) for v in rng.standard_normal((2, 256, 32), dtype=np.float32))
    out = kernels.add_kernel[2](a, b)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, a + b, rtol=0, atol=0)
    boxes1 = torch.from_numpy(numpy_refs.random_boxes(rng, (128, 32)))
    boxes2 = torch.from_numpy(numpy_refs.random_boxes(rng, (128, 32)))
    out = torch.zeros(128, 32)
    giou_kernel(boxes1.view(128, -1), boxes2.view(128, -1), out)
    expected = numpy_refs.giou(boxes1.numpy(), boxes2.numpy(), 1e-7)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_simulate_kernel_with_grid_and_plain_function(rng):
    a, b = rng.standard_normal((2, 256, 8), dtype=np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(nki.baremetal(kernels.add_kernel)[2], a, b), a + b)

    def double(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x) * 2)
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(double, a[:128]), 2 * a[:128])


def test_published_giou_example_runs_unmodified(capsys, monkeypatch):
    """`nki-ops simulate` runs the published example as printed; its output buffer holds GIoU."""
    captured = {}
    real_simulate = nki.simulate_kernel

    def recording_simulate(kernel, *args, **kwargs):
        captured["args"] = args
        return real_simulate(kernel, *args, **kwargs)

    monkeypatch.setattr(nki, "simulate_kernel", recording_simulate)
    assert cli_main(["simulate", str(FIXTURE)]) == 0
    preds, targets, out = captured["args"]
    expected = numpy_refs.giou(preds.reshape(1024, 256, 4), targets.reshape(1024, 256, 4), 1e-5)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    assert capsys.readouterr().out.count("preds") == 16  # device_print once per (m, n) tile


def test_simulator_benchmark_checks_output_and_reports_ratio(tmp_path):
    from benchmarks import sim_giou

    rows = sim_giou.run(128, 32, repeats=3, csv_name=str(tmp_path / "sim.csv"))
    assert [r.backend for r in rows] == [sim_giou.TORCH, sim_giou.TORCH_1, sim_giou.EXAMPLE, sim_giou.LEGACY,
                                         sim_giou.CURRENT]
    for row in rows[2:]:
        assert row.median_ms > 0 and "simulator / torch eager" in row.note
    assert (tmp_path / "sim.csv").read_text().count("\n") == 6


@nki.jit
def grid_coordinates_kernel(order):
    """Each instance writes its grid coordinates and its launch position (via a counter in `order`)."""
    out = nl.ndarray((nl.num_programs(0), nl.num_programs(1), 4), nl.int32, buffer=nl.shared_hbm)
    i, j = nl.program_id(0), nl.program_id(1)
    position = nl.load(order[0:1, 0:1])
    nl.store(order[0:1, 0:1], nl.add(position, 1))
    nl.store(out[i, j:j + 1, 0:1], nl.full((1, 1), i, nl.int32))
    nl.store(out[i, j:j + 1, 1:2], nl.full((1, 1), j, nl.int32))
    nl.store(out[i, j:j + 1, 2:3], nl.full((1, 1), nl.program_ndim() * 10 + nl.num_programs(), nl.int32))
    nl.store(out[i, j:j + 1, 3:4], position)
    return out


def test_two_dimensional_grid_shares_outputs_and_runs_serially():
    out = grid_coordinates_kernel[2, 3](np.zeros((1, 1), np.int32))
    np.testing.assert_array_equal(out[..., 0], [[0, 0, 0], [1, 1, 1]])
    np.testing.assert_array_equal(out[..., 1], [[0, 1, 2], [0, 1, 2]])
    assert (out[..., 2] == 26).all()
    np.testing.assert_array_equal(out[..., 3].ravel(), np.arange(6))  # row-major launch order


def test_seed_shuffles_grid_order():
    from nki_ops.sim import SimConfig, simulate

    orders = {tuple(simulate(grid_coordinates_kernel[2, 3], np.zeros((1, 1), np.int32),
                             config=SimConfig(seed=seed))[..., 3].ravel()) for seed in range(4)}
    assert len(orders) > 1 and all(sorted(o) == list(range(6)) for o in orders)


def test_gridded_kernel_cannot_be_called_inside_a_kernel():
    from nki_ops.sim import KernelUsageError

    @nki.jit
    def outer(a, b):
        return kernels.add_kernel[2](a, b)

    with pytest.raises(KernelUsageError, match="with an SPMD grid cannot be called from inside another kernel"):
        outer(np.zeros((256, 4), np.float32), np.zeros((256, 4), np.float32))


def test_kernel_called_inside_a_kernel_is_inlined(rng):
    @nki.trace
    def scale(tile, factor):
        return nl.multiply(tile, factor)

    @nki.jit
    def outer(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, scale(nl.load(x), 3.0))
        return out

    x = rng.standard_normal((128, 16), dtype=np.float32)
    np.testing.assert_allclose(outer(x), 3 * x)


def test_simulate_command_passes_arguments_and_options(tmp_path, capsys):
    script = tmp_path / "show.py"
    script.write_text("import sys\nimport neuronxcc.nki.isa as nisa\n"
                      "print(sys.argv[1:], nisa.get_nc_version().name)\n")
    assert cli_main(["simulate", "--target", "trn2", str(script), "a", "--flag"]) == 0
    assert capsys.readouterr().out.strip() == "['a', '--flag'] gen3"


def test_by_reference_output_reaches_non_contiguous_and_bf16_torch_tensors(rng):
    @nki.jit
    def fill(x, out):
        nl.store(out, nl.load(x))

    x = rng.standard_normal((128, 8), dtype=np.float32)
    transposed = torch.zeros(8, 128).t()  # non-contiguous: the simulator works on a copy
    fill(x, transposed)
    np.testing.assert_array_equal(transposed.numpy(), x)
    bf16 = torch.zeros(128, 8, dtype=torch.bfloat16)
    fill(x, bf16)
    torch.testing.assert_close(bf16, torch.from_numpy(x).to(torch.bfloat16), rtol=0, atol=0)
