"""The NKI simulator's cost per executed instruction: a fixed set of kernels in both NKI API generations,
each beside the same computation written as plain NumPy calls (the floor), timed on this CPU in one run.

Kernels (1-3 are written here in both generations; 4-6 are the project's own):

1. vector add 1x1: ``a + b`` of HBM ``[N, 1]`` fp32, one row per loop iteration through ``[1, 1]`` SBUF
   tiles (load, load, add, store: 4 instructions per row), so nearly all its time is per-instruction cost.
2. element-wise chain: per 128-row tile of an HBM ``[R, 512]`` fp32 input, one load, 7 element-wise
   instructions (multiply by a scalar, add, exp, maximum with a scalar, subtract, a two-operator
   tensor_scalar, multiply) and one store: 9 instructions on ``[128, 512]`` tiles per row tile.
3. matmul: ``a_t.T @ b``, 512 x 512 x 512 fp32, four K tiles of 128 accumulated into a PSUM ``[128, 512]``
   tile by ``nc_matmul`` per 128-row output tile, copied to SBUF and stored: 14 instructions per output
   tile in both generations (the legacy ``psum += nisa.nc_matmul(...)`` is recorded as the one matmul
   accumulating in PSUM, and its ``nl.zeros`` PSUM tile is a fill at allocation, not an instruction).
4. GIoU: ``nki_ops/ops/giou/nki_kernel.py`` (current API) and ``tests/sim/legacy_kernels/giou.py`` (legacy)
   on the published 1024 x 256 boxes workload, in the ``launch_layout`` both kernels take.
5. RMSNorm, 1024 x 1024 fp32: ``nki_ops/ops/rms_norm/nki_kernel.py`` and ``tests/sim/legacy_kernels/rms_norm.py``.
6. attention, causal, B=1, H=4, S=512, D=64 fp32: ``nki_ops/ops/attention/nki_kernel.py``'s forward. There
   is no legacy-API attention kernel, so this kernel has current-API rows only.

Per kernel and API generation the run reports the first call (the first call of that kernel in this
process, after one untimed warm-up of a different small kernel in each generation so imports and the
simulator's own first-use costs are paid; kernels 1-3 are jit-decorated afresh by every ``run``, the
project's kernels are module-level, so in a process that has already run them it is not their first
call), the median of the following calls (the third call with the same shapes is recorded, the later
ones replayed when the kernel can be: ``core/replay.py``; the row says which), the median of the same
calls with replay off (every call interpreted in full), the instructions the simulator executed (counted
once with the instruction record, outside the timed calls), microseconds per instruction (median /
instructions) and the ratio to the NumPy floor. The floor is the kernel's tile-level math as plain
NumPy calls on arrays of the same shapes, loops and load/store copies included, on one BLAS thread
as the simulator's products are; it is the reference row, so ``speedup_vs_torch`` holds floor / simulator.
Every simulated output is checked against the floor's before the following calls are timed.

All numbers are simulator timings on this CPU, not device timings: they measure the simulator's overhead
and say nothing about a NeuronCore. Run: ``python -m benchmarks.sim_overhead`` or ``nki-ops bench sim_overhead``.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from nki_ops import nki_api
from nki_ops.ops.attention import nki_kernel as current_attention
from nki_ops.ops.giou import nki_kernel as current_giou
from nki_ops.ops.giou.reference import GIOU_EPS
from nki_ops.ops.rms_norm import nki_kernel as current_rms_norm
from nki_ops.sim import configure
from nki_ops.sim.core import replay, trace
from nki_ops.sim.frontends import current as cnki
from nki_ops.sim.frontends import legacy as lnki
from nki_ops.sim.frontends.current import isa as cnisa
from nki_ops.sim.frontends.current import language as cnl
from nki_ops.sim.frontends.legacy import isa as lnisa
from nki_ops.sim.frontends.legacy import language as lnl
from nki_ops.workloads import giou_workload
from tests.sim.legacy_kernels import giou as legacy_giou
from tests.sim.legacy_kernels import rms_norm as legacy_rms_norm

from .harness import RESULTS_DIR, Row, Timing, append_csv, format_table, make_row, time_fn

OP = "sim_overhead"
LEGACY, CURRENT = "legacy", "current"
GENERATIONS = {LEGACY: "legacy API (neuronxcc.nki)", CURRENT: "current API (nki)"}
FIRST, FOLLOWING, FULL, FLOOR = "first call", "repeated calls", "repeated calls without replay", "NumPy floor"
P = 128  # partitions per tile
CHAIN_COLS = 512
MAX_SECONDS = 4.0  # timed work per series (simulator or floor) before time_fn stops early
EPS = 1e-6


@dataclass
class Case:
    """One kernel: its simulated calls per generation, its NumPy floor and how close they must agree.
    Every call takes no arguments and returns the output as a NumPy array (or a tuple of them)."""
    name: str
    shape: tuple[int, ...]
    calls: dict[str, Callable[[], object]]
    floor: Callable[[], object]
    rtol: float = 1e-6
    atol: float = 1e-6


# ------------------------------------------------------------------------------- 1. vector add 1x1

def vector_add(n: int = 3200) -> Case:
    """``out = a + b`` over HBM ``[n, 1]`` fp32, one ``[1, 1]`` tile per row: 4 instructions a row in each API."""

    @lnki.jit
    def add_legacy(a, b):
        out = lnl.ndarray(a.shape, dtype=a.dtype, buffer=lnl.shared_hbm)
        for i in lnl.affine_range(a.shape[0]):
            x = lnl.load(a[i:i + 1, 0:1])
            y = lnl.load(b[i:i + 1, 0:1])
            lnl.store(out[i:i + 1, 0:1], lnl.add(x, y))
        return out

    @cnki.jit
    def add_current(a, b):
        out = cnl.ndarray(a.shape, dtype=a.dtype, buffer=cnl.shared_hbm)
        for i in cnl.affine_range(a.shape[0]):
            x = cnl.ndarray((1, 1), dtype=a.dtype, buffer=cnl.sbuf)
            y = cnl.ndarray((1, 1), dtype=a.dtype, buffer=cnl.sbuf)
            cnisa.dma_copy(dst=x, src=a[i:i + 1, 0:1])
            cnisa.dma_copy(dst=y, src=b[i:i + 1, 0:1])
            total = cnl.ndarray((1, 1), dtype=a.dtype, buffer=cnl.sbuf)
            cnisa.tensor_tensor(dst=total, data1=x, data2=y, op=cnl.add)
            cnisa.dma_copy(dst=out[i:i + 1, 0:1], src=total)
        return out

    g = np.random.default_rng(0)
    a, b = (g.standard_normal((n, 1), dtype=np.float32) for _ in range(2))

    def floor():
        out = np.empty_like(a)
        for i in range(n):
            x = a[i:i + 1, 0:1].copy()
            y = b[i:i + 1, 0:1].copy()
            out[i:i + 1, 0:1] = x + y
        return out

    return Case("vector add 1x1", (n, 1), {LEGACY: lambda: add_legacy(a, b), CURRENT: lambda: add_current(a, b)},
                floor)


# --------------------------------------------------------------------------- 2. element-wise chain

def elementwise_chain(rows: int = 1024) -> Case:
    """Per 128-row tile of HBM ``[rows, 512]`` fp32: load, 7 element-wise instructions, store (9 a tile)."""

    @lnki.jit
    def chain_legacy(x):
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        for t in lnl.affine_range(x.shape[0] // P):
            tile = lnl.load(x[t * P:(t + 1) * P, :])
            scaled = lnl.multiply(tile, 0.5)
            summed = lnl.add(scaled, tile)
            grown = lnl.exp(summed)
            floored = lnl.maximum(grown, 1.0)
            diff = lnl.subtract(floored, tile)
            affine = lnisa.tensor_scalar(diff, lnl.multiply, 0.25, op1=lnl.add, operand1=1.0)
            lnl.store(out[t * P:(t + 1) * P, :], lnl.multiply(affine, tile))
        return out

    @cnki.jit
    def chain_current(x):
        out = cnl.ndarray(x.shape, dtype=x.dtype, buffer=cnl.shared_hbm)
        shape, f32, sbuf = (P, x.shape[1]), cnl.float32, cnl.sbuf
        for t in cnl.affine_range(x.shape[0] // P):
            tile = cnl.ndarray(shape, dtype=f32, buffer=sbuf)
            cnisa.dma_copy(dst=tile, src=x[t * P:(t + 1) * P, :])
            scaled = cnl.ndarray(shape, dtype=f32, buffer=sbuf)
            cnisa.tensor_scalar(dst=scaled, data=tile, op0=cnl.multiply, operand0=0.5)
            summed = cnl.ndarray(shape, dtype=f32, buffer=sbuf)
            cnisa.tensor_tensor(dst=summed, data1=scaled, data2=tile, op=cnl.add)
            grown = cnl.ndarray(shape, dtype=f32, buffer=sbuf)
            cnisa.activation(dst=grown, op=cnl.exp, data=summed)
            floored = cnl.ndarray(shape, dtype=f32, buffer=sbuf)
            cnisa.tensor_scalar(dst=floored, data=grown, op0=cnl.maximum, operand0=1.0)
            diff = cnl.ndarray(shape, dtype=f32, buffer=sbuf)
            cnisa.tensor_tensor(dst=diff, data1=floored, data2=tile, op=cnl.subtract)
            affine = cnl.ndarray(shape, dtype=f32, buffer=sbuf)
            cnisa.tensor_scalar(dst=affine, data=diff, op0=cnl.multiply, operand0=0.25, op1=cnl.add, operand1=1.0)
            result = cnl.ndarray(shape, dtype=f32, buffer=sbuf)
            cnisa.tensor_tensor(dst=result, data1=affine, data2=tile, op=cnl.multiply)
            cnisa.dma_copy(dst=out[t * P:(t + 1) * P, :], src=result)
        return out

    x = np.random.default_rng(1).uniform(-1.0, 1.0, (rows, CHAIN_COLS)).astype(np.float32)

    def floor():
        out = np.empty_like(x)
        for t in range(rows // P):
            tile = x[t * P:(t + 1) * P, :].copy()
            affine = (np.maximum(np.exp(tile * 0.5 + tile), 1.0) - tile) * 0.25 + 1.0
            out[t * P:(t + 1) * P, :] = affine * tile
        return out

    return Case("element-wise chain", (rows, CHAIN_COLS),
                {LEGACY: lambda: chain_legacy(x), CURRENT: lambda: chain_current(x)}, floor, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------- 3. matmul

def matmul(size: int = 512) -> Case:
    """``a_t.T @ b``, ``size`` x ``size`` x ``size`` fp32 (``size``: a multiple of 128, at most 512): per
    128-row output tile, ``size / 128`` K tiles accumulated in PSUM, a copy to SBUF and a store."""

    @lnki.jit
    def matmul_legacy(a_t, b):
        k, m = a_t.shape
        out = lnl.ndarray((m, b.shape[1]), dtype=lnl.float32, buffer=lnl.shared_hbm)
        for mt in lnl.affine_range(m // P):
            acc = lnl.zeros((P, b.shape[1]), dtype=lnl.float32, buffer=lnl.psum)
            for kt in lnl.affine_range(k // P):
                stationary = lnl.load(a_t[kt * P:(kt + 1) * P, mt * P:(mt + 1) * P])
                moving = lnl.load(b[kt * P:(kt + 1) * P, :])
                acc += lnisa.nc_matmul(stationary, moving)
            lnl.store(out[mt * P:(mt + 1) * P, :], lnl.copy(acc))
        return out

    @cnki.jit
    def matmul_current(a_t, b):
        k, m = a_t.shape
        n = b.shape[1]
        out = cnl.ndarray((m, n), dtype=cnl.float32, buffer=cnl.shared_hbm)
        for mt in cnl.affine_range(m // P):
            acc = cnl.ndarray((P, n), dtype=cnl.float32, buffer=cnl.psum)
            for kt in cnl.affine_range(k // P):
                stationary = cnl.ndarray((P, P), dtype=a_t.dtype, buffer=cnl.sbuf)
                cnisa.dma_copy(dst=stationary, src=a_t[kt * P:(kt + 1) * P, mt * P:(mt + 1) * P])
                moving = cnl.ndarray((P, n), dtype=b.dtype, buffer=cnl.sbuf)
                cnisa.dma_copy(dst=moving, src=b[kt * P:(kt + 1) * P, :])
                cnisa.nc_matmul(dst=acc, stationary=stationary, moving=moving)  # the first write overwrites
            result = cnl.ndarray((P, n), dtype=cnl.float32, buffer=cnl.sbuf)
            cnisa.tensor_copy(dst=result, src=acc)
            cnisa.dma_copy(dst=out[mt * P:(mt + 1) * P, :], src=result)
        return out

    g = np.random.default_rng(2)
    a_t, b = (g.standard_normal((size, size), dtype=np.float32) for _ in range(2))

    def floor():
        out = np.empty((size, size), np.float32)
        for mt in range(size // P):
            acc = np.zeros((P, size), np.float32)
            for kt in range(size // P):
                stationary = a_t[kt * P:(kt + 1) * P, mt * P:(mt + 1) * P].copy()
                moving = b[kt * P:(kt + 1) * P, :].copy()
                acc += stationary.T @ moving
            out[mt * P:(mt + 1) * P, :] = acc.copy()
        return out

    return Case("matmul, PSUM-accumulated", (size, size, size),
                {LEGACY: lambda: matmul_legacy(a_t, b), CURRENT: lambda: matmul_current(a_t, b)}, floor,
                rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------------------- 4. GIoU

def giou(batch: int = 1024, n_boxes: int = 256) -> Case:
    """The project's GIoU kernels on ``giou_workload(batch, n_boxes)`` in ``launch_layout``."""
    boxes1, boxes2 = giou_workload(batch, n_boxes)
    layout1 = current_giou.launch_layout(boxes1)[0].numpy()
    layout2 = current_giou.launch_layout(boxes2)[0].numpy()
    rows, cols = layout1.shape[0], layout1.shape[1] // 4

    def floor():
        """The current kernel's tile math: per 128-row tile, fp32 loads, strided coordinate planes,
        clamped extents, and each quotient as a reciprocal and a multiply."""
        out = np.empty((rows, cols), np.float32)
        for start in range(0, rows, P):
            a = layout1[start:start + P].astype(np.float32)  # the loads (copies)
            b = layout2[start:start + P].astype(np.float32)
            ax1, ay1, ax2, ay2 = a[:, 0::4], a[:, 1::4], a[:, 2::4], a[:, 3::4]
            bx1, by1, bx2, by2 = b[:, 0::4], b[:, 1::4], b[:, 2::4], b[:, 3::4]
            iw = np.maximum(np.minimum(ax2, bx2) - np.maximum(ax1, bx1), 0.0)
            ih = np.maximum(np.minimum(ay2, by2) - np.maximum(ay1, by1), 0.0)
            ew = np.maximum(np.maximum(ax2, bx2) - np.minimum(ax1, bx1), 0.0)
            eh = np.maximum(np.maximum(ay2, by2) - np.minimum(ay1, by1), 0.0)
            inter = iw * ih
            union = ((ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1)) - inter
            enclose = ew * eh
            iou = inter * np.reciprocal(np.maximum(union, GIOU_EPS))
            penalty = (enclose - union) * np.reciprocal(np.maximum(enclose, GIOU_EPS))
            out[start:start + P] = iou - penalty
        return out

    return Case("GIoU", tuple(boxes1.shape),
                {LEGACY: lambda: legacy_giou.giou_kernel(layout1, layout2),
                 CURRENT: lambda: current_giou.giou_kernel(layout1, layout2)}, floor, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------ 5. RMSNorm

def rms_norm(rows: int = 1024, width: int = 1024) -> Case:
    """The project's RMSNorm forward kernels on ``[rows, width]`` fp32 with a ``[1, width]`` weight."""
    g = np.random.default_rng(3)
    x = g.standard_normal((rows, width), dtype=np.float32)
    weight = (1.0 + 0.1 * g.standard_normal((1, width))).astype(np.float32)
    chunk = current_rms_norm.CHUNK
    ones_row = np.ones((1, P), np.float32)

    def floor():
        """The current kernel's tile math: per row tile and 512-column chunk, the sums of squares, then
        ``rsqrt(sum / D + eps)``, the weight chunk replicated by ``ones.T @ row`` and ``(x * r) * w``."""
        out = np.empty_like(x)
        for start in range(0, rows, P):
            size = min(P, rows - start)
            tile = x[start:start + size].copy()
            partial = np.empty((size, math.ceil(width / chunk)), np.float32)
            for index, c0 in enumerate(range(0, width, chunk)):
                partial[:, index] = np.square(tile[:, c0:c0 + chunk]).sum(axis=1)
            inv_rms = 1.0 / np.sqrt(partial.sum(axis=1, keepdims=True) * np.float32(1.0 / width) + np.float32(EPS))
            for c0 in range(0, width, chunk):
                row = weight[0:1, c0:c0 + chunk].copy()
                replicated = ones_row[:, :size].T @ row
                out[start:start + size, c0:c0 + chunk] = (tile[:, c0:c0 + chunk] * inv_rms) * replicated
        return out

    return Case("RMSNorm", (rows, width),
                {LEGACY: lambda: legacy_rms_norm.rms_norm_kernel(x, weight, EPS),
                 CURRENT: lambda: current_rms_norm.rms_norm_kernel(x, weight, EPS)}, floor, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------- 6. attention

def attention(batch: int = 1, heads: int = 4, seq: int = 512, dim: int = 64) -> Case:
    """The project's flash-attention forward, causal, fp32 (current API only: there is no legacy kernel)."""
    g = np.random.default_rng(4)
    q, k, v = (g.standard_normal((batch, heads, seq, dim), dtype=np.float32) for _ in range(3))
    q_t, k_t = (np.ascontiguousarray(t.transpose(0, 1, 3, 2)) for t in (q, k))
    scale = dim ** -0.5
    ka = current_attention

    def floor():
        """The kernel's tile math: per 128-row query tile, the online softmax over the visible 512-key
        blocks (causal mask on the blocks that need it), ``probs @ v`` over 128-key transposed chunks."""
        out = np.empty((batch, heads, seq, dim), np.float32)
        lse = np.empty((batch, heads, seq, 1), np.float32)
        for b in range(batch):
            for h in range(heads):
                for q0 in range(0, seq, P):
                    rows = min(P, seq - q0)
                    q_tile = q_t[b, h, :, q0:q0 + rows].copy()
                    row_max = np.full((rows, 1), ka.FLOOR, np.float32)
                    row_sum = np.zeros((rows, 1), np.float32)
                    acc = np.zeros((rows, dim), np.float32)
                    lo, hi = ka.visible_keys(q0, rows, seq, True, 0)
                    for k0, cols in ka.spans(lo, hi, ka.KV_BLOCK):
                        k_tile = k_t[b, h, :, k0:k0 + cols].copy()
                        scores = (q_tile.T @ k_tile) * np.float32(scale)
                        if k0 + cols - 1 > q0:
                            later = (k0 + np.arange(cols))[None, :] > (q0 + np.arange(rows))[:, None]
                            scores = np.where(later, np.float32(ka.MASKED), scores)
                        neg_max = -np.maximum(scores.max(axis=1, keepdims=True), row_max)
                        probs = np.exp(scores + neg_max)
                        rescale = np.exp(row_max + neg_max)
                        row_sum = row_sum * rescale + probs.sum(axis=1, keepdims=True)
                        row_max = -neg_max
                        product = np.zeros((rows, dim), np.float32)
                        for c0 in range(0, cols, P):
                            probs_t = probs[:, c0:c0 + P].T.copy()
                            v_tile = v[b, h, k0 + c0:k0 + c0 + P, :].copy()
                            product += probs_t.T @ v_tile
                        acc = acc * rescale + product
                    clamped = np.maximum(row_sum, np.float32(ka.TINY))
                    out[b, h, q0:q0 + rows] = acc * np.reciprocal(clamped)
                    lse[b, h, q0:q0 + rows] = np.log(clamped) + row_max
        return out, lse

    call = lambda: current_attention.flash_attention_kernel(q_t, k_t, v, None, scale, True, 0, 0.0)  # noqa: E731
    return Case("attention, causal", (batch, heads, seq, dim), {CURRENT: call}, floor, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------ measuring

def _warm_up() -> None:
    """One untimed call of a small kernel in each generation that is none of the measured ones, so the
    first calls measured do not pay imports or the front ends' own first use (a matmul's included: its
    first finds the process's BLAS libraries, ``core/blas.py``)."""

    @lnki.jit
    def warm_legacy(x):
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        tile = lnl.load(x)
        lnl.store(out, lnl.exp(tile) + lnl.copy(lnisa.nc_matmul(tile, tile)))
        return out

    @cnki.jit
    def warm_current(x):
        out = cnl.ndarray(x.shape, dtype=x.dtype, buffer=cnl.shared_hbm)
        tile = cnl.ndarray(x.shape, dtype=x.dtype, buffer=cnl.sbuf)
        cnisa.dma_copy(dst=tile, src=x)
        product = cnl.ndarray(x.shape, dtype=cnl.float32, buffer=cnl.psum)
        cnisa.nc_matmul(dst=product, stationary=tile, moving=tile)
        cnisa.activation(dst=tile, op=cnl.exp, data=product)
        cnisa.dma_copy(dst=out, src=tile)
        return out

    x = np.zeros((P, P), np.float32)
    warm_legacy(x)
    warm_current(x)


def instruction_count(call: Callable[[], object]) -> int:
    """Instructions the simulator executes in ``call()``, from the instruction record (barriers excluded)."""
    with trace.listen() as recorders:
        call()
    return sum(len([i for i in r.instrs if i is not None]) for r in recorders)


@contextlib.contextmanager
def _one_blas_thread():
    """The floor's products on one BLAS thread, as the simulator's (``nki_ops/sim/core/blas.py``)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _check(name: str, got, expected, case: Case) -> None:
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert len(got) == len(expected), f"{name}: {len(got)} outputs, the floor has {len(expected)}"
    for g, e in zip(got, expected):
        np.testing.assert_allclose(np.asarray(g), e, rtol=case.rtol, atol=case.atol, err_msg=name)


def cases(*, add_rows: int = 3200, chain_rows: int = 1024, matmul_size: int = 512,
          giou_boxes: tuple[int, int] = (1024, 256), rms_shape: tuple[int, int] = (1024, 1024),
          attention_shape: tuple[int, int, int, int] = (1, 4, 512, 64)) -> list[Case]:
    """The measured kernels at the given sizes. The project's current-API kernels run in the simulator
    only when ``nki_ops.nki_api`` chose it (no Neuron SDK ``nki`` here, or ``NKI_OPS_BACKEND=sim``);
    otherwise their current-API calls are left out."""
    chosen = [vector_add(add_rows), elementwise_chain(chain_rows), matmul(matmul_size), giou(*giou_boxes),
              rms_norm(*rms_shape), attention(*attention_shape)]
    if not nki_api.SIMULATED:
        for case in chosen[3:]:
            case.calls.pop(CURRENT, None)
    return [case for case in chosen if case.calls]


def run(repeats: int = 20, *, add_rows: int = 3200, chain_rows: int = 1024, matmul_size: int = 512,
        giou_boxes: tuple[int, int] = (1024, 256), rms_shape: tuple[int, int] = (1024, 1024),
        attention_shape: tuple[int, int, int, int] = (1, 4, 512, 64), max_seconds: float = MAX_SECONDS,
        csv_path: Path | None = None) -> list[Row]:
    """Time every kernel and generation of :func:`cases` and its NumPy floor; append the rows to
    ``csv_path`` (default ``results/sim_overhead.csv``) and return them."""
    _warm_up()
    rows: list[Row] = []
    for case in cases(add_rows=add_rows, chain_rows=chain_rows, matmul_size=matmul_size, giou_boxes=giou_boxes,
                      rms_shape=rms_shape, attention_shape=attention_shape):
        with _one_blas_thread():
            expected = case.floor()
            floor = time_fn(case.floor, warmup=1, repeats=repeats, max_seconds=max_seconds)
        measured = {}
        for generation, call in case.calls.items():
            name = f"{case.name}, {generation}"
            start = time.perf_counter()
            got = call()
            first_ms = (time.perf_counter() - start) * 1e3
            _check(name, got, expected, case)  # the first call's output, before the following calls are timed
            before, compiled_before = replay.replayed, replay.compiled_replays
            following = time_fn(call, warmup=0, repeats=repeats, max_seconds=max_seconds)
            replayed = ("as array operations" if replay.compiled_replays > compiled_before else "step by step") \
                if replay.replayed > before else None
            with configure(replay=False):
                full = time_fn(call, warmup=0, repeats=repeats, max_seconds=max_seconds)
            measured[generation] = (Timing(first_ms, first_ms, first_ms, 1), following, full, replayed,
                                    instruction_count(call))
        fewest = min(entry[-1] for entry in measured.values())
        rows.append(make_row(OP, f"{case.name}, {FLOOR}", case.shape, torch.float32, floor, floor,
                             f"{FLOOR}, the reference of this kernel's Nx ratios (floor / simulator): the same "
                             f"tile math as plain NumPy calls, {floor.median_ms * 1e3 / fewest:.2f} µs per "
                             f"instruction of the {fewest}-instruction simulated kernel"))
        for generation, (first, following, full, replayed, count) in measured.items():
            per_instruction = following.median_ms * 1e3 / count
            ratio = following.median_ms / floor.median_ms
            label = GENERATIONS[generation]
            rows.append(make_row(
                OP, f"{case.name}, {generation}, {FIRST}", case.shape, torch.float32, first, floor,
                f"{label}, {FIRST}: {first.median_ms * 1e3 / count:.1f} µs/instruction, {count} instructions, "
                f"{first.median_ms / following.median_ms:.2f}x the following calls, "
                f"{first.median_ms / floor.median_ms:.1f}x the NumPy floor"))
            how = (f"replayed {replayed} (core/replay.py), {full.median_ms / following.median_ms:.2f}x faster than "
                   f"with replay off" if replayed else "run in full (not replayable, see docs/simulator.md)")
            rows.append(make_row(
                OP, f"{case.name}, {generation}, {FOLLOWING}", case.shape, torch.float32, following, floor,
                f"{label}, {FOLLOWING}: {per_instruction:.1f} µs/instruction, {count} instructions, "
                f"{ratio:.1f}x the NumPy floor, {first.median_ms / following.median_ms:.1f}x faster than the "
                f"first call; {how}"))
            rows.append(make_row(
                OP, f"{case.name}, {generation}, {FULL}", case.shape, torch.float32, full, floor,
                f"{label}, {FULL}: {full.median_ms * 1e3 / count:.1f} µs/instruction, {count} instructions, "
                f"{full.median_ms / floor.median_ms:.1f}x the NumPy floor (every call interpreted in full)"))
    append_csv(rows, csv_path or RESULTS_DIR / f"{OP}.csv")
    return rows


if __name__ == "__main__":
    result = run()
    print("simulator timings on this CPU, not device time; 'vs torch' holds NumPy floor / simulator")
    print(format_table(result))
