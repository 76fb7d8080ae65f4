"""`tfgen serve` lets go of what it holds (issue 30): SIGTERM and Ctrl-C drain (in-flight requests finish with full
bodies), an unloaded version gives its memory back, clients trickling header bytes are dropped after a whole-header
deadline, version folders beyond int64 are ignored, JSON booleans are `bool` inputs, and an HTTP/0.9 request line
gets 400 at once.

In-process servers run on the shared tiny export of test_export.py (loaded once with test_serve.py); the drain and
memory checks run `tfgen serve` / a loader in subprocesses on a small export of their own whose requests are slow
(hundreds of new tokens that no eos can cut short).
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import tensorflow as tf
from conftest import build_hf_gpt2
from test_serve import MODEL, exports, load_tiny_export  # noqa: F401  (exports: a fixture)
from test_serve_reliability import wait_for

from tfgen.serving import ModelServer, start_in_thread
from tfgen.serving import http as serving_http
from tfgen.serving.options import grpc_available
from tfgen.serving.requests import parse_predict_request
from tfgen.serving.served_model import ServedModel, export_versions
from tfgen.serving.versions import ServedModels

pytestmark = pytest.mark.slow

STATUS = f"/v1/models/{MODEL}"
HEADER_TIMEOUT = 1.0  # the whole-header deadline of the trickling test's server
SLOW_TOKENS = 600  # new tokens per request of the slow export (min_new_tokens too: no early eos)
IN_FLIGHT = 10


def _get(address, path: str, timeout: float = 30) -> tuple[int, dict]:
    connection = http.client.HTTPConnection(*address, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


@pytest.fixture(scope="module")
def server(exports):  # noqa: F811  (the imported fixture)
    served = ModelServer(load_tiny_export(exports), port=0, max_connections=16)
    start_in_thread(served)
    yield served
    served.shutdown()
    served.server_close()


# --- the request line and headers ---------------------------------------------------------------------------------


def test_a_request_line_without_a_version_gets_400_at_once(server):
    started = time.monotonic()
    with socket.create_connection(server.server_address[:2], timeout=5) as sock:
        sock.sendall(b"GET /\r\n")  # HTTP/0.9: no version, and no headers follow
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == 400
        assert "has no HTTP version" in json.loads(response.read())["error"]
    assert time.monotonic() - started < 2  # not IDLE_TIMEOUT (10 s)


def test_header_tricklers_are_dropped_after_the_header_deadline(server, monkeypatch):
    monkeypatch.setattr(serving_http, "HEADER_TIMEOUT", HEADER_TIMEOUT)  # IDLE_TIMEOUT stays 10 s
    address = server.server_address[:2]
    request = f"GET {STATUS} HTTP/1.1\r\nHost: x\r\nX-Slow: {'a' * 200}\r\n\r\n".encode()
    dropped: list[float] = []

    def trickle():
        with socket.create_connection(address, timeout=30) as sock:
            started = time.monotonic()
            try:
                for byte in request:  # a byte every 0.1 s: each read is quick, the header never ends
                    sock.sendall(bytes([byte]))
                    time.sleep(0.1)
                    if _closed(sock):
                        break
            except OSError:
                pass  # the server closed the connection
            dropped.append(time.monotonic() - started)

    tricklers = [threading.Thread(target=trickle) for _ in range(server.max_connections)]
    for thread in tricklers:
        thread.start()
    started = time.monotonic()
    assert wait_for(lambda: server.open_connections == server.max_connections, 5)
    refused = 0
    while True:  # a legitimate client, retrying on 503
        status, _ = _get(address, STATUS)
        if status == 200:
            break
        refused += 1
        assert time.monotonic() - started < HEADER_TIMEOUT + 3, "the tricklers still hold every slot"
        time.sleep(0.05)
    served_after = time.monotonic() - started
    for thread in tricklers:
        thread.join(30)
    assert refused > 0 and served_after < HEADER_TIMEOUT + 3
    assert len(dropped) == server.max_connections
    assert all(HEADER_TIMEOUT - 0.2 < seconds < HEADER_TIMEOUT + 2 for seconds in dropped), dropped
    print(f"tricklers dropped after {min(dropped):.2f}-{max(dropped):.2f} s (deadline {HEADER_TIMEOUT} s); "
          f"a legitimate request served after {served_after:.2f} s, {refused} 503s before")


def _closed(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1024) == b""
    except BlockingIOError:
        return False
    finally:
        sock.setblocking(True)


# --- versions -----------------------------------------------------------------------------------------------------

HUGE_VERSION = "99999999999999999999"  # beyond int64


@pytest.fixture(scope="module")
def huge_version_folder(exports, tmp_path_factory):  # noqa: F811
    folder = tmp_path_factory.mktemp("huge") / MODEL
    for name in ("1", HUGE_VERSION, "007"):
        shutil.copytree(exports.portable, folder / name)
    return folder


def test_version_folders_beyond_int64_are_ignored_with_a_log_line(huge_version_folder, exports, caplog):  # noqa: F811
    with caplog.at_level(logging.WARNING, "tfgen.serving"):
        assert export_versions(str(huge_version_folder)) == [1]
    warnings = [record.getMessage() for record in caplog.records]
    assert any(HUGE_VERSION in message and "int64" in message for message in warnings)
    assert any("'007'" in message for message in warnings)
    models = ServedModels(huge_version_folder, MODEL, loaded=load_tiny_export(exports), version_policy="all")
    models.poll()  # what polling does every second: nothing more to load
    assert [model.version for model in models.available()] == [1]
    server = ModelServer(models, port=0)
    start_in_thread(server)
    try:
        status, answer = _get(server.server_address[:2], f"{STATUS}/versions/{HUGE_VERSION}")
        assert status == 404 and "version 99999999999999999999" in answer["error"]
        status, answer = _get(server.server_address[:2], STATUS)
        assert [entry["version"] for entry in answer["model_version_status"]] == ["1"]
    finally:
        server.shutdown()
        server.server_close()


def test_grpc_model_status_with_a_version_folder_beyond_int64(huge_version_folder, exports):  # noqa: F811
    pytest.importorskip("tensorflow_serving")
    import grpc
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

    from tfgen.serving.grpc_api import GrpcModelServer

    models = ServedModels(huge_version_folder, MODEL, loaded=load_tiny_export(exports), version_policy="all")
    models.poll()
    server = GrpcModelServer(models, port=0)
    server.start()
    try:
        with grpc.insecure_channel(server.target) as channel:
            status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
                get_model_status_pb2.GetModelStatusRequest(model_spec={"name": MODEL}), timeout=30)
        assert [entry.version for entry in status.model_version_status] == [1]
    finally:
        server.stop()


# --- bool inputs --------------------------------------------------------------------------------------------------


def test_bool_inputs_take_json_booleans_and_refuse_other_numbers():
    model = ServedModel("m", 1, "/nowhere", {"s": None}, {"s": {"flag": tf.TensorSpec([None], tf.bool)}}, {})
    _, arrays, _ = parse_predict_request({"signature_name": "s", "inputs": {"flag": [True, False, 1, 0]}}, model)
    assert arrays["flag"].dtype == bool and arrays["flag"].tolist() == [True, False, True, False]
    for value in (7, -1, 0.5, 1.0, "true", None):
        with pytest.raises(Exception, match="input 'flag' must hold bool values") as error:
            parse_predict_request({"signature_name": "s", "inputs": {"flag": [True, value]}}, model)
        assert error.value.status == 400


# --- draining and unloading (subprocesses on a slow export) -----------------------------------------------------


@pytest.fixture(scope="module")
def slow_export(tmp_path_factory):
    """A greedy-only portable export of a tiny GPT-2 with 1024 positions whose requests each generate SLOW_TOKENS
    tokens (min_new_tokens: no eos ends them early)."""
    from tfgen import AutoModelForCausalLM
    from tfgen.export import export_saved_model

    root = tmp_path_factory.mktemp("slow")
    build_hf_gpt2(root / "checkpoint", n_positions=1024)
    model = AutoModelForCausalLM.from_pretrained(str(root / "checkpoint"))
    config = model.generation_config.copy()
    config.update(min_new_tokens=SLOW_TOKENS)
    export_saved_model(model, root / MODEL, config, max_new_tokens=SLOW_TOKENS, jit_compile=False,
                       signatures=["greedy"], version=1)
    return root / MODEL


def _start_server(export_dir, *options) -> tuple[subprocess.Popen, tuple[str, int]]:
    """`tfgen serve` in a subprocess; returns it and its REST address once it serves."""
    grpc = ["--port", "0"] if grpc_available() else []
    process = subprocess.Popen(
        # SIGINT as a terminal delivers it (a background job of a non-interactive shell would inherit it ignored).
        [sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
         "from tfgen.cli import main; sys.exit(main())", "serve", str(export_dir),
         "--rest_api_port", "0", "--file_system_poll_wait_seconds", "0", *grpc, *options],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    lines = []
    for line in process.stderr:
        lines.append(line)
        found = re.search(r"at http://([0-9.]+):([0-9]+)/v1/models", line)
        if found:
            return process, (found.group(1), int(found.group(2)))
    raise AssertionError(f"the server did not start: {''.join(lines)}")


def _predict(address) -> tuple[int, dict, float]:
    body = json.dumps({"signature_name": "greedy", "instances": [
        {"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], "max_new_tokens": SLOW_TOKENS}]})
    connection = http.client.HTTPConnection(*address, timeout=120)
    try:
        connection.request("POST", f"{STATUS}:predict", body=body)
        response = connection.getresponse()
        return response.status, json.loads(response.read()), time.monotonic()
    finally:
        connection.close()


@pytest.mark.parametrize("stop, status", [(signal.SIGTERM, 0), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_drains_the_requests_in_flight(slow_export, stop, status):
    process, address = _start_server(slow_export)
    try:
        with concurrent.futures.ThreadPoolExecutor(IN_FLIGHT) as pool:
            answers = [pool.submit(_predict, address) for _ in range(IN_FLIGHT)]
            time.sleep(0.5)  # every request has arrived and is generating
            signalled = time.monotonic()
            process.send_signal(stop)
            time.sleep(0.5)
            with pytest.raises(OSError):  # the port is closed: a new connection is refused
                _get(address, STATUS, timeout=5)
            results = [answer.result(timeout=120) for answer in answers]
        stderr = process.stderr.read()
        assert process.wait(60) == status
    finally:
        process.kill()
    for code, answer, finished in results:
        assert code == 200, answer
        (prediction,) = answer["predictions"]
        assert prediction["sequence_lengths"] == 3 + SLOW_TOKENS  # the full body
        assert len(prediction["sequences"]) == 3 + SLOW_TOKENS
        assert finished > signalled, "a request finished before the signal: make them slower"
    assert "Traceback" not in stderr
    last = [line for line in stderr.splitlines() if line.startswith("tfgen serve:")]
    assert len(last) == 1 and last[0].startswith(f"tfgen serve: {stop.name}: stopped accepting connections, "
                                                 f"finished {IN_FLIGHT} in-flight requests"), stderr
    print(last[0])


_CYCLES = """
import ctypes, json, os, sys
from tfgen.serving.versions import ServedModels

