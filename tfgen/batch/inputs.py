"""Reading input rows: JSONL and TFRecord files (through TensorFlow's file systems, so `gs://` paths work) and
in-memory prompts, as `(number, record)` pairs for `tfgen.batch.rows.build_table`. A line or record too long for
any prompt, or a line nested absurdly deep, becomes an `Unreadable` record before it is parsed."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from tfgen.batch.options import INPUT_FORMATS
from tfgen.batch.rows import ROW_KEYS, Unreadable, metadata_warning, read_keys

logger = logging.getLogger(__name__)

# Records `tf.data` hands over at a time: fewer host round trips than one at a time.
_READ_CHUNK = 1024
# Bytes of a JSONL file read at a time: the reader holds one block and at most one line (up to the byte limit).
_READ_BLOCK = 1 << 20
#: A JSONL line nested deeper than this (arrays and objects) is a bad row, found before parsing: Python's JSON
#: parser recurses once per level and gives up with a RecursionError near 1000. A row needs 2 levels.
MAX_JSON_DEPTH = 100
# Lines longer than this are passed over by `first_messages_line` (the job's reader refuses them anyway).
_SCAN_LINE_BYTES = 1 << 26
# Features of a tf.train.Example row; a row's chat or options are read from JSONL rows only.
_EXAMPLE_FEATURES = ("id", "prompt", "input_ids")


def input_records(path: str, input_format: str, max_bytes: int) -> tuple[Iterator[tuple[int, Any]], str]:
    """The records of a JSONL or TFRecord file and the unit naming their positions ("line" or "record").

    `input_format` is one of `INPUT_FORMATS`; "auto" reads `.tfrecord` / `.tfrecords` (optionally `.gz`) as
    TFRecords and anything else as JSONL. A line or record over `max_bytes` bytes (see
    `tfgen.batch.rows.record_byte_limit`), or a line nested over `MAX_JSON_DEPTH` levels, is an `Unreadable`
    record, never parsed. Raises OSError when the file does not exist.
    """
    if input_format not in INPUT_FORMATS:
        raise ValueError(f"input_format must be one of {INPUT_FORMATS}, got {input_format!r}")
    if not tf.io.gfile.exists(path):
        raise OSError(f"input: {path} does not exist")
    if input_format == "auto":
        stem = path[: -len(".gz")] if path.endswith(".gz") else path
        input_format = "tfrecord" if stem.endswith((".tfrecord", ".tfrecords")) else "jsonl"
    if input_format == "tfrecord":
        return _tfrecord_records(path, max_bytes), "record"
    return _jsonl_records(path, max_bytes), "line"


def prompt_records(prompts) -> Iterator[tuple[int, Any]]:
    """In-memory prompts as records: strings, id lists and conversations (lists of message dicts) get their index as
    id; dicts are read as rows (`tfgen.batch.rows.read_keys`: metadata keys left out, with one warning)."""
    if isinstance(prompts, (str, bytes, dict)) or not isinstance(prompts, Iterable):
        raise TypeError(f"prompts must be a sequence of strings, token-id lists or dicts, got {type(prompts).__name__}")
    metadata: set = set()
    for index, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            yield index, {"id": index, "prompt": prompt}
        elif isinstance(prompt, list) and prompt and all(isinstance(message, dict) for message in prompt):
            yield index, {"id": index, "messages": prompt}
        elif isinstance(prompt, (list, tuple, np.ndarray)):
            yield index, {"id": index, "input_ids": np.asarray(prompt).tolist()}
        else:
            yield index, read_keys(prompt, metadata)
    if metadata:
        logger.warning("prompts: %s", metadata_warning(metadata))


def _jsonl_records(path: str, max_bytes: int) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object or `Unreadable`) per non-blank line; of an object, only the keys a row uses
    (`tfgen.batch.rows.read_keys`; the metadata keys left out are named in one warning at the end)."""
    metadata: set = set()
    for number, line in _lines(path, max_bytes):
        if isinstance(line, int):
            yield number, Unreadable(f"the line holds {line:,} bytes; a line may hold at most {max_bytes:,} (for "
                                     "this model's positions), so its prompt could never fit")
            continue
        if not line.strip():
            continue
        depth = _nesting_depth(line)
        if depth > MAX_JSON_DEPTH:
            yield number, Unreadable(f"JSON nested {depth} levels deep; at most {MAX_JSON_DEPTH} are allowed")
            continue
        try:
            record = json.loads(line)
        except ValueError as error:  # bad JSON and bad UTF-8 alike
            yield number, Unreadable(f"malformed JSON ({error})")
            continue
        yield number, read_keys(record, metadata)
    if metadata:
        logger.warning("%s: %s", path, metadata_warning(metadata))


