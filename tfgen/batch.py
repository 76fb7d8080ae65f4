"""Generation over many prompts: length-bucketed batches on every replica of a `tf.distribute` strategy, with a
crash-safe, resumable JSONL output. The design and the multi-device recipes are in `docs/batch.md`.

The work is cut into *windows* of consecutive input rows. Inside a window rows are sorted by prompt length and
cut into *groups* of `batch_size` rows padded to one length bucket; each group is one compiled generate call on
one replica, and a *step* runs one group per replica with `strategy.run`. A window's results are appended to the
output in input order, with flush and fsync, before the next window starts. Which rows form a group, and how
wide it is, depends only on the input, `batch_size` and `window` — never on the number of replicas or on where a
run was interrupted — and every row samples with its own key derived from the job seed and its id. So a resumed
run, or a run on 2 or 64 replicas, writes exactly the rows an uninterrupted single-device run writes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf

from tfgen.config import GenerationConfig
from tfgen.generation import DEFAULT_BUCKETS, _announce_compile, _prepare_request, _Request, _resolve_config
from tfgen.random import derive_seeds

DEFAULT_BATCH_SIZE = 8
DEFAULT_SEED = (0, 0)
#: The default window is this many groups of `batch_size` rows.
WINDOW_GROUPS = 64
#: New tokens per row when neither the call nor the generation config sets `max_new_tokens` (HF's default).
DEFAULT_MAX_NEW_TOKENS = 20
STRATEGIES = ("auto", "default", "mirrored", "tpu", "multi-worker")
ON_ERROR = ("stop", "skip")
INPUT_FORMATS = ("auto", "jsonl", "tfrecord")
#: Test hook: the process SIGKILLs itself once it has appended this many bytes to the partial output
#: (cutting the write there), i.e. a crash at an exact byte offset, torn last line included.
KILL_AFTER_BYTES_ENV = "TFGEN_BATCH_KILL_AFTER_BYTES"

_READ_CHUNK = 1024
_SHOWN_BAD_ROWS = 20
# generate() arguments that a batch job sets itself, or whose meaning depends on how rows were padded together.
_JOB_CONTROLLED_OPTIONS = {
    "input_ids": "rows come from `prompts`",
    "attention_mask": "rows come from `prompts`",
    "max_length": "it counts the padded prompt, which depends on the batch; use max_new_tokens",
    "jit_compile": "batch jobs always run the compiled program",
}


# ----------------------------------------------------------------------------------------------------------
# Input rows


@dataclasses.dataclass(frozen=True)
class BadRow:
    """An input row that cannot be generated: its position (`unit` "line", "record" or "index", `number`),
    its id when it has a usable one, and why."""

    number: int
    id: Any
    reason: str
    unit: str = "line"

    def __str__(self) -> str:
        return f"{self.unit} {self.number}: {self.reason}"

    def to_json(self) -> dict:
        return {self.unit: self.number, "id": self.id, "error": self.reason}


@dataclasses.dataclass
class _PromptTable:
    """The valid rows of an input, in input order.

    ids: each row's id as given (str or int). tokens: int32 `[total]`, every prompt's token ids back to back.
    offsets: int64 `[n + 1]`; row `i` is `tokens[offsets[i]:offsets[i + 1]]`.
    """

    ids: list
    tokens: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def lengths(self) -> np.ndarray:
        """int64 `[n]` prompt lengths."""
        return np.diff(self.offsets)

    def prompt(self, row: int) -> np.ndarray:
        return self.tokens[self.offsets[row] : self.offsets[row + 1]]

    def fingerprint(self) -> str:
        """sha256 of the ids and token ids: two inputs with the same fingerprint produce the same output."""
        digest = hashlib.sha256()
        digest.update("\n".join(_id_key(row_id) for row_id in self.ids).encode())
        digest.update(self.offsets.astype("<i8").tobytes())
        digest.update(self.tokens.astype("<i4").tobytes())
        return digest.hexdigest()


class _Unreadable(NamedTuple):
    """A record that could not even be parsed (bad JSON, not a tf.train.Example)."""

    reason: str


@dataclasses.dataclass(frozen=True)
class _RowRules:
    """What a valid row needs: token ids inside the vocabulary and short enough for the model."""

    vocab_size: int
    max_prompt_tokens: Optional[int]
    max_new_tokens: int
    bos_token_id: Optional[int]
    tokenizer: Any
    unit: str


def _id_key(row_id) -> str:
    """Canonical text of an id: 1 and "1" stay different ids."""
    return json.dumps(row_id, ensure_ascii=False)


def _check_record(record, rules: _RowRules) -> tuple[Optional[str], Any]:
    """Returns (what is wrong or None, the row id or None) for one parsed record."""
    if isinstance(record, _Unreadable):
        return record.reason, None
    if not isinstance(record, dict):
        return f"expected an object with 'id' and 'prompt' or 'input_ids', got {type(record).__name__}", None
    if "id" not in record:
        return "missing 'id'", None
    row_id = record["id"]
    if isinstance(row_id, bool) or not isinstance(row_id, (int, str)):
        return f"'id' must be a string or an integer, got {row_id!r}", None
    if ("prompt" in record) == ("input_ids" in record):
        return "needs exactly one of 'prompt' (text) and 'input_ids' (token ids)", row_id
    if "prompt" in record:
        if not isinstance(record["prompt"], str):
            return f"'prompt' must be a string, got {type(record['prompt']).__name__}", row_id
        if rules.tokenizer is None:
            return "has a text 'prompt' but no tokenizer was given (pass one, or give 'input_ids')", row_id
        return None, row_id
    ids = record["input_ids"]
    if not isinstance(ids, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
        return "'input_ids' must be a list of integers", row_id
    return None, row_id


def _check_tokens(tokens: list, rules: _RowRules) -> tuple[Optional[str], list]:
    """Returns (what is wrong or None, the prompt ids to use); an empty prompt starts from bos."""
    outside = [t for t in tokens if not 0 <= t < rules.vocab_size]
    if outside:
        return f"token id {outside[0]} is outside the vocabulary [0, {rules.vocab_size})", tokens
    if not tokens:
        if rules.bos_token_id is None:
            return "the prompt is empty and the model has no bos_token_id to start from", tokens
        tokens = [rules.bos_token_id]
    if rules.max_prompt_tokens is not None and len(tokens) > rules.max_prompt_tokens:
        return (
            f"the prompt has {len(tokens)} tokens; with max_new_tokens={rules.max_new_tokens} the model's "
            f"{rules.max_prompt_tokens + rules.max_new_tokens} positions leave room for {rules.max_prompt_tokens}"
        ), tokens
    return None, tokens


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _build_table(records: Iterable[tuple[int, Any]], rules: _RowRules) -> tuple[_PromptTable, list[BadRow]]:
    """Validates and tokenizes `(number, record)` pairs (records are dicts or `_Unreadable`) in input order.

    Every problem is collected (none stops the scan), so one pass reports all bad rows. Ids must be unique
    across the whole input; a repeated id is bad even when its first row was bad for another reason.
    """
    ids, prompts, bad = [], [], []
    first_seen: dict[str, int] = {}
    for chunk in _chunks(records, _READ_CHUNK):
        accepted = []
        for number, record in chunk:
            problem, row_id = _check_record(record, rules)
            if row_id is not None and problem is None:
                key = _id_key(row_id)
                if key in first_seen:
                    problem = f"duplicate id {row_id!r} (first on {rules.unit} {first_seen[key]})"
                else:
                    first_seen[key] = number
            if problem is None:
                accepted.append((number, row_id, record))
            else:
                bad.append(BadRow(number, row_id, problem, rules.unit))
        texts = [record["prompt"] for _, _, record in accepted if "prompt" in record]
        encoded = iter(rules.tokenizer(texts, padding=False, return_tensors=None)["input_ids"] if texts else ())
        for number, row_id, record in accepted:
            problem, tokens = _check_tokens(next(encoded) if "prompt" in record else record["input_ids"], rules)
            if problem is None:
                ids.append(row_id)
                prompts.append(np.asarray(tokens, np.int32))
            else:
                bad.append(BadRow(number, row_id, problem, rules.unit))
    bad.sort(key=lambda row: row.number)
    lengths = np.array([len(p) for p in prompts], np.int64)
    table = _PromptTable(
        ids=ids,
        tokens=np.concatenate(prompts) if prompts else np.zeros([0], np.int32),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
    )
    return table, bad


def _jsonl_records(path: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object or `_Unreadable`) per non-blank line."""
    number = 0
    for lines in tf.data.TextLineDataset(path).batch(_READ_CHUNK).prefetch(2).as_numpy_iterator():
        for raw in lines:
            number += 1
            if not raw.strip():
                continue
            try:
                yield number, json.loads(raw)
            except ValueError as error:  # bad JSON and bad UTF-8 alike
                yield number, _Unreadable(f"malformed JSON ({error})")


