"""The OpenAI-compatible requests `tfgen serve` takes (`/v1/completions`, `/v1/chat/completions`): parsing and
checking their bodies into a `CompletionRequest`, OpenAI's error object, and the shapes of its answers.

What is honoured, refused and ignored (docs/serving.md, "OpenAI-compatible API"): every field OpenAI defines is
either honoured, refused with a 400 naming it (`OpenAIError.param`) unless it holds its neutral value (e.g.
`"echo": false`, `"presence_penalty": 0`), or — only those OpenAI's own server does not act on — ignored
(`user`, `store`, `metadata`, `service_tier`). Any other field is a 400 naming it.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from http import HTTPStatus

from tfgen.serving.errors import RequestError

#: The most rows (`n` times the prompts) one request may ask for.
MAX_CHOICES = 128
# Fields OpenAI's server accepts without acting on the output; they are ignored here too.
_IGNORED = ("user", "store", "metadata", "service_tier")
# Fields refused unless they hold the neutral value listed (the value OpenAI's default behaves as).
_NEUTRAL = {"top_logprobs": (None, 0), "presence_penalty": (None, 0, 0.0),
            "frequency_penalty": (None, 0, 0.0), "logit_bias": (None, {}), "tools": (None, []),
            "tool_choice": (None, "none"), "parallel_tool_calls": (None, True, False), "functions": (None, []),
            "function_call": (None, "none"), "echo": (None, False),
            "suffix": (None, ""), "best_of": (None, 1), "modalities": (None, ["text"]), "audio": (None,),
            "prediction": (None,), "reasoning_effort": (None,), "web_search_options": (None,)}
_SAMPLING = ("model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream", "stream_options",
             "response_format")
_FIELDS = {"chat": {"messages", "max_completion_tokens", "logprobs", "top_logprobs", *_SAMPLING},
           "text": {"prompt", "logprobs", *_SAMPLING}}
#: The most alternatives per token a request may ask for: chat's `top_logprobs`, completions' `logprobs` (OpenAI's).
MAX_TOP_LOGPROBS = {"chat": 20, "text": 5}
_ROLES = ("system", "developer", "user", "assistant")


class OpenAIError(RequestError):
    """A refusal answered with OpenAI's error object: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: HTTPStatus, message: str, param: str | None = None, code: str | None = None):
        super().__init__(status, message)
        self.param, self.code = param, code

    def payload(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}}


def as_openai_error(error: RequestError) -> OpenAIError:
    """`error` (any refusal, e.g. a full queue's 503) as an `OpenAIError`, keeping its status and headers."""
    if isinstance(error, OpenAIError):
        return error
    converted = OpenAIError(error.status, str(error))
    converted.headers = error.headers
    return converted


def invalid(param: str, message: str) -> OpenAIError:
    return OpenAIError(HTTPStatus.BAD_REQUEST, f"{param}: {message}", param)


@dataclasses.dataclass
class CompletionRequest:
    """A checked completion request. `prompts`: one token-id list per prompt (each yields `n` choices, prompt
    after prompt); `max_tokens` None means as many as the export's buffer and slot allow; `seed` is OpenAI's int
    (a random one when the client sent none); `temperature` 0 decodes greedily."""

    chat: bool
    model: str
    prompts: list
    n: int = 1
    max_tokens: int | None = None
    budget_field: str = "max_tokens"  # the field `max_tokens` came from (chat: or `max_completion_tokens`)
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple = ()
    stream: bool = False
    include_usage: bool = False
    #: The request's `response_format` as sent (None: plain text); `tfgen.serving.openai_structured` checks it.
    response_format: dict | None = None
    logprobs: int | None = None  # None: no log-probabilities; else the alternatives per token (`top_logprobs`)


