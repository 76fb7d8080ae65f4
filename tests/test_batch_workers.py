"""Multi-worker `tfgen batch`, proven: two `tfgen batch --strategy multi-worker` processes on loopback, configured by
`TF_CONFIG` (MultiWorkerMirroredStrategy, one CPU replica each), against one process with `--strategy default`.

One module job (the tiny model, 32 sampled rows of 1-12 words, batch 4, window 8, so every step runs a group on
each worker's replica) is run once in one process: the reference. The two-worker tests compare files byte for
byte — every byte of the output is decided by the rows (ids, ids' keys, tokens, text), and both runs write it with
the same code, so a byte is the finest check there is (a JSON key order or float format change would also show).

A worker is lost at an exact point by `tests/kill_batch_worker.py` (it signals itself once its runner has finished
K windows, which the chief has then committed): the survivor must exit within `LOSS_BOUND` seconds with one line
(`tfgen.batch.distribute.WorkerLost`), never hang in its collective; both workers started again finish the job,
nothing lost or duplicated. Every subprocess runs under a timeout and is killed when the test ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tfgen import Tokenizer
from tfgen.batch import run_batch_job

ROWS = 32
WINDOW = 8
MAX_NEW_TOKENS = 8
OPTIONS = ["--batch-size", "4", "--window", str(WINDOW), "--seed", "3", "4", "--do-sample", "--max-new-tokens",
           str(MAX_NEW_TOKENS), "--no-progress"]
# A worker that outlives its peer must say so within this many seconds (TensorFlow aborts its collectives when the
# peer's connection is reset, at once, or when its heartbeats stop, ~10 s); generous for a loaded CI machine.
LOSS_BOUND = 60
# The most a whole worker process may take (start-up, compile, the job) before the test kills it and fails.
WORKER_TIMEOUT = 240
LOSING_CLI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kill_batch_worker.py")


@pytest.fixture(scope="module")
def job(model_dir, tiny_model, tmp_path_factory):
    """(model folder, prompts path, reference output bytes, compile cache folder): the job run in this process on
    one replica (the session's tiny model: the program of tests/test_batch_reliability.py's jobs)."""
    directory = tmp_path_factory.mktemp("workers_job")
    rng = np.random.default_rng(11)
    prompts = directory / "prompts.jsonl"
    prompts.write_text("".join(
        json.dumps({"id": f"r{index}", "prompt": " ".join(f"w{t}" for t in rng.integers(3, 97, size=count))}) + "\n"
        for index, count in enumerate(rng.integers(1, 13, size=ROWS))
    ))
    reference = str(directory / "reference.jsonl")
    run_batch_job(tiny_model, str(prompts), reference, tokenizer=Tokenizer.from_pretrained(model_dir), batch_size=4,
                  window=WINDOW, seed=(3, 4), do_sample=True, max_new_tokens=MAX_NEW_TOKENS, progress=False)
    with open(reference, "rb") as file:
        return model_dir, str(prompts), file.read(), str(directory / "compile_cache")


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports free right now (held open together, so they differ)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


@contextlib.contextmanager
def workers(job, output, lost=None):
    """Starts worker 0 (the chief) and worker 1 of a two-worker `tfgen batch` job on free loopback ports; `lost`:
    `(worker, windows, signal name)` runs that worker through `kill_batch_worker.py`. Yields the two Popen objects
    (stderr piped to files, read with `stderr_of`); every worker still running when the block ends is killed."""
    model_dir, prompts, _, compile_cache = job
    ports = free_ports(2)
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    processes = []
    try:
        for index in range(2):
            launcher = ["-m", "tfgen.cli"]
            if lost is not None and lost[0] == index:
                launcher = [LOSING_CLI, str(lost[1]), lost[2]]
            task = {"type": "worker", "index": index}
            # The workers share a persistent compile cache (the default for users; tests/conftest.py turns it off):
            # the restarted workers load the programs the first ones wrote, concurrently.
            env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": cluster, "task": task}),
                   "TFGEN_COMPILE_CACHE": "1", "TFGEN_CACHE_DIR": compile_cache}
            log = open(f"{output}.worker{index}.log", "w+", encoding="utf-8")  # noqa: SIM115 (closed below)
            command = [sys.executable, *launcher, "batch", "--model", model_dir, "--input", prompts,
                       "--output", output, "--strategy", "multi-worker", *OPTIONS]
            process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log)
            process.log = log
            processes.append(process)
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
            process.log.close()


def stderr_of(process) -> str:
    process.log.flush()
    process.log.seek(0)
    return process.log.read()


def wait_for(process, timeout: float = WORKER_TIMEOUT) -> int:
    """The process's exit status; fails the test (the process is then killed by `workers`) if it runs past
    `timeout` seconds."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a worker still ran after {timeout} s; its stderr ends:\n{stderr_of(process)[-3000:]}")