def _example_record(raw: bytes):
    """A `tf.train.Example` as a JSONL-like dict: `id` (one bytes or int64 value), `input_ids` (int64 list)
    or `prompt` (one UTF-8 bytes value); other features are ignored."""
    try:
        features = tf.train.Example.FromString(raw).features.feature
    except Exception as error:  # protobuf's DecodeError has no stable import path
        return _Unreadable(f"not a tf.train.Example ({error})")
    record = {}
    for name in ("id", "prompt", "input_ids"):
        if name not in features:
            continue
        kind = features[name].WhichOneof("kind")
        values = list(getattr(features[name], kind).value) if kind else []
        if name == "input_ids":
            if kind != "int64_list":
                return _Unreadable(f"feature 'input_ids' must be an int64 list, got {kind}")
            record[name] = [int(value) for value in values]
            continue
        if len(values) == 1 and kind == "bytes_list":
            try:
                record[name] = values[0].decode("utf-8")
            except UnicodeDecodeError as error:
                return _Unreadable(f"feature {name!r} is not UTF-8 ({error})")
        elif len(values) == 1 and kind == "int64_list" and name == "id":
            record[name] = int(values[0])
        else:
            allowed = "bytes or int64 value" if name == "id" else "bytes value"
            return _Unreadable(f"feature {name!r} must hold exactly one {allowed}")
    return record


