"""First-call time and peak memory: each library in a fresh interpreter, so nothing is compiled or cached yet.

`first_call_in_subprocess` starts `python -m benchmarks.first_call LIBRARY CHECKPOINT STRATEGIES PROMPT_LEN
NEW_TOKENS`, which loads the library, runs each strategy once at batch 1 and prints one JSON line.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.checkpoints import checkpoint_info
from benchmarks.peers import bench_prompt, load_runner, short_error

# The directory holding the `benchmarks` package: the worker must import it whatever the working directory.
_SOURCE_ROOT = str(Path(__file__).resolve().parents[1])


def first_call_in_subprocess(library: str, checkpoint: str, options) -> dict:
    """Runs the worker in a fresh interpreter. Returns {"load_s", "first_call_s": {strategy: s}, "errors":
    {strategy: message}, "peak_rss_mb"}, or {"error": message} when the library could not run at all.
    `options` gives `strategies`, `prompt_len`, `new_tokens` and `worker_timeout` (seconds)."""
    command = [
        sys.executable, "-m", "benchmarks.first_call", library, checkpoint,
        ",".join(options.strategies), str(options.prompt_len), str(options.new_tokens),
    ]
    python_path = os.pathsep.join(filter(None, [_SOURCE_ROOT, os.environ.get("PYTHONPATH")]))
    # A first call compiles: no library may load a program from the persistent compile cache (tfgen's, or XLA's
    # flag inherited by the peers).
    env = {key: value for key, value in os.environ.items() if key not in ("TF_XLA_FLAGS", "_TFGEN_ADDED_XLA_FLAG")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", HF_HUB_OFFLINE="1", PYTHONPATH=python_path, TFGEN_COMPILE_CACHE="0")
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=options.worker_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {options.worker_timeout} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        last_line = (done.stderr or done.stdout).strip().splitlines()[-1:] or "no output"
        return {"error": short_error(RuntimeError(last_line))}
    return json.loads(lines[-1])


def _worker(library: str, checkpoint: str, strategies: str, prompt_len: str, new_tokens: str) -> None:
    """The fresh interpreter's side: prints the report `first_call_in_subprocess` returns as one JSON line."""
    start = time.perf_counter()
    report: dict = {"first_call_s": {}, "errors": {}}
    try:
        runner = load_runner(library, checkpoint, int(new_tokens))
    except Exception as error:  # noqa: BLE001
        print(json.dumps({"error": short_error(error)}))
        return
    report["load_s"] = time.perf_counter() - start
    input_ids = bench_prompt(1, int(prompt_len), checkpoint_info(checkpoint)["vocab_size"])
    for strategy in strategies.split(","):
        start = time.perf_counter()
        try:
            runner.generate(strategy, input_ids)
            report["first_call_s"][strategy] = time.perf_counter() - start
        except Exception as error:  # noqa: BLE001
            report["errors"][strategy] = short_error(error)
    report["peak_rss_mb"] = _peak_rss_mb()
    print(json.dumps(report))


def _peak_rss_mb() -> float:
    """This process's peak resident memory in MB. Linux carries `ru_maxrss` over from the parent through fork
    and exec, so a worker started by a big benchmark process would report the parent's peak; the address
    space's own high-water mark (`VmHWM`) starts fresh at exec."""
    with contextlib.suppress(OSError):
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux, bytes on macOS


if __name__ == "__main__":
    _worker(*sys.argv[1:])
