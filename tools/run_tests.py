"""Runs the test suite as a few pytest processes instead of one, two at a time.

Why several processes: one process that runs the whole suite compiles well over a thousand XLA programs, and
TensorFlow 2.21 keeps growing with them; late in such a process an XLA program that raises inside its compiled code
took the process down (the C++ unwinder reading an exception-frame registration of JIT code that was already freed: a
segfault in `_Unwind_Find_FDE`, not a Python error). A fresh process per group of test files bounds what each one
accumulates. Files that share built fixtures (the exports that the export and serving tests share) stay in one group.

Why two at a time: most of the suite's time is XLA compiling, which runs on one core; two processes keep both of a
2-core machine's cores busy. Each group's output is printed whole when it ends (in the order the groups end).

    python tools/run_tests.py [--lanes N] [pytest options]     e.g. -x, -m "not slow", -k name

Every test file under tests/ runs exactly once (a new file joins the last group). First, `ruff check` lints the
source (its rules are in pyproject.toml): a lint failure fails the run too, after the tests. The exit status is the
lint's or the first failing group's (pytest's own codes), else 0.
"""

from __future__ import annotations

import concurrent.futures
import fnmatch
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Groups of test files (glob patterns under tests/), each run in its own process; the longest first.
GROUPS = [
    ["test_chat_command.py", "test_cli_errors.py", "test_constrained_beam.py", "test_fast_start.py",
     "test_hostile_*.py", "test_pipeline.py", "test_smollm2.py", "test_speculative.py"],
    ["test_batch*.py", "test_beam_search.py", "test_bench.py", "test_chat_template.py", "test_cli.py",
     "test_codebase.py", "test_compile_cache.py", "test_config.py", "test_contrastive.py",
     "test_default_model.py", "test_degenerate_values.py"],
    ["test_generate_*.py", "test_gguf_*.py", "test_gpt2_model.py", "test_keras_hub_*.py"],
    ["test_llama_*.py", "test_model_files.py", "test_option_fates.py", "test_processors.py", "test_pull.py"],
    ["test_export*.py", "test_serve*.py"],
]
#: How many groups run at once unless `--lanes` says otherwise.
LANES = 2


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


def run_group(group: list[str], argv: list[str], root: Path = ROOT) -> tuple[int, str, float]:
    """Runs one group's pytest process (files under `root`/tests); its exit code, its whole output and its seconds."""
    began = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:
        code = subprocess.call([sys.executable, "-m", "pytest", *[f"tests/{name}" for name in group], *argv],
                               cwd=root, stdout=log, stderr=subprocess.STDOUT)
        log.seek(0)
        return code, log.read(), time.monotonic() - began


def parse_lanes(argv: list[str]) -> tuple[int, list[str]]:
    """`--lanes N` taken out of `argv` (the rest goes to pytest)."""
    if "--lanes" not in argv:
        return LANES, argv
    at = argv.index("--lanes")
    try:
        lanes = int(argv[at + 1])
    except (IndexError, ValueError):
        raise SystemExit("run_tests.py: --lanes takes a whole number, e.g. --lanes 1") from None
    if lanes < 1:
        raise SystemExit("run_tests.py: --lanes must be at least 1")
    return lanes, argv[:at] + argv[at + 2:]


def main(argv: list[str]) -> int:
    lanes, argv = parse_lanes(argv)
    names = sorted(path.name for path in (ROOT / "tests").glob("test_*.py"))
    began = time.monotonic()
    print(f"=== lint: ruff check {' '.join(LINTED)}", flush=True)
    status = subprocess.call([sys.executable, "-m", "ruff", "check", *LINTED], cwd=ROOT)
    if status:
        print(f"=== lint failed (exit {status})", flush=True)
    groups = grouped_files(names)
    filtered = any(arg.startswith(("-k", "-m")) for arg in argv)
    with concurrent.futures.ThreadPoolExecutor(lanes) as pool:
        running = {pool.submit(run_group, group, argv): (index, group)
                   for index, group in enumerate(groups, 1)}
        for future in concurrent.futures.as_completed(running):
            index, group = running[future]
            code, output, seconds = future.result()
            print(f"\n=== tests, group {index} ({seconds:.0f} s): {' '.join(group)}\n{output}", end="", flush=True)
            if code not in (0, 5) or (code == 5 and not filtered):
                status = status or code
                print(f"=== group {index} failed (exit {code})", flush=True)
    print(f"\n=== all groups: {'passed' if status == 0 else f'failed (exit {status})'} in "
          f"{time.monotonic() - began:.0f} s", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
