"""The `tfgen` command line. Each subcommand lives in `tfgen/commands/<name>.py`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Modules whose `add_parser(subparsers)` registers one subcommand each.
SUBCOMMAND_MODULES = [
    "tfgen.commands.generate",
    "tfgen.commands.batch",
    "tfgen.commands.export",
    "tfgen.commands.serve",
    "tfgen.commands.bench",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tfgen", description="XLA-compiled generation for TF/Keras language models")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


def main(argv=None) -> int:
    # TF's C++ start-up chatter (CUDA probes, oneDNN notices) drowns the output of a command-line tool; errors
    # that matter reach the user as Python exceptions anyway. Set before any subcommand imports TensorFlow.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (ValueError, TypeError, OSError) as error:
        # Input problems are the user's to fix: one clear line, not a stack trace.
        print(f"tfgen: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