def _tfrecord_records(path: str) -> Iterator[tuple[int, Any]]:
    """(record number, dict or `_Unreadable`) per record; GZIP when the name ends in .gz."""
    dataset = tf.data.TFRecordDataset(path, compression_type="GZIP" if path.endswith(".gz") else "")
    number = 0
    try:
        for raw in dataset.prefetch(_READ_CHUNK).as_numpy_iterator():
            number += 1
            yield number, _example_record(raw)
    except tf.errors.DataLossError as error:
        # A broken frame hides where the following records start, so nothing after it can be trusted.
        raise ValueError(f"input: record {number + 1} of {path} is corrupted: {error.message}") from None


def _input_records(path: str, input_format: str) -> tuple[Iterator[tuple[int, Any]], str]:
    """The records of a JSONL or TFRecord file and the unit naming their positions ("line" or "record")."""
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


def _prompt_records(prompts) -> Iterator[tuple[int, Any]]:
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


def _bad_rows_message(bad: Sequence[BadRow], source: str) -> str:
    shown = "\n".join(f"  {row}" for row in bad[:_SHOWN_BAD_ROWS])
    more = f"\n  ... and {len(bad) - _SHOWN_BAD_ROWS} more" if len(bad) > _SHOWN_BAD_ROWS else ""
    return f"{source}: {len(bad)} bad row(s), nothing was generated:\n{shown}{more}"


# ----------------------------------------------------------------------------------------------------------
# Seeds, plan and the distributed run


def row_seeds(seed, row_ids: Sequence) -> np.ndarray:
    """int32 `[n, 2]` sampling keys, one per row id, from the job seed `[2]`.

    Each key derives from the job seed and a 64-bit hash (sha256) of the id's JSON text, through two
    `derive_seeds` steps (the high, then the low 32 bits), so a row samples the same tokens whatever batch,
    position or replica it lands in, and two ids share a key only with probability ~2**-64.
    """
    job_seed = _check_job_seed(seed)
    if not len(row_ids):
        return np.zeros([0, 2], np.int32)
    hashes = np.array(
        [int.from_bytes(hashlib.sha256(_id_key(row_id).encode()).digest()[:8], "big") for row_id in row_ids],
        np.uint64,
    )
    keys = np.tile(job_seed, [len(row_ids), 1])
    for half in (hashes >> np.uint64(32), hashes & np.uint64(0xFFFFFFFF)):
        keys = derive_seeds(keys, half.astype(np.int64)).numpy()
    return keys


