"""A local server speaking TF Serving's REST API for a `tfgen export` folder (`tfgen serve`), plus a text route.

Routes, as TF Serving answers them (so TF Serving clients work unchanged):
    GET  /v1/models/<name>[/versions/<v>]            model status
    GET  /v1/models/<name>[/versions/<v>]/metadata   signature definitions
    POST /v1/models/<name>[/versions/<v>]:predict    {"signature_name"?, "instances": [...]} (row format) or
                                                     {"signature_name"?, "inputs": {...}} (columnar format)
and, tfgen's own:
    POST /v1/models/<name>[/versions/<v>]:generate   {"text": "..." | ["...", ...]} -> {"text": same shape}
                                                     (runs the export's `generate_text` signature)
Every request runs through the loaded SavedModel's signatures. Errors are `{"error": "..."}` with a 4xx status for
bad requests (malformed JSON, unknown model/version/signature, wrong input names, dtypes or shapes, values the
graph's checks reject, bodies over the size limit) and 500 otherwise; the server keeps serving either way.

Why the standard library's `ThreadingHTTPServer`: it adds no dependency to the package; a thread per connection is
plenty for requests that each run a generation loop (TF releases the GIL while it runs, so requests overlap); and
the server is meant for local development and tests — production traffic goes to TF Serving itself (see
`docs/serving.md`). Bind it to localhost or put it behind a proxy: it has no TLS and no authentication.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

import numpy as np
import tensorflow as tf
from google.protobuf import json_format
from tensorflow.core.protobuf import saved_model_pb2

DEFAULT_PORT = 8501
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
TEXT_SIGNATURE = "generate_text"
# Seconds a connection may stay silent mid-request before its thread gives up on it.
_SOCKET_TIMEOUT = 60
# Oversized bodies up to this many times the limit are read (and dropped) before answering 413.
_DRAIN_FACTOR = 16

_MODEL_PATH = r"/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?"
_GET_ROUTE = re.compile(_MODEL_PATH + r"(?P<metadata>/metadata)?")
_POST_ROUTE = re.compile(_MODEL_PATH + r":(?P<verb>[A-Za-z]+)")


class RequestError(Exception):
    """A request the server refuses: `status` is the HTTP status, the message goes into `{"error": ...}`."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass
