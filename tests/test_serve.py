"""tfgen.serving / `tfgen serve`: TF Serving's REST API over the portable export of test_export.py.

Requests go over loopback HTTP to a server running in this process; answers are compared with the same
in-process generate() references as the export tests.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from test_export import (
    MAX_NEW_TOKENS,
    SAMPLE_ROWS,
    TEXTS,
    build_exports,
    build_references,
    requests,
    text_reference,
    within_budget,
)

from tfgen.export import SIGNATURES
from tfgen.serving import ModelServer, load_export, start_in_thread

# Every test here needs the shared exports (tens of seconds of tracing on 2 cores).
pytestmark = pytest.mark.slow

MODEL = "tiny"
MAX_REQUEST_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def exports(tmp_path_factory, tiny_model):
    return build_exports(tmp_path_factory, tiny_model)


_LOADED: dict = {}


def load_tiny_export(exports):
    """The portable export loaded for serving, once per process (test_serve_reliability.py serves it too)."""
    if "model" not in _LOADED:
        _LOADED["model"] = load_export(os.path.dirname(exports.portable), MODEL)
    return _LOADED["model"]


@pytest.fixture(scope="module")
def server(exports):
    served = ModelServer(load_tiny_export(exports), port=0, max_request_bytes=MAX_REQUEST_BYTES)
    start_in_thread(served)
    yield served
    served.shutdown()
    served.server_close()


@pytest.fixture(scope="module")
def expected(tiny_model, exports) -> dict:
    """What each route must answer for `requests()`, from in-process generate()."""
    references = build_references(tiny_model, exports.eos_token_ids)
    width = len(requests()["greedy"]["input_ids"][0])
    eos = exports.eos_token_ids
    sample_rows = np.stack([*references["sampled_rows"], references["greedy"][2]])  # row 2 has top_k=1
    greedy, greedy_lengths = within_budget(references["greedy"], width, [3, MAX_NEW_TOKENS, 0], eos, 0)
    sample, sample_lengths = within_budget(sample_rows, width, SAMPLE_ROWS["max_new_tokens"], eos, 0)
    default, default_lengths = within_budget(references["default_sampling"], width, [MAX_NEW_TOKENS] * 3, eos, 0)
    return {
        "greedy": {"sequences": greedy.tolist(), "sequence_lengths": greedy_lengths},
        "sample": {"sequences": sample.tolist(), "sequence_lengths": sample_lengths},
        "serving_default": {"sequences": default.tolist(), "sequence_lengths": default_lengths},
        "text": text_reference(tiny_model, exports.tokenizer, eos),
    }


def call(server, method: str, path: str, body=None, headers=None) -> tuple[int, dict]:
    """(status, decoded JSON answer) of one request on a fresh connection."""
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=120)
    try:
        data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
        connection.request(method, path, body=data, headers=headers or {})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def as_instances(columns: dict) -> list[dict]:
    """TF Serving's row format: one object per row."""
    return [{name: values[row] for name, values in columns.items()} for row in range(len(columns["input_ids"]))]


def as_columns(predictions: list[dict]) -> dict:
    return {name: [row[name] for row in predictions] for name in predictions[0]}


def test_status_and_metadata_follow_tf_serving(server):
    status = {"model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
    ]}
    assert call(server, "GET", f"/v1/models/{MODEL}") == (200, status)
    assert call(server, "GET", f"/v1/models/{MODEL}/versions/1") == (200, status)
    code, metadata = call(server, "GET", f"/v1/models/{MODEL}/metadata")
    assert code == 200
    assert metadata["model_spec"] == {"name": MODEL, "signature_name": "", "version": "1"}
    signature_defs = metadata["metadata"]["signature_def"]["signature_def"]
    assert set(SIGNATURES) <= set(signature_defs)
    input_ids = signature_defs["serving_default"]["inputs"]["input_ids"]
    assert input_ids["dtype"] == "DT_INT32"
    assert input_ids["tensor_shape"]["dim"] == [{"size": "-1"}, {"size": "-1"}]
    assert signature_defs["serving_default"]["method_name"] == "tensorflow/serving/predict"


def test_row_format_predict_matches_generate(server, expected):
    body = {"signature_name": "greedy", "instances": as_instances(requests()["greedy"])}
    code, answer = call(server, "POST", f"/v1/models/{MODEL}/versions/1:predict", body)
    assert code == 200
    assert as_columns(answer["predictions"]) == expected["greedy"]


def test_columnar_predict_matches_generate(server, expected):
    code, answer = call(server, "POST", f"/v1/models/{MODEL}:predict",
                        {"signature_name": "sample", "inputs": requests()["sample"]})
    assert (code, answer) == (200, {"outputs": expected["sample"]})


