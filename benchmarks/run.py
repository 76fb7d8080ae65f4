"""Measures tfgen's `generate()` next to its peers, prints the tables, and renders `docs/performance.md`.

    python -m benchmarks                               # full run, tables on stdout (about an hour on 2 CPUs)
    python -m benchmarks --quick                       # smoke run of the whole pipeline
    python -m benchmarks --json run.json --docs        # keep every timing, and render docs/performance.md
    python -m benchmarks --from-json a.json,b.json --docs  # re-render the docs from saved runs, merged

Run it from the root of a checkout (`tfgen bench ARGS` runs it too); the peers and the plots need
`pip install -e ".[bench]"`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks import harness, report

DOCS = Path(__file__).resolve().parents[1] / "docs"


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Parses `argv` (default: `sys.argv[1:]`), measures or loads the runs, prints the tables and, with
    `--docs`, renders the page and plots. Returns 0; raises `ValueError` for options that cannot be measured."""
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    harness.add_arguments(parser)
    parser.add_argument("--from-json", help="render saved runs (comma-separated --json files) instead of measuring")
    parser.add_argument("--docs", nargs="?", const=str(DOCS), metavar="DIR",
                        help=f"also render DIR/performance.md and the plots (DIR defaults to {DOCS})")
    options = parser.parse_args(argv)
    if options.from_json:
        results = report.merge([json.loads(Path(path).read_text()) for path in options.from_json.split(",")])
    else:
        harness.apply_quick(options)
        harness.check_options(options)
        results = harness.run_benchmark(options, log=lambda text: print(text, file=sys.stderr, flush=True))
        if options.json:
            Path(options.json).write_text(json.dumps(results, indent=1))
    print(report.report_tables(results))
    if options.docs:
        docs = Path(options.docs)
        docs.mkdir(parents=True, exist_ok=True)
        report.render(results, docs / "performance.md", report.plot(results, docs))
    return 0
