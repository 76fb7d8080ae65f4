"""OpenAI's `logprobs` objects of `tfgen serve`'s answers, from the log-probabilities the slot engine records per
token (`tfgen.engine.scheduler.Row.token_logprobs`: the raw log-probabilities, log-softmax of the model's logits
before any processor or warper, as vLLM reports them by default, and the export's K most likely tokens).

    chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}
    completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}   (the legacy one)

A token's text is the tokenizer's decoding of it alone; its `bytes` are that text's UTF-8, or, where the token
holds part of a character (the text then has U+FFFD), the token's own bytes when the vocabulary is byte-level BPE.
`text_offset` counts characters of those texts from the start of the completion (vLLM's way).
"""

from __future__ import annotations

from http import HTTPStatus

from tfgen.serving.openai_protocol import CompletionRequest, OpenAIError, invalid
from tfgen.text.byte_level_spec import byte_level_text

# How to re-export: what an export made before the slot state had log-probabilities is told.
_REEXPORT = ("export the model again with `tfgen export --slot-logprobs 20` (or serve it with `tfgen serve --model "
             "... --slot-logprobs 20`, which re-exports by itself)")


def check_logprobs(request: CompletionRequest, top_logprobs: int) -> None:
    """OpenAIError 400 naming the field when `request` asks for log-probabilities the engine does not record
    (`top_logprobs`: the K its programs keep per token, 0 for none)."""
    if request.logprobs is None:
        return
    if not top_logprobs:
        raise OpenAIError(HTTPStatus.BAD_REQUEST, f"logprobs: model {request.model!r} was exported without "
                          f"log-probabilities in its slot signatures; {_REEXPORT}", "logprobs")
    if request.logprobs > top_logprobs:
        name = "top_logprobs" if request.chat else "logprobs"
        raise invalid(name, f"{name} is {request.logprobs}; this export records the {top_logprobs} most likely "
                      "tokens per step (export it again with a larger `tfgen export --slot-logprobs`)")


class TokenTexts:
    """Each token id's text and bytes under `tokenizer` (a `tfgen` tokenizer), decoded once per id."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        backend = tokenizer.backend_tokenizer
        self._piece = backend.id_to_token if backend is not None else None
        self._known: dict[int, tuple[str, list]] = {}

    def __call__(self, token: int) -> tuple[str, list]:
        """(the text of `token` alone, its bytes as a list of ints)."""
        found = self._known.get(token)
        if found is None:
            text = self.tokenizer.decode([token], skip_special_tokens=False)
            raw = None
            if "\ufffd" in text and self._piece is not None:  # a cut character: the byte-level token's own bytes
                piece = self._piece(token)
                raw = byte_level_text(piece) if piece is not None else None
            found = self._known[token] = (text, list(raw if raw is not None else text.encode("utf-8")))
        return found


def chat_logprobs(entries: list, top: int, texts: TokenTexts) -> dict:
    """The `logprobs` of a chat choice (or chunk) for `entries` (`(token, (logprob, top ids, top logprobs))` per
    token), each with its `top` most likely alternatives."""
    content = []
    for token, (logprob, top_ids, top_logprobs) in entries:
        text, raw = texts(token)
        alternatives = []
        for other, value in zip(top_ids[:top], top_logprobs[:top]):
            other_text, other_raw = texts(other)
            alternatives.append({"token": other_text, "logprob": value, "bytes": other_raw})
        content.append({"token": text, "logprob": logprob, "bytes": raw, "top_logprobs": alternatives})
    return {"content": content}


def completion_logprobs(entries: list, top: int, texts: TokenTexts, offset: int = 0) -> dict:
    """The legacy `logprobs` of a completion choice (or chunk) for `entries` (as `chat_logprobs`), text offsets
    counted from `offset` (the characters of the tokens before them)."""
    answer = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token, (logprob, top_ids, top_logprobs) in entries:
        text, _ = texts(token)
        answer["tokens"].append(text)
        answer["token_logprobs"].append(logprob)
        answer["top_logprobs"].append({texts(other)[0]: value for other, value in zip(top_ids[:top],
                                                                                       top_logprobs[:top])})
        answer["text_offset"].append(offset)
        offset += len(text)
    return answer


def choice_logprobs(request: CompletionRequest, entries: list, texts: TokenTexts, offset: int = 0) -> dict | None:
    """A choice's (or chunk's) `logprobs` for `entries` in `request`'s kind (chat or legacy), None when it asked
    for none."""
    if request.logprobs is None:
        return None
    if request.chat:
        return chat_logprobs(entries, request.logprobs, texts)
    return completion_logprobs(entries, request.logprobs, texts, offset)


__all__ = ["TokenTexts", "chat_logprobs", "check_logprobs", "choice_logprobs", "completion_logprobs"]
