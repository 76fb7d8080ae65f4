"""Runs the test suite as a few pytest processes, one after another, instead of one.

Why: one process that runs the whole suite compiles well over a thousand XLA programs, and TensorFlow 2.21 keeps
growing with them; late in such a process an XLA program that raises inside its compiled code took the process
down (the C++ unwinder reading an exception-frame registration of JIT code that was already freed: a segfault in
`_Unwind_Find_FDE`, not a Python error). A fresh process per group of test files bounds what each one accumulates.
Files that share built fixtures (the exports that the export and serving tests share) stay in one group.

    python tools/run_tests.py [pytest options]     e.g. -x, -m "not slow", -k name

Every test file under tests/ runs exactly once (a new file joins the last group). First, `ruff check` lints the
source (its rules are in pyproject.toml): a lint failure fails the run too, after the tests. The exit status is the
lint's or the first failing group's (pytest's own codes), else 0.
"""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Groups of test files (glob patterns under tests/), each run in its own process, in this order.
GROUPS = [
    ["test_batch*.py", "test_beam_search.py", "test_bench.py", "test_chat_template.py", "test_cli.py",
     "test_codebase.py", "test_compile_cache.py", "test_config.py", "test_contrastive.py",
     "test_default_model.py", "test_degenerate_values.py"],
    ["test_export*.py", "test_serve*.py"],
    ["test_generate_*.py", "test_gguf_*.py", "test_gpt2_model.py", "test_keras_hub_*.py"],
    ["test_llama_*.py", "test_model_files.py", "test_option_fates.py", "test_processors.py", "test_pull.py"],
]


def grouped_files(names: list[str]) -> list[list[str]]:
    """`names` (test file names) split into GROUPS, files no group names forming the last group."""
    groups, taken = [], set()
    for patterns in GROUPS:
        group = [name for name in names if name not in taken and any(fnmatch.fnmatch(name, p) for p in patterns)]
        taken.update(group)
        groups.append(group)
    groups.append([name for name in names if name not in taken])
    return [group for group in groups if group]


#: What `ruff check` lints (the package, its tests, the benchmark and the tools).
LINTED = ["tfgen", "tests", "benchmarks", "tools"]


def main(argv: list[str]) -> int:
    names = sorted(path.name for path in (ROOT / "tests").glob("test_*.py"))
    began = time.monotonic()
    print(f"=== lint: ruff check {' '.join(LINTED)}", flush=True)
    status = subprocess.call([sys.executable, "-m", "ruff", "check", *LINTED], cwd=ROOT)
    if status:
        print(f"=== lint failed (exit {status})", flush=True)
    for index, group in enumerate(grouped_files(names), 1):
        print(f"\n=== tests, group {index}: {' '.join(group)}", flush=True)
        code = subprocess.call([sys.executable, "-m", "pytest", *[f"tests/{name}" for name in group], *argv],
                               cwd=ROOT)
        if code not in (0, 5) or (code == 5 and not any(arg.startswith(("-k", "-m")) for arg in argv)):
            status = status or code
            print(f"=== group {index} failed (exit {code})", flush=True)
    print(f"\n=== all groups: {'passed' if status == 0 else f'failed (exit {status})'} in "
          f"{time.monotonic() - began:.0f} s", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
