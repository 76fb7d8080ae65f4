"""`python tests/crash_batch_job.py N batch ARGS...`: runs `tfgen batch ARGS...`, but the process SIGKILLs
itself once the job has appended N bytes to its output, cutting the write that crosses N there — a crash at an
exact byte offset, torn last line included (tests/test_batch.py resumes after it)."""

from __future__ import annotations

import os
import signal
import sys

from tfgen.batch.jobfiles import JobFiles
from tfgen.cli import main


def crash_after(limit: int) -> None:
    """Makes every `JobFiles` in this process write at most `limit` bytes in all, then SIGKILL the process."""
    write = JobFiles.write
    written = 0

    def write_then_crash(files: JobFiles, data: bytes) -> None:
        nonlocal written
        crash = written + len(data) > limit
        data = data[: limit - written] if crash else data
        write(files, data)  # flushed and fsynced, as a real crash would find it
        written += len(data)
        if crash:
            os.kill(os.getpid(), signal.SIGKILL)

    JobFiles.write = write_then_crash


if __name__ == "__main__":
    crash_after(int(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