def test_predict_without_signature_name_runs_serving_default(server, expected):
    code, answer = call(server, "POST", f"/v1/models/{MODEL}:predict",
                        {"instances": as_instances(requests()["serving_default"])})
    assert code == 200
    assert as_columns(answer["predictions"]) == expected["serving_default"]


def test_text_routes_match_python_tokenization_and_generate(server, expected):
    assert call(server, "POST", f"/v1/models/{MODEL}:generate", {"text": TEXTS}) == (200, {"text": expected["text"]})
    # A prompt alone gets the tokens it gets in a batch (its sampling key comes from its own tokens).
    alone = call(server, "POST", f"/v1/models/{MODEL}:generate", {"text": TEXTS[1]})
    assert alone == (200, {"text": expected["text"][1]})
    # The same signature through :predict, with TF Serving's shorthand for single-input signatures.
    code, answer = call(server, "POST", f"/v1/models/{MODEL}:predict",
                        {"signature_name": "generate_text", "instances": TEXTS})
    assert (code, answer) == (200, {"predictions": expected["text"]})


def test_prompt_lookup_signature_answers_greedy_tokens(server, expected):
    body = {"signature_name": "prompt_lookup", "instances": as_instances(requests()["greedy"])}
    code, answer = call(server, "POST", f"/v1/models/{MODEL}:predict", body)
    assert code == 200
    answer = as_columns(answer["predictions"])
    assert {name: answer[name] for name in ("sequences", "sequence_lengths")} == expected["greedy"]
    assert len(answer["draft_accepted"]) == len(answer["draft_rounds"]) == 3
    # A left-padded batch of two rows whose continuations the tiny model repeats from their text, so drafts are
    # kept (several tokens a round): still the greedy signature's tokens.
    inputs = {"input_ids": [[72, 40, 17, 51, 40], [0, 0, 40, 40, 40]], "attention_mask": [[1] * 5, [0, 0, 1, 1, 1]],
              "max_new_tokens": [MAX_NEW_TOKENS, 6]}
    answers = [call(server, "POST", f"/v1/models/{MODEL}:predict", {"signature_name": name, "inputs": inputs})
               for name in ("greedy", "prompt_lookup")]
    assert [code for code, _ in answers] == [200, 200]
    greedy, speculative = (answer["outputs"] for _, answer in answers)
    assert {name: speculative[name] for name in greedy} == greedy
    assert speculative["draft_accepted"][0] > 0 and speculative["draft_accepted"][1] > 0


def _sample_inputs(**changes):
    return {"signature_name": "sample", "inputs": {**requests()["sample"], **changes}}


BAD_REQUESTS = {
    "malformed JSON": (":predict", b'{"instances": [', 400, "malformed JSON"),
    "unknown signature": (":predict", {"signature_name": "beam", "instances": [[1]]}, 400, "not found"),
    "both formats": (":predict", {"instances": [], "inputs": {}}, 400, "exactly one"),
    "float token ids": (":predict", {"inputs": {"input_ids": [[1.5]], "attention_mask": [[1]]}}, 400, "int32"),
    "ragged rows": (":predict", {"instances": [{"input_ids": [1, 2], "attention_mask": [1, 1]},
                                               {"input_ids": [1], "attention_mask": [1]}]}, 400, "rectangular"),
    "wrong rank": (":predict", {"inputs": {"input_ids": [1, 2], "attention_mask": [1, 1]}}, 400, "shape"),
    "missing input": (":predict", {"inputs": {"input_ids": [[1, 2]]}}, 400, "missing ['attention_mask']"),
    "batch sizes differ": (":predict", _sample_inputs(top_p=[1.0]), 400, "batch size"),
    "token out of vocabulary": (":predict", {"inputs": {"input_ids": [[5, 500]], "attention_mask": [[1, 1]]}}, 400,
                                "token ids must be in [0, 97)"),
    "empty row": (":predict", {"inputs": {"input_ids": [[5, 6]], "attention_mask": [[0, 0]]}}, 400,
                  "every row needs at least one token"),
    "zero temperature": (":predict", _sample_inputs(temperature=[0.0, 1.0, 1.0]), 400, "temperature must be > 0"),
    "text not a string": (":generate", {"text": 5}, 400, "text must be"),
    "unsupported verb": (":classify", {"examples": []}, 400, "not supported"),
    "too large": (":predict", b" " * (MAX_REQUEST_BYTES + 1), 413, "limit"),
}


