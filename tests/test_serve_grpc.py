"""`tfgen serve`'s TF Serving gRPC API (tfgen/serving/grpc_api.py), called through the official stubs of
tensorflow-serving-api on an insecure loopback channel, as a stock TF Serving client calls it.

The fast tests serve a stand-in model whose signatures are Python functions (status codes, limits, the flags);
the slow ones serve the shared tiny export of test_export.py (loaded once with test_serve.py) and compare the
answers with REST's `:predict` and in-process generate().
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)
from test_export import requests
from test_serve import MODEL, as_columns, as_instances, call, expected, exports, load_tiny_export  # noqa: F401
from test_serve import server as rest_server  # noqa: F401  (a fixture)

from tfgen import serving
from tfgen.cli import main
from tfgen.commands import serve as serve_command
from tfgen.serving.grpc_api import GrpcModelServer
from tfgen.serving.served_model import ServedModel

CODE = grpc.StatusCode

# --- a stand-in model: Python signatures, no export -------------------------------------------------------------

SPECS = {"input_ids": tf.TensorSpec([None, None], tf.int32), "temperature": tf.TensorSpec([None], tf.float32)}
SIGNATURE_DEF = {
    "inputs": {"input_ids": {"name": "sample_input_ids:0", "dtype": "DT_INT32",
                             "tensor_shape": {"dim": [{"size": "-1"}, {"size": "-1"}]}},
               "temperature": {"name": "sample_temperature:0", "dtype": "DT_FLOAT",
                               "tensor_shape": {"dim": [{"size": "-1"}]}}},
    "outputs": {"sequences": {"name": "out:0", "dtype": "DT_INT32"}, "scaled": {"name": "out:1", "dtype": "DT_FLOAT"}},
    "method_name": "tensorflow/serving/predict",
}
MAX_REQUEST_BYTES = 4096


class StandIn:
    """Signatures that double the ids and halve the temperatures; `block` makes the next calls wait for `release`,
    `fail` makes them raise (a server-side bug)."""

    def __init__(self):
        self.block, self.fail = False, False
        self.started, self.release = threading.Event(), threading.Event()

    def sample(self, input_ids, temperature):
        if self.block:
            self.started.set()
            self.release.wait(30)
        if self.fail:
            raise RuntimeError("a bug in the signature")
        return {"sequences": input_ids * 2, "scaled": temperature / 2}


@pytest.fixture(scope="module")
def stand_in():
    return StandIn()


@pytest.fixture(scope="module")
def fake(stand_in):
    """(gRPC server, PredictionService stub, ModelService stub) over the stand-in, version 7; one RPC at a time."""
    model = ServedModel(name="echo", version=7, directory=os.path.join("nowhere", "echo", "7"),
                        signatures={"serving_default": stand_in.sample, "sample": stand_in.sample},
                        input_specs={"serving_default": SPECS, "sample": SPECS},
                        signature_defs={"serving_default": SIGNATURE_DEF, "sample": SIGNATURE_DEF})
    server = GrpcModelServer(model, port=0, max_request_bytes=MAX_REQUEST_BYTES, max_connections=1)
    server.start()
    channel = grpc.insecure_channel(server.target)
    yield (server, prediction_service_pb2_grpc.PredictionServiceStub(channel),
           model_service_pb2_grpc.ModelServiceStub(channel))
    channel.close()
    server.stop()


def predict_request(model: str, signature: str = "", **inputs) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    for name, value in inputs.items():
        request.inputs[name].CopyFrom(value if isinstance(value, tensor_pb2.TensorProto)
                                      else tf.make_tensor_proto(value))
    return request


def echo_request(**changes) -> predict_pb2.PredictRequest:
    inputs = {"input_ids": np.array([[1, 2, 3]], np.int32), "temperature": np.array([0.5], np.float32), **changes}
    return predict_request("echo", "sample", **{name: value for name, value in inputs.items() if value is not None})


def refusal(rpc, request) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        rpc(request, timeout=30)
    return caught.value.code(), caught.value.details()


def test_predict_answers_tensor_protos_with_the_model_spec_filled_in(fake):
    _, stub, _ = fake
    response = stub.Predict(echo_request(), timeout=30)
    assert (response.model_spec.name, response.model_spec.version.value) == ("echo", 7)
    assert response.model_spec.signature_name == "sample"
    assert tf.make_ndarray(response.outputs["sequences"]).tolist() == [[2, 4, 6]]
    assert tf.make_ndarray(response.outputs["scaled"]).tolist() == [0.25]
    # No signature name: serving_default, named as such in the answer; output_filter keeps the outputs named.
    request = echo_request()
    request.model_spec.signature_name = ""
    request.output_filter.append("scaled")
    response = stub.Predict(request, timeout=30)
    assert response.model_spec.signature_name == "serving_default" and list(response.outputs) == ["scaled"]


def _with(request, **spec):
    for name, value in spec.items():
        if name == "version":
            request.model_spec.version.value = value
        elif name == "output_filter":
            request.output_filter.extend(value)
        else:
            setattr(request.model_spec, name, value)
    return request


def _malformed_tensor():
    proto = tf.make_tensor_proto(np.array([[1, 2]], np.int32))
    proto.tensor_content = b"\x01\x02\x03"
    return proto


def _huge_declared_shape():
    proto = tf.make_tensor_proto(np.array([[1]], np.int32))
    proto.tensor_shape.dim[1].size = 10 ** 9  # a few bytes on the wire, 4 GB once expanded
    return proto


BAD_REQUESTS = {
    "unknown model": (_with(echo_request(), name="other"), CODE.NOT_FOUND, "model 'other'"),
    "no model name": (_with(echo_request(), name=""), CODE.INVALID_ARGUMENT, "model_spec.name"),
    "unknown version": (_with(echo_request(), version=3), CODE.NOT_FOUND, "version 3 of 'echo'"),
    "version label": (_with(echo_request(), version_label="stable"), CODE.INVALID_ARGUMENT, "version_label 'stable'"),
    "unknown signature": (_with(echo_request(), signature_name="beam"), CODE.INVALID_ARGUMENT,
                          "signature_name 'beam' not found"),
    "unknown output": (_with(echo_request(), output_filter=["logits"]), CODE.INVALID_ARGUMENT,
                       "output_filter: ['logits']"),
    "missing input": (echo_request(temperature=None), CODE.INVALID_ARGUMENT, "missing ['temperature']"),
    "unknown input": (echo_request(top_p=np.array([1.0], np.float32)), CODE.INVALID_ARGUMENT, "unknown ['top_p']"),
    "wrong dtype": (echo_request(input_ids=np.array([[1, 2]], np.int64)), CODE.INVALID_ARGUMENT,
                    "input 'input_ids' has dtype int64, the signature wants int32"),
    "wrong rank": (echo_request(input_ids=np.array([1, 2], np.int32)), CODE.INVALID_ARGUMENT,
                   "input 'input_ids' has shape [2]"),
    "batch sizes differ": (echo_request(temperature=np.array([0.5, 1.0], np.float32)), CODE.INVALID_ARGUMENT,
                           "batch size"),
    "knob out of range": (echo_request(temperature=np.array([0.0], np.float32)), CODE.INVALID_ARGUMENT,
                          "temperature must be > 0"),
    "malformed tensor": (echo_request(input_ids=_malformed_tensor()), CODE.INVALID_ARGUMENT,
                         "input 'input_ids' is not a valid TensorProto"),
    "huge declared shape": (echo_request(input_ids=_huge_declared_shape()), CODE.RESOURCE_EXHAUSTED,
                            "input 'input_ids': shape [1, 1000000000]"),
    "message too large": (echo_request(input_ids=np.zeros((1, MAX_REQUEST_BYTES), np.int32)),
                          CODE.RESOURCE_EXHAUSTED, "larger than max"),
}


@pytest.mark.parametrize("request_, code, message", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_bad_predict_requests_get_tf_serving_codes_naming_the_field(fake, request_, code, message):
    _, stub, _ = fake
    got_code, details = refusal(stub.Predict, request_)
    assert got_code == code and message in details, details
    assert tf.make_ndarray(stub.Predict(echo_request(), timeout=30).outputs["sequences"]).tolist() == [[2, 4, 6]]


def test_a_failing_signature_is_internal_logged_and_the_server_keeps_serving(fake, stand_in, caplog):
    _, stub, _ = fake
    stand_in.fail = True
    try:
        code, details = refusal(stub.Predict, echo_request())
    finally:
        stand_in.fail = False
    assert code == CODE.INTERNAL and details == "RuntimeError: a bug in the signature"
    assert any(record.name == "tfgen.serving.grpc_api" and record.exc_info for record in caplog.records)
    assert stub.Predict(echo_request(), timeout=30).outputs["sequences"]


def test_rpcs_beyond_max_connections_are_refused_at_once(fake, stand_in):
    _, stub, _ = fake  # max_connections=1
    stand_in.started.clear()
    stand_in.release.clear()
    stand_in.block = True
    try:
        first = stub.Predict.future(echo_request(), timeout=30)
        assert stand_in.started.wait(30)
        code, _ = refusal(stub.Predict, echo_request())
        assert code == CODE.RESOURCE_EXHAUSTED
    finally:
        stand_in.block = False
        stand_in.release.set()
    assert tf.make_ndarray(first.result().outputs["sequences"]).tolist() == [[2, 4, 6]]


def test_metadata_status_and_unsupported_methods_on_the_stand_in(fake):
    _, stub, model_service = fake
    metadata = stub.GetModelMetadata(get_model_metadata_pb2.GetModelMetadataRequest(
        model_spec={"name": "echo"}, metadata_field=["signature_def"]), timeout=30)
    assert (metadata.model_spec.name, metadata.model_spec.version.value) == ("echo", 7)
    for fields, message in (([], "metadata_field is empty"), (["signature_def", "tags"], "'tags' is not supported")):
        code, details = refusal(stub.GetModelMetadata, get_model_metadata_pb2.GetModelMetadataRequest(
            model_spec={"name": "echo"}, metadata_field=fields))
        assert code == CODE.INVALID_ARGUMENT and message in details
    for spec in ({"name": "echo"}, {"name": "echo", "version": {"value": 7}}):
        status = model_service.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(model_spec=spec), timeout=30)
        assert [(each.version, each.state, each.status.error_code) for each in status.model_version_status] == [
            (7, get_model_status_pb2.ModelVersionStatus.AVAILABLE, 0)]
    code, _ = refusal(model_service.GetModelStatus, get_model_status_pb2.GetModelStatusRequest(
        model_spec={"name": "echo", "version": {"value": 8}}))
    assert code == CODE.NOT_FOUND
    code, details = refusal(stub.Classify, classification_pb2.ClassificationRequest(model_spec={"name": "echo"}))
    assert code == CODE.UNIMPLEMENTED and "Classify is not supported" in details and "Predict" in details


def test_a_port_in_use_is_an_oserror_naming_it(fake):
    server, _, _ = fake
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"port {port} is in use on 127.0.0.1"):
            GrpcModelServer(server.models, port=port)
    with pytest.raises(ValueError, match="max_request_bytes"):
        GrpcModelServer(server.models, port=0, max_request_bytes=0)


# --- the flags: TF Serving's names, checked before anything loads ----------------------------------------------


def test_flags_follow_tf_serving_without_importing_tensorflow():
    code = ("import sys; from tfgen.cli import build_parser; from tfgen.commands.serve import grpc_port\n"
            "for argv in (['serve', 'd', '--port', '9000', '--rest_api_port', '9001', '--model_name', 'm'],\n"
            "             ['serve', 'd', '--rest-api-port', '9001', '--model-name', 'm'], ['serve']):\n"
            "    args = build_parser().parse_args(argv)\n"
            "    print(grpc_port(args), args.rest_api_port, args.model_name)\n"
            "print('tensorflow' in sys.modules)")
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert output.stdout.split("\n") == ["9000 9001 m", "8500 9001 m", "8500 8501 None", "False", ""]


@pytest.fixture
def fake_serve(monkeypatch):
    served = {}
    monkeypatch.setattr(serving, "serve", lambda export_dir, **options: served.update(options, called=True))
    return served


def test_the_cli_passes_both_ports_and_the_name_to_serve(tmp_path, fake_serve):
    assert main(["serve", str(tmp_path), "--port", "0", "--rest_api_port", "0", "--model_name", "m"]) == 0
    assert (fake_serve["grpc_port"], fake_serve["port"], fake_serve["model_name"]) == (0, 0, "m")


def test_without_the_stubs_the_cli_serves_rest_only_unless_port_is_given(tmp_path, fake_serve, monkeypatch, capfd):
    monkeypatch.setattr(serve_command, "grpc_available", lambda: False)
    assert main(["serve", str(tmp_path), "--rest_api_port", "0"]) == 0
    assert fake_serve.pop("grpc_port") is None and fake_serve.pop("called")
    warning = capfd.readouterr().err
    assert "serving REST only" in warning and 'pip install "tfgen[serve]"' in warning
    assert main(["serve", str(tmp_path), "--port", "0", "--rest_api_port", "0"]) == 2
    assert "called" not in fake_serve
    error = capfd.readouterr().err.strip()
    assert error.startswith("tfgen: error: port 0: gRPC needs tensorflow-serving-api") and "\n" not in error
    assert 'pip install "tfgen[serve]"' in error


def test_the_cli_refuses_bad_or_taken_ports_before_loading(tmp_path, fake_serve, capfd):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cases = {
            ("--rest_api_port", str(port)): f"port {port} is in use on 127.0.0.1 (--rest_api_port)",
            ("--port", str(port), "--rest_api_port", "0"): f"port {port} is in use on 127.0.0.1 (--port)",
            ("--rest_api_port", "70000"): "rest_api_port must be an integer in 0..65535",
            ("--port", "9555", "--rest_api_port", "9555"): "port and rest_api_port are both 9555",
        }
        for options, message in cases.items():
            assert main(["serve", str(tmp_path), "--port", "0", *options]) == 2, options
            assert capfd.readouterr().err.strip().startswith(f"tfgen: error: {message}")
    assert "called" not in fake_serve


# --- the tiny export: the same answers as REST and generate() ----------------------------------------------------


@pytest.fixture(scope="module")
def tiny(exports):  # noqa: F811  (the imported fixture)
    """(PredictionService stub, ModelService stub, the served model) over the tiny export."""
    model = load_tiny_export(exports)
    server = GrpcModelServer(model, port=0)
    server.start()
    channel = grpc.insecure_channel(server.target)
    yield (prediction_service_pb2_grpc.PredictionServiceStub(channel),
           model_service_pb2_grpc.ModelServiceStub(channel), model)
    channel.close()
    server.stop()


def tensors(model: ServedModel, signature: str, columns: dict) -> dict:
    """JSON-ready columns as numpy arrays of the signature's dtypes."""
    specs = model.input_specs[signature]
    return {name: np.array(value, dtype=specs[name].dtype.as_numpy_dtype) for name, value in columns.items()}


