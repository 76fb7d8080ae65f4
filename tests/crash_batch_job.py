"""`python tests/crash_batch_job.py N [SIGNAL] batch ARGS...`: runs `tfgen batch ARGS...`, but the process sends
itself SIGNAL (default SIGKILL; e.g. SIGINT, what Ctrl-C sends) once the job has appended N bytes to its output,
cutting the write that crosses N there — a crash (or an interruption) at an exact byte offset, torn last line
included (tests/test_batch.py and tests/test_batch_reliability.py resume after it)."""

from __future__ import annotations

import os
import signal
import sys

from tfgen.batch.jobfiles import JobFiles
from tfgen.cli import main


def crash_after(limit: int, signal_number: int = signal.SIGKILL) -> None:
    """Makes every `JobFiles` in this process write at most `limit` bytes in all, then send `signal_number` to the
    process (SIGKILL ends it there; SIGINT raises KeyboardInterrupt right after the cut write, as Ctrl-C would)."""
    write = JobFiles.write
    written = 0

    def write_then_crash(files: JobFiles, data: bytes) -> None:
        nonlocal written
        crash = written + len(data) > limit
        data = data[: limit - written] if crash else data
        write(files, data)  # flushed and fsynced, as a real crash would find it
        written += len(data)
        if crash:
            os.kill(os.getpid(), signal_number)

    JobFiles.write = write_then_crash


if __name__ == "__main__":
    arguments = sys.argv[2:]
    chosen = signal.SIGKILL
    if arguments and arguments[0].startswith("SIG"):
        chosen = signal.Signals[arguments.pop(0)]
    crash_after(int(sys.argv[1]), chosen)
    sys.exit(main(arguments))