class ServedModel:
    """One loaded export version: its signature functions, their input specs and their SignatureDefs."""

    name: str
    version: int
    directory: str
    signatures: dict  # name -> concrete function
    input_specs: dict  # name -> {input name: tf.TensorSpec}
    signature_defs: dict  # name -> SignatureDef as TF Serving's JSON

    def predict(self, signature_name: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runs one signature on numpy inputs; graph checks that fail become a 400 RequestError."""
        function = self.signatures[signature_name]
        try:
            outputs = function(**{name: tf.constant(value) for name, value in inputs.items()})
        except tf.errors.InvalidArgumentError as error:
            raise RequestError(HTTPStatus.BAD_REQUEST, _error_text(error.message)) from None
        return {name: tensor.numpy() for name, tensor in outputs.items()}


def load_export(export_dir: str | os.PathLike, model_name: Optional[str] = None) -> ServedModel:
    """Loads the newest version under `export_dir` (TF Serving's default policy) for serving.

    `export_dir` holds numeric version folders, as `tfgen export` writes them. `model_name` defaults to the
    folder's name (TF Serving's docker image takes it from `MODEL_NAME`). Raises OSError when no version exists.
    """
    export_dir = os.fspath(export_dir)
    versions = sorted(
        int(entry) for entry in (os.listdir(export_dir) if os.path.isdir(export_dir) else [])
        if entry.isdigit() and os.path.isfile(os.path.join(export_dir, entry, "saved_model.pb"))
    )
    if not versions:
        raise OSError(f"export_dir: no version folder with a saved_model.pb in {export_dir!r} (expected <dir>/1/...)")
    directory = os.path.join(export_dir, str(versions[-1]))
    try:
        import tensorflow_text  # noqa: F401  registers the TF Text ops of the generate_text signature
    except ImportError:
        pass
    loaded = tf.saved_model.load(directory)
    with open(os.path.join(directory, "saved_model.pb"), "rb") as file:
        meta_graph = saved_model_pb2.SavedModel.FromString(file.read()).meta_graphs[0]
    signatures = dict(loaded.signatures)
    return ServedModel(
        name=model_name or os.path.basename(os.path.normpath(export_dir)),
        version=versions[-1],
        directory=directory,
        signatures=signatures,
        input_specs={name: function.structured_input_signature[1] for name, function in signatures.items()},
        signature_defs={
            name: json_format.MessageToDict(definition, preserving_proto_field_name=True)
            for name, definition in meta_graph.signature_def.items()
        },
    )


# ----------------------------------------------------------------------------------------------------------
# TF Serving's REST formats


def parse_predict_request(body: dict, model: ServedModel) -> tuple[str, dict[str, np.ndarray], bool]:
    """Returns (signature name, inputs as numpy arrays, whether the request used the row format)."""
    if not isinstance(body, dict):
        raise RequestError(HTTPStatus.BAD_REQUEST, "the request body must be a JSON object")
    unknown = set(body) - {"signature_name", "instances", "inputs"}
    if unknown:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"unknown request fields: {sorted(unknown)}")
    signature_name = body.get("signature_name") or "serving_default"
    if signature_name not in model.signatures:
        raise RequestError(
            HTTPStatus.BAD_REQUEST,
            f"signature_name {signature_name!r} not found; the model has {sorted(model.signatures)}",
        )
    specs = model.input_specs[signature_name]
    if ("instances" in body) == ("inputs" in body):
        raise RequestError(
            HTTPStatus.BAD_REQUEST, "send exactly one of 'instances' (row format) or 'inputs' (columnar format)"
        )
    row_format = "instances" in body
    if row_format:
        columns = _columns_from_instances(body["instances"], specs)
    else:
        columns = _named(body["inputs"], specs, "inputs")
    arrays = {name: _to_array(columns[name], spec, name) for name, spec in specs.items()}
    batch_sizes = {name: array.shape[0] for name, array in arrays.items()}
    if len(set(batch_sizes.values())) > 1:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"inputs disagree on the batch size: {batch_sizes}")
    return signature_name, arrays, row_format


def format_predict_response(outputs: dict[str, np.ndarray], row_format: bool) -> dict:
    """TF Serving's response: `predictions` (one entry per row) or `outputs` (one entry per output), each entry a
    bare value when the signature has a single output."""
    values = {name: _json_value(array) for name, array in outputs.items()}
    if not row_format:
        return {"outputs": next(iter(values.values())) if len(values) == 1 else values}
    rows = len(next(iter(values.values())))
    if len(values) == 1:
        return {"predictions": next(iter(values.values()))}
    return {"predictions": [{name: column[row] for name, column in values.items()} for row in range(rows)]}


def _named(value, specs: dict, where: str) -> dict:
    """`value` as {input name: value}; a bare value is accepted when the signature has a single input."""
    if not isinstance(value, dict) or (len(specs) == 1 and set(value) != set(specs)):
        if len(specs) != 1:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"{where} must be an object with the inputs {sorted(specs)}")
        return {next(iter(specs)): value}
    missing, unknown = set(specs) - set(value), set(value) - set(specs)
    if missing or unknown:
        raise RequestError(
            HTTPStatus.BAD_REQUEST,
            f"{where}: the signature takes {sorted(specs)}; missing {sorted(missing)}, unknown {sorted(unknown)}",
        )
    return value


def _columns_from_instances(instances, specs: dict) -> dict:
    if not isinstance(instances, list) or not instances:
        raise RequestError(HTTPStatus.BAD_REQUEST, "instances must be a non-empty list (one entry per row)")
    rows = [_named(instance, specs, f"instances[{index}]") for index, instance in enumerate(instances)]
    return {name: [row[name] for row in rows] for name in specs}


def _to_array(value, spec: tf.TensorSpec, name: str) -> np.ndarray:
    """The JSON value as a numpy array of the input's dtype and rank (TF Serving's dtype rules)."""
    if spec.dtype == tf.string:
        array = np.array(_decode_strings(value, name), dtype=object)
        valid = array.dtype == object and all(isinstance(item, bytes) for item in array.flat)
    else:
        try:
            array = np.array(value)
        except ValueError:
            array = np.array([], dtype=object)  # ragged
        kinds = "iu" if spec.dtype.is_integer else "iuf"
        valid = array.dtype.kind in kinds
        if valid and spec.dtype.is_integer:
            limits = np.iinfo(spec.dtype.as_numpy_dtype)
            valid = array.size == 0 or (array.min() >= limits.min and array.max() <= limits.max)
    if not valid:
        raise RequestError(
            HTTPStatus.BAD_REQUEST,
            f"input {name!r} must be a rectangular array of {spec.dtype.name} values",
        )
    expected = spec.shape
    if array.ndim != expected.rank or not expected.is_compatible_with(array.shape):
        raise RequestError(
            HTTPStatus.BAD_REQUEST,
            f"input {name!r} has shape {list(array.shape)}, the signature wants {_shape_text(expected)}",
        )
    return array if spec.dtype == tf.string else array.astype(spec.dtype.as_numpy_dtype)


def _decode_strings(value, name: str):
    """Nested lists of str / {"b64": ...} as nested lists of bytes (TF Serving's encoding of binary strings)."""
    if isinstance(value, list):
        return [_decode_strings(item, name) for item in value]
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except ValueError:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"input {name!r}: invalid base64") from None
    raise RequestError(HTTPStatus.BAD_REQUEST, f"input {name!r} must hold strings, got {value!r}")


