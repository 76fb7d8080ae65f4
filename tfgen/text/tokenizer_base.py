"""What every tfgen tokenizer shares, whatever its backend: batching with left padding for generation, truncation,
special tokens, chat templates, and streaming decoded text (`IncrementalDecoder`).

`tfgen.text.tokenizer.Tokenizer` (HF `tokenizer.json` files) and `tfgen.keras_hub.tokenizer.KerasHubTokenizer` (a
keras-hub preprocessor's tokenizer) are its two kinds; the stop-string and structured-output tables, streamers and the
export take any `BaseTokenizer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tfgen.text import chat_template as chat_templates
from tfgen.value_types import is_integer

_PADDING_SIDES = ("left", "right")
_RETURN_TENSORS = ("np", "tf", None)


class BaseTokenizer:
    """Text <-> ids for generation. A subclass provides `vocab_size`, `token_to_id`, `encode`, `_encode_batch`,
    `decode`, `batch_decode`, `save_pretrained` and `in_graph`; this class adds batching (`__call__`), special tokens
    and chat templates on top.

    Args:
        special_tokens: {"bos": ..., "eos": ..., "pad": ...}, each a token string or None. Without a pad token,
            `pad_token_id` falls back to the eos id (GPT-2 practice: padded positions are masked out, so which id
            fills them does not matter).
        padding_side: "left" (default; generation appends after the last column, so prompts must end there) or
            "right". Truncation follows it: with left padding the *last* `max_length` tokens are kept, since the end
            of a prompt is what the next token depends on; with right padding the first ones are kept.
        chat_template: the model's Jinja chat template (HF's `chat_template`), or None.
    """

    def __init__(self, special_tokens: dict[str, str | None], *, padding_side: str = "left",
                 chat_template: str | None = None):
        self._special_tokens = dict(special_tokens)
        self.padding_side = padding_side
        if chat_template is not None and not isinstance(chat_template, str):
            raise TypeError(f"chat_template must be a Jinja template string or None, got "
                            f"{type(chat_template).__name__}")
        self.chat_template = chat_template
        # The model's context in tokens, where the loader knows it: it sizes the bound on a rendered chat template.
        self.context_length: int | None = None

    @property
    def chat_template(self) -> str | None:
        """The model's Jinja chat template, or None. Setting it forgets where the loaded one came from."""
        return self._chat_template

    @chat_template.setter
    def chat_template(self, source: str | None) -> None:
        self._chat_template = source
        # Where the template comes from (a file, a GGUF key), named by the errors of a render that goes past a limit.
        self.chat_template_origin = "tokenizer.chat_template"

    @property
    def padding_side(self) -> str:
        """"left" or "right"; also picks which end truncation keeps (see the class docstring)."""
        return self._padding_side

    @padding_side.setter
    def padding_side(self, side: str) -> None:
        if side not in _PADDING_SIDES:
            raise ValueError(f"padding_side must be 'left' or 'right', got {side!r}")
        self._padding_side = side

    @property
    def backend_tokenizer(self):
        """The `tokenizers.Tokenizer` behind this one (HF's name for it), or None when the backend is another kind
        (the token-text tables then decode each id instead of reading the vocabulary)."""
        return None

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce, added tokens included (HF's `len(tokenizer)`)."""
        raise NotImplementedError

    def token_to_id(self, content: str) -> int | None:
        """The id of the token spelled `content`, or None when the vocabulary has none."""
        raise NotImplementedError

    @property
    def bos_token(self) -> str | None:
        return self._special_tokens["bos"]

    @property
    def eos_token(self) -> str | None:
        return self._special_tokens["eos"]

    @property
    def pad_token(self) -> str | None:
        """The pad token, or the eos token when none is configured (see `pad_token_id`)."""
        return self._special_tokens["pad"] or self._special_tokens["eos"]

    @property
    def bos_token_id(self) -> int | None:
        return self._id_of(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self._id_of(self.eos_token)

    @property
    def pad_token_id(self) -> int | None:
        """Id used to fill padded positions: the pad token's, else the eos token's (GPT-2 practice), else None."""
        return self._id_of(self.pad_token)

    def _id_of(self, content: str | None) -> int | None:
        return None if content is None else self.token_to_id(content)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of one string (special tokens added when `add_special_tokens`)."""
        raise NotImplementedError

    def _encode_batch(self, texts: Sequence[str], add_special_tokens: bool, max_length: int | None) -> list[list[int]]:
        """Token ids per text, truncated to `max_length` (special tokens included, which end per `padding_side`)."""
        raise NotImplementedError

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        """Text of `ids` (an int, a list, or a 1-D numpy array / tensor of ints)."""
        raise NotImplementedError

    def batch_decode(self, batch: Any, skip_special_tokens: bool = False) -> list[str]:
        """Texts of each row of `batch` (a list of id lists, or a 2-D numpy array / tensor `[B, T]`)."""
        raise NotImplementedError

    def save_pretrained(self, directory) -> None:
        """Writes the tokenizer's files to `directory`."""
        raise NotImplementedError

    def in_graph(self, vocab_size: int):
        """This tokenizer as TF ops (`tfgen.text.in_graph.InGraphTokenizer`), for the exported `generate_text`
        signature of a model with `vocab_size` ids; ValueError when it cannot run in a graph."""
        raise NotImplementedError

    def in_graph_problem(self) -> str | None:
        """Why `in_graph` would refuse this tokenizer (one line), found without building it; None when it would
        not."""
        return None

    def __call__(
        self,
        text: str | Sequence[str],
        *,
        padding: bool | str = True,
        pad_to_multiple_of: int | None = None,
        max_length: int | None = None,
        truncation: bool = False,
        add_special_tokens: bool = True,
        return_tensors: str | None = "np",
    ) -> dict[str, Any]:
        """Tokenizes a string (a batch of one) or a list of strings into `input_ids` and `attention_mask`.

        Args:
            padding: True / "longest" pads to the longest row, "max_length" to `max_length`, False not at all (rows
                must then have equal length unless `return_tensors=None`).
            pad_to_multiple_of: rounds the padded length up to a multiple of this (fewer distinct XLA shapes).
            max_length: the truncation limit (with `truncation=True`) and the "max_length" padding target.
            truncation: cut rows to `max_length` tokens, special tokens included and kept; which end is kept
                follows `padding_side` (left: the last tokens).
            return_tensors: "np" (numpy int32), "tf" (tf.Tensor int32) or None (lists of lists).

        Returns:
            {"input_ids": [B, T], "attention_mask": [B, T]} with 1 on real tokens and 0 on padding.
        """
        texts = [text] if isinstance(text, str) else text
        if not isinstance(texts, (list, tuple)) or not texts:
            raise TypeError(f"text must be a string or a non-empty list of strings, got {type(text).__name__}")
        for item in texts:
            check_text(item, "text")
        if return_tensors not in _RETURN_TENSORS:
            raise ValueError(f"return_tensors must be 'np', 'tf' or None, got {return_tensors!r}")
        if not (padding is True or padding is False or padding in ("longest", "max_length")):
            raise ValueError(f"padding must be True, False, 'longest' or 'max_length', got {padding!r}")
        check_positive_int(pad_to_multiple_of, "pad_to_multiple_of")
        check_positive_int(max_length, "max_length")
        if (truncation or padding == "max_length") and max_length is None:
            raise ValueError("max_length is required with truncation=True or padding='max_length'")
        if pad_to_multiple_of is not None and padding is False:
            raise ValueError("pad_to_multiple_of needs padding enabled")

        rows = self._encode_batch(texts, add_special_tokens, max_length if truncation else None)
        if padding is False and return_tensors is None:
            return {"input_ids": rows, "attention_mask": [[1] * len(row) for row in rows]}
        lengths = [len(row) for row in rows]
        length = max_length if padding == "max_length" else max(lengths)
        if pad_to_multiple_of is not None:
            length = -(-length // pad_to_multiple_of) * pad_to_multiple_of
        if max(lengths) > length:
            raise ValueError(f"a row has {max(lengths)} tokens, over max_length={max_length}; pass truncation=True")
        if padding is False and min(lengths) != length:
            raise ValueError("rows have different lengths; pass padding=True or return_tensors=None")
        if self.pad_token_id is None and min(lengths) < length:
            raise ValueError("padding needs a pad_token or eos_token, and this tokenizer has neither")

        input_ids = np.full((len(rows), length), self.pad_token_id or 0, np.int32)
        attention_mask = np.zeros((len(rows), length), np.int32)
        for row_index, row in enumerate(rows):
            columns = slice(length - len(row), length) if self._padding_side == "left" else slice(0, len(row))
            input_ids[row_index, columns] = row
            attention_mask[row_index, columns] = 1
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        if return_tensors == "tf":
            import tensorflow as tf  # lazy: tokenizing does not otherwise need TensorFlow

            return {key: tf.constant(value) for key, value in batch.items()}
        return batch if return_tensors == "np" else {key: value.tolist() for key, value in batch.items()}

    def apply_chat_template(
        self,
        messages: Any,
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        tokenize: bool = True,
        padding: bool | str = False,
        truncation: bool = False,
        max_length: int | None = None,
        return_tensors: str | None = None,
        return_dict: bool = False,
        **template_kwargs: Any,
    ) -> Any:
        """Renders a conversation with the chat template (HF 4.55's `apply_chat_template`: same text, same ids).

        `messages` is one conversation, a list of `{"role": ..., "content": ...}` dicts, or a list of them (a batch).
        `chat_template` replaces the tokenizer's; the template also sees `tools`, `documents` (lists of dicts),
        `add_generation_prompt`, the special tokens (`bos_token`, `eos_token`, `pad_token` as configured) and
        `template_kwargs`. `continue_final_message` ends the text inside the last message, for the model to continue.
        The text is tokenized without adding special tokens (the template writes its own, as in HF); `padding`,
        `truncation`, `max_length` and `return_tensors` act as in `__call__` (whose padding side applies). The
        template renders under limits (`tfgen.text.template_limits`; the size bound grows with `context_length`).

        Returns: the text (`tokenize=False`; a list for a batch); else the ids: a list (a list of lists for a batch),
        an `[B, T]` array / tensor with `return_tensors`, or with `return_dict` the `input_ids` and `attention_mask`.
        Raises ValueError without a template, and with the template's message when it fails or calls
        `raise_exception`; TypeError / ValueError naming `messages`, `tools` or `documents` when malformed.
        """
        chat_templates.check_options(template_kwargs, tokenize, padding=padding, truncation=truncation,
                                     max_length=max_length, return_tensors=return_tensors, return_dict=return_dict)
        special_tokens = {f"{name}_token": content for name, content in self._special_tokens.items() if content}
        text = chat_templates.render_chat(
            self.chat_template if chat_template is None else chat_template, messages, tools=tools,
            documents=documents, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, variables={**special_tokens, **template_kwargs},
            origin=self.chat_template_origin if chat_template is None else "chat_template=",
            context_tokens=self.context_length,
        )
        if not tokenize:
            return text
        encoded = self(text, padding=padding, truncation=truncation, max_length=max_length, add_special_tokens=False,
                       return_tensors=return_tensors)
        if isinstance(text, str) and return_tensors is None:
            encoded = {key: rows[0] for key, rows in encoded.items()}  # one conversation: one flat list, as in HF
        return encoded if return_dict else encoded["input_ids"]


class IncrementalDecoder:
    """Streams generated ids as text: each `push` returns the text completed since the previous one.

    Text ending in U+FFFD (an incomplete multi-byte character) is held back until a later id completes it, and
    `"".join(pushes) + flush() == tokenizer.decode(all_ids, skip_special_tokens)`. Each push decodes only a short
    window (the ids of the last emitted piece, for context such as word-initial spaces, plus the pending ids), so
    its cost does not grow with the stream.
    """

    def __init__(self, tokenizer: BaseTokenizer, skip_special_tokens: bool = True):
        if not isinstance(tokenizer, BaseTokenizer):
            raise TypeError(f"tokenizer must be a tfgen Tokenizer, got {type(tokenizer).__name__}")
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._reset()

    def _reset(self) -> None:
        self._window: list[int] = []  # context ids (already emitted), then pending ids
        self._context_length = 0

    def _window_texts(self) -> tuple[str, str]:
        decode = self._tokenizer.decode
        return (
            decode(self._window[: self._context_length], skip_special_tokens=self._skip_special_tokens),
            decode(self._window, skip_special_tokens=self._skip_special_tokens),
        )

    def push(self, token_ids: Any) -> str:
        """Adds ids (an int, a list, or a 1-D array / tensor) and returns the newly completed text ("" if none)."""
        self._window.extend(as_id_list(token_ids, "token_ids"))
        context_text, window_text = self._window_texts()
        if len(window_text) <= len(context_text) or window_text.endswith("\ufffd"):
            return ""
        self._window = self._window[self._context_length :]
        self._context_length = len(self._window)
        return window_text[len(context_text) :]

    def flush(self) -> str:
        """Returns whatever is still held back (even an incomplete character) and resets for a new stream."""
        context_text, window_text = self._window_texts()
        self._reset()
        return window_text[len(context_text) :]


def check_text(text: Any, name: str) -> None:
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a string, got {type(text).__name__}")


def check_positive_int(value: Any, name: str) -> None:
    if value is not None and (not is_integer(value) or value <= 0):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def as_id_list(ids: Any, name: str) -> list[int]:
    """Python ints of a scalar or 1-D id container (list, tuple, numpy array, eager tensor)."""
    array = np.asarray(ids)
    if array.size == 0:
        return []
    if array.ndim > 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must be an int or a 1-D sequence of ints, got shape {array.shape} {array.dtype}")
    return array.reshape(-1).tolist()
