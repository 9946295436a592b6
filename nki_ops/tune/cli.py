"""``nki-ops tune run|kernel|report|best``."""

from __future__ import annotations

import argparse
import difflib
import signal
import sys
from pathlib import Path

PRUNED_SHOWN = 8


class _Parser(argparse.ArgumentParser):
    """Everything after the first ``--`` is the training command, verbatim; before it, only this parser's
    options. (With a catch-all positional, the value of a misspelled option such as ``--studdy x`` would
    start the command and swallow every option after it.)"""

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        split = args.index("--") if "--" in args else len(args)
        namespace, extras = super().parse_known_args(args[:split], namespace)
        for extra in extras:
            if extra.startswith("-"):
                known = [o for action in self._actions for o in action.option_strings]
                close = difflib.get_close_matches(extra.split("=", 1)[0], known, n=1)
                self.error(f"unknown option {extra!r}" + (f"; did you mean {close[0]!r}?" if close else ""))
            self.error(f"unexpected argument {extra!r}; give the training command after --")
        namespace.command = args[split + 1:]
        return namespace, []


def _run(args) -> int:
    from .space import describe, load_space
    from .study import check_sweep_options, no_effect_reasons, run_sweep

    if not args.dry_run:
        check_sweep_options(args.study, args.command, args.trials, args.timeout)
    space = load_space(args.space)
    print(f"{len(space.points)} configuration(s) to try, default first: {describe(space.baseline)}")
    shown = space.pruned if args.dry_run else space.pruned[:PRUNED_SHOWN]
    for config, reason in shown:
        print(f"  pruned {describe(config)}: {reason}")
    if len(shown) < len(space.pruned):
        print(f"  ... and {len(space.pruned) - len(shown)} more pruned combinations (--dry-run lists them all)")
    for axis, reason in no_effect_reasons(space.axes).items():
        if len(space.axes[axis]) > 1:
            print(f"  {axis.split('.', 1)[1]}: no effect on this host ({reason}); still passed to the trials")
    if args.dry_run:
        return 0
    # SIGTERM ends the sweep like Ctrl-C: the running trial is stopped and queued again for the resume
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        run_sweep(args.study, space, args.command, storage=args.storage, metric=args.metric, direction=args.direction,
                  trials=args.trials, timeout=args.timeout, progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"\ninterrupted; run the same command again to resume study {args.study!r}", file=sys.stderr)
        return 130
    return _report(args)


def _kernel(args) -> int:
    from .kernel import load_kernel_file, load_kernel_space, run_kernel_sweep
    from .space import describe

    if args.command:
        print("nki-ops tune kernel: error: tune kernel takes no command; the space file names the kernel's "
              "Python file", file=sys.stderr)
        return 2
    spec = load_kernel_space(args.space)
    target = args.target or spec.target or "trn2"
    args.study = args.study or f"{Path(args.space).stem}-{target}"
    build, check = load_kernel_file(spec.kernel)
    print(f"{len(spec.space.points)} candidate(s) of {spec.kernel.name} on the {target} cost model, default first: "
          f"{describe(spec.space.baseline)}" + ("" if check else " (no check(): values are not verified)"))
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        run_kernel_sweep(args.study, spec.space, build, check, target=target, storage=args.storage,
                         trials=args.trials, jobs=args.jobs, timeout=args.timeout, progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"\ninterrupted; run the same command again to resume study {args.study!r}", file=sys.stderr)
        return 130
    return _report(args)


