"""How `tfgen serve` runs requests through continuous batching: which requests go to the slot engine, how their
rows become engine rows and the engine's tokens become the signature's answer (the same tensors the signature
would return), and text streaming.

The engine takes greedy and sampling rows (the `greedy` and `sample` signatures, `serving_default` and
`generate_text` when the export's config decodes greedily or samples); beam search, contrastive search and prompt
lookup run as whole calls of their signatures, as do rows too long for a slot. `served` is always the
`tfgen.serving.served_model.ServedModel` a request is for (its `signatures`, `directory` and `engine`).
"""

from __future__ import annotations

import json
import logging
import os
import queue
from collections.abc import Iterator
from http import HTTPStatus

import numpy as np
import tensorflow as tf

from tfgen.config.knobs import KNOBS
from tfgen.decoding.strategies import STRATEGIES
from tfgen.engine.scheduler import EngineFull, EngineStopped, ExportedSlots, Row, SlotEngine
from tfgen.engine.slot_state import REQUEST_KNOBS
from tfgen.export.request_checks import request_checks
from tfgen.export.signature_inputs import default_row_seeds
from tfgen.serving.errors import RequestError, bad_request, error_text

logger = logging.getLogger(__name__)

#: What a request refused for a full queue is told to wait (seconds, the 503's Retry-After).
RETRY_AFTER = 1
# The modes the slot engine decodes (by their value in the export's info), with their rows' `do_sample`.
_ENGINE_MODES = {mode.value: strategy.slot_sampling for mode, strategy in STRATEGIES.items()
                 if strategy.slot_sampling is not None}
_TEXT_SIGNATURES = ("text_tokenize", "text_detokenize")


def attach_engine(served, *, steps_per_call: int, max_queue: int | None = None) -> SlotEngine | None:
    """Starts `served`'s continuous-batching engine when its export has the slot signatures (None otherwise). Its
    programs compile on their first call (`tfgen.engine.scheduler.warm_up` decodes one row to have them before the
    first request)."""
    if "slot_init" not in served.signatures:
        return None
    with open(os.path.join(served.directory, "assets.extra", "tfgen_export.json"), encoding="utf-8") as file:
        info = json.load(file)["slots"]
    served.engine = SlotEngine(ExportedSlots(served.signatures, info), steps_per_call=steps_per_call,
                               max_queue=max_queue)
    logger.info("continuous batching: %d slots of %d columns, %d tokens per call", info["slots"], info["length"],
                steps_per_call)
    return served.engine


def engine_signatures(served) -> frozenset[str]:
    """The signatures whose rows `served`'s engine decodes when they fit a slot (none without an engine): `greedy`
    and `sample`, and `serving_default` and `generate_text` (tokenized by `text_tokenize`, answered through
    `text_detokenize`) when the export's config decodes greedily or samples. Their whole-call programs run only for
    rows too long for a slot."""
    engine = getattr(served, "engine", None)
    if engine is None:
        return frozenset()
    names = {"greedy", "sample"}
    if engine.programs.info["serving_default_mode"] in _ENGINE_MODES:
        names.add("serving_default")
        if all(name in served.signatures for name in _TEXT_SIGNATURES):
            names.add("generate_text")
    return frozenset(names)


def engine_predict(served, signature_name: str, inputs: dict) -> dict | None:
    """The signature's outputs for `inputs`, decoded by the engine; None when the request is not one the engine
    takes (the caller runs the signature). RequestError 400 for what the signature's checks refuse, 503 when the
    queue is full."""
    rows = engine_rows(served, signature_name, inputs)
    if rows is None:
        return None
    _submit(served.engine, rows)
    engine = served.engine
    return _assemble([_finished(row) for row in rows], engine.programs.pad_token_id, engine.budget_cap)


