"""Ctrl-C for the `tfgen` command: the first SIGINT ends the command (a KeyboardInterrupt that is never lost), a
second one ends the process at once, even in the middle of an XLA compile.

Python runs a signal handler only in the main thread and only between bytecodes: a SIGINT that arrives while
TensorFlow compiles (seconds to minutes of C++ with the GIL released) is acted on when the compile returns. Its
KeyboardInterrupt can then still be lost: raised inside a finalizer (a `__del__` or weakref callback, which Python
reports and drops; TensorFlow's `ConcreteFunctionGarbageCollector.__del__` even swallows it with a bare `except`)
or inside library code that catches everything (Keras's `shape()` has a bare `except: pass`; TensorFlow turns one
raised while it converts a Python sequence into a ValueError), it never reaches the command, which carries on.
TensorFlow itself leaves the SIGINT handler alone (checked before, during and after a compile). So
`interrupt_guard` keeps delivering: while the command has not taken the KeyboardInterrupt, the signal is sent to
the main thread again `REDELIVERY_SECONDS` after each time the handler raised it. A watcher thread reads every
signal from the wakeup file descriptor, which the C-level handler writes to at once, so a second SIGINT is seen
even while the main thread is stuck in C++: it writes `tfgen: interrupted` and ends the process with status 130.

A command that answers a Ctrl-C and carries on (`tfgen chat` stops the answer and returns to its prompt) calls
`interrupt_handled()`: the guard stops delivering that one, and the next Ctrl-C counts as a first one again.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from os import _exit as exit_now  # public API despite the underscore: exit without cleanup, from any thread

# How long a raised KeyboardInterrupt may take to reach the command before it counts as lost and is raised again
# (unwinding the stack through cleanup code takes far less).
REDELIVERY_SECONDS = 1.0
INTERRUPTED_STATUS = 130  # the shell's status for a command ended by SIGINT (128 + 2)
INTERRUPTED_MESSAGE = "tfgen: interrupted"


class _Guard:
    """The state shared by the SIGINT handler (main thread) and the watcher thread."""

    def __init__(self, stderr_fd: int):
        self.stderr_fd = stderr_fd
        self.main_thread_id = threading.main_thread().ident
        self.lock = threading.Lock()
        self.signals = 0  # SIGINTs received (counted by the watcher, from the wakeup fd)
        self.handled = 0  # of those, the ones the command answered and carried on from (`interrupt_handled`)
        self.injected = 0  # wakeup bytes written by our own re-deliveries, not by the user
        self.raised_at: float | None = None  # when the handler last raised KeyboardInterrupt
        self.taken = False  # the command has its KeyboardInterrupt (or ended): stop delivering

    @property
    def received(self) -> bool:
        """Whether a SIGINT that the command has not handled came while the guard was on (whether or not Python has
        acted on it yet)."""
        return self.signals > self.handled or self.raised_at is not None

    def mark_handled(self) -> None:
        """The command took the KeyboardInterrupt and carries on: no more deliveries of it, and the next SIGINT
        counts as a first one."""
        with self.lock:
            self.handled = max(self.handled + 1, self.signals)
            self.raised_at = None

    def handle(self, signum, frame) -> None:
        """The Python-level SIGINT handler: raises KeyboardInterrupt until the command has taken it."""
        if self.taken:
            return
        self.raised_at = time.monotonic()
        raise KeyboardInterrupt

    def watch(self, read_fd: int) -> None:
        """Watcher thread: counts SIGINTs from the wakeup fd; re-delivers a lost first one, ends the process on a
        second one."""
        while True:
            try:
                data = os.read(read_fd, 64) if self._wait_readable(read_fd) else None
            except OSError:
                return
            if data == b"":  # the guard closed the pipe
                return
            for byte in data or b"":
                if byte != signal.SIGINT:
                    continue
                with self.lock:
                    if self.injected:
                        self.injected -= 1
                        continue
                    self.signals += 1
                if self.signals - self.handled >= 2 and not self.taken:
                    os.write(self.stderr_fd, (INTERRUPTED_MESSAGE + "\n").encode())
                    exit_now(INTERRUPTED_STATUS)
            self._redeliver_if_lost()

    def _wait_readable(self, read_fd: int) -> bool:
        readable, _, _ = select.select([read_fd], [], [], REDELIVERY_SECONDS / 4)
        return bool(readable)

    def _redeliver_if_lost(self) -> None:
        raised_at = self.raised_at
        if self.taken or self.signals <= self.handled or raised_at is None:
            return  # nothing to deliver, or the handler has not run yet (the main thread is still in C++)
        if time.monotonic() - raised_at < REDELIVERY_SECONDS:
            return
        with self.lock:
            self.injected += 1
            self.raised_at = None
        # The signal again, to the main thread: it also ends a wait there (sleep, select) as the user's did.
        signal.pthread_kill(self.main_thread_id, signal.SIGINT)


_ACTIVE: list[_Guard] = []  # the guards on, innermost last


def interrupt_handled() -> None:
    """Says that the command took the Ctrl-C it was given and carries on (see the module docstring); nothing when no
    guard is on."""
    if _ACTIVE:
        _ACTIVE[-1].mark_handled()


def interrupt_pending() -> bool:
    """Whether a Ctrl-C came that the command has not handled (an error raised meanwhile may be a KeyboardInterrupt
    that a library turned into another exception)."""
    return bool(_ACTIVE) and _ACTIVE[-1].received


@contextlib.contextmanager
def interrupt_guard():
    """Installs the SIGINT handling described in the module docstring for the block; the block sees Ctrl-C as a
    KeyboardInterrupt (caught by the caller). Yields an object whose `received` says whether a SIGINT came (so that
    an error which a library made of the KeyboardInterrupt can be told apart). Outside the main thread, or where
    SIGINT is ignored (a background job), it changes nothing."""
    usable = threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) not in (
        signal.SIG_IGN, None
    )
    if not usable:
        yield _Guard(-1)
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (ValueError, OSError):  # a platform whose wakeup fd must be a socket: plain Python behaviour
        os.close(read_fd)
        os.close(write_fd)
        yield _Guard(-1)
        return
    sys.stderr.flush()
    guard = _Guard(os.dup(2))  # the real stderr, even while fd 2 is redirected (TensorFlow's import)
    previous_handler = signal.signal(signal.SIGINT, guard.handle)
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _dropping_interrupts(previous_hook)
    watcher = threading.Thread(target=guard.watch, args=(read_fd,), name="tfgen-interrupts", daemon=True)
    watcher.start()
    _ACTIVE.append(guard)
    try:
        yield guard
    finally:
        _ACTIVE.remove(guard)
        # In this order: no more deliveries, the watcher stopped (no injection can still be pending when the
        # previous handler comes back), then everything as it was.
        guard.taken = True
        signal.set_wakeup_fd(previous_fd)
        os.close(write_fd)
        watcher.join()
        os.close(read_fd)
        signal.signal(signal.SIGINT, previous_handler)
        sys.unraisablehook = previous_hook
        os.close(guard.stderr_fd)


def _dropping_interrupts(previous_hook):
    """An unraisable hook that drops the KeyboardInterrupts raised in finalizers (they are delivered again, so the
    report would only be noise: "Exception ignored in ... KeyboardInterrupt") and passes everything else on."""

    def hook(unraisable):
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            previous_hook(unraisable)

    return hook
