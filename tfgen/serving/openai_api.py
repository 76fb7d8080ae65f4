"""The OpenAI-compatible routes of `tfgen serve` (`GET /v1/models`, `POST /v1/completions`,
`POST /v1/chat/completions`): requests (`tfgen.serving.openai_protocol`) become rows of the served version's
continuous-batching engine, tokenized and detokenized with the export's own tokenizer (`ServedModel.tokenizer`,
from `assets.extra/tokenizer/`); answers are OpenAI's objects, whole or as server-sent events. Requests with a
`response_format` run as whole calls of the export's `structured` signature instead (`openai_structured`).

Stop strings are matched here, on the text decoded so far: a row whose text reaches one is cancelled (its slot is
freed at the engine's next call) and its text cut before the stop string, as OpenAI does. `served` is always a
`tfgen.serving.served_model.ServedModel`.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import time
import uuid
from collections.abc import Iterator
from http import HTTPStatus

import numpy as np

from tfgen.config.generation_config import GenerationConfig
from tfgen.config.knobs import KNOBS
from tfgen.engine.scheduler import EngineFull, EngineStopped, Row
from tfgen.serving.errors import RequestError
from tfgen.serving.openai_logprobs import TokenTexts, check_logprobs, choice_logprobs
from tfgen.serving.openai_protocol import CompletionRequest, OpenAIError, invalid, parse_completion, seed_pair
from tfgen.serving.openai_structured import structured_choices
from tfgen.serving.requests import parse_json_body

#: What a request refused for a full queue is told to wait (seconds, the 503's Retry-After).
RETRY_AFTER = 1
#: OpenAI's routes by path: the methods each takes, and whether it completes a chat (None: the model list).
OPENAI_ROUTES = {"/v1/models": (("GET", "HEAD"), None), "/v1/completions": (("POST",), False),
                 "/v1/chat/completions": (("POST",), True)}


def openai_route(models, method: str, path: str, read_body, held: contextlib.ExitStack):
    """The answer to `method path` (one of `OPENAI_ROUTES`) for the served `models` (`ServedModels`):
    `read_body()` gives the request's bytes; the version used is held in `held` until the answer is sent."""
    methods, chat = OPENAI_ROUTES[path]
    if method not in methods:
        raise RequestError(HTTPStatus.METHOD_NOT_ALLOWED, f"{path} takes {' and '.join(methods)}, not {method}",
                           headers={"Allow": ", ".join(methods)})
    if chat is None:
        return list_models(models)
    body = parse_json_body(read_body())
    name = body.get("model") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name:
        raise invalid("model", "model must name the served model (GET /v1/models lists it)")
    try:
        served = held.enter_context(models.acquire(name))
    except RequestError as error:
        raise OpenAIError(error.status, f"The model {name!r} does not exist (this server serves {models.name!r})",
                          "model", "model_not_found") from None
    return complete(served, parse_completion(body, chat, served.tokenizer))


def list_models(models) -> dict:
    """`GET /v1/models`: the served model (`models`, a `tfgen.serving.versions.ServedModels`) in OpenAI's list
    shape; `created` is its newest version folder's time."""
    latest = models.latest
    return {"object": "list", "data": [{"id": models.name, "object": "model",
                                        "created": int(os.path.getmtime(latest.directory)), "owned_by": "tfgen"}]}


def complete(served, request: CompletionRequest):
    """The answer to a checked request: a dict (OpenAI's `chat.completion` / `text_completion`), or with `stream`
    an `EventStream`. Its rows are queued before this returns, so a full queue is a 503 OpenAIError now; with
    `response_format`, its whole call of the `structured` signature runs before this returns."""
    if request.response_format is not None:
        if request.logprobs is not None:  # a whole call of the `structured` signature records none
            raise invalid("logprobs", "logprobs cannot be combined with response_format on this server")
        follower = structured_choices(served, request, _eos_ids(served))
        rows = follower.rows
    else:
        rows, follower = _submitted(served, request)
    header = {"id": ("chatcmpl-" if request.chat else "cmpl-") + uuid.uuid4().hex, "created": int(time.time()),
              "model": request.model}
    if request.stream:
        return EventStream(_stream_events(header, request, follower))
    texts, reasons = [""] * len(rows), [None] * len(rows)
    with contextlib.closing(follower):
        for index, piece, reason, _ in follower:
            texts[index] += piece
            reasons[index] = reason or reasons[index]
    logprobs = [follower.logprobs(index, (0, row.used)) for index, row in enumerate(rows)]
    if request.chat:
        choices = [{"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs[index],
                    "finish_reason": reasons[index]} for index, text in enumerate(texts)]
    else:
        choices = [{"index": index, "text": text, "logprobs": logprobs[index], "finish_reason": reasons[index]}
                   for index, text in enumerate(texts)]
    return {**header, "object": "chat.completion" if request.chat else "text_completion", "choices": choices,
            "usage": _usage(request, rows)}


