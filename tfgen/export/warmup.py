"""TF Serving's warm-up records: `assets.extra/tf_serving_warmup_requests`, one small valid request per signature.

TF Serving (`--enable_model_warmup`, on by default) replays this file when it loads a version, before the version
serves, so the first user request does not pay for building (and, in an XLA export, compiling) a signature's
program; `tfgen serve` replays it the same way (`replay_warmup_requests`). The file is a TFRecord file of
`tensorflow.serving.PredictionLog` protos, each a `predict_log` whose `request` is a `PredictRequest`.

The protos come from `tensorflow-serving-api` (`pip install "tfgen[serve]"`) when it is installed. Without it the
same bytes are written (and read) by the few lines of protobuf wire format below, so an export always carries its
warm-up records; the tests check both ways against the official protos.

XLA compiles once per distinct input shape: the records compile each signature for batch 1 and a short prompt.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2

from tfgen.config.knobs import declared

logger = logging.getLogger(__name__)

WARMUP_FILE = "tf_serving_warmup_requests"
# The warm-up prompt: this many tokens (fewer when the model's positions leave less room), one row.
WARMUP_PROMPT_TOKENS = 8
# Each record's per-row budget, where the signature takes `max_new_tokens`: enough to run the loop's body.
WARMUP_NEW_TOKENS = 2
WARMUP_TEXT = "Hello, world"


def warmup_prompt(vocab_size: int, prompt_tokens: int = WARMUP_PROMPT_TOKENS) -> np.ndarray:
    """The warm-up prompt's ids `[prompt_tokens]`: a repeated bigram (prompt lookup finds drafts in it), away from
    the usual special ids 0-2 when the vocabulary allows. ValueError for sizes below 1."""
    if vocab_size < 1 or prompt_tokens < 1:
        raise ValueError(f"vocab_size and prompt_tokens must be positive, got {vocab_size} and {prompt_tokens}")
    first = min(3, vocab_size - 1)
    return (first + np.arange(prompt_tokens) % 2) % vocab_size


def warmup_text(tokenizer, vocab_size: int, prompt_tokens: int = WARMUP_PROMPT_TOKENS) -> str | None:
    """A text whose tokens the model takes: `WARMUP_TEXT` when the tokenizer encodes it back to itself with ids
    below `vocab_size`, else the decoded warm-up prompt (a tokenizer trained without those characters drops them,
    and the graph's tokenizer would give ids out of range); None when neither does."""
    for text in (WARMUP_TEXT, tokenizer.decode(warmup_prompt(vocab_size, prompt_tokens).tolist())):
        ids = tokenizer.encode(text, add_special_tokens=False)
        if text and ids and max(ids) < vocab_size and tokenizer.decode(ids) == text:
            return text
    return None


def warmup_requests(input_specs: dict[str, dict], vocab_size: int, prompt_tokens: int = WARMUP_PROMPT_TOKENS,
                    tokenizer=None) -> dict[str, dict]:
    """`{signature name: warmup_inputs(...)}` for signatures with these `{name: {input name: tf.TensorSpec}}`; a
    signature taking `text` needs `tokenizer` (its text from `warmup_text`) and is left out, with a warning, when
    no text fits the model's vocabulary."""
    text = None
    if any("text" in specs for specs in input_specs.values()):
        if tokenizer is None:
            raise ValueError("tokenizer: a signature takes text, so its warm-up request needs the tokenizer")
        text = warmup_text(tokenizer, vocab_size, prompt_tokens)
    found = {}
    for name, specs in input_specs.items():
        if "text" in specs and text is None:
            logger.warning("no warm-up request for %r: the tokenizer encodes neither %r nor the decoded warm-up "
                           "prompt within the model's %d ids", name, WARMUP_TEXT, vocab_size)
            continue
        found[name] = warmup_inputs(specs, vocab_size, prompt_tokens, text or WARMUP_TEXT)
    return found


def warmup_inputs(input_specs: dict, vocab_size: int, prompt_tokens: int = WARMUP_PROMPT_TOKENS,
                  text: str = WARMUP_TEXT) -> dict:
    """One row of valid inputs for a signature with these `{input name: tf.TensorSpec}`: `warmup_prompt` (mask
    all 1) or `text`, `WARMUP_NEW_TOKENS` as budget, and each knob's neutral value (`tfgen.config.knobs`), in the spec's
    dtype. ValueError for an input it cannot fill."""
    prompt = warmup_prompt(vocab_size, prompt_tokens)
    inputs = {}
    for name, spec in input_specs.items():
        dtype = spec.dtype.as_numpy_dtype
        if name == "input_ids":
            value = prompt[None, :]
        elif name == "attention_mask":
            value = np.ones([1, prompt_tokens])
        elif name == "text":
            value = np.array([text.encode("utf-8")], dtype=object)
        elif name == "max_new_tokens":
            value = np.array([WARMUP_NEW_TOKENS])
        else:
            try:
                value = declared(name).fill(1)
            except KeyError:
                raise ValueError(f"input_specs: no warm-up value for the input {name!r}") from None
            if not declared(name).per_row:  # a shared knob of fixed shape (a structured signature's tables)
                value = np.broadcast_to(value, spec.shape.as_list())
        inputs[name] = value if dtype == object else np.asarray(value).astype(dtype)  # noqa: E721 (a numpy dtype)
    return inputs


def warmup_prompt_tokens(max_positions: int | None, buffer_new_tokens: int) -> int:
    """The warm-up prompt's length: `WARMUP_PROMPT_TOKENS`, fewer when prompt plus buffer would not fit the
    model's positions (at least 1)."""
    if max_positions is None:
        return WARMUP_PROMPT_TOKENS
    return max(1, min(WARMUP_PROMPT_TOKENS, int(max_positions) - int(buffer_new_tokens)))


def write_warmup_requests(path: str, requests, model_name: str = "") -> int:
    """Writes requests — `{signature name: {input name: numpy array}}`, or `(signature name, inputs)` pairs to have
    several per signature (e.g. one per prompt width and batch size an XLA export serves) — to `path` as TFRecord
    PredictionLog records, in order; returns how many."""
    pairs = list(requests.items() if isinstance(requests, dict) else requests)
    with tf.io.TFRecordWriter(os.fspath(path)) as writer:
        for signature_name, inputs in pairs:
            writer.write(prediction_log_bytes(signature_name, inputs, model_name))
    return len(pairs)


def prediction_log_bytes(signature_name: str, inputs: dict, model_name: str = "", *,
                         official: bool | None = None) -> bytes:
    """One serialized `PredictionLog` holding a `PredictRequest` for `signature_name` with `inputs` as
    TensorProtos. official: True uses tensorflow-serving-api's protos, False the wire format below, None the
    protos when installed."""
    protos = _serving_protos() if official is not False else None
    if official and protos is None:
        raise ImportError('tensorflow-serving-api is not installed (pip install "tfgen[serve]")')
    tensors = {name: tf.make_tensor_proto(value) for name, value in inputs.items()}
    if protos is not None:
        log = protos.PredictionLog()
        request = log.predict_log.request
        request.model_spec.name = model_name
        request.model_spec.signature_name = signature_name
        for name, tensor in tensors.items():
            request.inputs[name].CopyFrom(tensor)
        return log.SerializeToString()
    spec = (_field(1, model_name.encode("utf-8")) if model_name else b"") + _field(3, signature_name.encode("utf-8"))
    entries = b"".join(_field(2, _field(1, name.encode("utf-8")) + _field(2, tensor.SerializeToString()))
                       for name, tensor in tensors.items())
    return _field(_PREDICT_LOG, _field(1, _field(1, spec) + entries))


def read_warmup_requests(path: str, *, official: bool | None = None) -> list[tuple[str, dict]]:
    """The `(signature name, {input name: numpy array})` of each predict record in a warm-up file (other kinds
    of records are skipped). official: as in `prediction_log_bytes`."""
    protos = _serving_protos() if official is not False else None
    found = []
    for record in tf.data.TFRecordDataset(os.fspath(path)).as_numpy_iterator():
        if protos is not None:
            log = protos.PredictionLog.FromString(record)
            if log.WhichOneof("log_type") == "predict_log":
                request = log.predict_log.request
                found.append((request.model_spec.signature_name,
                              {name: tf.make_ndarray(tensor) for name, tensor in request.inputs.items()}))
            continue
        predict_log = _fields(record).get(_PREDICT_LOG)
        if predict_log is None:
            continue
        request = _fields(predict_log[-1]).get(1, [b""])[-1]
        signature = _fields(_fields(request).get(1, [b""])[-1]).get(3, [b""])[-1].decode("utf-8")
        inputs = {}
        for entry in _fields(request).get(2, []):
            entry_fields = _fields(entry)
            tensor = tensor_pb2.TensorProto.FromString(entry_fields.get(2, [b""])[-1])
            inputs[entry_fields.get(1, [b""])[-1].decode("utf-8")] = tf.make_ndarray(tensor)
        found.append((signature, inputs))
    return found


def replay_warmup_requests(directory: str, signatures: dict, skip=frozenset()) -> int:
    """Runs each record of `directory/assets.extra/tf_serving_warmup_requests` through its signature once (the
    concrete functions of `signatures`), as TF Serving does at load, except the records of the signatures named in
    `skip`; returns how many ran (0 without a file). ValueError for a record naming a signature the export lacks; a
    record that fails raises its TF error."""
    path = os.path.join(directory, "assets.extra", WARMUP_FILE)
    if not os.path.isfile(path):
        return 0
    started = time.monotonic()
    requests = read_warmup_requests(path)
    ran, skipped = 0, set()
    for signature_name, inputs in requests:
        name = signature_name or "serving_default"
        if name not in signatures:
            raise ValueError(f"{path}: a warm-up record names the signature {name!r}; the export has "
                             f"{sorted(signatures)}")
        if name in skip:
            skipped.add(name)
            continue
        signatures[name](**{key: tf.constant(value) for key, value in inputs.items()})
        ran += 1
    note = f"; skipped {len(requests) - ran} of {', '.join(sorted(skipped))}" if skipped else ""
    logger.info("warm-up: %d requests from %s ran in %.1f s%s", ran, path, time.monotonic() - started, note)
    return ran


def _serving_protos():
    """tensorflow-serving-api's prediction_log_pb2, or None when the package is not installed."""
    try:
        from tensorflow_serving.apis import prediction_log_pb2
    except ImportError:
        return None
    return prediction_log_pb2


# The protobuf wire format, for the few fields written and read without tensorflow-serving-api:
# PredictionLog.predict_log = 6; PredictLog.request = 1; PredictRequest.model_spec = 1, .inputs = 2 (a map: entries
# with key = 1, value = 2); ModelSpec.name = 1, .signature_name = 3.
_PREDICT_LOG = 6
_LENGTH_DELIMITED = 2


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (a string, bytes or a nested message)."""
    return _varint(number << 3 | _LENGTH_DELIMITED) + _varint(len(payload)) + payload


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(data):
            raise ValueError("warm-up record: truncated protobuf")
        byte = data[position]
        value |= (byte & 0x7F) << shift
        position, shift = position + 1, shift + 7
        if not byte & 0x80:
            return value, position


def _fields(data: bytes) -> dict[int, list[bytes]]:
    """The length-delimited fields of a serialized message, by field number (other wire types are skipped)."""
    found: dict[int, list[bytes]] = {}
    position = 0
    while position < len(data):
        key, position = _read_varint(data, position)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, position = _read_varint(data, position)
        elif wire_type == 1 or wire_type == 5:
            position += 8 if wire_type == 1 else 4
        elif wire_type == _LENGTH_DELIMITED:
            length, position = _read_varint(data, position)
            if position + length > len(data):
                raise ValueError("warm-up record: truncated protobuf")
            found.setdefault(number, []).append(data[position:position + length])
            position += length
        else:
            raise ValueError(f"warm-up record: unsupported protobuf wire type {wire_type}")
    return found
