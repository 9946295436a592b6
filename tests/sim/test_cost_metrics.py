"""The profile's figures under neuron-profile's names (MFU, HFU, MBU, HBM read/write bytes, engine
active time), JAX Pallas' CostEstimate triple and the NKI performance guide's bound, each checked on
a small kernel whose value is computed here by hand."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from nki_ops.sim import configure, nisa, nki, nl, profile
from nki_ops.sim.core.errors import SimulatorWarning
from nki_ops.sim.observers import cost
from nki_ops.sim.observers.profile import metrics

from .current_tiles import load
from .current_tiles import nisa as cisa
from .current_tiles import nki as cnki
from .current_tiles import nl as cl

pytestmark = pytest.mark.simulation
bf16 = ml_dtypes.bfloat16


def figures(kernel, *args, target="trn1"):
    return metrics(profile(kernel, target=target, timing_only=True)(*args).estimate)


@nki.jit
def one_matmul(a, b):
    out = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=nl.copy(nl.matmul(nl.load(a), nl.load(b), transpose_x=True)))
    return out


@nki.jit
def matmul_untransposed(x, y):
    """``x @ y``: without transpose_x, x is first transposed on the Tensor engine."""
    out = nl.ndarray((x.shape[0], y.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=nl.copy(nl.matmul(nl.load(x), nl.load(y))))
    return out


@nki.jit
def exp_then_add(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    nl.store(out, value=nl.add(nisa.activation(op=nl.exp, data=t), nl.tanh(t)))
    return out


@nki.jit
def copy_rows(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        nl.store(out[i * 128:(i + 1) * 128, :], value=nl.load(x[i * 128:(i + 1) * 128, :]))
    return out


@nki.jit
def matmul_heavy(a, b, repeats):
    """One stationary and one moving tile loaded once, multiplied ``repeats`` times into PSUM."""
    out = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    sa, sb = nl.load(a), nl.load(b)
    acc = nl.zeros((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.psum)
    for _ in nl.affine_range(repeats):
        acc += nisa.nc_matmul(sa, sb)
    nl.store(out, value=nl.copy(acc))
    return out


@cnki.jit
def lnc2_copy(x):
    """Each program of an LNC2 launch copies its half of ``x`` through SBUF, 128 rows at a time."""
    half = x.shape[0] // 2
    out = cl.ndarray(x.shape, dtype=x.dtype, buffer=cl.shared_hbm)
    me = cl.program_id(0)
    for i in range(half // 128):
        rows = slice(me * half + i * 128, me * half + (i + 1) * 128)
        cisa.dma_copy(dst=out[rows, :], src=load(x[rows, :]))
    return out


def test_a_matmul_counts_two_flops_per_multiply_add_as_model_and_hardware_flops():
    a, b = np.zeros((128, 128), bf16), np.zeros((128, 512), bf16)
    m = figures(one_matmul, a, b)
    flops = 2 * 128 * 128 * 512  # K x M x N multiply-adds
    assert m["model_flops"] == m["hardware_flops"] == m["flops"] == flops
    peak = cost.TARGETS["trn1"].bf16_tflops * 1e12
    assert m["mfu_estimated_percent"] == m["hfu_estimated_percent"] == pytest.approx(
        100 * flops / (peak * m["total_time"]))
    assert m["transcendentals"] == 0


def test_a_tensor_engine_transpose_counts_in_hfu_not_mfu():
    x, y = np.zeros((64, 128), bf16), np.zeros((128, 512), bf16)
    m = figures(matmul_untransposed, x, y)
    transpose = 2 * 64 * 128 * 64  # the (64, 128) tile against a 64 x 64 identity
    assert m["transpose_flops"] == transpose
    assert m["model_flops"] == 2 * 128 * 64 * 512  # then K=128, M=64, N=512
    assert m["hardware_flops"] == m["model_flops"] + transpose
    assert m["hfu_estimated_percent"] / m["mfu_estimated_percent"] == pytest.approx(m["hardware_flops"]
                                                                                  / m["model_flops"])


def test_activation_functions_count_transcendentals_and_arithmetic_counts_flops():
    x = np.zeros((128, 1024), np.float32)
    m = figures(exp_then_add, x)
    assert m["transcendentals"] == 2 * 128 * 1024  # exp (nisa.activation) and nl.tanh, one per element
    assert m["flops"] == 128 * 1024  # the add; no matmul


def test_loads_and_stores_count_hbm_read_and_write_bytes_and_mbu():
    x = np.zeros((256, 512), np.float32)
    m = figures(copy_rows, x)
    assert m["hbm_read_bytes"] == m["hbm_write_bytes"] == x.nbytes
    assert m["bytes_accessed"] == 2 * x.nbytes
    stack = cost.TARGETS["trn1"].hbm_bytes_per_ns  # 410 GB/s: one of trn1's two HBM stacks
    assert m["mbu_estimated_percent"] == pytest.approx(100 * 2 * x.nbytes / (m["total_time"] * 1e9) / stack)
    assert m["model_flops"] == m["flops"] == m["transcendentals"] == 0
    assert 0 < m["dma_active_time_percent"] <= 100 and m["tensor_engine_active_time_percent"] == 0


def test_a_current_api_nl_load_counts_its_hbm_read():
    @cnki.jit
    def copy(x):
        out = cl.ndarray(x.shape, dtype=x.dtype, buffer=cl.shared_hbm)
        cl.store(out, cl.load(x))
        return out

    x = np.zeros((128, 512), np.float32)
    m = figures(copy, x)
    assert m["hbm_read_bytes"] == m["hbm_write_bytes"] == x.nbytes


def test_the_bound_follows_the_performance_guide_rule():
    a, b = np.zeros((128, 128), bf16), np.zeros((128, 512), bf16)
    heavy = figures(matmul_heavy, a, b, 512)
    assert heavy["tensor_engine_active_time_percent"] >= 90 and heavy["bound"] == "compute-bound"
    assert heavy["mm_arithmetic_intensity"] > heavy["peak_flops_bandwidth_ratio"]
    # Both cores of an LNC2 launch stream through one HBM stack: above the guide's 60% MBU bar.
    x = np.zeros((2048, 8192), np.float32)
    copy = metrics(profile(lnc2_copy[2], target="trn2", timing_only=True)(x).estimate)
    assert copy["cores"] == 2 and copy["hbm_read_bytes"] == x.nbytes
    assert copy["mbu_estimated_percent"] >= 60 and copy["bound"] == "memory-bound"
    small = figures(one_matmul, a, b)  # a few microseconds of fixed DMA latency: neither
    assert small["bound"] == "neither"


def test_report_and_trace_carry_the_figures(tmp_path):
    a, b = np.zeros((128, 128), bf16), np.zeros((128, 512), bf16)
    prof = profile(one_matmul, target="trn2", timing_only=True)(a, b)
    text = prof.report()
    for name in ("MFU", "HFU", "MBU", "hbm_read_bytes", "hbm_write_bytes", "transcendentals=0",
                 f"flops={2 * 128 * 128 * 512}", "bound", "estimate for trn2"):
        assert name in text
    prof.write_trace(tmp_path / "t.json")
    (launch,) = json.loads((tmp_path / "t.json").read_text())["otherData"]["launches"]
    assert launch["name"] == "one_matmul" and launch["label"] == "estimate for trn2"
    assert launch["model_flops"] == 2 * 128 * 128 * 512 and launch["hbm_write_bytes"] == 128 * 512 * 4


# ------------------------------------------------------------------------------------------ spills

@nki.jit
def hold_all(x):
    """Load every 128-row tile of x, keeping all live until the stores at the end."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    n = x.shape[0] // 128
    tiles = [nl.load(x[i * 128:(i + 1) * 128, :]) for i in range(n)]
    for i in range(n):
        nl.store(out[i * 128:(i + 1) * 128, :], value=tiles[i])
    return out