def answer(response) -> dict:
    return {name: tf.make_ndarray(proto).tolist() for name, proto in response.outputs.items()}


@pytest.mark.slow
@pytest.mark.parametrize("signature", ["greedy", "sample"])
def test_predict_matches_rest_and_generate(tiny, rest_server, expected, signature):  # noqa: F811
    stub, _, model = tiny
    response = stub.Predict(predict_request(MODEL, signature, **tensors(model, signature, requests()[signature])),
                            timeout=300)
    assert answer(response) == expected[signature]
    assert (response.model_spec.name, response.model_spec.version.value) == (MODEL, 1)
    code, rest = call(rest_server, "POST", f"/v1/models/{MODEL}:predict",
                      {"signature_name": signature, "instances": as_instances(requests()[signature])})
    assert code == 200 and as_columns(rest["predictions"]) == answer(response)


@pytest.mark.slow
def test_text_signature_takes_string_tensors(tiny, expected):  # noqa: F811
    stub, _, _ = tiny
    texts = np.array([text.encode() for text in requests()["generate_text"]["text"]], dtype=object)
    response = stub.Predict(predict_request(MODEL, "generate_text", text=texts), timeout=300)
    assert [text.decode() for text in tf.make_ndarray(response.outputs["text"])] == expected["text"]
    code, details = refusal(stub.Predict, predict_request(MODEL, "generate_text", text=np.array([b""], object)))
    assert code == CODE.INVALID_ARGUMENT and "text[0] is empty" in details


