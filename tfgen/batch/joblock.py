"""The lock that keeps a second run off a job's output: an exclusive `flock` on `<output>.lock`, held for the
job's lifetime (TensorFlow-free).

The operating system releases a `flock` when its holder dies, however it dies (SIGKILL, a power loss, a crashed
host), so a lock is never stale: a job killed with SIGKILL is resumed by running the same command again.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket

# A finishing run removes the lock file while holding it; a run that opened the old file just before may then
# win the lock on a file no one else can find, and must start over on the new one. Two retries cover any
# realistic interleaving; more would mean a busy loop with another process.
_ATTEMPTS = 3


class OutputLock:
    """An exclusive lock on the job writing `output`, on the file `<output>.lock`, which names the holder's pid
    and host (JSON) for the message a second run gets."""

    def __init__(self, output: str):
        self.output = output
        self.path = output + ".lock"
        self._descriptor: int | None = None

    @property
    def held(self) -> bool:
        return self._descriptor is not None

    def acquire(self) -> None:
        """Takes the lock without waiting and writes this process's pid and host into the lock file.

        Raises ValueError naming the holder's pid and host when another run (of this process or another) holds
        it, or naming the lock file when it cannot be created or locked (a missing directory, a file system
        without locks); OSError naming it when the pid cannot be written (a full disk), the lock given back.
        """
        if self.held:
            return
        for _ in range(_ATTEMPTS):
            try:
                descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as error:
                raise ValueError(f"output: cannot create the job's lock file {self.path}: {error.strerror}") from None
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                holder = _holder(descriptor)
                os.close(descriptor)
                if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise ValueError(
                        f"output: {self.output} is being written by another tfgen batch run ({holder}, which holds "
                        f"{self.path}); two runs would write every row twice. Wait for it to end or stop it, then "
                        "run this command again to resume."
                    ) from None
                raise ValueError(f"output: cannot lock {self.path}: {error.strerror}") from None
            if _is_the_file_at(descriptor, self.path):
                break
            os.close(descriptor)
        else:
            raise ValueError(f"output: {self.path} keeps being replaced by another process; is another run starting?")
        try:
            os.ftruncate(descriptor, 0)
            os.write(descriptor, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode() + b"\n")
        except OSError as error:  # a full disk, say: give the lock back rather than hold it until the process ends
            os.close(descriptor)
            failure = OSError(f"output: cannot write the job's lock file {self.path}: {error.strerror}")
            failure.errno = error.errno
            raise failure from None
        self._descriptor = descriptor

    def check_free(self) -> None:
        """Raises as `acquire` does when another run holds the lock, and otherwise leaves it free: a cheap early
        refusal, before reading an input and hashing a model that `acquire` would then refuse anyway."""
        if not self.held:
            self.acquire()
            self.release()

    def release(self) -> None:
        """Removes the lock file (while still holding it, so no run can lock the old file after this) and
        releases the lock. Does nothing when the lock is not held."""
        if self._descriptor is None:
            return
        descriptor, self._descriptor = self._descriptor, None
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
        finally:
            os.close(descriptor)


def _holder(descriptor: int) -> str:
    """The holder's "pid P on host H" as it wrote them into the lock file, or a placeholder before it has."""
    try:
        holder = json.loads(os.pread(descriptor, 4096, 0))
        return f"pid {int(holder['pid'])} on host {holder['host']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "pid unknown: it has not written its pid yet"


def _is_the_file_at(descriptor: int, path: str) -> bool:
    """Whether `descriptor` is the file now at `path` (and not one a finishing run has just removed)."""
    try:
        at_path = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(descriptor)
    return (opened.st_dev, opened.st_ino) == (at_path.st_dev, at_path.st_ino)
