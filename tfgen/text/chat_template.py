"""Chat templates: a model's Jinja template turned into the text of a conversation, as HF transformers 4.55 does it.

HF renders `tokenizer.chat_template` in an immutable sandboxed Jinja environment with `trim_blocks` and
`lstrip_blocks`, the loop controls (`{% break %}`, `{% continue %}`), a `{% generation %}` block (training templates
mark the assistant's part with it), a `tojson` filter that writes plain JSON (Jinja's own escapes HTML characters),
and two globals: `raise_exception(message)` and `strftime_now(format)`. The template sees `messages`, `tools`,
`documents`, `add_generation_prompt`, the tokenizer's special tokens (`bos_token`, ...) and the caller's extra
keyword arguments. This module builds the same environment (our own code), checks the conversation, renders it,
and reads and writes the template files of a checkpoint (`chat_template.jinja`, `tokenizer_config.json`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes

from tfgen.local_files import JSON_FILE_CAP, file_present, read_text_file
from tfgen.text import template_limits as limits
from tfgen.text.tokenizer_files import CHAT_TEMPLATE_FILE, read_json_object

logger = logging.getLogger(__name__)

# Options of HF's `apply_chat_template` that tfgen does not implement: refused, never handed to the template.
UNSUPPORTED_OPTIONS = ("return_assistant_tokens_mask", "tokenizer_kwargs")
# Python errors a template can raise while it runs (`'a' + 1`, `messages[5]`, ...), besides Jinja's own.
_RENDER_ERRORS = (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError, ArithmeticError)


class MissingChatTemplateError(ValueError):
    """The tokenizer has no chat template and none was passed. The `tfgen` command exits with status 1 on it."""

    exit_status = 1


class GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: renders its body. HF uses the block to find the assistant's tokens
    (`return_assistant_tokens_mask`); it is kept as a called block so that names set inside it stay inside, as in HF."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        line = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("render_body"), [], [], body).set_lineno(line)

    def render_body(self, caller) -> str:
        return caller()


def _raise_exception(message: Any) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    # Templates paste this into the prompt verbatim: no HTML escaping, non-ASCII kept, json.dumps's options exposed.
    width = indent if isinstance(indent, int) else len(indent) if isinstance(indent, str) else 0
    limits.check_size(limits.text_size(value, indent=width), "the JSON of tojson")
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:  # noqa: A002 (HF's name: templates may pass format=)
    return datetime.now().strftime(format)


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    environment = limits.LimitedSandbox(trim_blocks=True, lstrip_blocks=True,
                                 extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    environment.add_filter("tojson", _tojson)
    environment.add_global("raise_exception", _raise_exception)
    # A directive expands to at most a few dozen characters ("%c"): sized before the call.
    environment.add_global("strftime_now", _strftime_now,
                           lambda format: 64 * len(format) if isinstance(format, str) else 0)  # noqa: A006
    return environment


@functools.lru_cache(maxsize=64)
def compile_chat_template(source: str, origin: str | None = None) -> jinja2.Template:
    """The compiled template of `source` (cached: a model's template compiles once per process). Raises ValueError
    with Jinja's message and line when `source` is not a valid template, and ValueError naming `origin` (where the
    template comes from) when it nests too deeply to compile."""
    if not isinstance(source, str):
        raise TypeError(f"chat_template must be a Jinja template string, got {type(source).__name__}")
    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"the chat template is not valid Jinja (line {error.lineno}): {error.message}") from None
    except RecursionError:
        raise ValueError(f"the chat template ({origin or 'chat_template='}) nests too deeply to compile (over "
                         f"Python's recursion limit of {sys.getrecursionlimit()} frames)") from None


def render_chat(
    source: str | None,
    messages: Any,
    *,
    tools: Any = None,
    documents: Any = None,
    add_generation_prompt: bool = False,
    continue_final_message: bool = False,
    variables: Mapping[str, Any] | None = None,
    origin: str | None = None,
    context_tokens: int | None = None,
) -> str | list[str]:
    """The text of one conversation (a list of message dicts), or a list of texts for a list of conversations.

    `variables` (special tokens, the caller's extra names) are passed to the template after `messages`, `tools`,
    `documents` and `add_generation_prompt`. With `continue_final_message` the text ends right after the last
    message's content, so the model continues that message. Raises MissingChatTemplateError when `source` is None,
    ValueError carrying the template's message when it fails (`raise_exception` included), TypeError/ValueError
    naming the argument for a malformed `messages`, `tools` or `documents`.

    Each conversation renders under the limits of `tfgen.text.template_limits` (a step budget, a size bound from
    `context_tokens`, the model's context, bounded recursion); going past one is a ValueError naming `origin` (where
    the template comes from: a file, a GGUF key) and the limit, raised before anything is tokenized.
    """
    if source is None:
        raise MissingChatTemplateError(
            "this tokenizer has no chat template (a checkpoint gives one in chat_template.jinja or in "
            "tokenizer_config.json's chat_template); pass chat_template= with a Jinja template"
        )
    if continue_final_message and add_generation_prompt:
        raise ValueError(
            "continue_final_message and add_generation_prompt exclude each other: the first leaves the last message "
            "open for the model to continue, the second starts a new assistant message"
        )
    conversations, batched = conversations_of(messages)
    _check_list_of_dicts(tools, "tools", "JSON schemas (tfgen does not derive schemas from Python functions)")
    _check_list_of_dicts(documents, "documents", "dicts such as {'title': ..., 'text': ...}")
    template = compile_chat_template(source, origin)
    max_bytes = limits.render_limit(context_tokens)
    texts = []
    for conversation in conversations:
        text = _render(template, origin, max_bytes, context_tokens, messages=conversation, tools=tools,
                       documents=documents, add_generation_prompt=add_generation_prompt, **(variables or {}))
        texts.append(_open_final_message(text, conversation[-1]) if continue_final_message else text)
    return texts if batched else texts[0]


def _render(template: jinja2.Template, origin: str | None, max_bytes: int, context_tokens: int | None,
            **names: Any) -> str:
    """`template` rendered with `names` under the limits; ValueError naming `origin` and the limit it went past."""
    where = f"the chat template ({origin or 'chat_template='})"
    context = context_tokens or f"an assumed {limits.ASSUMED_CONTEXT_TOKENS}"
    bound = (f"the size bound, max({limits.MIN_RENDER_BYTES}, {context}-token context x "
             f"{limits.RENDER_BYTES_PER_TOKEN}) = {max_bytes} characters")
    try:
        with limits.render_budget(max_bytes):
            text = template.render(**names)
    except limits.RenderLimitError as error:
        raise ValueError(f"{where} went past a render limit: {error}{f' ({bound})' if error.sized else ''}") from None
    except RecursionError:
        raise ValueError(f"{where} recursed too deeply (over Python's recursion limit of "
                         f"{sys.getrecursionlimit()} frames)") from None
    except _RENDER_ERRORS as error:
        raise ValueError(f"the chat template failed: {error}") from None
    if len(text) > max_bytes:
        raise ValueError(f"{where} rendered {len(text)} characters, over {bound}")
    return text


def conversations_of(messages: Any) -> tuple[list[list[Mapping]], bool]:
    """`(conversations, batched)`: `messages` is one conversation (a non-empty list of message dicts) or a list of
    them. Each message has a string `role`, and a `content` that is a string or a list of content blocks (dicts);
    a message with `tool_calls` may have no content."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise TypeError(
            "messages must be a non-empty list of message dicts ({'role': ..., 'content': ...}) or a list of such "
            f"lists, got {_describe(messages)}"
        )
    batched = isinstance(messages[0], (list, tuple))
    conversations = list(messages) if batched else [messages]
    for index, conversation in enumerate(conversations):
        where = f"messages[{index}]" if batched else "messages"
        if not isinstance(conversation, (list, tuple)) or not conversation:
            raise TypeError(f"{where} must be a non-empty list of message dicts, got {_describe(conversation)}")
        for position, message in enumerate(conversation):
            _check_message(message, f"{where}[{position}]")
    return [list(conversation) for conversation in conversations], batched


