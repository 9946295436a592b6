"""``nki-ops simulate SCRIPT [ARGS...]``: run a Python script with ``neuronxcc.nki`` simulated;
``nki-ops profile SCRIPT [ARGS...]``: the same, reporting the cost model's estimate of every kernel launch."""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from .core.config import TARGETS, configure
from .install import install


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "simulate", help="run a script that imports neuronxcc.nki on the CPU simulator",
        description="Run SCRIPT unmodified with neuronxcc.nki, .language, .isa and .typing resolving to the "
                    "nki-ops simulator (used only when the Neuron SDK is not importable, unless --force).")
    parser.add_argument("script", help="path of the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    parser.add_argument("--target", choices=sorted(TARGETS), default="trn1", help="simulated NeuronCore target")
    parser.add_argument("--seed", type=int, default=None,
                        help="shuffle affine_range iterations and SPMD grid order with this seed")
    parser.add_argument("--lenient", action="store_true",
                        help="warn instead of raising on tile-size and capacity violations")
    parser.add_argument("--force", action="store_true", help="simulate even when the Neuron SDK is installed")
    parser.set_defaults(func=run)

    parser = subparsers.add_parser(
        "profile", help="run a script on the CPU simulator and estimate its kernels' device time",
        description="Run SCRIPT as `simulate` does while the cost model listens, then report each kernel launch: "
                    "estimated device time for the target (an estimate, not a measurement), engine busy and active "
                    "time, MFU/HFU, MBU, HBM read/write bytes, Pallas-style flops/transcendentals/bytes_accessed, "
                    "compute- or memory-bound, critical path and the costliest source lines.")
    parser.add_argument("script", help="path of the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    parser.add_argument("--target", choices=sorted(TARGETS), default="trn1", help="NeuronCore target to estimate")
    parser.add_argument("--timing-only", action="store_true",
                        help="skip the Tensor engine's arithmetic (outputs are meaningless; faster on large kernels)")
    parser.add_argument("--trace", metavar="JSON", help="write a Chrome/Perfetto trace of the launches here")
    parser.add_argument("--png", metavar="PNG", help="write a timeline of the last launch here")
    parser.add_argument("--force", action="store_true", help="simulate even when the Neuron SDK is installed")
    parser.set_defaults(func=run_profile, seed=None, lenient=False)


def run_profile(args: argparse.Namespace) -> int:
    from .observers.profile import Profile, listen
    with configure(timing_only=args.timing_only), listen(args.target) as launches:
        status = run(args, "profile")
    if status:
        return status
    found = launches()
    if not found:
        print("nki-ops profile: no kernel ran", file=sys.stderr)
        return 1
    profile = Profile(found)
    print(profile.report())
    if args.trace:
        profile.write_trace(args.trace)
        print(f"trace: {args.trace}")
    if args.png:
        profile.write_png(args.png)
        print(f"timeline: {args.png}")
    return 0


def run(args: argparse.Namespace, command: str = "simulate") -> int:
    if not os.path.isfile(args.script):
        what = "is a folder, not a Python script" if os.path.isdir(args.script) else "does not exist"
        print(f"nki-ops {command}: error: {args.script!r} {what}", file=sys.stderr)
        return 2
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [args.script, *args.args]
    # As `python SCRIPT` does: the script's folder comes first on sys.path, so it imports its neighbours.
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    try:
        with install(force=args.force), configure(target=args.target, seed=args.seed, strict=not args.lenient,
                                                  timing_only=getattr(args, "timing_only", False)):
            runpy.run_path(args.script, run_name="__main__")
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
    return 0
