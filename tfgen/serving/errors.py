"""How `tfgen serve` refuses a request: `RequestError` (an HTTP status, a message for `{"error": ...}`, headers), which
the REST and gRPC fronts turn into their own answers."""

from __future__ import annotations

import re
from http import HTTPStatus


class RequestError(Exception):
    """A request the server refuses: `status` is the HTTP status, the message goes into `{"error": ...}`, `headers`
    are sent with the answer (e.g. `Allow` with a 405)."""

    def __init__(self, status: HTTPStatus, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


def bad_request(message: str) -> RequestError:
    return RequestError(HTTPStatus.BAD_REQUEST, message)


def error_text(message: str) -> str:
    """What a TF error says about the request: the export's assertion message, else the first line that is
    not graph-debugging boilerplate."""
    assertion = re.search(r"assertion failed: \[(.*)\]", message)
    if assertion:
        return assertion.group(1)
    boilerplate = ("Graph execution error", "Detected at node", "<stack traces", "[[", "Node:")
    lines = [line.strip() for line in message.splitlines()]
    return next((line for line in lines if line and not line.startswith(boilerplate)), "invalid argument")
