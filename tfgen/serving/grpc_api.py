"""TF Serving's gRPC API for `tfgen serve` (`--port`, 8500 by default), so a client built on the official stubs
of `tensorflow-serving-api` (`prediction_service_pb2_grpc.PredictionServiceStub`, `model_service_pb2_grpc.
ModelServiceStub`) works unchanged:

    tensorflow.serving.PredictionService/Predict           PredictRequest -> PredictResponse (outputs as TensorProtos,
                                                           `output_filter` honoured, model_spec filled in)
    tensorflow.serving.PredictionService/GetModelMetadata  metadata_field "signature_def" -> a SignatureDefMap in
                                                           `metadata["signature_def"]` (a packed Any)
    tensorflow.serving.ModelService/GetModelStatus         the served versions, AVAILABLE
Classify, Regress, MultiInference and HandleReloadConfigRequest answer UNIMPLEMENTED (an export's signatures are
predict signatures).

A request is checked by the same code as a REST one (`tfgen/serving/requests.py`: signature names, input names,
dtypes, shapes, batch sizes and knob ranges) and finds its model through the same `ServedModels.resolve`; a
refusal carries REST's message with the status code TF Serving would send (400 -> INVALID_ARGUMENT, 404 ->
NOT_FOUND, 413 -> RESOURCE_EXHAUSTED, 503 -> UNAVAILABLE, the server's own failures INTERNAL, logged). Messages
over `max_request_bytes` are refused by gRPC itself (RESOURCE_EXHAUSTED), and at most `max_connections` RPCs run
at once, one worker thread each; more get RESOURCE_EXHAUSTED at once. No TLS, no authentication: bind it to
localhost, as the REST server.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import math
import threading
from http import HTTPStatus

import grpc
import numpy as np
import tensorflow as tf
from google.protobuf import json_format
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from tfgen.serving.errors import RequestError
from tfgen.serving.options import (
    DEFAULT_GRPC_PORT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_REQUEST_BYTES,
    check_port_free,
    check_server_options,
)
from tfgen.serving.requests import check_arrays, signature_for
from tfgen.serving.served_model import ServedModel
from tfgen.serving.versions import ServedModels

__all__ = ["GrpcModelServer", "grpc_code"]

logger = logging.getLogger(__name__)

_CODES = {
    HTTPStatus.BAD_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    HTTPStatus.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    HTTPStatus.SERVICE_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    HTTPStatus.NOT_IMPLEMENTED: grpc.StatusCode.UNIMPLEMENTED,
}
_SERVED_METHODS = "Predict and GetModelMetadata (PredictionService), GetModelStatus (ModelService)"


def grpc_code(status: int) -> grpc.StatusCode:
    """The gRPC status code for a RequestError's HTTP status (INTERNAL for any status without a counterpart)."""
    return _CODES.get(status, grpc.StatusCode.INTERNAL)


def bad_request(message: str) -> RequestError:
    return RequestError(HTTPStatus.BAD_REQUEST, message)


def _rpc(method):
    """Runs one RPC: a RequestError aborts it with its message and mapped code, any other failure with INTERNAL
    (logged with its traceback); the server keeps serving either way."""

    @functools.wraps(method)
    def run(self, request, context):
        try:
            return method(self, request, context)
        except RequestError as error:
            code, message = grpc_code(error.status), str(error)
        except Exception as error:
            logger.exception("gRPC %s failed", method.__name__)
            code, message = grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {error}"
        context.abort(code, message)

    return run


def _unimplemented(name: str):
    @_rpc
    def refuse(self, request, context):
        raise RequestError(HTTPStatus.NOT_IMPLEMENTED, f"{name} is not supported: an export's signatures are "
                           f"predict signatures; tfgen serve answers {_SERVED_METHODS}")

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"UNIMPLEMENTED: tfgen serve answers {_SERVED_METHODS}."
    return refuse


def _resolve(models: ServedModels, spec):
    """The version a ModelSpec names (the newest when it names none), refusing version labels: a context manager
    holding it for the RPC (`ServedModels.acquire`: it is not unloaded under a running request)."""
    if not spec.name:
        raise bad_request(f"model_spec.name is empty: name the model (this server serves {models.name!r})")
    choice = spec.WhichOneof("version_choice")
    if choice == "version_label":
        raise bad_request(f"model_spec.version_label {spec.version_label!r}: this server has no version labels; "
                           "name a version with model_spec.version, or neither for the newest")
    return models.acquire(spec.name, spec.version.value if choice == "version" else None)


def _fill_spec(target, model: ServedModel, signature_name: str = "") -> None:
    target.name = model.name
    target.version.value = model.version
    target.signature_name = signature_name


def _tensor_array(name: str, proto, max_elements: int) -> np.ndarray:
    """A request's TensorProto as a numpy array; a malformed proto or a shape declaring more than `max_elements`
    values (a few bytes can declare billions, repeating the last value) is a RequestError naming the input."""
    dims = [dim.size for dim in proto.tensor_shape.dim]
    if proto.tensor_shape.unknown_rank or any(size < 0 for size in dims):
        raise bad_request(f"input {name!r}: the TensorProto's shape {dims} is not fully defined")
    elements = math.prod(dims)
    if elements > max_elements:
        raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"input {name!r}: shape {dims} has {elements} "
                           f"values; a request may hold at most {max_elements} (max_request_bytes)")
    try:
        return tf.make_ndarray(proto)
    except (ValueError, TypeError) as error:
        raise bad_request(f"input {name!r} is not a valid TensorProto: {error}") from None


