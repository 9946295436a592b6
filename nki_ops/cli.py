"""The ``nki-ops`` command line: ``demo``, ``bench``, ``simulate``, ``tune``.

Each subcommand lives next to the code it drives and exposes ``add_parser(subparsers)``;
the parser sets ``func`` to the function that runs it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMAND_MODULES = (
    "nki_ops.demo",
    "nki_ops.bench",
    "nki_ops.sim.cli",
    "nki_ops.tune.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nki-ops", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMAND_MODULES:
        importlib.import_module(module).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
