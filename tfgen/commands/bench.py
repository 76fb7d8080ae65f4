"""`tfgen bench`: runs the side-by-side benchmark harness of a source checkout (`benchmarks/`, next to the
`tfgen/` package directory; see `docs/performance.md`).

The harness is not part of the installed package. Everything after `bench` goes to its own parser, so
`tfgen bench --help` is the harness's help; building this parser imports nothing of it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

BENCHMARKS_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def add_parser(subparsers) -> None:
    # No prefix characters the harness uses, so its flags (--help included) reach `arguments` untouched.
    parser = subparsers.add_parser(
        "bench", help="tokens/s of generate() next to HF transformers and keras-hub (source checkout only)",
        add_help=False, prefix_chars="+",
    )
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="the harness's arguments (tfgen bench --help)")
    parser.set_defaults(handler=run, needs_tensorflow=lambda args: not {"-h", "--help"} & set(args.arguments))


def harness_main():
    """The harness's `main(argv, prog)` from `BENCHMARKS_DIR`, whose parent it puts on `sys.path`. Raises
    `OSError` when the directory is absent (an installed wheel)."""
    if not (BENCHMARKS_DIR / "run.py").is_file():
        raise OSError(
            f"the benchmark harness ships in the source tree, not in wheels, and {str(BENCHMARKS_DIR)!r} is missing; "
            "run `python -m benchmarks` from a tfgen checkout"
        )
    if str(BENCHMARKS_DIR.parent) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS_DIR.parent))
    return importlib.import_module("benchmarks.run").main


def run(options) -> int:
    return harness_main()(options.arguments, prog="tfgen bench")