class _PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    """tensorflow.serving.PredictionService over a `ServedModels`."""

    def __init__(self, models: ServedModels, max_elements: int):
        self.models = models
        self.max_elements = max_elements

    @_rpc
    def Predict(self, request, context):
        """Runs one signature on the request's TensorProtos, checked as REST checks its JSON."""
        with _resolve(self.models, request.model_spec) as model:
            return self._predict(model, request)

    def _predict(self, model: ServedModel, request):
        signature_name = signature_for(model, request.model_spec.signature_name)
        wanted = list(dict.fromkeys(request.output_filter))
        outputs = model.signature_defs[signature_name].get("outputs", {})
        unknown = [name for name in wanted if name not in outputs]
        if unknown:
            raise bad_request(f"output_filter: {unknown} are not outputs of signature {signature_name!r}; it has "
                               f"{sorted(outputs)}")
        arrays = {name: _tensor_array(name, proto, self.max_elements) for name, proto in request.inputs.items()}
        check_arrays(signature_name, arrays, model.input_specs[signature_name])
        results = model.predict(signature_name, arrays)
        response = predict_pb2.PredictResponse()
        _fill_spec(response.model_spec, model, signature_name)
        for name in wanted or results:
            response.outputs[name].CopyFrom(tf.make_tensor_proto(results[name]))
        return response

    @_rpc
    def GetModelMetadata(self, request, context):
        """The signature definitions, as TF Serving packs them (a SignatureDefMap in an Any)."""
        with _resolve(self.models, request.model_spec) as model:
            pass  # the definitions are plain data, read after the version is let go
        fields = list(request.metadata_field)
        if not fields:
            raise bad_request("metadata_field is empty: ask for 'signature_def'")
        unsupported = [field for field in fields if field != "signature_def"]
        if unsupported:
            raise bad_request(f"metadata_field {unsupported[0]!r} is not supported; this server answers "
                               "'signature_def'")
        definitions = get_model_metadata_pb2.SignatureDefMap()
        for name, definition in model.signature_defs.items():
            json_format.ParseDict(definition, definitions.signature_def[name])
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        _fill_spec(response.model_spec, model)
        response.metadata["signature_def"].Pack(definitions)
        return response

    Classify = _unimplemented("Classify")
    Regress = _unimplemented("Regress")
    MultiInference = _unimplemented("MultiInference")


class _ModelService(model_service_pb2_grpc.ModelServiceServicer):
    """tensorflow.serving.ModelService's status method over a `ServedModels`."""

    def __init__(self, models: ServedModels):
        self.models = models

    @_rpc
    def GetModelStatus(self, request, context):
        """The named version, or every version served, each AVAILABLE with an OK status."""
        spec = request.model_spec
        with _resolve(self.models, spec) as model:
            pass  # only its version number is read
        versions = [model] if spec.WhichOneof("version_choice") else self.models.available()
        response = get_model_status_pb2.GetModelStatusResponse()
        for served in versions:
            status = response.model_version_status.add()
            status.version = served.version
            status.state = get_model_status_pb2.ModelVersionStatus.AVAILABLE
            status.status.error_code = 0  # tensorflow.error.OK
        return response

    HandleReloadConfigRequest = _unimplemented("HandleReloadConfigRequest")


class GrpcModelServer:
    """TF Serving's gRPC API over a `ServedModels` (or one `ServedModel`): `start()` serves in gRPC's threads,
    `stop()` ends it. At most `max_connections` RPCs run at once (more get RESOURCE_EXHAUSTED); messages over
    `max_request_bytes` are refused. Raises ValueError for a bad option, OSError naming the port when it cannot
    listen (port 0: any free port; `port` then holds the one chosen)."""

    def __init__(self, models: ServedModels | ServedModel, host: str = "127.0.0.1", port: int = DEFAULT_GRPC_PORT,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, max_connections: int = DEFAULT_MAX_CONNECTIONS):
        check_server_options(port=port, max_request_bytes=max_request_bytes, max_connections=max_connections)
        self.models = models if isinstance(models, ServedModels) else ServedModels.of(models)
        self.host = host
        executor = concurrent.futures.ThreadPoolExecutor(max_connections, thread_name_prefix="tfgen-grpc")
        self._server = grpc.server(
            executor,
            options=[
                ("grpc.max_receive_message_length", max_request_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),  # a port in use is an error, not shared with the other server
            ],
            maximum_concurrent_rpcs=max_connections,
        )
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
            _PredictionService(self.models, max_request_bytes), self._server
        )
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(_ModelService(self.models), self._server)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            self.port = self._server.add_insecure_port(address)
        except RuntimeError:  # grpcio >= 1.52 raises where older releases returned 0
            self.port = 0
        if not self.port:
            self._server.stop(None)
            executor.shutdown(wait=False)
            check_port_free(host, port, "--port")  # says why, when the system does
            raise OSError(f"cannot listen on {host}:{port} for gRPC")

    @property
    def target(self) -> str:
        """host:port, what a client's `grpc.insecure_channel` takes."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def start(self) -> None:
        self._server.start()

    def stop(self, grace: float | None = None, wait: bool = True) -> threading.Event:
        """Stops serving: new RPCs are refused, those running get `grace` seconds to finish (None: cancelled at
        once). Returns an event set once they ended (already set when `wait`)."""
        stopped = self._server.stop(grace)
        if wait:
            stopped.wait()
        return stopped