def test_live_tiles_over_the_sbuf_budget_pay_spill_saves_and_reloads():
    x = np.zeros((8 * 128, 8192), np.float32)  # eight tiles of 32 KiB per partition: 256 KiB, 64 over trn1's 192
    with pytest.warns(SimulatorWarning, match="SBUF capacity exceeded"):
        spilled = profile(hold_all, target="trn1", timing_only=True)(x)
    m = metrics(spilled.estimate)
    tile = 128 * 8192 * 4
    assert m["spill_save_bytes"] == m["spill_reload_bytes"] == 2 * tile  # two tiles out and back in
    items = spilled.estimate.schedules[0].items
    loads = [i for i in items if i.instr.api == "nl.load"]
    saves = [i for i in items if i.instr.api == cost.SPILL_SAVE]
    reloads = [i for i in items if i.instr.api == cost.SPILL_RELOAD]
    # Belady: the live tiles used farthest ahead (stored last, the 6th and 7th) go out, the last one stays.
    assert [s.instr.srcs[0].key for s in saves] == [loads[5].instr.dst.key, loads[6].instr.dst.key]
    assert [r.instr.dst.key for r in reloads] == [loads[5].instr.dst.key, loads[6].instr.dst.key]
    assert m["hbm_read_bytes"] == x.nbytes + 2 * tile and m["hbm_write_bytes"] == x.nbytes + 2 * tile
    with configure(sbuf_budget_bytes=8 * 32768):  # the same kernel with room for every tile
        fits = profile(hold_all, target="trn1", timing_only=True)(x)
    assert metrics(fits.estimate)["spill_save_bytes"] == 0
    spill_dma_ns = sum(i.end - i.start for i in saves + reloads)  # each transfer takes all 16 queues
    assert spilled.seconds - fits.seconds >= spill_dma_ns * 1e-9 > 0


