#!/usr/bin/env python3
"""Build the GpSimd C++ operators in cpp_ops/ into build/<target>/lib<op>.so.

    python build.py [--target auto|neuron|cpu] [--ops giou,nms] [--clean] [--verbose]

--target cpu builds the CPU emulation (any machine); --target neuron uses torch-neuronx's
custom_op.load and the GpSimd toolchain (a trn1/inf2 host); auto picks neuron when
torch-neuronx is installed. A library is rebuilt only when the hash of its sources, the
headers next to them, the emulation headers, the flags or the torch version changed, or when
lib<op>.so no longer has the SHA-256 recorded when it was built (truncated or modified).
Compiler errors are printed with file:line and the failing command; the exit status is
non-zero when any library fails. Libraries build side by side, one process per CPU; runs on one build
folder wait for each other.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import json
import multiprocessing
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from nki_ops.cpp import BuildError, custom_op
from nki_ops.cpp._build import archive_path, file_sha256, linked_libraries, source_hash
from nki_ops.cpp.operators import LIBRARIES, build_directory, host_target


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=("auto", "neuron", "cpu"), default="auto",
                        help="cpu: the CPU emulation; neuron: the GpSimd toolchain; auto: neuron if available")
    parser.add_argument("--ops", default=",".join(LIBRARIES),
                        help=f"comma-separated libraries to build (default: {','.join(LIBRARIES)})")
    parser.add_argument("--clean", action="store_true", help="delete the target's build directory first")
    parser.add_argument("--verbose", action="store_true", help="print every compiler command")
    args = parser.parse_args(argv)
    args.ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    unknown = [op for op in args.ops if op not in LIBRARIES]
    if unknown:
        parser.error(f"unknown ops {unknown}; choose from {sorted(LIBRARIES)}")
    return args


@contextlib.contextmanager
def build_lock(out_dir: Path):
    """Hold the lock of one build folder: two runs compiling into and packing the same files break each other."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # Beside the folder, not in it: --clean removes the folder.
    with open(out_dir.parent / f".{out_dir.name}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"build.py: waiting for another build.py to finish with {out_dir}", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def read_stamp(stamp: Path) -> dict:
    """What the last successful build recorded: the hash of its inputs, the SHA-256 of its output and of the
    libraries it linked (the CPU build's, which the output packs)."""
    try:
        return json.loads(stamp.read_text())
    except (OSError, ValueError):
        return {}


def library_digest(name: str, target: str) -> str:
    spec = LIBRARIES[name]
    return source_hash(name, spec.compute_srcs, spec.shape_srcs, [], [], spec.multicore) + f" {target}"


def up_to_date(name: str, target: str, out_dir: Path) -> bool:
    """Whether lib<name>.so is built from the current inputs and as it was built. A damaged one is reported, and
    the libraries it packs that are damaged too are removed for ninja to relink."""
    archive = archive_path(out_dir, name)
    recorded = read_stamp(out_dir / f"lib{name}.hash")
    if not archive.is_file() or recorded.get("inputs") != library_digest(name, target):
        return False
    if recorded.get("sha256") == file_sha256(archive):
        return True
    print(f"build.py: {archive} does not have the SHA-256 recorded when it was built (truncated or modified "
          "since): building it again", file=sys.stderr)
    for library in linked_libraries(out_dir / f"{name}.emulation", name):
        if library.is_file() and file_sha256(library) != recorded.get("linked", {}).get(library.name):
            library.unlink()
    return False


def build_one(name: str, target: str, out_dir: Path, verbose: bool) -> str:
    """Build one library that is not up to date; returns "built"."""
    spec = LIBRARIES[name]
    stamp = out_dir / f"lib{name}.hash"
    digest = library_digest(name, target)
    stamp.unlink(missing_ok=True)
    if target == "neuron":
        real = custom_op.neuron_custom_op()
        real.load(name=name, compute_srcs=[str(s) for s in spec.compute_srcs],
                  shape_srcs=[str(s) for s in spec.shape_srcs],
                  build_directory=str(out_dir), multicore=spec.multicore, verbose=verbose)
    else:
        custom_op.load(name, spec.compute_srcs, spec.shape_srcs, build_directory=str(out_dir),
                       multicore=spec.multicore, verbose=verbose)
    linked = {library.name: file_sha256(library)
              for library in linked_libraries(out_dir / f"{name}.emulation", name) if library.is_file()}
    stamp.write_text(json.dumps({"inputs": digest, "sha256": file_sha256(archive_path(out_dir, name)),
                                 "linked": linked}))
    return "built"


def timed_build(name: str, target: str, out_dir: Path, verbose: bool) -> tuple[str, str | BuildError, float]:
    start = time.perf_counter()
    try:
        outcome = build_one(name, target, out_dir, verbose)
    except BuildError as error:
        outcome = error
    return name, outcome, time.perf_counter() - start


def build_all(names: list[str], target: str, out_dir: Path, verbose: bool):
    """(name, "built" or BuildError, seconds) of each library, in order. Libraries build side by side, one process
    each: most of a library's time is one large source (its shape functions include torch), which one CPU compiles."""
    jobs = min(len(names), os.cpu_count() or 1)
    if jobs <= 1:
        yield from (timed_build(name, target, out_dir, verbose) for name in names)
        return
    # spawn: a forked child would inherit this process's torch and its threads.
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield from pool.map(functools.partial(timed_build, target=target, out_dir=out_dir, verbose=verbose), names)


def main(argv=None) -> int:
    args = parse_args(argv)
    target = host_target() if args.target == "auto" else args.target
    if target == "neuron" and custom_op.neuron_custom_op() is None:
        print("build.py: --target neuron needs a Neuron host: torch-neuronx (from the Neuron pip repository) and the "
              "aws-neuronx-gpsimd-customop-lib and aws-neuronx-gpsimd-tools packages. Use --target cpu elsewhere.",
              file=sys.stderr)
        return 2
    if target == "cpu" and custom_op.neuron_custom_op() is not None:
        print("build.py: --target cpu is not available on a Neuron host, where nki_ops.cpp.custom_op hands over to "
              "torch-neuronx; use --target neuron", file=sys.stderr)
        return 2
    out_dir = build_directory(target)
    failed = []
    with build_lock(out_dir):
        if args.clean and out_dir.exists():
            shutil.rmtree(out_dir)
            print(f"removed {out_dir}")
        out_dir.mkdir(parents=True, exist_ok=True)
        stale = []
        for name in args.ops:
            if up_to_date(name, target, out_dir):
                print(f"{name:6s} {target}: up to date -> {archive_path(out_dir, name)}", flush=True)
            else:
                stale.append(name)
        for name, outcome, seconds in build_all(stale, target, out_dir, args.verbose):
            if isinstance(outcome, BuildError):
                print(f"build.py: {name} ({target}): {outcome}", file=sys.stderr)
                failed.append(name)
                continue
            print(f"{name:6s} {target}: {outcome} ({seconds:.1f} s) -> {archive_path(out_dir, name)}", flush=True)
    if failed:
        print(f"build.py: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
