"""Reading input rows: JSONL and TFRecord files (through `tf.data`, so `gs://` paths work) and in-memory prompts,
as `(number, record)` pairs for `tfgen.batch.rows.build_table`."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from tfgen.batch.options import INPUT_FORMATS
from tfgen.batch.rows import Unreadable

# Lines (or records) `tf.data` hands over per batch: fewer host round trips than one at a time.
_READ_CHUNK = 1024


def input_records(path: str, input_format: str) -> tuple[Iterator[tuple[int, Any]], str]:
    """The records of a JSONL or TFRecord file and the unit naming their positions ("line" or "record").

    `input_format` is one of `INPUT_FORMATS`; "auto" reads `.tfrecord` / `.tfrecords` (optionally `.gz`) as
    TFRecords and anything else as JSONL. Raises OSError when the file does not exist.
    """
    if input_format not in INPUT_FORMATS:
        raise ValueError(f"input_format must be one of {INPUT_FORMATS}, got {input_format!r}")
    if not tf.io.gfile.exists(path):
        raise OSError(f"input: {path} does not exist")
    if input_format == "auto":
        stem = path[: -len(".gz")] if path.endswith(".gz") else path
        input_format = "tfrecord" if stem.endswith((".tfrecord", ".tfrecords")) else "jsonl"
    if input_format == "tfrecord":
        return _tfrecord_records(path), "record"
    return _jsonl_records(path), "line"


def prompt_records(prompts) -> Iterator[tuple[int, Any]]:
    """In-memory prompts as records: strings and id lists get their index as id; dicts are taken as they are."""
    if isinstance(prompts, (str, bytes, dict)) or not isinstance(prompts, Iterable):
        raise TypeError(f"prompts must be a sequence of strings, token-id lists or dicts, got {type(prompts).__name__}")
    for index, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            yield index, {"id": index, "prompt": prompt}
        elif isinstance(prompt, (list, tuple, np.ndarray)):
            yield index, {"id": index, "input_ids": np.asarray(prompt).tolist()}
        else:
            yield index, prompt


def _jsonl_records(path: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object or `Unreadable`) per non-blank line."""
    number = 0
    for lines in tf.data.TextLineDataset(path).batch(_READ_CHUNK).prefetch(2).as_numpy_iterator():
        for raw in lines:
            number += 1
            if not raw.strip():
                continue
            try:
                yield number, json.loads(raw)
            except ValueError as error:  # bad JSON and bad UTF-8 alike
                yield number, Unreadable(f"malformed JSON ({error})")


def _example_record(raw: bytes):
    """A `tf.train.Example` as a JSONL-like dict: `id` (one bytes or int64 value), `input_ids` (int64 list)
    or `prompt` (one UTF-8 bytes value); other features are ignored."""
    try:
        features = tf.train.Example.FromString(raw).features.feature
    except Exception as error:  # noqa: BLE001 (protobuf's DecodeError has no stable import path)
        return Unreadable(f"not a tf.train.Example ({error})")
    record = {}
    for name in ("id", "prompt", "input_ids"):
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


def _tfrecord_records(path: str) -> Iterator[tuple[int, Any]]:
    """(record number, dict or `Unreadable`) per record; GZIP when the name ends in .gz."""
    dataset = tf.data.TFRecordDataset(path, compression_type="GZIP" if path.endswith(".gz") else "")
    number = 0
    try:
        for raw in dataset.prefetch(_READ_CHUNK).as_numpy_iterator():
            number += 1
            yield number, _example_record(raw)
    except tf.errors.DataLossError as error:
        # A broken frame hides where the following records start, so nothing after it can be trusted.
        raise ValueError(f"input: record {number + 1} of {path} is corrupted: {error.message}") from None
