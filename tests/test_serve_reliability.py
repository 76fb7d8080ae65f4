"""`tfgen serve` under hostile clients: every client error is a 4xx JSON `{"error": ...}` naming the field, refused
before any signature runs; a connection cap and short timeouts bound the threads; nothing is printed for a client
that goes silent or away; bad ports are one clear line.

One server, on the shared tiny export of test_export.py (loaded once with test_serve.py), with its timeouts lowered
through the module constants and a cap of 3 connections. Requests go over loopback with `http.client` or raw sockets.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import struct
import time

import pytest
from test_export import requests
from test_serve import MAX_REQUEST_BYTES, MODEL, exports, load_tiny_export  # noqa: F401  (exports: a fixture)

from tfgen import serving
from tfgen.serving import ModelServer, start_in_thread
from tfgen.serving import http as serving_http
from tfgen.serving.batching import RETRY_AFTER

TIMEOUT = 0.5  # IDLE_TIMEOUT and BODY_TIMEOUT of the server under test
MAX_CONNECTIONS = 3
PREDICT, GENERATE = f"/v1/models/{MODEL}:predict", f"/v1/models/{MODEL}:generate"
STATUS = f"/v1/models/{MODEL}"


@pytest.fixture(scope="module")
def server(exports):  # noqa: F811  (the imported fixture)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(serving_http, "IDLE_TIMEOUT", TIMEOUT)
        patch.setattr(serving_http, "BODY_TIMEOUT", TIMEOUT)
        served = ModelServer(load_tiny_export(exports), port=0, max_request_bytes=MAX_REQUEST_BYTES,
                             max_connections=MAX_CONNECTIONS)
        start_in_thread(served)
        yield served
        served.shutdown()
        served.server_close()


@pytest.fixture(autouse=True)
def nothing_printed(capfd, caplog):
    """No traceback on stderr and no tfgen warning or error logged: every case here is the client's doing."""
    yield
    assert "Traceback" not in capfd.readouterr().err
    assert [record.getMessage() for record in caplog.records
            if record.name.startswith("tfgen") and record.levelno >= logging.WARNING] == []


def request(server, method: str, path: str, body=None, headers=None):
    """(status, response headers, decoded JSON or None for an empty body) on a fresh connection."""
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    try:
        data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
        connection.request(method, path, body=data, headers=headers or {})
        response = connection.getresponse()
        raw = response.read()
        return response.status, response.headers, json.loads(raw) if raw else None
    finally:
        connection.close()


def raw_exchange(server, data: bytes, half_close: bool = False):
    """(status, headers, JSON) for bytes sent as they are; `half_close` ends the client's side after them."""
    with socket.create_connection(server.server_address[:2], timeout=30) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, response.headers, json.loads(response.read())


def wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _inputs(signature: str, **changes) -> dict:
    return {"signature_name": signature, "inputs": {**requests()[signature], **changes}}


def _sample(**changes) -> dict:
    return _inputs("sample", **changes)


def _literal(signature: str, name: str, literal: str) -> bytes:
    """A `signature` request whose input `name` holds the JSON literal `literal` in every row (NaN, Infinity: text
    that json.dumps does not write)."""
    inputs = {**requests()[signature], name: ["LITERAL"] * 3}
    return json.dumps({"signature_name": signature, "inputs": inputs}).replace('"LITERAL"', literal).encode()