def _check_message(message: Any, where: str) -> None:
    if not isinstance(message, Mapping):
        raise TypeError(f"{where} must be a dict with 'role' and 'content', got {_describe(message)}")
    if not isinstance(message.get("role"), str):
        raise ValueError(f"{where} needs a string 'role' (such as 'user'), got {message.get('role')!r}")
    content = message.get("content")
    if content is None and "tool_calls" in message:
        return  # an assistant turn that only calls tools
    if isinstance(content, str):
        return
    if isinstance(content, list) and all(isinstance(block, Mapping) for block in content):
        return  # content blocks, such as [{"type": "text", "text": ...}]
    raise ValueError(f"{where}['content'] must be a string or a list of content blocks (dicts), got {content!r}")


def _check_list_of_dicts(value: Any, name: str, what: str) -> None:
    if value is None:
        return
    if not isinstance(value, (list, tuple)) or not all(isinstance(item, Mapping) for item in value):
        raise TypeError(f"{name} must be a list of {what}, got {_describe(value)}")


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _open_final_message(text: str, final_message: Mapping) -> str:
    """`text` cut right after the final message's content (HF's `continue_final_message` rule): after its last
    occurrence, keeping the message's trailing whitespace only where the template kept it."""
    content = final_message.get("content")
    if isinstance(content, list):
        # The last block that has text is the one to continue (the others may be images).
        texts = [block["text"] for block in content if "text" in block]
        if not texts:
            raise ValueError("continue_final_message: the final message has no text block to continue")
        content = texts[-1]
    if not isinstance(content, str):
        raise ValueError(f"continue_final_message: the final message has no text to continue, got {content!r}")
    stripped, without_leading = content.strip(), content.lstrip()
    start = text.rfind(stripped)
    if start < 0:
        raise ValueError(
            "continue_final_message: the final message does not appear in the text the chat template rendered (the "
            "template changes it), so it cannot be left open"
        )
    kept_whole = text[start : start + len(without_leading)] == without_leading
    return text[: start + len(without_leading if kept_whole else stripped)]