def parse_completion(body, chat: bool, tokenizer) -> CompletionRequest:
    """Checks `body` (parsed JSON) field by field and tokenizes its prompt (`chat`: renders `messages` with the
    tokenizer's chat template, the assistant's turn opened). OpenAIError 400 naming the first field at fault."""
    if not isinstance(body, dict):
        raise invalid("body", "the request body must be a JSON object")
    for name in body:
        if name in _IGNORED or name in _FIELDS["chat" if chat else "text"]:
            continue
        if name in _NEUTRAL:
            if body[name] not in _NEUTRAL[name]:
                raise invalid(name, f"{name} is not supported by this server (send it unset)")
            continue
        raise invalid(name, f"unknown field {name!r}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "model must name the served model (GET /v1/models lists it)")
    if tokenizer is None:
        raise OpenAIError(HTTPStatus.BAD_REQUEST, f"model {model!r} was exported without a tokenizer, so it cannot "
                          "take text; export it again with its tokenizer (tfgen export writes it to "
                          "assets.extra/tokenizer/)", "model")
    request = CompletionRequest(chat=chat, model=model, prompts=[])
    request.n = _integer(body, "n", 1, 1, MAX_CHOICES)
    limit = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    request.max_tokens, request.budget_field = _integer(body, limit, None, 1, None), limit
    request.temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    request.top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if request.top_p == 0.0:
        raise invalid("top_p", "top_p must be above 0")
    request.seed = _integer(body, "seed", None, -2**63, 2**63 - 1)
    if request.seed is None:
        request.seed = secrets.randbits(63)
    request.stop = _stop(body.get("stop"))
    request.logprobs = _logprobs(body, chat)
    request.stream = _boolean(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise invalid("stream_options", 'stream_options takes {"include_usage": true|false}')
        if not request.stream:
            raise invalid("stream_options", "stream_options needs stream: true")
        request.include_usage = _boolean(options, "include_usage")
    if body.get("response_format") not in (None, {"type": "text"}):
        request.response_format = body["response_format"]
    request.prompts = [_chat_prompt(body, tokenizer)] if chat else _text_prompts(body, tokenizer)
    if len(request.prompts) * request.n > MAX_CHOICES:
        raise invalid("n", f"the request asks for {len(request.prompts) * request.n} choices; the limit is "
                      f"{MAX_CHOICES}")
    return request


def seed_pair(seed: int, choice: int) -> tuple[int, int]:
    """tfgen's per-row seed pair (two int32) of OpenAI's `seed` for the `choice`-th row of a prompt: the 64-bit
    two's complement of `seed + choice` split into its high and low 32 bits, each read as a signed int32."""
    value = (seed + choice) % 2**64
    high, low = value >> 32, value & 0xFFFFFFFF
    return tuple(part - 2**32 if part >= 2**31 else part for part in (high, low))


def _chat_prompt(body: dict, tokenizer) -> list:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "messages must be a non-empty list of {role, content} objects")
    conversation = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise invalid("messages", f"{where} must be an object whose role is one of {', '.join(_ROLES)}")
        unknown = set(message) - {"role", "content", "name"}
        if unknown:
            raise invalid("messages", f"{where} has fields this server does not take: {', '.join(sorted(unknown))}")
        role = "system" if message["role"] == "developer" else message["role"]  # OpenAI's newer name for it
        conversation.append({"role": role, "content": _content(message.get("content"), where)})
    if tokenizer.chat_template is None:
        raise invalid("messages", "the served model's tokenizer has no chat template; use /v1/completions")
    try:
        return list(tokenizer.apply_chat_template(conversation, add_generation_prompt=True))
    except (ValueError, TypeError) as error:
        raise invalid("messages", f"the chat template refused the conversation: {error}") from None


def _content(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise invalid("messages", f"{where}.content: only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                              f"are supported, got {json.dumps(part)[:60]}")
            texts.append(part["text"])
        return "".join(texts)
    raise invalid("messages", f"{where}.content must be a string or a non-empty list of text parts")


def _text_prompts(body: dict, tokenizer) -> list:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompt = [prompt]
    elif isinstance(prompt, list) and prompt and all(_is_int(token) for token in prompt):
        return [list(prompt)]  # one prompt given as token ids
    if not isinstance(prompt, list) or not prompt:
        raise invalid("prompt", "prompt must be a string, a non-empty list of strings or of token-id lists")
    prompts = []
    for item in prompt:
        if isinstance(item, str):
            ids = tokenizer.encode(item)
        elif isinstance(item, list) and all(_is_int(token) for token in item):
            ids = list(item)
        else:
            raise invalid("prompt", f"each prompt must be a string or a list of token ids, got {json.dumps(item)[:40]}")
        if not ids:
            raise invalid("prompt", "a prompt is empty (no tokens)")
        if not all(0 <= token < tokenizer.vocab_size for token in ids):
            raise invalid("prompt", f"token ids must lie in [0, {tokenizer.vocab_size})")
        prompts.append(ids)
    return prompts


def _logprobs(body: dict, chat: bool) -> int | None:
    """The alternatives per token a request asks for (None: no log-probabilities): chat's `logprobs: true` with
    `top_logprobs` (0 when unset), completions' `logprobs` integer."""
    if not chat:
        return _integer(body, "logprobs", None, 0, MAX_TOP_LOGPROBS["text"])
    wanted = _boolean(body, "logprobs")
    top = _integer(body, "top_logprobs", None, 0, MAX_TOP_LOGPROBS["chat"])
    if top and not wanted:
        raise invalid("top_logprobs", "top_logprobs needs logprobs: true")
    return (top or 0) if wanted else None


def _stop(stop) -> tuple:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise invalid("stop", "stop must be a non-empty string or a list of up to 4 of them")
    return tuple(stops)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integer(body: dict, name: str, default, low: int, high: int | None):
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value) or value < low or (high is not None and value > high):
        bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise invalid(name, f"{name} must be an integer {bounds}, got {json.dumps(value)[:40]}")
    return value


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
        raise invalid(name, f"{name} must be a number in [{low:g}, {high:g}], got {json.dumps(value)[:40]}")
    return float(value)


def _boolean(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(name, f"{name} must be true or false, got {json.dumps(value)[:40]}")
    return value


__all__ = ["MAX_CHOICES", "CompletionRequest", "OpenAIError", "as_openai_error", "invalid", "parse_completion",
           "seed_pair"]