def _json_value(array: np.ndarray):
    if array.dtype == object:
        return np.vectorize(lambda item: item.decode("utf-8", errors="replace"), otypes=[object])(array).tolist()
    return array.tolist()


def _shape_text(shape: tf.TensorShape) -> str:
    return "[" + ", ".join("B" if index == 0 else ("*" if dim is None else str(dim))
                           for index, dim in enumerate(shape.as_list())) + "]"


def _error_text(message: str) -> str:
    """What a TF error says about the request: the export's assertion message, else the first line that is
    not graph-debugging boilerplate."""
    assertion = re.search(r"assertion failed: \[(.*)\]", message)
    if assertion:
        return assertion.group(1)
    boilerplate = ("Graph execution error", "Detected at node", "<stack traces", "[[", "Node:")
    lines = [line.strip() for line in message.splitlines()]
    return next((line for line in lines if line and not line.startswith(boilerplate)), "invalid argument")


# ----------------------------------------------------------------------------------------------------------
# HTTP


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: every response carries a Content-Length
    timeout = _SOCKET_TIMEOUT
    server: "ModelServer"

    def log_message(self, format, *args):  # noqa: A002  (the base class's name)
        pass  # TF Serving logs no access lines either; errors go back to the client as JSON

    def do_GET(self):
        self._respond(self._get)

    def do_POST(self):
        self._respond(self._post)

    def _respond(self, route):
        try:
            status, payload = HTTPStatus.OK, route()
        except RequestError as error:
            status, payload = error.status, {"error": str(error)}
        except Exception as error:  # the server keeps serving whatever one request did
            status, payload = HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(error).__name__}: {error}"}
        body = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _model(self, match) -> ServedModel:
        model = self.server.model
        if match.group("name") != model.name:
            raise RequestError(HTTPStatus.NOT_FOUND, f"Servable not found for request: model {match.group('name')!r}")
        version = match.group("version")
        if version is not None and int(version) != model.version:
            raise RequestError(
                HTTPStatus.NOT_FOUND,
                f"Servable not found for request: version {version} of {model.name!r} (serving {model.version})",
            )
        return model

    def _get(self) -> dict:
        match = _GET_ROUTE.fullmatch(self.path)
        if match is None:
            raise RequestError(HTTPStatus.NOT_FOUND, f"no route for GET {self.path}")
        model = self._model(match)
        if match.group("metadata"):
            return {
                "model_spec": {"name": model.name, "signature_name": "", "version": str(model.version)},
                "metadata": {"signature_def": {"signature_def": model.signature_defs}},
            }
        return {"model_version_status": [
            {"version": str(model.version), "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        ]}

    def _post(self) -> dict:
        match = _POST_ROUTE.fullmatch(self.path)
        if match is None:
            raise RequestError(HTTPStatus.NOT_FOUND, f"no route for POST {self.path}")
        verb = match.group("verb")
        if verb not in ("predict", "generate"):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"{verb!r} is not supported; use :predict or :generate")
        model = self._model(match)
        body = self._json_body()
        if verb == "predict":
            signature_name, inputs, row_format = parse_predict_request(body, model)
            return format_predict_response(model.predict(signature_name, inputs), row_format)
        return _generate_text(model, body)

    def _json_body(self):
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "a Content-Length header is required")
        length, limit = int(length), self.server.max_request_bytes
        if length > limit:
            # The connection closes after the answer. A moderately oversized body is read first: closing a socket
            # with unread data resets it, and the client could lose the answer.
            self.close_connection = True
            remaining = length if length <= _DRAIN_FACTOR * limit else 0
            while remaining > 0:
                chunk = self.rfile.read(min(1 << 16, remaining))
                remaining = remaining - len(chunk) if chunk else 0
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the request has {length} bytes; the limit is {limit}"
            )
        try:
            return json.loads(self.rfile.read(length))
        except (ValueError, UnicodeDecodeError) as error:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"malformed JSON: {error}") from None


