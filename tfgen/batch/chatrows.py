"""Chat rows of a batch job: `{"messages": [...]}` rows (OpenAI's chat format) checked row by row, and the text a
chat row (or a `prompt` row on a model with a chat template) becomes: the conversation rendered with the model's
chat template, the assistant's turn opened — as `tfgen generate` renders its prompt. TensorFlow-free."""

from __future__ import annotations

import inspect
import json
from typing import Any

from tfgen.text.tokenizer_base import BaseTokenizer

# apply_chat_template's own parameters, which the job sets (`tools` and `documents` are template inputs and pass).
_SET_BY_THE_JOB = tuple(
    name for name in inspect.signature(BaseTokenizer.apply_chat_template).parameters
    if name not in ("self", "messages", "tools", "documents", "template_kwargs")
)


def check_template_kwargs(kwargs, tokenizer, raw: bool = False) -> dict:
    """`chat_template_kwargs` of a job (e.g. `{"enable_thinking": False}`), checked: a dict of names the template
    sees, none of them an `apply_chat_template` parameter the job sets, and a tokenizer with a chat template to
    see them. TypeError / ValueError naming `chat_template_kwargs`."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise TypeError(f"chat_template_kwargs must be a dict (a JSON object), got {type(kwargs).__name__}")
    taken = [name for name in kwargs if name in _SET_BY_THE_JOB]
    if taken:
        raise ValueError(f"chat_template_kwargs: {', '.join(map(repr, taken))} is set by the batch job, not by the "
                         "template's variables")
    if kwargs and getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("chat_template_kwargs: the model has no chat template to pass them to")
    return dict(kwargs)


def parse_template_kwargs(text: str) -> dict:
    """The `--chat-template-kwargs JSON` flag's object; ValueError naming the flag when it is not a JSON object."""
    try:
        value = json.loads(text)
    except ValueError as error:
        raise ValueError(f"--chat-template-kwargs: not JSON ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"--chat-template-kwargs: expected a JSON object such as '{{\"enable_thinking\": false}}', "
                         f"got a JSON {type(value).__name__}")
    return value


def messages_problem(messages: Any) -> str | None:
    """What makes a row's `messages` something other than a conversation, naming the key, or None: a non-empty
    list of objects, each with a string `role` and a string `content` (other keys go to the template as given)."""
    if not isinstance(messages, list) or not messages:
        return f"'messages' must be a non-empty list of {{'role', 'content'}} objects, got {_kind(messages)}"
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"'messages[{index}]' must be an object with 'role' and 'content', got {_kind(message)}"
        for key in ("role", "content"):
            if key not in message:
                return f"'messages[{index}]' has no {key!r}"
            if not isinstance(message[key], str):
                return f"'messages[{index}].{key}' must be a string, got {_kind(message[key])}"
    return None


def _kind(value: Any) -> str:
    return "an empty list" if value == [] else f"a JSON {type(value).__name__}" if value is not None else "null"


def conversation_text(tokenizer, messages: list, template_kwargs: dict) -> str:
    """The text of `messages` in the tokenizer's chat template with the assistant's turn opened (to be tokenized
    without adding special tokens: the template writes its own). Raises the template's ValueError / TypeError."""
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **template_kwargs)


def user_message(prompt: str) -> list[dict]:
    """A `prompt` row as the conversation `tfgen generate` makes of its prompt: one user message."""
    return [{"role": "user", "content": prompt}]
