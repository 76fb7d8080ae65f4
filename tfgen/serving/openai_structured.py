"""`response_format` on the OpenAI-compatible routes: `{"type": "json_object"}` and `{"type": "json_schema",
"json_schema": {"name", "schema", "strict"}}` decode under the structured-output automaton
(`tfgen.structured`), through the export's `structured` signature (`tfgen.export.structured_inputs`).

The continuous-batching slot programs cannot carry an automaton, so such a request runs as one whole call of the
`structured` signature: its choices (`n` per prompt) are the call's rows, the prompts left-padded to a power-of-two
width (at least `MIN_WIDTH`) and the rows padded to a power of two with empty rows (budget 0), so few programs
compile. The automaton's tables are built with the export's tokenizer on a schema's first request and kept per
tokenizer (`TABLE_CACHE_SIZE`, least recently used dropped). `json_object` uses outlines-core's translation of
`{"type": "object"}` (`JSON_OBJECT_SCHEMA`): an object whose values nest at most two objects or arrays deep (the
innermost hold strings, numbers, booleans and null; arrays hold such scalars), strings without `\\u` escapes.

Honoured as in the engine's path: `seed` (the same per-row seed pairs, `openai_protocol.seed_pair`),
`temperature` (0: greedy, the signature's `top_k` 1), `top_p`, `max_tokens` (at most the export's buffer), `stop`
(cut out of the finished text, finish_reason "stop"), `n`, `stream` (the chunks are sent once the call ends: a
whole call has no partial output) and `stream_options`. A client that hangs up does not stop the call.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import threading
import weakref
from http import HTTPStatus

import numpy as np
import tensorflow as tf

from tfgen.export.saved_model import EXPORT_INFO_FILE
from tfgen.export.structured_inputs import STRUCTURED_SIGNATURE, structured_tables
from tfgen.serving.errors import error_text
from tfgen.serving.openai_protocol import CompletionRequest, OpenAIError, invalid, seed_pair
from tfgen.structured.automaton import build_automaton
from tfgen.structured.json_schema import schema_regex

#: The schema `{"type": "json_object"}` stands for: outlines-core's generic object (see the module docstring).
JSON_OBJECT_SCHEMA = {"type": "object"}
#: Automaton tables kept per tokenizer (one per schema and table size).
TABLE_CACHE_SIZE = 32
#: The narrowest prompt width a call is padded to.
MIN_WIDTH = 16
_NAME_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


@dataclasses.dataclass(frozen=True)
class ResponseFormat:
    """A checked `response_format`: `kind` "json_object" or "json_schema", and the JSON schema its output follows."""

    kind: str
    schema: dict


def parse_response_format(value) -> ResponseFormat | None:
    """The `response_format` a request sent (parsed JSON), checked: None for `{"type": "text"}` or no value; an
    OpenAIError 400 naming `response_format` for anything else OpenAI would not take."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text" and set(value) == {"type"}:
        return None
    if kind == "json_object" and set(value) == {"type"}:
        return ResponseFormat("json_object", JSON_OBJECT_SCHEMA)
    if kind != "json_schema":
        raise invalid("response_format", 'response_format must be {"type": "text"}, {"type": "json_object"} or '
                      '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}, got '
                      f"{json.dumps(value)[:80]}")
    spec = value.get("json_schema")
    if set(value) != {"type", "json_schema"} or not isinstance(spec, dict):
        raise invalid("response_format", 'a json_schema response_format is {"type": "json_schema", "json_schema": '
                      '{"name", "schema", "strict", "description"}}')
    unknown = set(spec) - {"name", "schema", "strict", "description"}
    if unknown:
        raise invalid("response_format", f"json_schema has fields this server does not take: {', '.join(unknown)}")
    name = spec.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= 64 or not set(name) <= _NAME_CHARACTERS:
        raise invalid("response_format", "json_schema.name must be 1 to 64 letters, digits, '_' or '-'")
    if spec.get("strict") not in (None, True, False):
        raise invalid("response_format", "json_schema.strict must be true or false")
    if not isinstance(spec.get("schema"), dict):
        raise invalid("response_format", "json_schema.schema must be a JSON schema object (this server needs one)")
    return ResponseFormat("json_schema", spec["schema"])


@dataclasses.dataclass
class _Choice:
    used: int  # completion tokens (`usage`)


class StructuredChoices:
    """The finished choices of a `response_format` request, as `openai_api`'s follower yields them: iterating gives
    `(choice index, text, finish_reason, token span)` once per choice; `rows[i].used` is choice i's completion
    tokens. It has no log-probabilities (`logprobs` is None: such requests are refused before the call)."""

    def __init__(self, texts: list, reasons: list, used: list):
        self.texts, self.reasons = texts, reasons
        self.rows = [_Choice(count) for count in used]

    def __iter__(self):
        return ((index, text, self.reasons[index], (0, 0)) for index, text in enumerate(self.texts))

    def logprobs(self, index: int, span: tuple) -> None:
        return None

    def close(self) -> None:
        """Nothing to cancel: the call has ended."""