def engine_rows(served, signature_name: str, inputs: dict) -> list[Row] | None:
    """The engine rows of a `:predict` request on `signature_name` (None: run it as a whole call)."""
    if signature_name not in engine_signatures(served) - {"generate_text"}:
        return None
    engine = served.engine
    info = engine.programs.info
    if signature_name == "serving_default":
        do_sample = _ENGINE_MODES[info["serving_default_mode"]]
    else:
        do_sample = signature_name == "sample"
    ids = np.asarray(inputs["input_ids"], np.int32)
    mask = np.asarray(inputs["attention_mask"], np.int32)
    count = ids.shape[0]
    budgets = np.asarray(inputs.get("max_new_tokens", np.full([count], engine.budget_cap)), np.int32)
    if not all(engine.fits(ids.shape[1], int(budget)) for budget in budgets):
        return None
    _check_prompt(info, ids, mask)
    if signature_name == "sample":
        seeds, knobs = inputs["seed"], {name: inputs[name] for name in REQUEST_KNOBS}
    else:
        # The export's config decides: its knob values (neutral where it leaves one off), keys from the prompt.
        seeds = _prompt_seeds(ids, mask) if do_sample else np.zeros([count, 2], np.int32)
        knobs = {name: np.full([count], info["knobs"].get(name, KNOBS[name].neutral)) for name in REQUEST_KNOBS}
    return [Row(ids[index], mask[index], int(budgets[index]), do_sample, tuple(int(v) for v in seeds[index]),
                **{name: np.asarray(values[index]).item() for name, values in knobs.items()})
            for index in range(count)]


def _assemble(rows: list[Row], pad_token_id: int, budget_cap: int) -> dict:
    """`sequences` int32 `[B, W + budget_cap]` (each row as sent, its new tokens, then pad) and `sequence_lengths`
    `[B]`: what the signatures return for the same rows."""
    width = rows[0].width
    sequences = np.full([len(rows), width + budget_cap], pad_token_id, np.int32)
    lengths = np.zeros([len(rows)], np.int32)
    for index, row in enumerate(rows):
        sequences[index, :width] = row.input_ids
        sequences[index, width:width + len(row.tokens)] = row.tokens
        lengths[index] = width + len(row.tokens)
    return {"sequences": sequences, "sequence_lengths": lengths}


def _finished(row: Row) -> Row:
    try:
        row.wait()
    except EngineStopped as error:
        raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE, f"the request could not finish: {error}",
                           headers={"Retry-After": str(RETRY_AFTER)}) from None
    return row


def _submit(engine: SlotEngine, rows: list[Row]) -> None:
    try:
        engine.submit(rows)
    except EngineFull as error:
        raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE, f"the server is busy: {error}; retry in {RETRY_AFTER} s",
                           headers={"Retry-After": str(RETRY_AFTER)}) from None
    except EngineStopped as error:
        raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE, f"the server is stopping: {error}",
                           headers={"Retry-After": str(RETRY_AFTER)}) from None


def _check_prompt(info: dict, ids: np.ndarray, mask: np.ndarray) -> None:
    """The signature's own prompt checks (`tfgen.export.request_checks`), run eagerly: the same 400s, same words."""
    try:
        request_checks(tf.constant(ids), tf.constant(mask), {}, (), vocab_size=info["vocab_size"],
                       max_positions=info["max_positions"], buffer_new_tokens=info["max_new_tokens"])
    except tf.errors.InvalidArgumentError as error:
        raise bad_request(error_text(error.message)) from None