def first_messages_line(path: str, input_format: str) -> int | None:
    """The number of the first JSONL line of `path` that is an object with `messages` (a chat row), or None (none;
    or a TFRecord input, whose rows have no chats). A quick scan (a byte search; only lines that name `messages` are
    parsed), so that a model without a chat template refuses a chat job before it loads."""
    _, unit = input_records(path, input_format, _SCAN_LINE_BYTES)
    if unit != "line":
        return None
    for number, line in _lines(path, _SCAN_LINE_BYTES):
        if isinstance(line, bytes) and b'"messages"' in line and _nesting_depth(line) <= MAX_JSON_DEPTH:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a bad row, reported as such when the job reads its input
            if isinstance(record, dict) and "messages" in record:
                return number
    return None


def _lines(path: str, max_bytes: int) -> Iterator[tuple[int, bytes | int]]:
    """(line number, the line's bytes without its newline, or its length in bytes when over `max_bytes`) per
    line. Reads `_READ_BLOCK` bytes at a time and drops an over-long line's bytes as it goes, so no line is ever
    held whole past `max_bytes` (`tf.data.TextLineDataset` would read a 200 MB line whole)."""
    number = 0
    parts: list[bytes] = []  # the current line's bytes so far
    held = 0  # their length; counting on (with `parts` emptied) once past `max_bytes`
    with tf.io.gfile.GFile(path, "rb") as file:
        while block := file.read(_READ_BLOCK):
            *ends, rest = block.split(b"\n")
            for end in ends:
                number += 1
                held += len(end)
                yield number, (b"".join([*parts, end]) if held <= max_bytes else held)
                parts, held = [], 0
            held += len(rest)
            parts = [*parts, rest] if held <= max_bytes else []
    if held:
        yield number + 1, (b"".join(parts) if held <= max_bytes else held)


def _nesting_depth(line: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest, brackets inside strings not counted; in linear time
    (numpy), whatever the line holds. A line with fewer brackets in all than the limit is not looked at further."""
    if line.count(b"[") + line.count(b"{") <= MAX_JSON_DEPTH:
        return 0
    codes = np.frombuffer(line, np.uint8)
    positions = np.arange(len(codes))
    # A quote is escaped after an odd run of backslashes; the unescaped ones open and close strings in turn.
    last_other = np.maximum.accumulate(np.where(codes != ord("\\"), positions, -1))
    backslashes = np.concatenate([[0], positions[:-1] - last_other[:-1]])
    quotes = (codes == ord('"')) & (backslashes % 2 == 0)
    outside = np.cumsum(quotes) % 2 == 0
    steps = np.isin(codes, (ord("["), ord("{"))).astype(np.int64) - np.isin(codes, (ord("]"), ord("}")))
    return int(np.cumsum(np.where(outside, steps, 0)).max(initial=0))


def _example_record(raw: bytes):
    """A `tf.train.Example` as a JSONL-like dict: `id` (one bytes or int64 value), `input_ids` (int64 list)
    or `prompt` (one UTF-8 bytes value); other features are ignored."""
    try:
        features = tf.train.Example.FromString(raw).features.feature
    except Exception as error:  # noqa: BLE001 (protobuf's DecodeError has no stable import path)
        return Unreadable(f"not a tf.train.Example ({error})")
    for name in ROW_KEYS:
        if name in features and name not in _EXAMPLE_FEATURES:
            return Unreadable(f"feature {name!r}: chats and per-row options are read from JSONL rows only")
    record = {}
    for name in _EXAMPLE_FEATURES:
        if name not in features:
            continue
        kind = features[name].WhichOneof("kind")
        values = list(getattr(features[name], kind).value) if kind else []
        if name == "input_ids":
            if kind != "int64_list":
                return Unreadable(f"feature 'input_ids' must be an int64 list, got {kind}")
            record[name] = [int(value) for value in values]
            continue
        if len(values) == 1 and kind == "bytes_list":
            try:
                record[name] = values[0].decode("utf-8")
            except UnicodeDecodeError as error:
                return Unreadable(f"feature {name!r} is not UTF-8 ({error})")
        elif len(values) == 1 and kind == "int64_list" and name == "id":
            record[name] = int(values[0])
        else:
            allowed = "bytes or int64 value" if name == "id" else "bytes value"
            return Unreadable(f"feature {name!r} must hold exactly one {allowed}")
    return record


def _tfrecord_records(path: str, max_bytes: int) -> Iterator[tuple[int, Any]]:
    """(record number, dict or `Unreadable`) per record; GZIP when the name ends in .gz."""
    dataset = tf.data.TFRecordDataset(path, compression_type="GZIP" if path.endswith(".gz") else "")
    number = 0
    try:
        for raw in dataset.prefetch(_READ_CHUNK).as_numpy_iterator():
            number += 1
            if len(raw) > max_bytes:
                yield number, Unreadable(f"the record holds {len(raw):,} bytes; a record may hold at most "
                                         f"{max_bytes:,} (for this model's positions), so its prompt could never fit")
            else:
                yield number, _example_record(raw)
    except tf.errors.DataLossError as error:
        # A broken frame hides where the following records start, so nothing after it can be trusted.
        raise ValueError(f"input: record {number + 1} of {path} is corrupted: {error.message}") from None
