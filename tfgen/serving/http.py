"""A local server speaking TF Serving's REST API for a `tfgen export` folder (`tfgen serve`), plus a text route.

Routes, as TF Serving answers them (so TF Serving clients work unchanged):
    GET  /v1/models/<name>[/versions/<v>]            model status (HEAD: the same headers, no body)
    GET  /v1/models/<name>[/versions/<v>]/metadata   signature definitions
    POST /v1/models/<name>[/versions/<v>]:predict    {"signature_name"?, "instances": [...]} (row format) or
                                                     {"signature_name"?, "inputs": {...}} (columnar format)
OpenAI's (`tfgen/serving/openai_api.py`): GET /v1/models, POST /v1/completions, POST /v1/chat/completions;
and, tfgen's own:
    POST /v1/models/<name>[/versions/<v>]:generate   {"text": "..." | ["...", ...]} -> {"text": same shape}
                                                     (runs the export's `generate_text` signature)
Every request runs through the loaded SavedModel's signatures (`tfgen/serving/requests.py` parses and checks
them). Every answer is JSON; errors are `{"error": "..."}` naming the field at fault, with a 4xx status for
whatever the client did (malformed or too deep JSON, unknown model/version/signature/route, a method the route
does not take, wrong input names, types, dtypes, ranges or shapes, values the graph's checks reject, a body over
the size limit, shorter than its Content-Length or too slow to arrive), 503 with `Retry-After` beyond the
connection cap, and 500 for the server's own failures (logged). The server keeps serving either way, and prints
nothing for a client that disconnects or goes silent (one debug log line). `serve(..., grpc_port=N)` also answers
TF Serving's gRPC API on port N (`tfgen/serving/grpc_api.py`), for the same models.

Why the standard library's `ThreadingHTTPServer`: it adds no dependency to the package; a thread per connection is
plenty for requests that each run a generation loop (TF releases the GIL while it runs, so requests overlap); and
the server is meant for local development and tests — production traffic goes to TF Serving itself (see
`docs/serving.md`). The connection cap bounds its threads; bind it to localhost or put it behind a proxy: it has
no TLS and no authentication.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import select
import socket
import sys
import threading
import time
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tfgen.serving.batching import TextStream, text_stream
from tfgen.serving.connections import ConnectionTracker, DeadlineReader, close_gently, refuse
from tfgen.serving.errors import RequestError
from tfgen.serving.openai_api import OPENAI_ROUTES, EventStream, openai_route
from tfgen.serving.openai_protocol import as_openai_error
from tfgen.serving.options import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_PORT,
    bind_failure,
    check_server_options,
)
from tfgen.serving.requests import (
    format_predict_response,
    generate_text,
    parse_json_body,
    parse_predict_request,
)
from tfgen.serving.served_model import ServedModel
from tfgen.serving.versions import ServedModels

logger = logging.getLogger(__name__)

# Seconds a connection may wait for the first byte of its next request (read when a connection opens, so tests can
# lower them): a silent or half-open client gives its thread back after this.
IDLE_TIMEOUT = 10.0
# Seconds a request's line and headers may take to arrive in all, from its first byte (read per request): a client
# trickling header bytes is dropped after it instead of holding its connection slot (nginx's client_header_timeout).
HEADER_TIMEOUT = 10.0
# Seconds a request's whole body may take to arrive once its headers did (408 after it).
BODY_TIMEOUT = 10.0
# What a connection over the cap is told to wait before retrying (seconds, the 503's Retry-After).
RETRY_AFTER = 1
# Oversized bodies up to this many times the limit are read (and dropped) before answering 413.
_DRAIN_FACTOR = 16

_MODEL_PATH = r"/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>[0-9]+))?"
# Each route, with the methods it takes.
_STATUS_ROUTE = (re.compile(_MODEL_PATH + r"(?P<metadata>/metadata)?"), ("GET", "HEAD"))
_VERB_ROUTE = (re.compile(_MODEL_PATH + r":(?P<verb>[A-Za-z]+)"), ("POST",))
_METHODS = ("GET", "HEAD", "POST")


class _Handler(BaseHTTPRequestHandler):
    """One connection: routes each request, answers JSON; a request's first byte must come within IDLE_TIMEOUT,
    its line and headers within HEADER_TIMEOUT, its body within BODY_TIMEOUT."""

    protocol_version = "HTTP/1.1"  # keep-alive: every response carries a Content-Length
    server: ModelServer

    def setup(self):
        self.timeout = IDLE_TIMEOUT
        self.body_read = False
        super().setup()
        self.rfile.close()  # the socket's own reader, replaced by one with deadlines
        self.reader = DeadlineReader(self.connection, self.timeout)
        self.rfile = io.BufferedReader(self.reader)
        self.server.track(self.connection)

    def finish(self):
        self.server.untrack(self.connection)
        super().finish()

    def handle_one_request(self):
        self.reader.deadline = time.monotonic() + IDLE_TIMEOUT
        try:
            self.rfile.peek(1)  # the request's first byte (or the end of the connection)
        except TimeoutError as error:
            self.log_error("Request timed out: %r", error)
            self.close_connection = True
            return
        self.reader.deadline = time.monotonic() + HEADER_TIMEOUT  # the base class drops the connection after it
        super().handle_one_request()

    def log_message(self, format, *args):  # noqa: A002  (the base class's name)
        pass  # TF Serving logs no access lines either; errors go back to the client as JSON

    def log_error(self, format, *args):  # noqa: A002
        # The base class's notes about a connection (timeouts, its own refusals): not worth more than a debug line.
        logger.debug("connection from %s: %s", self.client_address[0], format % args)

    def do_GET(self):
        self._answer()

    # The other methods get the same routing, so a known route says which methods it takes (405, with Allow).
    do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = do_GET

    def parse_request(self) -> bool:
        if len(self.raw_requestline.split()) == 2 and self.raw_requestline.endswith(b"\n"):
            # HTTP/0.9 (`GET /`): the base class would wait for headers that such a client never sends.
            self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
            self.command, self.request_version = None, "HTTP/1.0"
            self.send_error(HTTPStatus.BAD_REQUEST, "the request line has no HTTP version (HTTP/0.9 is not "
                            "supported): send 'METHOD PATH HTTP/1.1'")
            return False
        parsed = super().parse_request()
        self.reader.deadline = None  # the headers are in; the answer's writes get the idle timeout
        self.connection.settimeout(self.timeout)
        if not parsed:
            return False
        self.body_read = False  # per request on a keep-alive connection
        return True

    def send_error(self, code, message=None, explain=None):
        """The standard library's own refusals (malformed request line, oversized headers, an unknown method) as
        JSON, like every other answer."""
        if self.request_version == "HTTP/0.9":
            self.request_version = "HTTP/1.0"  # a malformed line parses as 0.9, whose answers have no status line
        self.close_connection = True
        headers = {}
        if code == HTTPStatus.NOT_IMPLEMENTED:  # the base class's answer to a method without a do_ method
            headers = {"Allow": ", ".join(_METHODS)}
            message = f"method {self.command!r} is not supported; the server takes {', '.join(_METHODS)}"
        self._send_json(code, {"error": message or HTTPStatus(code).phrase}, headers)

    def _answer(self):
        if not self.server.begin_request(self.connection):
            self.close_connection = True
            self._send_json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "the server is shutting down"},
                            {"Retry-After": str(RETRY_AFTER)})
            return
        try:
            with contextlib.ExitStack() as self.held:  # the model version the request uses, until it is answered
                self._answer_request()
        finally:
            self.server.end_request(self.connection)

    def _answer_request(self):
        headers = {}
        try:
            status, payload = HTTPStatus.OK, self._route()
        except RequestError as error:
            status, payload, headers = error.status, {"error": str(error)}, error.headers
            if urllib.parse.urlsplit(self.path).path in OPENAI_ROUTES:  # OpenAI's error object
                payload = as_openai_error(error).payload()
        except (ConnectionError, TimeoutError):
            raise  # the client went away: nobody to answer (ModelServer.handle_error logs one debug line)
        except Exception as error:  # the server keeps serving whatever one request did
            logger.exception("%s %s failed", self.command, self.path)
            status, payload = HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(error).__name__}: {error}"}
        if not self.body_read and ("Transfer-Encoding" in self.headers
                                   or self.headers.get("Content-Length", "0").strip() != "0"):
            # The body is still on the wire, where it would be read as the next request.
            self.close_connection = True
        if self.server.draining:
            self.close_connection = True  # the last answer on this connection
        if isinstance(payload, (TextStream, EventStream)):
            self._send_stream(payload)
        else:
            self._send_json(status, payload, headers)

    def _send_stream(self, stream: TextStream | EventStream):
        """Server-sent events over a chunked response (`tfgen.serving.batching.TextStream`); a client that hangs up
        ends the stream, which frees its decode slot."""
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunks = stream.chunks()
        try:
            for chunk in chunks:
                if self._client_left():
                    raise ConnectionResetError("the client closed the stream")
                self.wfile.write(chunk)
                self.wfile.flush()
        except (ConnectionError, TimeoutError):
            self.close_connection = True
            raise
        finally:
            chunks.close()  # a stream left early cancels its row (its slot is freed)

    def _client_left(self) -> bool:
        """Whether the client closed its side of the connection (a write may still succeed into the socket's
        buffer after that, so a hang-up is looked for before each event)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and not self.connection.recv(1, socket.MSG_PEEK)
        except (OSError, ValueError):
            return True

    def _send_json(self, status: int, payload: dict, headers: dict):
        body = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":  # HEAD: GET's headers, no body
            self.wfile.write(body)

    def _route(self) -> dict:
        path = urllib.parse.urlsplit(self.path).path
        if path in OPENAI_ROUTES:
            return openai_route(self.server.models, self.command, path, self._body, self.held)
        for pattern, methods in (_STATUS_ROUTE, _VERB_ROUTE):  # noqa: B007 (read after the loop)
            match = pattern.fullmatch(path)
            if match is not None:
                break
        else:
            raise RequestError(HTTPStatus.NOT_FOUND, f"no route for {self.command} {path}")
        if self.command not in methods:
            raise RequestError(HTTPStatus.METHOD_NOT_ALLOWED, f"{path} takes {' and '.join(methods)}, not "
                               f"{self.command}", headers={"Allow": ", ".join(methods)})
        if self.command == "POST":
            return self._post(match)
        model = self._model(match)
        if match.group("metadata"):
            return {
                "model_spec": {"name": model.name, "signature_name": "", "version": str(model.version)},
                "metadata": {"signature_def": {"signature_def": model.signature_defs}},
            }
        # Without a version, TF Serving lists every version it serves.
        served = [model] if match.group("version") else self.server.models.available()
        return {"model_version_status": [
            {"version": str(each.version), "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
            for each in served
        ]}

    def _model(self, match) -> ServedModel:
        version = match.group("version")
        return self.held.enter_context(
            self.server.models.acquire(match.group("name"), None if version is None else int(version)))

    def _post(self, match) -> dict:
        verb = match.group("verb")
        if verb not in ("predict", "generate"):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"{verb!r} is not supported; use :predict or :generate")
        model = self._model(match)
        body = parse_json_body(self._body())
        if verb == "predict":
            signature_name, inputs, row_format = parse_predict_request(body, model)
            return format_predict_response(model.predict(signature_name, inputs), row_format)
        if isinstance(body, dict) and "stream" in body:
            return text_stream(model, body, generate_text)
        return generate_text(model, body)

    def _body(self) -> bytes:
        """The request body, as its Content-Length announces it (no chunked bodies)."""
        lengths = self.headers.get_all("Content-Length") or []
        if "Transfer-Encoding" in self.headers or not lengths:
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "a Content-Length header is required (no chunked bodies)")
        if len(lengths) > 1 or not re.fullmatch(r"[0-9]{1,15}", lengths[0].strip()):
            self.close_connection = True  # where this body ends is unknown
            raise RequestError(HTTPStatus.BAD_REQUEST, f"Content-Length must be one number of bytes, got {lengths}")
        length, limit = int(lengths[0]), self.server.max_request_bytes
        if length > limit:
            # The connection closes after the answer. A moderately oversized body is read first: closing a socket
            # with unread data resets it, and the client could lose the answer.
            if length <= _DRAIN_FACTOR * limit:
                try:
                    self._receive(length, keep=False)
                except RequestError:
                    pass  # too slow or cut short: the 413 is still the answer
            self.close_connection = True
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the request has {length} bytes; the limit is {limit}"
            )
        return self._receive(length)

    def _receive(self, length: int, keep: bool = True) -> bytes:
        """`length` bytes of body, within BODY_TIMEOUT seconds in all (408 after it, 400 if the client stops
        sending); the chunks are dropped unless `keep`."""
        chunks, remaining = [], length
        self.reader.deadline = time.monotonic() + BODY_TIMEOUT
        try:
            while remaining > 0:
                chunk = self.rfile.read1(min(remaining, 1 << 16))
                if not chunk:
                    self.close_connection = True
                    raise RequestError(HTTPStatus.BAD_REQUEST, f"the body ended after {length - remaining} of the "
                                       f"{length} bytes its Content-Length announced")
                remaining -= len(chunk)
                if keep:
                    chunks.append(chunk)
        except TimeoutError:
            self.close_connection = True
            raise RequestError(HTTPStatus.REQUEST_TIMEOUT, f"the body did not arrive within {BODY_TIMEOUT:g} s: "
                               f"{length - remaining} of the {length} bytes its Content-Length announced") from None
        finally:
            self.reader.deadline = None
            self.connection.settimeout(self.timeout)
        self.body_read = True
        return b"".join(chunks)


