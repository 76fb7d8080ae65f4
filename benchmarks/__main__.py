"""`python -m benchmarks`: the benchmark's command line (`benchmarks/run.py`)."""

import sys

from benchmarks.run import main

try:
    sys.exit(main(prog="python -m benchmarks"))
except ValueError as error:  # options that cannot be measured: one clear line, not a stack trace
    sys.exit(f"python -m benchmarks: error: {error}")