def _report(args) -> int:
    from .results import format_report, load_results, write_csv, write_plot

    results = load_results(args.study, args.storage)
    print(format_report(results))
    if getattr(args, "csv", None):
        write_csv(results, args.csv)
        print(f"wrote {args.csv}")
    if getattr(args, "plot", None):
        write_plot(results, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _best(args) -> int:
    from .results import format_best, load_results

    print(format_best(load_results(args.study, args.storage), args.format))
    return 0


def _guarded(func):
    def run(args) -> int:
        from .flags import SpaceError
        from .study import SweepError, check_study_name, quiet_optuna

        quiet_optuna()
        try:
            if args.study is not None:
                check_study_name(args.study)
            return func(args)
        except (SpaceError, SweepError) as error:
            print(f"nki-ops tune: error: {error}", file=sys.stderr)
            return 2
    return run


def add_parser(subparsers) -> None:
    tune = subparsers.add_parser("tune", help="sweep compiler flags, XLA/Neuron env and script params over real "
                                              "runs, or kernel parameters on the cost model")
    commands = tune.add_subparsers(dest="tune_command", required=True, parser_class=_Parser)

    def common(parser):
        parser.add_argument("--study", required=True, help="study name (sweeps with the same name resume/share)")
        parser.add_argument("--storage", help="postgresql://... (or mysql://, sqlite:///) to share a study between "
                                              "machines, or a journal file path; default .nki-ops/tune/STUDY.journal")

    run = commands.add_parser("run", help="run (or resume, or join) a sweep",
                              usage="%(prog)s --study NAME --space FILE [options] -- COMMAND [ARGS ...]",
                              description="Run every configuration of the space as a fresh subprocess of COMMAND.")
    common(run)
    run.add_argument("--space", required=True, help="TOML search space: [neuron_cc_flags], [env], [params]")
    run.add_argument("--metric", default="samples_per_sec", help="metric the script reports (default samples_per_sec)")
    run.add_argument("--direction", choices=("maximize", "minimize"), default="maximize")
    run.add_argument("--trials", type=int, help="stop after this many trials (TPE when below the grid size; "
                                                "default: the whole grid)")
    run.add_argument("--timeout", type=float, default=3600.0, help="seconds before a trial is killed (default 3600)")
    run.add_argument("--dry-run", action="store_true", help="list the configurations and pruned combinations only")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.set_defaults(func=_guarded(_run))

    kernel = commands.add_parser(
        "kernel", help="tune an NKI kernel's parameters on the simulator's cost model (no device)",
        usage="%(prog)s --space FILE [options]",
        description="Cost every parameter combination of the kernel named in the space file with the simulator's "
                    "cost model (timing-only), check its values with the file's check(), and report the fastest "
                    "correct one.")
    kernel.add_argument("--space", required=True,
                        help='TOML: kernel = "file.py" (with build(**params) and optional check(**params)), '
                             'optional target, and [params] lists, the default first')
    kernel.add_argument("--study", help="study name (default: the space file's name and the target, e.g. "
                                        "matmul-trn2); sweeps with the same name resume/share")
    kernel.add_argument("--storage", help="postgresql://... (or mysql://, sqlite:///) or a journal file path; "
                                          "default .nki-ops/tune/STUDY.journal")
    kernel.add_argument("--target", choices=("trn1", "trn2", "trn3", "inf2"),
                        help="cost-model target (default: the space file's target, else trn2)")
    kernel.add_argument("--trials", type=int, help="how many candidates (default: all when at most 64, else 64; "
                                                   "TPE when below the number of combinations)")
    kernel.add_argument("--jobs", type=int, default=1, help="candidates costed at once, each in its own process")
    kernel.add_argument("--timeout", type=float, default=600.0,
                        help="seconds before a candidate is stopped and recorded as timeout (default 600)")
    kernel.add_argument("--csv", help="write every candidate to this CSV file")
    kernel.add_argument("--plot", help="write a PNG bar chart of the estimates to this file")
    kernel.add_argument("--no-progress", action="store_true", help="no progress bar")
    kernel.set_defaults(func=_guarded(_kernel))

    report = commands.add_parser("report", help="table sorted by the metric, failed trials, CSV and PNG")
    common(report)
    report.add_argument("--csv", help="write every trial to this CSV file")
    report.add_argument("--plot", help="write a PNG bar chart to this file")
    report.set_defaults(func=_guarded(_report))

    best = commands.add_parser("best", help="the best configuration, ready to paste")
    common(best)
    best.add_argument("--format", choices=("env", "json"),
                      help="env: export lines (default for flag sweeps); json (default for kernel sweeps)")
    best.set_defaults(func=_guarded(_best))