def _prompt_seeds(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """`serving_default`'s sampling keys (a hash of each row's prompt, `default_row_seeds`)."""
    return default_row_seeds(tf.constant(ids), tf.constant(mask)).numpy()


# ----------------------------------------------------------------------------------------------------------
# Text


def text_rows(served, texts: list[bytes]) -> tuple[list[Row], np.ndarray] | None:
    """(engine rows, input_ids) of a `generate_text` request, or None when it runs as a whole call."""
    if "generate_text" not in engine_signatures(served):
        return None
    encoded = served.signatures["text_tokenize"](text=tf.constant(texts, tf.string))
    inputs = {"input_ids": encoded["input_ids"].numpy(), "attention_mask": encoded["attention_mask"].numpy()}
    rows = engine_rows(served, "serving_default", inputs)
    return None if rows is None else (rows, inputs["input_ids"])


def detokenize(served, rows: list[Row]) -> list[str]:
    """The generated text of each row so far (bytes cut inside a character become U+FFFD)."""
    result = _assemble(rows, served.engine.programs.pad_token_id, max(len(row.tokens) for row in rows))
    text = served.signatures["text_detokenize"](
        sequences=tf.constant(result["sequences"]), width=tf.constant(rows[0].width, tf.int32),
        sequence_lengths=tf.constant(result["sequence_lengths"]))["text"].numpy()
    return [item.decode("utf-8", errors="replace") for item in text]


def engine_text(served, texts: list[bytes]) -> list[str] | None:
    """`generate_text`'s answer through the engine (None: run the signature)."""
    found = text_rows(served, texts)
    if found is None:
        return None
    rows, _ = found
    _submit(served.engine, rows)
    return detokenize(served, [_finished(row) for row in rows])


def stream_text(served, text: bytes) -> Iterator[str]:
    """Queues one prompt and returns an iterator over its generated text in pieces as the engine decodes it (each
    piece ends on a whole character; the last one flushes the rest). Closing the iterator early cancels the row
    (its slot is freed at the next engine call). RequestError now, before any piece, when the export cannot
    stream (no slot or text signatures), the prompt does not fit a slot, or the queue is full."""
    found = text_rows(served, [text])
    if found is None:
        raise bad_request("streaming needs an export with the slot and text signatures (tfgen export with a "
                           "tokenizer and slots > 0) and a prompt that fits a slot")
    (row,), _ = found
    row.listener = queue.SimpleQueue()
    _submit(served.engine, [row])
    return _pieces(served, row)


def _pieces(served, row: Row) -> Iterator[str]:
    sent = ""
    try:
        while row.listener.get() is not None:
            # A trailing U+FFFD may be a character still cut between tokens: hold it back until the row ends.
            stable = detokenize(served, [row])[0].rstrip("\ufffd")
            if len(stable) > len(sent):
                yield stable[len(sent):]
                sent = stable
        if row.error is not None:
            raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE, f"the request could not finish: {row.error}")
        final = detokenize(served, [row])[0] if row.tokens else ""
        if len(final) > len(sent):
            yield final[len(sent):]
    finally:
        if not row.done.is_set():
            served.engine.cancel(row)


class TextStream:
    """A `:generate` answer sent as server-sent events: `pieces`, the text as it is generated."""

    def __init__(self, pieces: Iterator[str]):
        self.pieces = pieces

    def chunks(self) -> Iterator[bytes]:
        """The HTTP/1.1 chunks of the answer: `data: {"text": piece}` per piece, then `data: {"done": true}` (or
        `event: error` with `data: {"error": ...}`), then the last chunk. Closing it early (the client left)
        cancels the row."""
        def chunk(payload: dict, kind: str = "") -> bytes:
            data = ((f"event: {kind}\n" if kind else "") + f"data: {json.dumps(payload)}\n\n").encode("utf-8")
            return f"{len(data):x}\r\n".encode("ascii") + data + b"\r\n"

        try:
            for piece in self.pieces:
                yield chunk({"text": piece})
            yield chunk({"done": True})
        except RequestError as error:
            yield chunk({"error": str(error)}, "error")
        finally:
            self.pieces.close()
        yield b"0\r\n\r\n"


def text_stream(model, body: dict, answer_whole):
    """`{"text": "...", "stream": true}` -> a `TextStream`; `"stream": false` answers `answer_whole(model, body)`
    without the flag. RequestError 400 for anything else."""
    stream = body["stream"]
    if not isinstance(stream, bool):
        raise bad_request(f"stream must be true or false, got {json.dumps(stream)[:40]}")
    rest = {name: value for name, value in body.items() if name != "stream"}
    if not stream:
        return answer_whole(model, rest)
    if set(rest) != {"text"} or not isinstance(rest["text"], str) or not rest["text"]:
        raise bad_request('a streamed request is {"text": "<one non-empty string>", "stream": true}')
    try:
        encoded = rest["text"].encode("utf-8")
    except UnicodeEncodeError as error:
        raise bad_request(f"text is not valid Unicode: {error.reason}") from None
    return TextStream(stream_text(model, encoded))


__all__ = ["TextStream", "attach_engine", "text_stream", "engine_predict", "engine_signatures", "engine_rows",
           "engine_text", "stream_text"]