def test_live_tiles_within_the_sbuf_budget_spill_nothing():
    x = np.zeros((6 * 128, 8192), np.float32)  # 192 KiB per partition: exactly trn1's SBUF
    m = metrics(profile(hold_all, target="trn1", timing_only=True)(x).estimate)
    assert m["spill_save_bytes"] == m["spill_reload_bytes"] == 0
    assert m["hbm_read_bytes"] == m["hbm_write_bytes"] == x.nbytes


@cnki.jit
def labelled_transpose(x):
    """x.T through nc_matmul against an identity with is_transpose=True."""
    p, f = x.shape
    flipped = cl.ndarray((f, p), dtype=cl.float32, buffer=cl.psum)
    identity = load(cl.shared_identity_matrix(p, dtype=cl.float32))
    cisa.nc_matmul(dst=flipped, stationary=load(x), moving=identity, is_transpose=True)
    result = cl.ndarray((f, p), dtype=x.dtype, buffer=cl.sbuf)
    cisa.tensor_copy(dst=result, src=flipped)
    out = cl.ndarray((f, p), dtype=x.dtype, buffer=cl.shared_hbm)
    cisa.dma_copy(dst=out, src=result)
    return out


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_nc_matmul_with_is_transpose_counts_as_transpose_flops(target):
    """nc_matmul page: "setting is_transpose=True ensures neuron-profile identifies this instruction
    as a transpose" (on trn1 an ordinary matmul against the identity, from trn2 the transpose mode)."""
    x = np.zeros((64, 32), np.float32)
    m = metrics(profile(labelled_transpose, target=target, timing_only=True)(x).estimate)
    assert m["transpose_flops"] == m["hardware_flops"] == 2 * 64 * 32 * 64
    assert m["model_flops"] == m["mfu_estimated_percent"] == 0 < m["hfu_estimated_percent"]