def error_line(process) -> str:
    """The last line of the process's stderr."""
    return stderr_of(process).strip().splitlines()[-1]


def partial_rows(output) -> list[bytes]:
    with open(output + ".partial", "rb") as file:
        return file.read().splitlines(keepends=True)


def assert_lost_worker_reported(survivor, died_at: float, saved: int | None):
    """The survivor exits with status 1 within `LOSS_BOUND` s of its peer's loss, with one `WorkerLost` line (and,
    on the chief, the rows saved) and no traceback."""
    status = wait_for(survivor, timeout=LOSS_BOUND + max(0.0, died_at - time.monotonic()))
    assert time.monotonic() - died_at < LOSS_BOUND
    log = stderr_of(survivor)
    assert status == 1, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    expected = r"tfgen: error: a worker of this 2-worker job failed or became unreachable \(TensorFlow: \w+: .+\); " \
               r"restart every worker with the same arguments to resume the job"
    if saved is not None:
        expected += rf" \({saved} of {ROWS} rows are saved in .+\.partial\)"
    assert re.fullmatch(expected, error_line(survivor)), log[-3000:]


def test_two_workers_equal_one_process_and_resume_after_a_worker_is_killed(job, tmp_path):
    reference = job[2]
    reference_rows = reference.splitlines(keepends=True)
    output = str(tmp_path / "out.jsonl")

    # 1. Worker 1 is SIGKILLed once both workers have generated two windows (the chief commits 16 rows): the chief
    # must fail at its next collective, at once, with one line saying what happened and what is saved.
    with workers(job, output, lost=(1, 2, "SIGKILL")) as (chief, worker):
        assert wait_for(worker) == -signal.SIGKILL, stderr_of(worker)[-3000:]
        assert_lost_worker_reported(chief, time.monotonic(), saved=2 * WINDOW)
    assert partial_rows(output) == reference_rows[: 2 * WINDOW]
    assert not os.path.exists(output)

    # 2. Both started again: the job resumes after the 16 rows and its output equals one process's, byte for byte.
    with workers(job, output) as (chief, worker):
        assert wait_for(chief) == 0, stderr_of(chief)[-3000:]
        assert wait_for(worker) == 0, stderr_of(worker)[-3000:]
        assert f"{ROWS} rows in {output} ({2 * WINDOW} already done, 0 skipped)" in stderr_of(chief)
        assert f"{ROWS} rows in {output} (written by the chief) ({2 * WINDOW} already done" in stderr_of(worker)
    with open(output, "rb") as file:
        assert file.read() == reference
    assert not os.path.exists(output + ".partial")


@pytest.mark.slow
def test_a_hung_worker_fails_the_chief_in_bounded_time(job, tmp_path):
    # Worker 1 stops (SIGSTOP: alive, its sockets open, answering nothing) after one window: no connection is
    # reset, so only the heartbeats tell; the chief must still fail within LOSS_BOUND with the WorkerLost line.
    output = str(tmp_path / "out.jsonl")
    with workers(job, output, lost=(1, 1, "SIGSTOP")) as (chief, worker):
        deadline = time.monotonic() + WORKER_TIMEOUT
        while os.waitid(os.P_PID, worker.pid, os.WEXITED | os.WSTOPPED | os.WNOWAIT | os.WNOHANG) is None:
            assert time.monotonic() < deadline and chief.poll() is None, stderr_of(chief)[-3000:]
            time.sleep(0.05)
        assert_lost_worker_reported(chief, time.monotonic(), saved=WINDOW)
    assert partial_rows(output) == job[2].splitlines(keepends=True)[:WINDOW]