def structured_choices(served, request: CompletionRequest, eos_ids) -> StructuredChoices:
    """Runs `request` (its `response_format` set) as one call of the served version's `structured` signature;
    `eos_ids`: the ids that end a row. OpenAIError 400 naming `response_format` when the export has no such
    signature or the schema cannot be used (unsupported, too large for the export's tables), naming the budget
    field when `max_tokens` is over the export's buffer."""
    response_format = parse_response_format(request.response_format)
    signature = served.signatures.get(STRUCTURED_SIGNATURE)
    if signature is None:
        raise invalid("response_format", f"model {request.model!r} was exported without the `structured` signature, "
                      "so it cannot follow a response_format; export it with `tfgen export --structured-inputs "
                      "STATES,CLASSES` (`tfgen serve --model` exports one; docs/serving.md gives the sizes schemas "
                      "need)")
    info = _export_info(served.directory)
    states, classes = info["structured_inputs"]["states"], info["structured_inputs"]["classes"]
    tables = _tables(served.tokenizer, response_format.schema, states, classes,
                     info["structured_inputs"]["vocab_size"])
    budget = info["max_new_tokens"] if request.max_tokens is None else request.max_tokens
    if budget > info["max_new_tokens"]:
        raise invalid(request.budget_field, f"{request.budget_field} is {budget}; with response_format this export "
                      f"allows at most {info['max_new_tokens']} new tokens (its buffer)")
    rows = [(ids, seed_pair(request.seed, prompt_index * request.n + choice))
            for prompt_index, ids in enumerate(request.prompts) for choice in range(request.n)]
    inputs = _call_inputs(rows, budget, request)
    try:
        outputs = signature(**{name: tf.constant(value) for name, value in {**inputs, **tables}.items()})
    except tf.errors.InvalidArgumentError as error:
        raise OpenAIError(HTTPStatus.BAD_REQUEST, error_text(error.message),
                          "messages" if request.chat else "prompt") from None
    sequences, lengths = outputs["sequences"].numpy(), outputs["sequence_lengths"].numpy()
    width, eos = inputs["input_ids"].shape[1], set(eos_ids)
    texts, reasons, used = [], [], []
    for index in range(len(rows)):
        tokens = sequences[index, width:int(lengths[index])].tolist()
        ended = bool(tokens) and tokens[-1] in eos
        text, count = _stopped(served.tokenizer, tokens, request.stop)
        texts.append(text if count is not None else _decode(served.tokenizer, tokens))
        reasons.append("stop" if ended or count is not None else "length")
        used.append(len(tokens) if count is None else count)
    return StructuredChoices(texts, reasons, used)


def _call_inputs(rows: list, budget: int, request: CompletionRequest) -> dict:
    """The signature's inputs for `rows` (`(prompt ids, seed pair)`): prompts left-padded to a power-of-two width
    (positions follow the mask, so padding changes no token), rows padded to a power of two with empty rows
    (budget 0)."""
    count = 1 << (len(rows) - 1).bit_length()
    width = max(MIN_WIDTH, 1 << (max(len(ids) for ids, _ in rows) - 1).bit_length())
    ids = np.zeros([count, width], np.int32)
    mask = np.zeros([count, width], np.int32)
    seeds = np.zeros([count, 2], np.int32)
    budgets = np.zeros([count], np.int32)
    for index, (prompt, seed) in enumerate(rows):
        ids[index, width - len(prompt):] = prompt
        mask[index, width - len(prompt):] = 1
        seeds[index], budgets[index] = seed, budget
    mask[len(rows):, -1] = 1  # an empty row still has one prompt token
    greedy = request.temperature == 0
    return {"input_ids": ids, "attention_mask": mask, "seed": seeds, "max_new_tokens": budgets,
            "temperature": np.full([count], 1.0 if greedy else request.temperature, np.float32),
            "top_k": np.full([count], 1 if greedy else 0, np.int32),
            "top_p": np.full([count], request.top_p, np.float32)}


def _decode(tokenizer, tokens: list) -> str:
    return tokenizer.decode(tokens, skip_special_tokens=True)


def _stopped(tokenizer, tokens: list, stops: tuple) -> tuple[str, int | None]:
    """(the text cut before its first stop string, the fewest tokens whose text reaches it), or (text, None)."""
    if not stops or not any(stop in _decode(tokenizer, tokens) for stop in stops):
        return "", None
    for count in range(1, len(tokens) + 1):
        text = _decode(tokenizer, tokens[:count])
        found = [position for position in (text.find(stop) for stop in stops) if position >= 0]
        if found:
            return text[:min(found)], count
    return "", None


_infos: dict = {}
_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _export_info(directory: str) -> dict:
    """The version's `tfgen_export.json` (read once per folder)."""
    if directory not in _infos:
        with open(os.path.join(directory, "assets.extra", EXPORT_INFO_FILE), encoding="utf-8") as file:
            _infos[directory] = json.load(file)
    return _infos[directory]


def _tables(tokenizer, schema: dict, states: int, classes: int, vocab_size: int) -> dict:
    """The `structured` signature's tables of `schema` over `tokenizer` (cached per tokenizer, least recently used
    dropped past `TABLE_CACHE_SIZE`). OpenAIError 400 naming `response_format` when the schema is unsupported or
    its automaton larger than the export's tables."""
    key = (json.dumps(schema, sort_keys=True), states, classes, vocab_size)
    with _lock:
        tables = _cache.setdefault(tokenizer, collections.OrderedDict())
        if key in tables:
            tables.move_to_end(key)
            return tables[key]
    try:
        automaton = build_automaton(tokenizer, vocab_size, schema_regex(schema), "json_schema")
        built = structured_tables(automaton, states, classes, vocab_size)
    except (ValueError, TypeError) as error:
        raise invalid("response_format", str(error)) from None
    except RuntimeError as error:
        raise OpenAIError(HTTPStatus.INTERNAL_SERVER_ERROR, str(error), "response_format") from None
    with _lock:
        tables[key] = built
        while len(tables) > TABLE_CACHE_SIZE:
            tables.popitem(last=False)
    return built


__all__ = ["JSON_OBJECT_SCHEMA", "TABLE_CACHE_SIZE", "ResponseFormat", "StructuredChoices", "parse_response_format",
           "structured_choices"]
