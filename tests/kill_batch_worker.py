"""`python tests/kill_batch_worker.py K SIGNAL batch ARGS...`: runs `tfgen batch ARGS...`, but the process sends
itself SIGNAL (SIGKILL: it dies; SIGSTOP: it hangs, its sockets open) once its runner has finished K windows — a
worker of a multi-worker job lost at an exact point (tests/test_batch_workers.py)."""

from __future__ import annotations

import os
import signal
import sys

from tfgen.batch.runner import BatchRunner
from tfgen.cli import main


def lose_after(windows_done: int, signal_number: int) -> None:
    """Makes every `BatchRunner.windows` in this process send `signal_number` to the process when it is asked for
    the window after its `windows_done`-th (so every worker, the chief included, has those windows' results)."""
    windows = BatchRunner.windows

    def windows_then_lost(runner, *args, **kwargs):
        for done, window in enumerate(windows(runner, *args, **kwargs), 1):
            yield window
            if done == windows_done:
                os.kill(os.getpid(), signal_number)

    BatchRunner.windows = windows_then_lost


if __name__ == "__main__":
    lose_after(int(sys.argv[1]), signal.Signals[sys.argv[2]])
    sys.exit(main(sys.argv[3:]))