def _generate_text(model: ServedModel, body) -> dict:
    """`{"text": str | [str]}` -> `{"text": ...}` of the same shape, through the `generate_text` signature."""
    if TEXT_SIGNATURE not in model.signatures:
        raise RequestError(
            HTTPStatus.BAD_REQUEST,
            f"this export has no {TEXT_SIGNATURE} signature (export with a byte-level BPE tokenizer and tfgen[text])",
        )
    if not isinstance(body, dict) or set(body) != {"text"}:
        raise RequestError(HTTPStatus.BAD_REQUEST, 'the body must be {"text": "..."} or {"text": ["...", ...]}')
    text = body["text"]
    single = isinstance(text, str)
    texts = [text] if single else text
    if not isinstance(texts, list) or not texts or not all(isinstance(item, str) for item in texts):
        raise RequestError(HTTPStatus.BAD_REQUEST, "text must be a string or a non-empty list of strings")
    outputs = model.predict(TEXT_SIGNATURE, {"text": np.array([t.encode("utf-8") for t in texts], dtype=object)})
    generated = _json_value(outputs["text"])
    return {"text": generated[0] if single else generated}


class ModelServer(ThreadingHTTPServer):
    """`ThreadingHTTPServer` serving one `ServedModel`; `serve_forever()` runs it, `shutdown()` stops it."""

    daemon_threads = True

    def __init__(self, model: ServedModel, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES):
        if not isinstance(max_request_bytes, int) or max_request_bytes <= 0:
            raise ValueError(f"max_request_bytes must be a positive integer, got {max_request_bytes!r}")
        self.model = model
        self.max_request_bytes = max_request_bytes
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


def serve(export_dir, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT, model_name: Optional[str] = None,
          max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
    """Loads the newest version under `export_dir` and serves it until interrupted (Ctrl-C)."""
    model = load_export(export_dir, model_name)
    server = ModelServer(model, host, port, max_request_bytes)
    print(f"serving {model.name!r} version {model.version} ({', '.join(sorted(model.signatures))}) at "
          f"{server.url}/v1/models/{model.name}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def start_in_thread(server: ModelServer) -> threading.Thread:
    """Runs `server.serve_forever()` in a daemon thread (for tests and notebooks); stop with `server.shutdown()`."""
    thread = threading.Thread(target=server.serve_forever, name="tfgen-serve", daemon=True)
    thread.start()
    return thread
