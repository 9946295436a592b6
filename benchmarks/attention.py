"""Attention at B=1, H=8, S in {512, 2048}, D=64, causal and not, forward and forward+backward: the simulated
NKI kernels against torch eager ``scaled_dot_product_attention`` and the op's torch reference, in one run.

Ratios are against eager SDPA of the same row. A last row times the simulated forward+backward at B=1, H=4,
S=2048, D=64 causal, the size the simulator is held to (under 20 s on a 2-core machine).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import nki_ops

from .harness import RESULTS_DIR, Row, TunedRow, append_csv, estimate_device_ms, make_row, time_fn, tuned_estimates

SIMULATOR_TARGET_S = 20.0


def _inputs(batch, heads, seq, dim):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(batch, heads, seq, dim, generator=g).requires_grad_() for _ in range(3)]


def _step(attend, backward):
    """A callable running ``attend(q, k, v)``, then, with ``backward``, its backward for a fixed gradient."""
    def run(q, k, v, grad):
        out = attend(q, k, v)
        if backward:
            q.grad = k.grad = v.grad = None
            out.backward(grad)
        return out
    return run


def run(seqs=(512, 2048), heads: int = 8, dim: int = 64, *, repeats: int = 5, check_target: bool = True,
        csv_name: str = "attention.csv") -> list[Row]:
    rows: list[Row] = []
    nki_why_not = nki_ops.availability("attention")["nki"]
    for seq in seqs:
        q, k, v = _inputs(1, heads, seq, dim)
        grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
        for causal in (False, True):
            backends = {
                "torch SDPA (eager)": lambda q, k, v, c=causal: F.scaled_dot_product_attention(q, k, v, is_causal=c),
                "torch (reference backend)": lambda q, k, v, c=causal: nki_ops.attention(q, k, v, causal=c,
                                                                                         backend="torch"),
            }
            if nki_why_not is None:
                backends[nki_ops._backends.label("attention", "nki")] = \
                    lambda q, k, v, c=causal: nki_ops.attention(q, k, v, causal=c, backend="nki")
            for backward in (False, True):
                note = f"{'forward + backward' if backward else 'forward'}, {'causal' if causal else 'full'}"
                eager = None
                for name, attend in backends.items():
                    simulated = "simulated" in name
                    timing = time_fn(_step(attend, backward), q, k, v, grad, warmup=1 if simulated else 3,
                                     repeats=3 if simulated else repeats, max_seconds=5.0)
                    eager = eager or timing
                    estimate = estimate_device_ms(_step(attend, backward), q, k, v, grad) if simulated else None
                    rows.append(make_row("attention", name, q.shape, q.dtype, timing, eager, note, estimate))
    if check_target and nki_why_not is None:
        rows.append(_simulator_target_row())
    append_csv(rows, RESULTS_DIR / csv_name)
    return rows


def _simulator_target_row() -> Row:
    q, k, v = _inputs(1, 4, 2048, 64)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    step = _step(lambda q, k, v: nki_ops.attention(q, k, v, causal=True, backend="nki"), True)
    timing = time_fn(step, q, k, v, grad, warmup=0, repeats=1, max_seconds=0.0)
    verdict = "met" if timing.median_ms < SIMULATOR_TARGET_S * 1e3 else "MISSED"
    reference = time_fn(_step(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), True),
                        q, k, v, grad, repeats=3)
    return make_row("attention", nki_ops._backends.label("attention", "nki"), q.shape, q.dtype, timing, reference,
                    f"forward + backward, causal: simulator target < {SIMULATOR_TARGET_S:g} s {verdict}")


def tuned() -> list[TunedRow]:
    """The forward kernel's estimated device time with its default and its tuned kv_block, per target."""
    from nki_ops.ops.attention import tuning

    return tuned_estimates(tuning)