HOSTILE = {
    # Body and JSON
    "nested 30000 deep": (PREDICT, b"[" * 30000 + b"]" * 30000, "nested deeper than 32 levels"),
    "nested 40 deep": (PREDICT, b'{"inputs": ' + b"[" * 40 + b"]" * 40 + b"}", "nested deeper than 32 levels"),
    "not JSON": (PREDICT, b"hello", "malformed JSON"),
    "not UTF-8": (PREDICT, b'{"inputs": "\xff"}', "malformed JSON"),
    "empty body": (PREDICT, b"", "malformed JSON"),
    "body an array": (PREDICT, [1, 2], "the request body must be a JSON object, got an array"),
    "body a string": (PREDICT, "instances", "the request body must be a JSON object, got a string"),
    "unknown field": (PREDICT, {"instance": []}, "unknown request fields: ['instance']"),
    # signature_name
    "signature_name a number": (PREDICT, {"signature_name": 5, "instances": [[1]]}, "signature_name must be a string"),
    "signature_name []": (PREDICT, {"signature_name": [], "inputs": requests()["serving_default"]},
                          "signature_name must be a string, got an array"),
    "signature_name an object": (PREDICT, {"signature_name": {}, "instances": [[1]]}, "signature_name must be"),
    "signature_name null": (PREDICT, {"signature_name": None, "instances": [[1]]}, "signature_name must be"),
    # instances / inputs of the wrong type
    "instances an object": (PREDICT, {"instances": {"input_ids": [1]}}, "instances must be a non-empty list"),
    "instances a string": (PREDICT, {"instances": "abc"}, "instances must be a non-empty list"),
    "instances empty": (PREDICT, {"instances": []}, "instances must be a non-empty list"),
    "inputs an array": (PREDICT, {"inputs": [[5]]}, "inputs must be an object with the inputs"),
    "empty batch": (PREDICT, {"signature_name": "generate_text", "inputs": {"text": []}}, "the batch is empty"),
    # Element types and ranges
    "int beyond int32": (PREDICT, {"inputs": {"input_ids": [[10 ** 30]], "attention_mask": [[1]]}},
                         "input 'input_ids': 1000000000000000000000000000000 is outside the int32 range"),
    "int beyond int64": (PREDICT, _sample(seed=[[2 ** 63, 1]] * 3), "input 'seed': 9223372036854775808 is outside"),
    "top_k beyond int32": (PREDICT, _sample(top_k=[2 ** 31, 0, 0]), "input 'top_k': 2147483648 is outside"),
    "string for an int": (PREDICT, {"inputs": {"input_ids": [["5"]], "attention_mask": [[1]]}},
                          "input 'input_ids' must hold int32 values"),
    "boolean for an int": (PREDICT, {"inputs": {"input_ids": [[True]], "attention_mask": [[1]]}},
                           "input 'input_ids' must hold int32 values"),
    "null for an int": (PREDICT, {"inputs": {"input_ids": [[5]], "attention_mask": None}},
                        "input 'attention_mask' must hold int32 values"),
    "NaN for an int": (PREDICT, b'{"inputs": {"input_ids": [[NaN]], "attention_mask": [[1]]}}',
                       "input 'input_ids' must hold int32 values"),
    "string for a float": (PREDICT, _sample(temperature=["hot", 1.0, 1.0]), "input 'temperature' must hold float32"),
    "float beyond float32": (PREDICT, _sample(temperature=[1e39, 1.0, 1.0]),
                             "input 'temperature': 1e+39 is outside the float32 range"),
    "ragged rows": (PREDICT, {"inputs": {"input_ids": [[5, 6], [5]], "attention_mask": [[1, 1], [1, 1]]}},
                    "input 'input_ids' must be a rectangular array"),
    "lists mixed with values": (PREDICT, {"inputs": {"input_ids": [[5], 6], "attention_mask": [[1], [1]]}},
                                "input 'input_ids' must be a rectangular array"),
    "wrong rank": (PREDICT, {"inputs": {"input_ids": [5], "attention_mask": [1]}},
                   "has shape [1], the signature wants [B, *]"),
    "invalid base64": (PREDICT, {"signature_name": "generate_text", "instances": [{"b64": "!!"}]},
                       "input 'text': invalid base64"),
    # Knobs out of their tfgen.config.knobs range: the server's 400 names the knob, as generate() and the export do
    "top_p 0": (PREDICT, _sample(top_p=[0.0, 1.0, 1.0]), "top_p must be in (0, 1]; row 0 has 0.0"),
    "top_p above 1": (PREDICT, _sample(top_p=[1.0, 1.0, 1.5]), "top_p must be in (0, 1]; row 2 has 1.5"),
    "temperature < 0": (PREDICT, _sample(temperature=[1.0, -0.5, 1.0]), "temperature must be > 0"),
    "temperature NaN": (PREDICT, _literal("sample", "temperature", "NaN"), "temperature must be > 0"),
    "top_p Infinity": (PREDICT, _literal("sample", "top_p", "Infinity"), "top_p must be in (0, 1]"),
    "top_k < 0": (PREDICT, _sample(top_k=[5, -1, 0]), "top_k must be >= 0"),
    "max_new_tokens < 0": (PREDICT, _inputs("greedy", max_new_tokens=[1, -1, 1]), "max_new_tokens must be >= 0"),
    "length_penalty NaN": (PREDICT, _literal("beam_search", "length_penalty", "NaN"), "length_penalty must be"),
    "penalty_alpha < 0": (PREDICT, _inputs("contrastive", penalty_alpha=[0.5, -1.0, 0.5]),
                          "penalty_alpha must be >= 0"),
    # A knob the signature does not take is refused, not ignored
    "repetition_penalty 0": (PREDICT, _sample(repetition_penalty=[0.0] * 3), "unknown ['repetition_penalty']"),
    # Text
    "lone surrogate, :generate": (GENERATE, b'{"text": "a\\ud800"}', "text[0] is not valid Unicode"),
    "lone surrogate, :predict": (PREDICT, b'{"signature_name": "generate_text", "instances": ["\\udc00"]}',
                                 "input 'text' is not valid Unicode"),
    "empty text": (GENERATE, {"text": ""}, "text[0] is empty"),
    "empty text in a list": (GENERATE, {"text": ["the fox", ""]}, "text[1] is empty"),
    "empty text, :predict": (PREDICT, {"signature_name": "generate_text", "instances": [""]}, "text[0] is empty"),
    "text a number": (GENERATE, {"text": 5}, "text must be a string or a non-empty list of strings"),
}