def _check_job_seed(seed) -> np.ndarray:
    array = np.asarray(seed)
    if array.shape != (2,) or array.dtype == object or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"seed must be two integers, got {seed!r}")
    if array.min() < -(2**31) or array.max() >= 2**32:
        raise ValueError(f"seed values must fit in 32 bits, got {seed!r}")
    return (array.astype(np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


class _Group(NamedTuple):
    """Rows (table indices) generated together in one compiled call, left-padded to `width` columns."""

    rows: np.ndarray
    width: int


def _plan_window(lengths: np.ndarray, start: int, stop: int, batch_size: int, buckets) -> list[_Group]:
    """Groups of rows `[start, stop)`: sorted by length (ties in input order), cut every `batch_size` rows."""
    order = start + np.argsort(lengths[start:stop], kind="stable")
    return [
        _Group(rows, buckets.prompt_length(int(lengths[rows].max())))
        for rows in np.split(order, np.arange(batch_size, len(order), batch_size))
    ]


def _steps(groups: list[_Group], replicas: int) -> Iterator[list[Optional[_Group]]]:
    """Lists of `replicas` groups of one width (one compiled program); `None` fills a short last step."""
    by_width: dict[int, list[_Group]] = {}
    for group in groups:
        by_width.setdefault(group.width, []).append(group)
    for same_width in by_width.values():
        for first in range(0, len(same_width), replicas):
            step = same_width[first : first + replicas]
            yield step + [None] * (replicas - len(step))


def _backing_variable(variable):
    # Keras 3 variables wrap the tf.Variable (a MirroredVariable etc. under a strategy) in `.value`.
    return variable if isinstance(variable, tf.Variable) else variable.value


def _resolve_job_config(model, generation_config, generate_kwargs) -> GenerationConfig:
    """The job's config: `generation_config` (or the model's) updated with `generate_kwargs`, with
    `max_new_tokens` set; raises for options a batch job cannot honour per row."""
    for name, why in _JOB_CONTROLLED_OPTIONS.items():
        if name in generate_kwargs:
            raise ValueError(f"{name}: not a batch option ({why}).")
    config, _ = _resolve_config(model, generation_config, dict(generate_kwargs))
    if config.min_length:
        raise ValueError(
            f"min_length={config.min_length} counts the padded prompt, which depends on the batch; use min_new_tokens."
        )
    if (config.num_return_sequences or 1) != 1:
        raise ValueError("num_return_sequences: a batch job writes one continuation per row; repeat rows instead.")
    for flag in ("return_dict_in_generate", "output_scores", "output_logits"):
        if getattr(config, flag):
            raise ValueError(f"{flag}: a batch job writes ids and text only.")
    if config.max_new_tokens is None:
        config.max_new_tokens = DEFAULT_MAX_NEW_TOKENS
    return config


class _BatchRunner:
    """Runs the planned groups of a `_PromptTable` on the replicas of a strategy and shapes the results."""

    def __init__(self, model, strategy, generation_config, tokenizer, batch_size, window, seed, generate_kwargs):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        window = WINDOW_GROUPS * batch_size if window is None else window
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive integer (rows), got {window!r}")
        self.strategy = strategy or tf.distribute.get_strategy()
        if not all(self.strategy.extended.variable_created_in_scope(_backing_variable(v)) for v in model.variables):
            raise ValueError(
                "model: its weights were not created under this strategy's scope; build or load the model inside "
                "`with strategy.scope():` so that every replica holds a copy."
            )
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.window = window
        self.job_seed = _check_job_seed(seed)
        self.config = _resolve_job_config(model, generation_config, generate_kwargs)
        self.max_new_tokens = int(self.config.max_new_tokens)
        self.eos_ids = self.config.eos_token_ids()
        self.pad_id = self.config.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.eos_ids[0] if self.eos_ids else 0
        self.buckets = getattr(model, "generation_buckets", DEFAULT_BUCKETS)
        self.replicas = self.strategy.num_replicas_in_sync
        self._step_functions: dict = {}
        #: Called before a step that compiles (a progress line must end before the compile message).
        self.before_compile = lambda: None
        # Preparing one row now surfaces every option error (unsupported mode, bad values) before any input is read.
        self._request(None, None, self.buckets.prompt_length(1))

    def rules(self, unit: str) -> _RowRules:
        max_positions = getattr(self.model.config, "max_position_embeddings", None)
        return _RowRules(
            vocab_size=int(self.model.config.vocab_size),
            max_prompt_tokens=None if max_positions is None else int(max_positions) - self.max_new_tokens,
            max_new_tokens=self.max_new_tokens,
            bos_token_id=self.config.bos_token_id,
            tokenizer=self.tokenizer,
            unit=unit,
        )

    def settings(self) -> dict:
        """Everything besides the input that decides the output (a resumed job must match it exactly)."""
        return {
            "model": _model_digest(self.model),
            "generation_config": json.loads(self.config.to_json_string()),
            "seed": self.job_seed.tolist(),
            "batch_size": self.batch_size,
            "window": self.window,
            "buckets": dataclasses.asdict(self.buckets),
        }

    def windows(self, table: _PromptTable, first_row: int = 0) -> Iterator[tuple[int, list[dict]]]:
        """Yields `(start, results)` per window from the one holding `first_row`; `results` are the output
        records of rows `[start, start + len(results))` in input order."""
        if first_row >= len(table):
            return
        lengths = table.lengths
        for start in range(first_row - first_row % self.window, len(table), self.window):
            stop = min(start + self.window, len(table))
            new_tokens: list = [None] * (stop - start)
            for step in _steps(_plan_window(lengths, start, stop, self.batch_size, self.buckets), self.replicas):
                for group, tokens in zip(step, self._run_step(table, step)):
                    for row, row_tokens in zip(group.rows if group is not None else (), tokens):
                        new_tokens[row - start] = row_tokens
            yield start, self._records(table, start, new_tokens)

    def _records(self, table: _PromptTable, start: int, new_tokens: list) -> list[dict]:
        finished = [self._trim(tokens) for tokens in new_tokens]
        token_lists = [tokens for tokens, _ in finished]
        texts = (
            self.tokenizer.batch_decode(token_lists, skip_special_tokens=True)
            if self.tokenizer is not None
            else [None] * len(token_lists)
        )
        return [
            {"id": table.ids[start + offset], "text": text, "token_ids": tokens, "finish_reason": reason}
            for offset, (text, (tokens, reason)) in enumerate(zip(texts, finished))
        ]

    def _trim(self, tokens: np.ndarray) -> tuple[list, str]:
        """The generated ids up to and including the first eos, and why the row stopped."""
        hits = np.flatnonzero(np.isin(tokens, self.eos_ids)) if self.eos_ids else ()
        if len(hits):
            return tokens[: hits[0] + 1].tolist(), "eos"
        return tokens.tolist(), "length"

    def _request(self, table: Optional[_PromptTable], group: Optional[_Group], width: int) -> _Request:
        """The prepared generate call of one group at `width` columns (`None`: a filler group whose rows
        generate nothing)."""
        rows = group.rows if group is not None else ()
        ids = np.full((self.batch_size, width), self.pad_id, np.int32)
        mask = np.zeros((self.batch_size, width), np.int32)
        mask[:, -1] = 1  # filler rows need one visible token to pass the checks; their budget is 0
        for index, row in enumerate(rows):
            prompt = table.prompt(row)
            ids[index, width - len(prompt) :] = prompt
            mask[index, width - len(prompt) :] = 1
        seeds = None
        if self.config.do_sample:
            seeds = np.zeros((self.batch_size, 2), np.int32)
            seeds[: len(rows)] = row_seeds(self.job_seed, [table.ids[row] for row in rows])
        request = _prepare_request(self.model, ids, self.config, None, seeds, {"attention_mask": mask})
        budgets = np.zeros(request.decode_inputs.max_new_tokens.shape, np.int32)
        budgets[: len(rows)] = self.max_new_tokens
        request.decode_inputs = request.decode_inputs._replace(max_new_tokens=tf.constant(budgets))
        return request

    def _run_step(self, table: _PromptTable, step: list[Optional[_Group]]) -> list[np.ndarray]:
        """Runs one group per replica; returns each group's new tokens int32 `[rows, max_new_tokens]`."""
        width = step[0].width
        requests = [self._request(table, group, width) for group in step]
        step_function, is_new = self._step_function(requests[0])
        inputs = self.strategy.experimental_distribute_values_from_function(
            lambda context: requests[context.replica_id_in_sync_group].decode_inputs
        )
        if is_new:
            self.before_compile()
        with _announce_compile(requests[0], is_new, what=f"generate on {self.replicas} replica(s)"):
            new_tokens = step_function(inputs).numpy()
        per_replica = np.split(new_tokens, self.replicas)
        # Strategies that return several rows per prompt (beams) put the chosen one first.
        rows_per_prompt = len(per_replica[0]) // requests[0].padded_batch_size
        return [
            block[: len(group.rows) * rows_per_prompt : rows_per_prompt, : self.max_new_tokens]
            if group is not None else block[:0]
            for group, block in zip(step, per_replica)
        ]

    def _step_function(self, request: _Request):
        """Returns `(step_function, is_new)`: a tf.function running the request's compiled program on every
        replica and gathering the new tokens `[replicas * rows, buffer_new_tokens]`; one per program
        (TPUStrategy.run must be called inside a tf.function)."""
        step_function = self._step_functions.get(request.static_key)
        if step_function is not None:
            return step_function, False
        program, _ = self.model._generate_program(request, True)
        strategy, new_columns = self.strategy, request.buffer_new_tokens

        def step(inputs):
            # A lambda, not `program` itself: MirroredStrategy.run hands a tf.function its PerReplica values unsplit.
            new_tokens = strategy.run(lambda replica_inputs: program(replica_inputs)["sequences"][:, -new_columns:],
                                      args=(inputs,))
            return strategy.gather(new_tokens, axis=0)

        step_function = self._step_functions[request.static_key] = tf.function(step)
        return step_function, True


def _model_digest(model) -> str:
    """A cheap identity of the weights (names, shapes and the first values of each floating-point variable), to
    refuse resuming a job with another model. Integer state such as a dropout seed differs per process."""
    digest = hashlib.sha256()
    for variable in model.variables:
        value = np.asarray(variable.numpy())
        if value.dtype.kind != "f":
            continue
        digest.update(f"{getattr(variable, 'path', variable.name)}{value.shape}{value.dtype}".encode())
        digest.update(np.ascontiguousarray(value.reshape(-1)[:64]).tobytes())
    return digest.hexdigest()


def batch_generate(
    model,
    prompts,
    strategy: Optional[tf.distribute.Strategy] = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    generation_config: Optional[GenerationConfig] = None,
    tokenizer=None,
    seed=DEFAULT_SEED,
    window: Optional[int] = None,
    **generate_kwargs,
) -> list[dict]:
    """Generates a continuation for every prompt, on every replica of `strategy`, in memory.

    Args:
        model: a tfgen causal LM, built or loaded under `strategy.scope()`.
        prompts: strings (needs `tokenizer`), token-id lists, or dicts `{"id", "prompt" | "input_ids"}`; strings
            and lists get their index as id.
        strategy: a `tf.distribute.Strategy`; default: the current one (one device unless inside a scope).
        batch_size: rows per compiled call on one replica (a power of two or multiple of 8 avoids padding rows).
        generation_config / **generate_kwargs: as for `model.generate` (`max_new_tokens`, `do_sample`, `top_p`,
            ...); `max_new_tokens` defaults to the config's, else 20. `max_length` and `min_length` are refused:
            they count the padded prompt, which depends on the batch.
        tokenizer: a `tfgen.Tokenizer` to encode text prompts and decode `text`; without it `text` is None.
        seed: the job seed `[2]`; row keys derive from it and each row's id (see `row_seeds`).
        window: rows sorted by length together (default `64 * batch_size`); with `batch_size` it decides the
            batches, so keep both fixed to reproduce a run bit for bit.

    Returns:
        One dict per prompt, in order: `id`, `text` (the continuation only), `token_ids` (generated ids, up to
        and including eos) and `finish_reason` ("eos" or "length").

    Raises:
        ValueError naming every bad prompt (index and reason) before anything is generated.
    """
    runner = _BatchRunner(model, strategy, generation_config, tokenizer, batch_size, window, seed, generate_kwargs)
    table, bad = _build_table(_prompt_records(prompts), runner.rules("index"))
    if bad:
        raise ValueError(_bad_rows_message(bad, "prompts"))
    return [record for _, records in runner.windows(table) for record in records]


# ----------------------------------------------------------------------------------------------------------
# Files of a job


def _fsync_directory(path: str) -> None:
    descriptor = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_atomically(path: str, text: str) -> None:
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    _fsync_directory(path)


class _JobFiles:
    """The files of a job writing `<output>`.

    `<output>.job.json`: the manifest (settings that decide the output, state "running"/"complete").
    `<output>.partial`: finished windows, appended in input order with flush + fsync; renamed to `<output>`
    when the last window is written. `<output>.skipped.jsonl`: rows skipped with `on_error="skip"`.
    """

    def __init__(self, output: str):
        self.output = output
        self.partial = output + ".partial"
        self.manifest = output + ".job.json"
        self.skipped = output + ".skipped.jsonl"
        self._file = None
        self._appended = 0
        self.complete = False
        self.cut_bytes = 0  # bytes of an interrupted write dropped on resume
        limit = os.environ.get(KILL_AFTER_BYTES_ENV)
        self._kill_after = int(limit) if limit else None

    def start(self, settings: dict, expected_ids: list) -> int:
        """Opens the job: returns how many rows are already written (all of them when the job is complete).

        Raises ValueError when the files belong to another job (other settings or input), or when `<output>`
        exists without a manifest (not ours to overwrite).
        """
        manifest = _read_manifest(self.manifest)
        if manifest is None:
            for path in (self.output, self.partial):
                if os.path.exists(path):
                    raise ValueError(
                        f"output: {path} exists but {self.manifest} does not, so no tfgen batch job wrote it; "
                        "remove it or choose another output path."
                    )
            return self._fresh(settings)
        differing = sorted(key for key in settings.keys() | manifest["settings"].keys()
                           if settings.get(key) != manifest["settings"].get(key))
        if differing:
            raise ValueError(
                f"output: {self.output} belongs to a job with another {', '.join(differing)} (see {self.manifest}); "
                "rerun with the same arguments and input, or remove those files to start over."
            )
        if os.path.exists(self.partial):
            return self._recover(expected_ids)
        if os.path.exists(self.output):
            if manifest["state"] != "complete":  # killed between the final rename and the manifest update
                self._write_manifest(settings, "complete")
            self.complete = True
            return len(expected_ids)
        return self._fresh(settings)

    def _fresh(self, settings: dict) -> int:
        self._write_manifest(settings, "running")
        with open(self.partial, "wb") as file:
            os.fsync(file.fileno())
        _fsync_directory(self.partial)
        return 0

    def _recover(self, expected_ids: list) -> int:
        """Keeps the partial output up to the first incomplete or unreadable line (what a crash leaves: a write
        cut short, or unsynced garbage after a power loss) and cuts the rest, after checking that the kept rows
        are this job's first rows; returns their count (and sets `cut_bytes`)."""
        count = kept_bytes = 0
        with open(self.partial, "rb") as file:
            for line in file:
                try:
                    row_id = json.loads(line)["id"] if line.endswith(b"\n") else None
                except (ValueError, KeyError, TypeError):
                    row_id = None
                if row_id is None:
                    break
                if count >= len(expected_ids) or _id_key(row_id) != _id_key(expected_ids[count]):
                    raise ValueError(
                        f"output: line {count + 1} of {self.partial} has id {row_id!r}, which is not this job's "
                        f"row {count + 1}; remove the output files to start over."
                    )
                count += 1
                kept_bytes += len(line)
        self.cut_bytes = os.path.getsize(self.partial) - kept_bytes
        if self.cut_bytes:
            os.truncate(self.partial, kept_bytes)
        return count

    def append(self, records: list[dict]) -> None:
        """Appends result rows as one write, flushed and fsynced before returning."""
        if self._file is None:
            self._file = open(self.partial, "ab")
        data = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records).encode("utf-8")
        crash = self._kill_after is not None and self._appended + len(data) > self._kill_after
        if crash:
            data = data[: self._kill_after - self._appended]
        self._file.write(data)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._appended += len(data)
        if crash:
            os.kill(os.getpid(), signal.SIGKILL)

    def finish(self, settings: dict) -> None:
        """Publishes the complete output under its final name and marks the job complete."""
        if self._file is not None:
            self._file.close()
        os.replace(self.partial, self.output)
        _fsync_directory(self.output)
        self._write_manifest(settings, "complete")
        self.complete = True

    def write_skipped(self, bad: list[BadRow]) -> None:
        if bad:
            lines = "".join(json.dumps(row.to_json(), ensure_ascii=False) + "\n" for row in bad)
            _write_atomically(self.skipped, lines)
        elif os.path.exists(self.skipped):
            os.remove(self.skipped)  # left by an earlier job on this path; this input skips nothing

    def _write_manifest(self, settings: dict, state: str) -> None:
        _write_atomically(self.manifest, json.dumps({"state": state, "settings": settings}, indent=2) + "\n")


def _read_manifest(path: str) -> Optional[dict]:
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as file:
            manifest = json.load(file)
        if isinstance(manifest, dict) and isinstance(manifest.get("settings"), dict) and "state" in manifest:
            return manifest
    except ValueError:
        pass
    raise ValueError(f"output: {path} is not a tfgen batch manifest; remove it (and the output files) to start over")


# ----------------------------------------------------------------------------------------------------------
# Progress and the file job


class _Progress:
    """A progress line on a stream: rows done, generated tokens per second and ETA. Redrawn in place on a
    terminal (at most 5 times a second), one line every 10 s otherwise."""

    def __init__(self, total: int, done: int, stream=None, enabled: bool = True):
        self.total, self.done, self.tokens = total, done, 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = self.last_drawn = time.monotonic()
        self.first = done
        self.drawn = False  # a line drawn in place is showing
        self.drawn_rows = None

    def advance(self, rows: int, tokens: int) -> None:
        self.done += rows
        self.tokens += tokens
        if time.monotonic() - self.last_drawn >= (0.2 if self.interactive else 10.0):
            self._draw()

    def close(self) -> None:
        if self.drawn_rows != self.done:
            self._draw()
        self.end_line()

    def end_line(self) -> None:
        """Moves a line drawn in place out of the way of other messages."""
        if self.enabled and self.interactive and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = (self.done - self.first) / elapsed
        remaining = self.total - self.done
        eta = _clock(remaining / rate) if rate > 0 else "?"
        filled = int(20 * self.done / self.total) if self.total else 20
        percent = 100.0 * self.done / self.total if self.total else 100.0
        return (
            f"[{'#' * filled}{'.' * (20 - filled)}] {self.done}/{self.total} rows ({percent:.1f}%) | "
            f"{self.tokens / elapsed:,.0f} tok/s | ETA {eta}"
        )

    def _draw(self) -> None:
        self.last_drawn = time.monotonic()
        self.drawn_rows = self.done
        if self.enabled:
            self.stream.write(("\r" if self.interactive else "") + self.line() + ("" if self.interactive else "\n"))
            self.stream.flush()
            self.drawn = self.interactive


def _clock(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


@dataclasses.dataclass
class BatchJobResult:
    """What one `run_batch_job` call did: `rows` valid rows in the input, `skipped` bad rows left out,
    `resumed_from` rows already written before this run, `new_tokens` generated by this run in `seconds`."""

    output: str
    rows: int
    skipped: int
    resumed_from: int
    new_tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


def _worker_count(strategy) -> int:
    try:
        local_replicas = len(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy has no device list: one process, one device
        return 1
    return strategy.num_replicas_in_sync // local_replicas


def _agree_on_start(strategy, written: Optional[int]) -> int:
    """Every worker learns the chief's resume row (`written`; None on other workers and on a chief that failed,
    which makes every worker fail instead of waiting forever in the first collective)."""
    if _worker_count(strategy) == 1:
        return written
    if strategy.extended.should_checkpoint:
        value = -1 if written is None else written
    else:
        value = -2  # no say: the maximum over all replicas is the chief's value
    votes = strategy.gather(
        strategy.experimental_distribute_values_from_function(lambda _: tf.constant([value], tf.int64)), axis=0
    )
    agreed = int(tf.reduce_max(votes))
    if agreed < 0:
        raise ValueError("the chief worker could not open the output (see its log); nothing was generated.")
    return agreed


def run_batch_job(
    model,
    input_path: str,
    output_path: str,
    *,
    strategy: Optional[tf.distribute.Strategy] = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    window: Optional[int] = None,
    generation_config: Optional[GenerationConfig] = None,
    tokenizer=None,
    seed=DEFAULT_SEED,
    on_error: str = "stop",
    input_format: str = "auto",
    progress: bool = True,
    progress_stream=None,
    **generate_kwargs,
) -> BatchJobResult:
    """Generates for every row of a JSONL or TFRecord file into a JSONL file, resumably.

    Input rows: JSONL objects `{"id": str | int, "prompt": str}` or `{"id": ..., "input_ids": [int, ...]}`
    (blank lines are ignored), or `tf.train.Example` records with an `id` feature (one bytes or int64 value)
    and an `input_ids` int64 feature (or a `prompt` bytes feature); `.gz` TFRecords are read as GZIP.

    Output: `output_path` gets one JSON object per valid row, in input order (see `batch_generate`). The job
    is crash-safe: windows are appended to `<output>.partial` with flush + fsync, and a rerun with the same
    arguments checks `<output>.job.json`, cuts a torn last line, skips the rows already written and ends with
    every row exactly once, identical to an uninterrupted run. On several workers
    (MultiWorkerMirroredStrategy) every worker runs this with the same arguments; only the chief writes.

    on_error: "stop" raises ValueError naming every bad row (line number and reason) before generating;
    "skip" leaves them out, lists them on `progress_stream` and writes them to `<output>.skipped.jsonl`.
    Other arguments are those of `batch_generate`. Returns a `BatchJobResult`.
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    stream = progress_stream or sys.stderr
    runner = _BatchRunner(model, strategy, generation_config, tokenizer, batch_size, window, seed, generate_kwargs)
    records, unit = _input_records(os.fspath(input_path), input_format)
    table, bad = _build_table(records, runner.rules(unit))
    if bad and on_error == "stop":
        hint = "\n(on_error='skip', --on-error skip, skips them)"
        raise ValueError(_bad_rows_message(bad, f"input {input_path}") + hint)
    settings = {**runner.settings(), "input": table.fingerprint(), "rows": len(table)}
    files = _JobFiles(os.fspath(output_path))
    is_writer = runner.strategy.extended.should_checkpoint
    written = None
    if is_writer:
        try:
            written = files.start(settings, table.ids)
        except Exception:
            _agree_on_start(runner.strategy, None)
            raise
    written = _agree_on_start(runner.strategy, written)
    if is_writer:
        if 0 < written < len(table):
            cut = f" (dropped {files.cut_bytes} bytes of an interrupted write)" if files.cut_bytes else ""
            print(f"resuming: {written} of {len(table)} rows already written{cut}", file=stream)
        files.write_skipped(bad)
        if bad:
            print(f"skipping {len(bad)} bad row(s), listed in {files.skipped}:", file=stream)
            print("\n".join(f"  {row}" for row in bad[:_SHOWN_BAD_ROWS]), file=stream)
            if len(bad) > _SHOWN_BAD_ROWS:
                print(f"  ... and {len(bad) - _SHOWN_BAD_ROWS} more", file=stream)

    meter = _Progress(len(table), written, stream, enabled=progress and is_writer)
    runner.before_compile = meter.end_line
    started = time.monotonic()
    new_tokens = 0
    for start, results in runner.windows(table, written):
        fresh = results[max(written - start, 0) :]
        if is_writer:
            files.append(fresh)
        tokens = sum(len(record["token_ids"]) for record in fresh)
        new_tokens += tokens
        meter.advance(len(fresh), tokens)
    if is_writer and not files.complete:
        files.finish(settings)
    meter.close()
    return BatchJobResult(
        output=files.output,
        rows=len(table),
        skipped=len(bad),
        resumed_from=written,
        new_tokens=new_tokens,
        seconds=time.monotonic() - started,
    )


# ----------------------------------------------------------------------------------------------------------
# Strategies


def make_strategy(name: str = "auto", tpu: str = "local") -> tf.distribute.Strategy:
    """A `tf.distribute` strategy by name.

    "default": one device. "mirrored": every local GPU, or every logical CPU device when there is no GPU.
    "tpu": TPUStrategy on `tpu` ("local" on a TPU VM, else the TPU's name or grpc:// address).
    "multi-worker": MultiWorkerMirroredStrategy, configured by `TF_CONFIG`. "auto": multi-worker when
    `TF_CONFIG` lists several tasks, tpu when a TPU is visible or `TPU_NAME` is set, mirrored when there are
    several GPUs (or logical CPUs), else default.
    """
    if name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {name!r}")
    if name == "auto":
        name = _detect_strategy()
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
        return tf.distribute.MirroredStrategy([device.name for device in devices])
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    return tf.distribute.MultiWorkerMirroredStrategy()


def _detect_strategy() -> str:
    cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {})
    if sum(len(tasks) for tasks in cluster.values()) > 1:
        return "multi-worker"
    if os.environ.get("TPU_NAME") or tf.config.list_physical_devices("TPU"):
        return "tpu"
    if len(tf.config.list_logical_devices("GPU")) > 1 or len(tf.config.list_logical_devices("CPU")) > 1:
        return "mirrored"
    return "default"
