"""The cost model against published device times of kernels whose source is public.

    python -m benchmarks.cost_calibration --samples DIR [--only SUBSTRING ...] [--target-override T]

DIR is a checkout of aws-neuron/nki-samples at 0898a77 (the last commit with its reference kernels and
unit tests): ``git --git-dir=<nki-samples.git> archive 0898a77 | tar -x -C DIR``. Every kernel runs
unmodified in timing-only mode on the target its figure was published for; the table prints the
published time, the estimate and their ratio, the geometric-mean error (exp of the mean absolute log
ratio) and how many pairs of one family's kernels rank as published. docs/simulator.md keeps the
result ("Calibration and measured error").

Sources: the matmul and layernorm tutorials (``tests/sim/cost_kernels.py`` writes their kernels), the
fused Mamba tutorial (nki-samples ``tutorials/fused_mamba``), and nki-samples' unit-test performance
thresholds (``test/unit/test_*.py``, trn1 CI): a threshold written as ``measured * 1.05`` gives the
measured time; any other threshold is an upper bound, listed with "<=" and left out of the error and
ranking. (``resize_nearest_fixed_dma_kernel`` is left out: the simulator refuses its tuple argument.)
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

bf16, f16 = ml_dtypes.bfloat16, np.float16


@dataclass
class Case:
    family: str  # versions or shapes of one kernel: pairs within a family are ranked
    name: str
    target: str
    published_us: float
    bound: bool  # the published figure is a CI threshold (an upper bound), not a measurement
    run: object  # () -> (kernel, args)


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def cases(samples: Path) -> list[Case]:
    from tests.sim import cost_kernels

    out = []
    lhs, rhs = np.zeros((8192, 4096), bf16), np.zeros((8192, 8192), bf16)
    for name, ms in {"tiled": 51.8, "hoisted": 42.96, "blocked": 22.07, "optimized": 6.97}.items():
        out.append(Case("matmul tutorial", f"matmul {name} 4096x8192x8192 bf16", "trn1", ms * 1e3, False,
                        lambda name=name: (getattr(cost_kernels, name), (lhs, rhs))))
    x, g = np.zeros((4096, 8192), np.float32), np.zeros(8192, np.float32)
    for name, us in {"layernorm_v1": 2311, "layernorm_v2": 1969}.items():
        out.append(Case("layernorm tutorial", f"{name} 4096x8192 fp32", "trn1", us, False,
                        lambda name=name: (getattr(cost_kernels, name), (x, 1e-5, g, g))))

    mamba = _module(samples / "src/nki_samples/tutorials/fused_mamba/mamba_nki_kernels.py", "calib_mamba")

    def mamba_args(channels, seq_len):
        d = np.zeros((1, channels, seq_len), np.float32)
        return (d, d, np.zeros((channels, 16), np.float32), np.zeros((1, 16, seq_len), np.float32),
                np.zeros((1, 16, seq_len), np.float32))

    for version, channels, seq_len, us in [("v1", 256, 512, 172.93), ("v1", 4096, 512, 2340),
                                           ("v2", 4096, 512, 1610), ("v2", 4096, 1024, 4400),
                                           ("v2", 4096, 4096, 17600), ("v2", 4096, 8192, 53330),
                                           ("v3", 4096, 1024, 3300), ("v3", 4096, 8192, 27800)]:
        out.append(Case("mamba tutorial", f"mamba {version} {channels}x{seq_len}", "trn1", us, False,
                        lambda v=version, c=channels, s=seq_len: (getattr(mamba, f"mamba_{v}"), mamba_args(c, s))))

    sys.path.insert(0, str(samples / "src"))
    from nki_samples.reference import allocated_fused_linear, attention, vision

    for n, c, h, w, size, dtype, us in [(1, 64, 56, 56, 7, np.float32, 65), (2, 128, 28, 28, 7, np.float32, 109),
                                        (1, 256, 14, 14, 7, f16, 88), (4, 64, 56, 56, (7, 7), np.float32, 152),
                                        (2, 128, 28, 28, (14, 14), np.float32, 327),
                                        (1, 512, 7, 7, 1, np.float32, 14), (8, 64, 32, 32, (4, 4), f16, 103),
                                        (2, 2048, 32, 32, (3, 3), np.float32, 564),
                                        (2, 64, 256, 256, 1, np.float32, 255)]:
        out.append(Case("adaptive avg pool", f"adaptive_avg_pool2d {n}x{c}x{h}x{w}->{size} {np.dtype(dtype).name}",
                        "trn1", us, False,
                        lambda n=n, c=c, h=h, w=w, size=size, dtype=dtype:
                        (vision.adaptive_avg_pool2d_kernel, (np.zeros((n, c, h, w), dtype), size))))
    for seqlen, d, dtype, us in [(4096, 128, np.float32, 675), (4096, 128, bf16, 536), (4096, 64, f16, 600)]:
        out.append(Case("SD attention", f"fused_self_attn_for_SD_small_head_size {seqlen} d{d} "
                        f"{np.dtype(dtype).name}", "trn1", us * 1.05, True,
                        lambda s=seqlen, d=d, t=dtype: (attention.fused_self_attn_for_SD_small_head_size[1],
                                                        (np.zeros((1, d, s), t), np.zeros((1, s, d), t),
                                                         np.zeros((1, s, d), t)))))
    for seqlen, dim, d_head, dtype, us in [(128, 512, 512, f16, 25), (512, 1024, 384, bf16, 40),
                                           (128, 1024, 512, bf16, 28)]:
        out.append(Case("rmsnorm qkv", f"allocated_fused_rms_norm_qkv {seqlen}x{dim}x{d_head} {np.dtype(dtype).name}",
                        "trn1", us, True,
                        lambda s=seqlen, m=dim, d=d_head, t=dtype: (allocated_fused_linear.allocated_fused_rms_norm_qkv,
                                                                   (np.zeros((1, s, m), t), np.zeros((m, d), t)))))
    return out


def estimate_us(case: Case) -> float:
    from nki_ops.sim import profile
    kernel, args = case.run()
    return profile(kernel, target=case.target, timing_only=True)(*args).seconds * 1e6


def summary(rows: list[tuple[Case, float]]) -> tuple[float, int, int]:
    """(geometric-mean error, pairs ranked as published, pairs) over rows with a measured figure; pairs
    within a family whose published times differ."""
    measured = [(c, e) for c, e in rows if not c.bound]
    error = math.exp(sum(abs(math.log(e / c.published_us)) for c, e in measured) / max(len(measured), 1))
    ranked = total = 0
    for (a, ea), (b, eb) in itertools.combinations(rows, 2):
        if a.family == b.family and a.published_us != b.published_us and not (a.bound or b.bound):
            total += 1
            ranked += (ea < eb) == (a.published_us < b.published_us)
    return error, ranked, total


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=Path, required=True)
    parser.add_argument("--only", nargs="*", default=[])
    args = parser.parse_args(argv)
    import nki_ops.sim
    nki_ops.sim.install()
    rows = []
    print("| Kernel | Target | Published | Estimate | Ratio |\n|---|---|---|---|---|")
    for case in cases(args.samples):
        if args.only and not any(s in case.name for s in args.only):
            continue
        start = time.perf_counter()
        est = estimate_us(case)
        rows.append((case, est))
        mark = "<= " if case.bound else ""
        print(f"| {case.name} | {case.target} | {mark}{case.published_us:.0f} us | {est:.0f} us | "
              f"{est / case.published_us:.2f} |  <!-- {time.perf_counter() - start:.1f} s -->", flush=True)
    error, ranked, total = summary(rows)
    bounded = [(c, e) for c, e in rows if c.bound]
    print(f"\ngeometric-mean error {error:.2f}x over {len(rows) - len(bounded)} measured; "
          f"{ranked} of {total} pairs ranked as published; "
          f"{sum(e <= c.published_us for c, e in bounded)} of {len(bounded)} estimates within their CI bound")
    return 0


if __name__ == "__main__":
    sys.exit(main())
