"""The connection side of `tfgen serve`'s REST server (`tfgen/serving/http.py`): reads with a deadline over a whole
request part (`DeadlineReader`), which connections are between requests and which are answering one
(`ConnectionTracker`, for draining on SIGTERM / Ctrl-C), and closing a connection without losing the answer just
sent (`close_gently`)."""

from __future__ import annotations

import io
import json
import socket
import threading
import time


class DeadlineReader(io.RawIOBase):
    """A connection's input that raises TimeoutError once `deadline` (time.monotonic(); None: none) has passed,
    however the bytes trickle in (a socket timeout alone bounds each read, not their sum), or when one read waits
    longer than `idle_timeout` seconds."""

    def __init__(self, connection: socket.socket, idle_timeout: float):
        self.connection = connection
        self.idle_timeout = idle_timeout
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the deadline passed")
            self.connection.settimeout(min(left, self.idle_timeout))
        return self.connection.recv_into(buffer)


class ConnectionTracker:
    """Mixed into the REST server (a `socketserver` server, which counts its open connections in `_open` under
    `_open_lock`): its handlers report their connections (`track` / `untrack`) and requests (`begin_request` /
    `end_request`), so that `stop_accepting()` and `wait_closed(deadline)` drain it."""

    def __init__(self, *args, **kwargs):
        self._open = 0
        self._open_lock = threading.Lock()  # guards _open, _waiting, _busy, draining
        self._waiting: set[socket.socket] = set()  # connections between requests (or reading one)
        self._busy: set[socket.socket] = set()  # connections whose request is being answered
        self.draining = False
        super().__init__(*args, **kwargs)

    def track(self, connection: socket.socket) -> None:
        """A handler's connection opened (waiting for its first request)."""
        with self._open_lock:
            self._waiting.add(connection)
        if self.draining:
            shut(connection)

    def untrack(self, connection: socket.socket) -> None:
        with self._open_lock:
            self._waiting.discard(connection)
            self._busy.discard(connection)

    def begin_request(self, connection: socket.socket) -> bool:
        """Marks the connection's request as running; False when the server is draining (the request is refused)."""
        with self._open_lock:
            if self.draining:
                return False
            self._waiting.discard(connection)
            self._busy.add(connection)
            return True

    def end_request(self, connection: socket.socket) -> None:
        with self._open_lock:
            self._busy.discard(connection)
            self._waiting.add(connection)

    def stop_accepting(self) -> int:
        """Starts draining (call it from another thread than `serve_forever`'s, which it ends): the listening
        socket closes (new connections are refused), connections between requests are closed, a request arriving
        now on an open connection gets 503. Returns the number of requests still running."""
        self.shutdown()
        self.socket.close()
        with self._open_lock:
            self.draining = True
            waiting, running = list(self._waiting), len(self._busy)
        for connection in waiting:
            shut(connection)
        return running

    def wait_closed(self, deadline: float) -> int:
        """Waits until every connection has closed or time.monotonic() reaches `deadline`; returns the number of
        requests still running then."""
        while self._open and time.monotonic() < deadline:
            time.sleep(0.02)
        with self._open_lock:
            return len(self._busy)


def shut(connection: socket.socket) -> None:
    """Ends a connection that is between requests: its handler's read returns at once and the handler closes it."""
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


def close_gently(connection: socket.socket) -> None:
    """Ends our side of a connection, reads what the client already sent, then closes it: closing a socket with
    unread input resets the connection, and the client could lose the answer just sent (a 413, a 405 answered
    before its body was read, a 503)."""
    try:
        connection.shutdown(socket.SHUT_WR)
        connection.setblocking(False)
        for _ in range(64):  # at most 4 MiB; the rest may reset
            if not connection.recv(1 << 16):
                break
    except OSError:
        pass  # nothing more has arrived, or the client left
    finally:
        connection.close()


def refuse(connection: socket.socket, message: str, retry_after: int) -> None:
    """Answers 503 `{"error": message}` with `Retry-After` on a fresh connection (a few bytes: sent at once, by the
    accepting thread), then closes it."""
    body = json.dumps({"error": message}).encode("utf-8")
    head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
            f"\r\nRetry-After: {retry_after}\r\nConnection: close\r\n\r\n").encode("ascii")
    try:
        connection.settimeout(1.0)
        connection.sendall(head + body)
    except OSError:
        pass  # the client left
    close_gently(connection)