def _submitted(served, request: CompletionRequest) -> tuple[list[Row], _follow]:
    """The request's engine rows, queued, and the follower of their progress (503 OpenAIError: a full queue)."""
    rows = _rows(served, request)
    events = queue.SimpleQueue()
    for index, row in enumerate(rows):
        row.listener = _Tagged(events, index)
    try:
        served.engine.submit(rows)
    except (EngineFull, EngineStopped) as error:
        raise OpenAIError(HTTPStatus.SERVICE_UNAVAILABLE, f"the server is busy or stopping: {error}; retry in "
                          f"{RETRY_AFTER} s") from None
    return rows, _follow(served, request, rows, events)


class EventStream:
    """An answer sent as server-sent events (`chunks()`: HTTP/1.1 chunks of `data: {...}` lines, then
    `data: [DONE]`). Closing it early (the client left) cancels its rows."""

    def __init__(self, events: Iterator[dict]):
        self.events = events

    def chunks(self) -> Iterator[bytes]:
        def chunk(data: str) -> bytes:
            encoded = f"data: {data}\n\n".encode()
            return f"{len(encoded):x}\r\n".encode("ascii") + encoded + b"\r\n"

        try:
            for event in self.events:
                yield chunk(json.dumps(event))
            yield chunk("[DONE]")
        except RequestError as error:
            yield chunk(json.dumps(_error_payload(error)))
        finally:
            self.events.close()
        yield b"0\r\n\r\n"


def _error_payload(error: RequestError) -> dict:
    param = getattr(error, "param", None)
    return {"error": {"message": str(error), "type": "server_error" if error.status >= 500 else
                      "invalid_request_error", "param": param, "code": None}}


def _stream_events(header: dict, request: CompletionRequest, follower) -> Iterator[dict]:
    """OpenAI's chunk objects for the pieces `follower` yields (then the usage chunk when asked for)."""
    kind = "chat.completion.chunk" if request.chat else "text_completion"
    usage = {"usage": None} if request.include_usage else {}
    with contextlib.closing(follower):  # a client that left cancels the rows still decoding
        if request.chat:  # each choice's first chunk names the role
            for index in range(request.n * len(request.prompts)):
                yield {**header, "object": kind, **usage, "choices": [
                    {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                     "finish_reason": None}]}
        for index, piece, reason, span in follower:
            choice = _chunk_choice(request.chat, index, piece, reason)
            choice["logprobs"] = follower.logprobs(index, span)
            yield {**header, "object": kind, **usage, "choices": [choice]}
    if request.include_usage:
        yield {**header, "object": kind, "choices": [], "usage": _usage(request, follower.rows)}


def _chunk_choice(chat: bool, index: int, piece: str, reason: str | None) -> dict:
    if chat:
        return {"index": index, "delta": {"content": piece} if piece else {}, "logprobs": None, "finish_reason": reason}
    return {"index": index, "text": piece, "logprobs": None, "finish_reason": reason}


def _usage(request: CompletionRequest, rows: list[Row]) -> dict:
    prompt = sum(len(ids) for ids in request.prompts)
    completion = sum(row.used for row in rows)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _rows(served, request: CompletionRequest) -> list[Row]:
    """One engine row per choice (prompt after prompt, `n` each), or an OpenAIError 400 when a prompt and its
    budget do not fit a slot."""
    engine = served.engine
    if engine is None:
        raise OpenAIError(HTTPStatus.BAD_REQUEST, f"model {request.model!r} has no continuous-batching signatures "
                          "(export it with slots > 0, the default for models that support them)", "model")
    check_logprobs(request, engine.top_logprobs)
    param = "messages" if request.chat else "prompt"
    rows = []
    for prompt_index, ids in enumerate(request.prompts):
        room = min(engine.budget_cap, engine.length - len(ids))
        if room < 1:
            raise invalid(param, f"the prompt has {len(ids)} tokens; a slot holds {engine.length} columns, "
                          f"prompt and new tokens together")
        budget = room if request.max_tokens is None else request.max_tokens
        if budget > room:
            limit = request.budget_field
            raise invalid(limit, f"{limit} is {budget}; this export allows at most {room} new tokens for this "
                          f"prompt ({engine.budget_cap} its buffer, {engine.length} columns per slot)")
        for choice in range(request.n):
            seed = seed_pair(request.seed, prompt_index * request.n + choice)
            rows.append(Row(np.asarray(ids, np.int32), np.ones([len(ids)], np.int32), budget,
                            do_sample=request.temperature > 0, seed=seed,
                            temperature=request.temperature or KNOBS["temperature"].neutral,
                            top_k=KNOBS["top_k"].neutral, top_p=request.top_p,
                            logprobs=request.logprobs is not None))
    return rows