def check_options(template_kwargs: Mapping[str, Any], tokenize: bool, **tokenizer_options: Any) -> None:
    """Refuses, naming them, HF options tfgen does not implement (they would otherwise reach the template as
    variables) and tokenizing options given with `tokenize=False` (they would have nothing to act on)."""
    unsupported = [name for name in UNSUPPORTED_OPTIONS if name in template_kwargs]
    if unsupported:
        raise ValueError(f"apply_chat_template does not support {', '.join(unsupported)} in tfgen")
    defaults = {"padding": False, "truncation": False, "max_length": None, "return_tensors": None, "return_dict": False}
    given = [name for name, value in tokenizer_options.items() if value != defaults[name]]
    if given and not tokenize:
        raise ValueError(f"{', '.join(given)} need tokenize=True (tokenize=False returns the rendered text)")


def read_chat_template(directory: str | os.PathLike) -> str | None:
    """The chat template of a checkpoint directory, picked as HF 4.55 picks it: `chat_template.jinja`, else
    `tokenizer_config.json`'s `chat_template` (a string, or a list of `{"name", "template"}` objects whose "default"
    is used, with a warning naming the others); None when there is none. OSError naming the file when it cannot be read,
    ValueError for an entry of the wrong type."""
    path = os.path.join(directory, CHAT_TEMPLATE_FILE)
    if file_present(path):
        # Line ends as text mode reads them, as HF does: "\r\n" becomes "\n".
        return read_text_file(path, None, JSON_FILE_CAP)
    config_path = os.path.join(directory, "tokenizer_config.json")
    value = read_json_object(config_path).get("chat_template")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(entry, dict) and isinstance(entry.get("name"), str) and isinstance(entry.get("template"), str)
        for entry in value
    ):
        templates = {entry["name"]: entry["template"] for entry in value}
        others = sorted(set(templates) - {"default"})
        # HF keeps them all: it renders "tool_use" when tools= is given, and a template that chat_template= names.
        if "default" not in templates:
            logger.warning("%s: chat templates %s but none named 'default': the tokenizer gets no chat template",
                           config_path, others)
        elif others:
            logger.warning("%s: tfgen keeps only the 'default' chat template; %s are left out (HF would render "
                           "'tool_use' when tools= is given, or one that chat_template= names)", config_path, others)
        return templates.get("default")
    raise ValueError(
        f"{config_path!r}: chat_template must be a template string or a list of {{'name': ..., 'template': ...}} "
        f"objects, got {_describe(value)}"
    )


def chat_template_origin(directory: str | os.PathLike) -> str:
    """Where `read_chat_template` takes a checkpoint directory's template from, as errors name it."""
    path = os.path.join(directory, CHAT_TEMPLATE_FILE)
    return path if os.path.isfile(path) else f"{os.path.join(directory, 'tokenizer_config.json')} chat_template"


def write_chat_template(directory: str | os.PathLike, source: str | None) -> None:
    """Writes `source` to `directory/chat_template.jinja`, where HF 4.55 reads it first (a stale file is removed when
    `source` is None, so the directory never describes a template the tokenizer does not have)."""
    path = os.path.join(directory, CHAT_TEMPLATE_FILE)
    if source is None:
        if os.path.isfile(path):
            os.remove(path)
        return
    with open(path, "w", encoding="utf-8") as file:
        file.write(source)