@pytest.mark.slow
def test_metadata_and_status_of_the_export(tiny):
    stub, model_service, model = tiny
    metadata = stub.GetModelMetadata(get_model_metadata_pb2.GetModelMetadataRequest(
        model_spec={"name": MODEL}, metadata_field=["signature_def"]), timeout=30)
    definitions = get_model_metadata_pb2.SignatureDefMap()
    assert metadata.metadata["signature_def"].Unpack(definitions)
    # Every SignatureDef of the MetaGraph, as REST's /metadata (and TF Serving) list them, init op included.
    assert set(definitions.signature_def) == set(model.signature_defs) >= set(model.signatures)
    input_ids = definitions.signature_def["serving_default"].inputs["input_ids"]
    assert input_ids.dtype == tf.int32.as_datatype_enum and [dim.size for dim in input_ids.tensor_shape.dim] == [-1, -1]
    status = model_service.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(model_spec={"name": MODEL}),
                                          timeout=30)
    assert [(each.version, each.state) for each in status.model_version_status] == [
        (1, get_model_status_pb2.ModelVersionStatus.AVAILABLE)]


@pytest.mark.slow
def test_graph_checks_are_invalid_argument_and_the_server_keeps_serving(tiny, expected):  # noqa: F811
    stub, _, model = tiny
    columns = requests()["greedy"]
    columns["input_ids"][1][2] = 500
    code, details = refusal(stub.Predict, predict_request(MODEL, "greedy", **tensors(model, "greedy", columns)))
    assert code == CODE.INVALID_ARGUMENT and "token ids must be in [0, 97)" in details
    columns = {**requests()["sample"], "top_p": [0.0, 1.0, 1.0]}
    code, details = refusal(stub.Predict, predict_request(MODEL, "sample", **tensors(model, "sample", columns)))
    assert code == CODE.INVALID_ARGUMENT and details.startswith("top_p must be in (0, 1]; row 0 has 0.0")
    response = stub.Predict(predict_request(MODEL, "greedy", **tensors(model, "greedy", requests()["greedy"])),
                            timeout=300)
    assert answer(response) == expected["greedy"]


@pytest.mark.slow
def test_cli_serves_grpc_and_rest_side_by_side(exports, expected):  # noqa: F811
    command = [sys.executable, "-m", "tfgen.cli", "serve", os.path.dirname(exports.portable), "--port", "0",
               "--rest_api_port", "0", "--model_name", MODEL]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    try:
        rest = target = None
        for line in process.stderr:  # the REST line, then the gRPC line, once both listen
            rest = rest or re.search(r"at (http://[\d.]+:\d+)/v1/models/tiny", line)
            target = re.search(r"gRPC .* at ([\d.]+:\d+)$", line.strip())
            if target:
                break
        assert rest and target, "the server never announced both addresses"
        with grpc.insecure_channel(target.group(1)) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            inputs = {name: np.array(value, np.int32) for name, value in requests()["greedy"].items()}
            response = stub.Predict(predict_request(MODEL, "greedy", **inputs), timeout=300)
    finally:
        process.terminate()
        process.wait(timeout=60)
    assert answer(response) == expected["greedy"]
