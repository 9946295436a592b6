"""``python -m nki_ops.ops.retune OP [--jobs N]``: rerun the studies behind an op's tuned kernel parameters.

For every kernel in the op's ``tuning.py`` (``TUNED`` and its ``BUILD``: ``build``/``check`` per kernel)
and every target, runs :func:`nki_ops.tune.tune_kernel` over the recorded space and prints each target's
best parameters next to the recorded ones, to paste into ``per_target``.
"""

from __future__ import annotations

import argparse
import importlib

from ._tuned import TARGETS

TUNABLE = ("rms_norm", "giou", "attention")


def retune(op: str, targets=TARGETS, jobs: int = 1, progress: bool = False) -> dict:
    """``{kernel: {target: KernelTuneResult}}`` of fresh in-memory studies of ``op``'s tuned kernels."""
    from nki_ops.tune import tune_kernel

    tuning = importlib.import_module(f"nki_ops.ops.{op}.tuning")
    results: dict = {}
    for kernel, tuned in tuning.TUNED.items():
        build, check = tuning.BUILD[kernel]
        for target in targets:
            results.setdefault(kernel, {})[target] = tune_kernel(build, tuned.space, target=target, check=check,
                                                                 jobs=jobs, progress=progress)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nki_ops.ops.retune", description=__doc__.splitlines()[0])
    parser.add_argument("op", choices=TUNABLE)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args(argv)
    tuning = importlib.import_module(f"nki_ops.ops.{args.op}.tuning")
    for kernel, by_target in retune(args.op, jobs=args.jobs, progress=True).items():
        recorded = tuning.TUNED[kernel].per_target
        print(f"{kernel} ({tuning.TUNED[kernel].kernel}):")
        for target, result in by_target.items():
            for row in result.rows:
                print(f"  {target} {row.params} {row.status} "
                      + ("" if row.estimate_us is None else f"{row.estimate_us:.1f} us"))
            same = "same as recorded" if result.best == recorded.get(target) else f"recorded {recorded.get(target)}"
            print(f"  {target}: best {result.best} ({same})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
