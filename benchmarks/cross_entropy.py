"""Cross-entropy and fused linear cross-entropy, forward + backward (a language model's loss step): every
available backend against the torch eager reference, in one run; and the peak memory of the fused op
against the torch composition (``python -m benchmarks.cross_entropy --memory``).

Peak memory is measured as the growth of the process's peak resident set (``ru_maxrss``) over one
forward + backward, in a fresh process per measurement, after the inputs exist: it sees torch's
allocations and the simulator's NumPy HBM arrays alike.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch

import nki_ops
from nki_ops.ops.cross_entropy.reference import cross_entropy_reference, fused_linear_cross_entropy_reference

from .harness import Row, compare_backends

OPTIONS = dict(ignore_index=-100, reduction="mean", label_smoothing=0.1, softcap=None)


def _forward_backward(logits, target, *, backend):
    logits.grad = None
    nki_ops.cross_entropy(logits, target, **OPTIONS, backend=backend).backward()


def _reference_forward_backward(logits, target):
    logits.grad = None
    cross_entropy_reference(logits, target, *OPTIONS.values()).backward()


def _fused_forward_backward(hidden, weight, bias, target, *, backend):
    hidden.grad = weight.grad = bias.grad = None
    nki_ops.fused_linear_cross_entropy(hidden, weight, target, bias, **OPTIONS, backend=backend).backward()


def _fused_reference_forward_backward(hidden, weight, bias, target):
    hidden.grad = weight.grad = bias.grad = None
    fused_linear_cross_entropy_reference(hidden, weight, target, bias, *OPTIONS.values()).backward()


def fused_inputs(rows: int, hidden_size: int, vocab: int, dtype=torch.float32, seed: int = 0):
    """Hidden states, classifier weight and bias, and targets (every 17th ignored). Scaled in place: a
    temporary as large as the weight would leave freed memory that the measured step reuses unseen."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, hidden_size, generator=g).to(dtype).requires_grad_()
    weight = torch.randn(vocab, hidden_size, generator=g).div_(hidden_size ** 0.5).to(dtype).requires_grad_()
    bias = torch.randn(vocab, generator=g).mul_(0.1).to(dtype).requires_grad_()
    target = torch.randint(0, vocab, (rows,), generator=g)
    target[::17] = -100
    return hidden, weight, bias, target


def run(rows: int = 1024, vocab: int = 8192, fused_rows: int = 512, hidden_size: int = 256, *,
        repeats: int = 10) -> list[Row]:
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(rows, vocab, generator=g)).requires_grad_()
    target = torch.randint(0, vocab, (rows,), generator=g)
    target[::17] = -100
    result = compare_backends("cross_entropy", _forward_backward, _reference_forward_backward, (logits, target),
                              repeats=repeats, include_compile=False,
                              note="forward + backward, label smoothing 0.1")
    inputs = fused_inputs(fused_rows, hidden_size, vocab)
    result += compare_backends("fused_linear_cross_entropy", _fused_forward_backward,
                               _fused_reference_forward_backward, inputs, repeats=repeats, include_compile=False,
                               csv_name="cross_entropy.csv", shape=(fused_rows, hidden_size, vocab),
                               note="N x H x V, forward + backward, label smoothing 0.1, bias")
    return result


# ------------------------------------------------------------------------------------ peak memory

_MEASURE = """
import json, resource, sys
import torch
import nki_ops
from benchmarks.cross_entropy import fused_inputs
rows, hidden_size, vocab, backend, composed = json.loads(sys.argv[1])


def step(hidden, weight, bias, target):
    if composed:
        return nki_ops.cross_entropy(hidden @ weight.T + bias, target, backend=backend)
    return nki_ops.fused_linear_cross_entropy(hidden, weight, target, bias, backend=backend)


# Once on a small problem first, so that imports and kernel tracing are not counted.
step(*fused_inputs(130, 8, 300)).backward()
hidden, weight, bias, target = fused_inputs(rows, hidden_size, vocab)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
loss = step(hidden, weight, bias, target)
forward = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
loss.backward()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"forward_mb": (forward - before) / 1024, "peak_growth_mb": (peak - before) / 1024,
                  "loss": loss.item()}))
"""


def peak_memory_mb(rows: int, hidden_size: int, vocab: int, backend: str, composed: bool) -> dict:
    """Growth of the peak resident set (MiB) over the forward (``forward_mb``) and the forward + backward
    (``peak_growth_mb``) of the fused op on ``backend`` (``composed``: of ``cross_entropy(hidden @
    weight.T + bias)`` instead), in a fresh process, with the loss it gave."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", _MEASURE, json.dumps([rows, hidden_size, vocab, backend, composed])],
                            capture_output=True, text=True, check=True, cwd=root)
    return json.loads(result.stdout.strip().splitlines()[-1])


def memory_table(rows: int, hidden_size: int, vocab: int, backends=("torch", "nki")) -> list[tuple]:
    """``(backend, what, forward MiB, forward + backward MiB, loss)`` for the composition and the fused op
    on each backend."""
    table = []
    for backend in backends:
        for composed in (True, False):
            measured = peak_memory_mb(rows, hidden_size, vocab, backend, composed)
            what = "cross_entropy(hidden @ weight.T + bias)" if composed else "fused_linear_cross_entropy"
            table.append((backend, what, measured["forward_mb"], measured["peak_growth_mb"], measured["loss"]))
    return table


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory", nargs=3, type=int, metavar=("N", "H", "V"),
                        help="measure peak memory at this size instead of timing")
    args = parser.parse_args()
    if args.memory:
        n, h, v = args.memory
        print(f"peak memory growth, N={n} H={h} V={v} fp32 (logits alone: {n * v * 4 / 2 ** 20:.0f} MiB; "
              f"weight: {v * h * 4 / 2 ** 20:.0f} MiB)")
        print(f"{'backend':<8} {'op':<42} {'forward':>12} {'+ backward':>12}")
        for backend, what, forward, peak, loss in memory_table(n, h, v):
            print(f"{backend:<8} {what:<42} {forward:>8.1f} MiB {peak:>8.1f} MiB  loss {loss:.6f}")
    else:
        from .harness import format_table
        print(format_table(run()))