@pytest.mark.parametrize("route, body, status, message", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_bad_requests_get_4xx_and_the_server_keeps_serving(server, expected, route, body, status, message):
    code, answer = call(server, "POST", f"/v1/models/{MODEL}{route}", body)
    assert code == status
    assert message in answer["error"]
    code, answer = call(server, "POST", f"/v1/models/{MODEL}:generate", {"text": TEXTS[0]})
    assert (code, answer) == (200, {"text": expected["text"][0]})


@pytest.mark.parametrize("method, path", [
    ("GET", "/v1/models/other"), ("GET", f"/v1/models/{MODEL}/versions/2"), ("POST", "/v1/models/other:predict"),
    ("GET", "/v2/anything"),
])
def test_unknown_models_versions_and_routes_get_404(server, method, path):
    code, answer = call(server, method, path, {} if method == "POST" else None)
    assert code == 404 and answer["error"]


def test_concurrent_requests_are_all_answered_correctly(server, expected):
    kinds = {
        "greedy": (f"/v1/models/{MODEL}:predict",
                   {"signature_name": "greedy", "instances": as_instances(requests()["greedy"])},
                   lambda answer: as_columns(answer["predictions"]) == expected["greedy"]),
        "sample": (f"/v1/models/{MODEL}:predict", {"signature_name": "sample", "inputs": requests()["sample"]},
                   lambda answer: answer == {"outputs": expected["sample"]}),
        "text": (f"/v1/models/{MODEL}:generate", {"text": TEXTS},
                 lambda answer: answer == {"text": expected["text"]}),
    }
    schedule = [list(kinds)[index % len(kinds)] for index in range(64)]

    def one(kind):
        path, body, is_right = kinds[kind]
        code, answer = call(server, "POST", path, body)
        return code == 200 and is_right(answer)

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(one, schedule, timeout=600))
    assert outcomes == [True] * 64


def test_cli_exports_then_serves_a_model_folder(tiny_checkpoint, tiny_model, tmp_path, capsys):
    from tfgen.cli import main as cli_main

    out = tmp_path / "served"
    export = ["export", "--model", tiny_checkpoint[0], "--max-new-tokens", "4", "--no-jit",
              "--signatures", "greedy,greedy", "--num-beams", "3", "--contrastive-top-k", "5", "--prompt-lookup", "6",
              "--max-matching-ngram-size", "3", str(out)]
    assert cli_main(export) == 0
    assert capsys.readouterr().out.strip() == str(out / "1")
    assert os.listdir(out) == ["1"]  # no staging folder left behind
    assert {"saved_model.pb", "variables", "assets.extra"} <= set(os.listdir(out / "1"))
    info = json.loads((out / "1" / "assets.extra" / "tfgen_export.json").read_text())
    signatures = {"greedy": SIGNATURES["greedy"].description}
    assert info == {"max_new_tokens": 4, "vocab_size": 97, "max_positions": 64, "jit_compile": False,
                    "signatures": signatures, "num_beams": 3,
                    "contrastive_top_k": 5, "prompt_lookup_num_tokens": 6, "max_matching_ngram_size": 3,
                    "warmup_requests": 1}  # no slots: a jit_compile=False export has no slot signatures
    assert cli_main(export) == 2  # the version exists: refused, untouched
    assert "already exists" in capsys.readouterr().err

    command = [sys.executable, "-m", "tfgen.cli", "serve", str(out), "--port", "0", "--rest_api_port", "0",
               "--model-name", MODEL]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    try:
        address = None
        for line in process.stderr:  # TF may log first; the server announces its address once it listens
            found = re.search(r"at http://([\d.]+):(\d+)/v1/models/", line)
            if found:
                address = found.group(1), int(found.group(2))
                break
        assert address is not None, "the server never announced its address"
        columns = {**requests()["greedy"], "max_new_tokens": [4, 2, 4]}
        connection = http.client.HTTPConnection(*address, timeout=120)
        connection.request("POST", f"/v1/models/{MODEL}:predict",
                           body=json.dumps({"signature_name": "greedy", "instances": as_instances(columns)}))
        response = connection.getresponse()
        assert response.status == 200
        answer = as_columns(json.loads(response.read())["predictions"])
    finally:
        process.terminate()
        process.wait(timeout=60)
    ids, mask = np.array(columns["input_ids"]), np.array(columns["attention_mask"])
    reference = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=4, jit_compile=False).numpy()
    eos = [tiny_model.generation_config.eos_token_id]
    sequences, lengths = within_budget(reference, ids.shape[1], columns["max_new_tokens"], eos, pad_token_id=0)
    assert answer == {"sequences": sequences.tolist(), "sequence_lengths": lengths}