folder = sys.argv[1]
class MallInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]
mallinfo = ctypes.CDLL("libc.so.6").mallinfo2
mallinfo.restype = MallInfo
def rss_mb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024
models = ServedModels(folder, "tiny")
sizes, in_use = [], []
for version in range(2, 12):  # ten load / unload cycles: version n+1 replaces version n
    os.rename(os.path.join(folder, str(version - 1)), os.path.join(folder, str(version)))
    models.poll()
    model = models.latest
    assert model.version == version
    model.predict("greedy", {"input_ids": [[5, 6, 7]], "attention_mask": [[1, 1, 1]], "max_new_tokens": [4]})
    sizes.append(rss_mb())
    in_use.append(mallinfo().uordblks / 2**20)  # bytes malloc hands out now: no free pages, no fragmentation
print(json.dumps({"rss": sizes, "in_use": in_use}))
"""


def _version_cycles(export_dir, folder) -> tuple[list[float], list[float]]:
    """RSS and malloc's bytes in use (MB) after each of ten load / unload cycles of `export_dir` in a subprocess
    (`_CYCLES`, TFGEN_COMPILE_CACHE as the tests run: off, every program compiled)."""
    shutil.copytree(export_dir, folder)
    result = subprocess.run([sys.executable, "-c", _CYCLES, str(folder)], capture_output=True, text=True,
                            timeout=600, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr
    measured = json.loads(result.stdout.splitlines()[-1])
    print("RSS (MB) after each of ten version cycles:", [round(size) for size in measured["rss"]])
    print("malloc in use (MB):", [round(size, 1) for size in measured["in_use"]])
    return measured["rss"], measured["in_use"]


def test_ten_version_cycles_keep_the_memory_flat(slow_export, tmp_path):
    sizes, _ = _version_cycles(slow_export, tmp_path / MODEL)
    assert max(sizes[1:]) <= sizes[0] * 1.10, sizes
    assert sizes[-1] - sizes[1] < 30, sizes  # no steady growth


@pytest.fixture(scope="module")
def jit_export(tmp_path_factory):
    """A greedy-only XLA export of a tiny GPT-2 with 1024 positions (8 new tokens at most)."""
    from tfgen import AutoModelForCausalLM
    from tfgen.export import export_saved_model

    root = tmp_path_factory.mktemp("jit")
    build_hf_gpt2(root / "checkpoint", n_positions=1024)
    model = AutoModelForCausalLM.from_pretrained(str(root / "checkpoint"))
    export_saved_model(model, root / MODEL, max_new_tokens=8, signatures=["greedy"], version=1)
    return root / MODEL


def test_ten_version_cycles_of_an_xla_export_keep_the_memory_flat(jit_export, tmp_path):
    # TensorFlow keeps every compiled XLA program, keyed by function name, and each load names its functions anew:
    # before the unload dropped them, ~15 MB of RSS (~12 MB in use) stayed per cycle (+13% over ten cycles).
    sizes, in_use = _version_cycles(jit_export, tmp_path / MODEL)
    assert max(sizes[1:]) <= sizes[0] * 1.10, sizes
    assert (in_use[-1] - in_use[0]) / (len(in_use) - 1) < 6, in_use  # 2.8 MB per cycle stays (see the docs)


_DROP = """
import sys
import numpy as np
from tfgen.serving.served_model import load_export
from tfgen.serving.xla_programs import drop_compiled_programs

model = load_export(sys.argv[1])
assert model.xla
inputs = {"input_ids": [[5, 6, 7]], "attention_mask": [[1, 1, 1]], "max_new_tokens": [4]}
before = model.predict("greedy", inputs)["sequences"]
assert drop_compiled_programs() >= 1  # TensorFlow's internal names still match (the cache was found)
assert drop_compiled_programs() == 0  # nothing compiled since
np.testing.assert_array_equal(model.predict("greedy", inputs)["sequences"], before)
assert drop_compiled_programs() >= 1
model.warm_up()
assert drop_compiled_programs() >= 1  # the warm-up compiled its programs again
print("ok")
"""


def test_dropping_the_compiled_programs_keeps_a_served_version_working(jit_export):
    """The XLA program cache dropped under a served version: the next call compiles again, with the same tokens
    (in a subprocess: dropping them here would make the other tests compile theirs again)."""
    result = subprocess.run([sys.executable, "-c", _DROP, str(jit_export)], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0 and result.stdout.split()[-1] == "ok", result.stderr