class ModelServer(ConnectionTracker, ThreadingHTTPServer):
    """`ThreadingHTTPServer` serving one `ServedModel`; `serve_forever()` runs it, `shutdown()` stops it.

    At most `max_connections` connections are served at once (one thread each); one more is answered 503 with
    `Retry-After` and closed. `stop_accepting()` then `wait_closed(deadline)` drain it: no new connection or
    request is taken, the requests running finish, idle connections are closed. Raises ValueError for a bad
    option and OSError ("port 8501 is in use ...") when it cannot listen.
    """

    daemon_threads = True
    # The listen backlog (socketserver's default is 5): a burst of connections waits there for the accepting
    # thread instead of having its SYNs dropped (a client then retries after a second).
    request_queue_size = 128

    def __init__(self, model: ServedModel | ServedModels, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, max_connections: int = DEFAULT_MAX_CONNECTIONS):
        check_server_options(port=port, max_request_bytes=max_request_bytes, max_connections=max_connections)
        self.max_request_bytes = max_request_bytes
        self.max_connections = max_connections
        try:
            super().__init__((host, port), _Handler)
        except OSError as error:
            raise OSError(bind_failure(host, port, error)) from None
        self.models = model if isinstance(model, ServedModels) else ServedModels.of(model)

    @property
    def model(self) -> ServedModel:
        """The newest version served (what a request naming no version gets)."""
        return self.models.latest

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def open_connections(self) -> int:
        """Connections being served now (each holds a thread)."""
        return self._open

    def process_request(self, request, client_address):
        with self._open_lock:
            admitted = self._open < self.max_connections
            self._open += admitted
        if not admitted:
            self._refuse(request, client_address)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release()  # no thread started
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release()

    def handle_error(self, request, client_address):
        """A connection's failure outside a request's answer: one debug line for a client that left or went
        silent, the traceback (logged) for anything else."""
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            logger.debug("connection from %s ended: %s", client_address[0], error)
        else:
            logger.error("connection from %s failed", client_address[0], exc_info=True)

    def shutdown_request(self, request):
        close_gently(request)

    def _release(self):
        with self._open_lock:
            self._open -= 1

    def _refuse(self, connection: socket.socket, client_address):
        """Answers 503 on a connection over the cap, on the accepting thread, then closes it."""
        logger.debug("refused a connection from %s: %d connections open", client_address[0], self.max_connections)
        refuse(connection, f"the server has {self.max_connections} connections open, its limit; retry in "
               f"{RETRY_AFTER} s", RETRY_AFTER)


def start_in_thread(server: ModelServer) -> threading.Thread:
    """Runs `server.serve_forever()` in a daemon thread (for tests and notebooks); stop with `server.shutdown()`."""
    thread = threading.Thread(target=server.serve_forever, name="tfgen-serve", daemon=True)
    thread.start()
    return thread