@pytest.mark.slow
@pytest.mark.parametrize("path, body, message", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_bodies_get_400_json_naming_the_field_before_any_signature_runs(server, monkeypatch, path, body,
                                                                               message):
    ran = []
    for name in list(server.model.signatures):
        monkeypatch.setitem(server.model.signatures, name, lambda *args, _name=name, **kwargs: ran.append(_name))
    status, headers, answer = request(server, "POST", path, body)
    assert (status, headers["Content-Type"]) == (400, "application/json")
    assert message in answer["error"]
    assert ran == []


@pytest.mark.slow
@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"])
def test_other_methods_get_405_json_with_allow(server, method):
    status, headers, answer = request(server, method, STATUS)
    assert (status, headers["Allow"]) == (405, "GET, HEAD")
    assert method in answer["error"]
    status, headers, answer = request(server, method, PREDICT, {})
    assert (status, headers["Allow"]) == (405, "POST")
    status, _, answer = request(server, method, "/v2/elsewhere")
    assert status == 404 and "no route" in answer["error"]


@pytest.mark.slow
def test_get_head_and_unknown_methods(server):
    status, headers, answer = request(server, "GET", PREDICT)
    assert (status, headers["Allow"]) == (405, "POST")
    status, get_headers, answer = request(server, "GET", STATUS + "?verbose=1")  # a query string does not matter
    assert status == 200 and answer["model_version_status"][0]["state"] == "AVAILABLE"
    status, headers, answer = request(server, "HEAD", STATUS)
    assert (status, answer) == (200, None)
    assert headers["Content-Length"] == get_headers["Content-Length"]
    status, headers, answer = request(server, "BREW", STATUS)
    assert (status, headers["Allow"]) == (501, "GET, HEAD, POST")
    assert "'BREW' is not supported" in answer["error"]


_POST_HEAD = f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\n".encode()


@pytest.mark.slow
@pytest.mark.parametrize("data, status, message", [
    (b"hello\r\n\r\n", 400, "Bad request syntax"),
    (b"GET /" + b"x" * 70000 + b" HTTP/1.1\r\n\r\n", 414, "URI Too Long"),
    (b"GET /\r\n\r\n", 400, "has no HTTP version"),
    (_POST_HEAD + b"\r\n", 411, "Content-Length header is required"),
    (_POST_HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 411, "no chunked bodies"),
    (_POST_HEAD + b"Content-Length: -5\r\n\r\n", 400, "Content-Length must be one number"),
    (_POST_HEAD + b"Content-Length: 2\r\nContent-Length: 9\r\n\r\n{}", 400, "Content-Length must be one number"),
], ids=["garbage line", "line too long", "HTTP/0.9", "no length", "chunked", "negative length", "two lengths"])
def test_malformed_http_gets_json(server, data, status, message):
    code, headers, answer = raw_exchange(server, data)
    assert (code, headers["Content-Type"]) == (status, "application/json")
    assert message in answer["error"]


@pytest.mark.slow
def test_a_body_shorter_than_its_length_gets_408_or_400_quickly(server):
    partial = _POST_HEAD + b"Content-Length: 100\r\n\r\n" + b'{"instances"'
    started = time.monotonic()
    status, _, answer = raw_exchange(server, partial)  # the client waits for the rest of its own body
    assert status == 408 and "12 of the 100 bytes" in answer["error"]
    assert time.monotonic() - started < TIMEOUT + 5
    status, _, answer = raw_exchange(server, partial, half_close=True)  # the client stops sending
    assert status == 400 and "the body ended after 12 of the 100 bytes" in answer["error"]


@pytest.mark.slow
def test_the_connection_cap_answers_503_and_silent_clients_are_dropped_without_a_trace(server, monkeypatch):
    # Long enough for the silent connections to fill the cap while the extra one connects.
    monkeypatch.setattr(serving_http, "IDLE_TIMEOUT", 2.0)
    monkeypatch.setattr(serving_http, "BODY_TIMEOUT", 2.0)
    assert wait_for(lambda: server.open_connections == 0)
    address = server.server_address[:2]
    silent = [socket.create_connection(address, timeout=30) for _ in range(MAX_CONNECTIONS - 1)]
    silent[0].sendall(b"GET /v1/mo")  # half a request line
    # A client that resets its connection mid-body.
    resetting = socket.create_connection(address, timeout=30)
    resetting.sendall(_POST_HEAD + b"Content-Length: 100\r\n\r\n{")
    silent.append(resetting)
    try:
        assert wait_for(lambda: server.open_connections == MAX_CONNECTIONS)
        with socket.create_connection(address, timeout=30) as extra:
            response = http.client.HTTPResponse(extra)
            response.begin()
            assert (response.status, response.headers["Retry-After"]) == (503, str(RETRY_AFTER))
            assert f"{MAX_CONNECTIONS} connections open" in json.loads(response.read())["error"]
        resetting.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        resetting.close()
        # The silent ones are closed by the server after its idle timeout, unanswered.
        for sock in silent[:-1]:
            assert sock.recv(1024) == b""
    finally:
        for sock in silent:
            sock.close()
    assert wait_for(lambda: server.open_connections == 0)
    assert request(server, "GET", STATUS)[0] == 200


@pytest.mark.slow
def test_the_server_still_generates_after_the_hostile_requests(server):
    status, _, answer = request(server, "POST", GENERATE, {"text": ["the quick", "lazy dog"]})
    assert status == 200 and len(answer["text"]) == 2 and all(isinstance(text, str) for text in answer["text"])
    status, _, answer = request(server, "POST", PREDICT, _sample())
    assert status == 200 and len(answer["outputs"]["sequences"]) == 3


# --- options and ports: one clear line, exit 2, before any model is loaded ----------------------------------------


@pytest.mark.parametrize("option, value, message", [
    ("--port", "99999", "port must be an integer in 0..65535"),
    ("--port", "-1", "port must be an integer in 0..65535"),
    ("--max-connections", "0", "max_connections must be a positive integer"),
    ("--max-request-bytes", "-3", "max_request_bytes must be a positive integer"),
])
def test_cli_refuses_bad_options_in_one_line(tmp_path, capfd, option, value, message):
    from tfgen.cli import main

    assert main(["serve", str(tmp_path), option, value]) == 2  # tmp_path holds no export: never read
    error = capfd.readouterr().err.strip()
    assert error.startswith(f"tfgen: error: {message}") and error.endswith(f"got {value}") and "\n" not in error


def test_a_port_in_use_is_one_line_from_the_cli_and_an_oserror_from_the_server(tmp_path, capfd):
    from tfgen.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(tmp_path), "--port", str(port)]) == 2
        assert capfd.readouterr().err.strip().startswith(f"tfgen: error: port {port} is in use on 127.0.0.1")
        with pytest.raises(OSError, match=f"port {port} is in use"):
            ModelServer(None, port=port)
    for port in (65536, -1, True, "8501"):
        with pytest.raises(ValueError, match="port must be an integer"):
            ModelServer(None, port=port)
    with pytest.raises(ValueError, match="max_connections"):
        ModelServer(None, port=0, max_connections=0)


def test_the_cli_passes_max_connections_to_the_server(tmp_path, monkeypatch):
    from tfgen.cli import main

    served = {}
    monkeypatch.setattr(serving, "serve", lambda export_dir, **options: served.update(options))
    assert main(["serve", str(tmp_path), "--port", "0", "--rest_api_port", "0", "--max-connections", "7"]) == 0
    assert served["max_connections"] == 7
    assert main(["serve", str(tmp_path), "--port", "0", "--rest_api_port", "0"]) == 0
    assert served["max_connections"] == serving.DEFAULT_MAX_CONNECTIONS == 64
