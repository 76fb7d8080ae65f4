"""TF Serving's warm-up records (`assets.extra/tf_serving_warmup_requests`) in the exports of test_export.py: they
parse as the official PredictionLog protos, cover every signature, run through the loaded SavedModel, and the
hand-written wire format (used without tensorflow-serving-api) says exactly what the official protos say."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
import tensorflow as tf
from test_export import MAX_NEW_TOKENS, build_exports

from tfgen.export import EXPORT_INFO_FILE, SIGNATURES
from tfgen.export.warmup import (
    WARMUP_FILE,
    WARMUP_NEW_TOKENS,
    prediction_log_bytes,
    read_warmup_requests,
    replay_warmup_requests,
    warmup_inputs,
    warmup_prompt,
    warmup_prompt_tokens,
    warmup_requests,
    warmup_text,
    write_warmup_requests,
)

prediction_log_pb2 = pytest.importorskip("tensorflow_serving.apis.prediction_log_pb2")

# The shared exports take tens of seconds of tracing on 2 cores.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exports(tmp_path_factory, tiny_model):
    return build_exports(tmp_path_factory, tiny_model)


def _warmup_path(version_dir: str) -> str:
    return os.path.join(version_dir, "assets.extra", WARMUP_FILE)


def _records(version_dir: str) -> list:
    return [prediction_log_pb2.PredictionLog.FromString(record)
            for record in tf.data.TFRecordDataset(_warmup_path(version_dir)).as_numpy_iterator()]


@pytest.mark.parametrize("which", ["jit", "portable"])
def test_records_are_prediction_logs_covering_every_signature(exports, which):
    version_dir = getattr(exports, which)
    with open(os.path.join(version_dir, "assets.extra", EXPORT_INFO_FILE), encoding="utf-8") as file:
        info = json.load(file)
    records = _records(version_dir)
    assert info["warmup_requests"] == len(records)
    assert all(record.WhichOneof("log_type") == "predict_log" for record in records)
    named = [record.predict_log.request.model_spec.signature_name for record in records]
    assert sorted(named) == sorted(info["signatures"])  # one request per exported signature
    if which == "portable":  # every signature of the table: generate_text and prompt_lookup included
        assert sorted(named) == sorted(SIGNATURES)
    signatures = tf.saved_model.load(version_dir).signatures
    for record in records:
        request = record.predict_log.request
        specs = signatures[request.model_spec.signature_name].structured_input_signature[1]
        assert set(request.inputs) == set(specs)
        for name, tensor in request.inputs.items():
            value = tf.make_ndarray(tensor)
            assert tf.as_dtype(tensor.dtype) == specs[name].dtype and value.shape[0] == 1, name
            assert specs[name].shape.is_compatible_with(value.shape), name


def test_each_request_runs_through_the_loaded_signature(exports):
    version_dir = exports.portable
    signatures = tf.saved_model.load(version_dir).signatures
    requests = read_warmup_requests(_warmup_path(version_dir))
    assert len(requests) == len(SIGNATURES)
    for name, inputs in requests:
        outputs = signatures[name](**{key: tf.constant(value) for key, value in inputs.items()})
        if name == "generate_text":
            assert outputs["text"].shape == [1]
            continue
        width = inputs["input_ids"].shape[1]
        assert outputs["sequences"].shape == [1, width + MAX_NEW_TOKENS], name
        new_tokens = int(outputs["sequence_lengths"][0]) - width
        budget = WARMUP_NEW_TOKENS if "max_new_tokens" in inputs else MAX_NEW_TOKENS
        assert 1 <= new_tokens <= budget, name


def test_inputs_are_small_valid_and_neutral(exports):
    requests = dict(read_warmup_requests(_warmup_path(exports.portable)))
    greedy = requests["greedy"]
    assert greedy["input_ids"].shape == (1, warmup_prompt_tokens(64, MAX_NEW_TOKENS))
    assert np.all(greedy["attention_mask"] == 1) and np.all(greedy["input_ids"] < 97)
    sample = requests["sample"]
    assert sample["seed"].shape == (1, 2) and sample["seed"].dtype == np.int32
    assert (sample["temperature"].tolist(), sample["top_k"].tolist(), sample["top_p"].tolist()) == ([1.0], [0], [1.0])
    assert requests["beam_search"]["length_penalty"].dtype == np.float32  # the wire dtype of a float64 knob
    # The test tokenizer knows a few lowercase words only: "Hello, world" would lose characters (and the graph's
    # tokenizer give ids out of range), so the text is the decoded warm-up prompt.
    text = requests["generate_text"]["text"][0].decode()
    assert text == warmup_text(exports.tokenizer, 97) == exports.tokenizer.decode(warmup_prompt(97).tolist())
    assert warmup_prompt_tokens(10, 8) == 2 and warmup_prompt_tokens(9, 8) == 1 and warmup_prompt_tokens(None, 8) == 8


def test_wire_format_without_serving_api_matches_the_official_protos(exports):
    inputs = {
        "input_ids": np.array([[3, 4, 3]], np.int32), "temperature": np.array([0.5], np.float32),
        "seed": np.array([[1, 2]], np.int32), "text": np.array(["héllo".encode()], dtype=object),
    }
    for model_name in ("", "gpt2"):
        official = prediction_log_pb2.PredictionLog.FromString(
            prediction_log_bytes("sample", inputs, model_name, official=True))
        handmade = prediction_log_pb2.PredictionLog.FromString(
            prediction_log_bytes("sample", inputs, model_name, official=False))
        assert handmade == official and official.predict_log.request.model_spec.signature_name == "sample"
    path = _warmup_path(exports.portable)
    by_protos, by_hand = read_warmup_requests(path, official=True), read_warmup_requests(path, official=False)
    assert [name for name, _ in by_hand] == [name for name, _ in by_protos]
    for (_, expected), (_, found) in zip(by_protos, by_hand):
        assert set(found) == set(expected)
        for key in expected:
            assert found[key].dtype == expected[key].dtype and np.array_equal(found[key], expected[key])


def test_replay_runs_each_record_once_and_refuses_unknown_signatures(exports, caplog):
    calls = []
    fakes = {name: (lambda name: lambda **inputs: calls.append((name, sorted(inputs))))(name) for name in SIGNATURES}
    with caplog.at_level(logging.INFO, logger="tfgen.export.warmup"):
        assert replay_warmup_requests(exports.portable, fakes) == len(SIGNATURES)
    assert sorted(name for name, _ in calls) == sorted(SIGNATURES)
    assert dict(calls)["greedy"] == ["attention_mask", "input_ids", "max_new_tokens"]
    assert f"warm-up: {len(SIGNATURES)} requests" in caplog.text
    with pytest.raises(ValueError, match="names the signature 'greedy'"):
        replay_warmup_requests(exports.portable, {"serving_default": fakes["serving_default"]})
    assert replay_warmup_requests(os.path.dirname(exports.portable), fakes) == 0  # no file, nothing to run
    calls.clear()
    with caplog.at_level(logging.INFO, logger="tfgen.export.warmup"):
        assert replay_warmup_requests(exports.portable, fakes, skip={"greedy", "sample"}) == len(SIGNATURES) - 2
    assert sorted(name for name, _ in calls) == sorted(set(SIGNATURES) - {"greedy", "sample"})
    assert "skipped 2 of greedy, sample" in caplog.text


class _WordTokenizer:
    """Knows the words of `vocabulary` only (ids from 3), dropping anything else, as a trained BPE does."""

    def __init__(self, *vocabulary):
        self.words = list(vocabulary)

    def encode(self, text, add_special_tokens=True):
        return [3 + self.words.index(word) for word in text.split() if word in self.words]

    def decode(self, ids):
        return " ".join(self.words[i - 3] for i in ids if 0 <= i - 3 < len(self.words))


def test_warmup_text_is_one_the_model_can_read(caplog):
    ids_spec = {"input_ids": tf.TensorSpec([None, None], tf.int32)}
    specs = {"greedy": ids_spec, "generate_text": {"text": tf.TensorSpec([None], tf.string)}}
    assert warmup_text(_WordTokenizer("Hello,", "world"), 97) == "Hello, world"
    assert warmup_text(_WordTokenizer("a", "b"), 97, 3) == "a b a"  # the decoded prompt [3, 4, 3]
    assert warmup_text(_WordTokenizer("Hello,", "world"), 3) is None  # ids 3 and 4 are beyond a vocabulary of 3
    with caplog.at_level(logging.WARNING, logger="tfgen.export.warmup"):
        assert list(warmup_requests(specs, 3, 2, _WordTokenizer("Hello,", "world"))) == ["greedy"]
    assert "no warm-up request for 'generate_text'" in caplog.text
    with pytest.raises(ValueError, match="tokenizer"):
        warmup_requests(specs, 97)


def test_several_requests_per_signature_keep_their_order(tmp_path):
    specs = {name: tf.TensorSpec([None, None], tf.int32) for name in ("input_ids", "attention_mask")}
    specs["max_new_tokens"] = tf.TensorSpec([None], tf.int32)
    shapes = [(1, 4), (3, 4), (2, 6)]
    pairs = [("greedy", {name: np.repeat(value, batch, axis=0)
                         for name, value in warmup_inputs(specs, 97, width).items()}) for batch, width in shapes]
    path = str(tmp_path / WARMUP_FILE)
    assert write_warmup_requests(path, pairs, "gpt2") == 3
    for official in (True, False):
        back = read_warmup_requests(path, official=official)
        assert [(name, inputs["input_ids"].shape) for name, inputs in back] == [("greedy", shape) for shape in shapes]
        assert back[1][1]["max_new_tokens"].tolist() == [WARMUP_NEW_TOKENS] * 3


def test_warmup_inputs_refuse_what_they_cannot_fill():
    with pytest.raises(ValueError, match="'sequences'"):
        warmup_inputs({"sequences": tf.TensorSpec([None, None], tf.int32)}, 97)
    with pytest.raises(ValueError, match="vocab_size"):
        warmup_inputs({"input_ids": tf.TensorSpec([None, None], tf.int32)}, 0)