class _Tagged:
    """A row's listener: puts `(row index, item)` on the queue the rows of one request share."""

    def __init__(self, events: queue.SimpleQueue, index: int):
        self.events, self.index = events, index

    def put(self, item) -> None:
        self.events.put((self.index, item))


class _follow:  # noqa: N801 (a generator with the rows at hand)
    """Yields `(choice index, new text, finish_reason or None, (start, stop))` as the engine decodes the rows, a
    last one per row with its finish reason; `[start, stop)` are the row's tokens whose text the new text completes
    (what `logprobs` gives for it). Sets each row's `used` (its completion tokens). Closing it cancels the rows
    still decoding."""

    def __init__(self, served, request: CompletionRequest, rows: list[Row], events: queue.SimpleQueue):
        self.served, self.request, self.rows, self.events = served, request, rows, events
        self.eos = set(_eos_ids(served))
        self.texts = None if request.logprobs is None else TokenTexts(served.tokenizer)
        self.generator = self._run()

    def __iter__(self):
        return self.generator

    def close(self) -> None:
        self.generator.close()

    def logprobs(self, index: int, span: tuple) -> dict | None:
        """The `logprobs` object of row `index`'s tokens `[start, stop)` (None when the request asked for none)."""
        if self.texts is None:
            return None
        row, (start, stop) = self.rows[index], span
        offset = sum(len(self.texts(token)[0]) for token in row.tokens[:start])
        return choice_logprobs(self.request, list(zip(row.tokens[start:stop], row.token_logprobs[start:stop])),
                               self.texts, offset)

    def _run(self):
        sent = [""] * len(self.rows)
        sent_tokens = [0] * len(self.rows)  # the tokens whose text was sent
        open_rows = set(range(len(self.rows)))
        for row in self.rows:
            row.used = 0
        try:
            while open_rows:
                index, item = self.events.get()
                if index not in open_rows:
                    continue  # a row already cut at a stop string
                row = self.rows[index]
                tokens = list(row.tokens)
                text, stop_at = self._text(tokens)
                if stop_at is not None or item is None:
                    if item is None and row.error is not None:
                        raise OpenAIError(HTTPStatus.SERVICE_UNAVAILABLE, f"the request could not finish: {row.error}")
                    if stop_at is not None:
                        self.served.engine.cancel(row)
                        row.used = self._tokens_to(tokens, stop_at)
                        reason = "stop"
                    else:
                        row.used = len(tokens)
                        ended_early = len(tokens) < row.max_new_tokens or (tokens and tokens[-1] in self.eos)
                        reason = "stop" if ended_early else "length"
                    open_rows.discard(index)
                    yield index, text[len(sent[index]):], reason, (min(sent_tokens[index], row.used), row.used)
                    continue
                # Hold back a trailing partial character, and what could still become a stop string.
                stable = text.rstrip("\ufffd")
                hold = max((len(stop) - 1 for stop in self.request.stop), default=0)
                stable = stable[:max(len(sent[index]), len(stable) - hold)]
                if len(stable) > len(sent[index]):
                    covered = self._tokens_within(tokens, len(stable), sent_tokens[index])
                    yield index, stable[len(sent[index]):], None, (sent_tokens[index], covered)
                    sent[index], sent_tokens[index] = stable, covered
        finally:
            for index in open_rows:
                self.served.engine.cancel(self.rows[index])

    def _text(self, tokens: list) -> tuple[str, int | None]:
        """(the row's text, cut before its first stop string; where it was cut, or None)."""
        text = self.served.tokenizer.decode(tokens, skip_special_tokens=True)
        found = [text.find(stop) for stop in self.request.stop]
        found = [position for position in found if position >= 0]
        if not found:
            return text, None
        return text[:min(found)], min(found)

    def _tokens_within(self, tokens: list, length: int, start: int) -> int:
        """The most of `tokens` (at least `start`) whose text lies within its first `length` characters (only
        counted when the request asked for log-probabilities)."""
        if self.texts is None:
            return start
        for count in range(len(tokens), start, -1):
            if len(self._text(tokens[:count])[0]) <= length:
                return count
        return start

    def _tokens_to(self, tokens: list, position: int) -> int:
        """The fewest of `tokens` whose text reaches a stop string (what a row cut there generated)."""
        for count in range(1, len(tokens) + 1):
            if self._text(tokens[:count])[1] is not None:
                return count
        return len(tokens)


def _eos_ids(served) -> list:
    """The ids that end a row: the export's generation config's `eos_token_id`, and the tokenizer's eos."""
    config = GenerationConfig.from_pretrained(os.path.join(served.directory, "assets.extra"))
    ids = list(config.eos_token_ids())
    if served.tokenizer is not None and served.tokenizer.eos_token_id is not None:
        ids.append(served.tokenizer.eos_token_id)
    return ids


__all__ = ["OPENAI_ROUTES", "EventStream", "complete", "list_models", "openai_route"]
