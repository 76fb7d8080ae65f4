"""Text <-> token ids for decoder-only LMs: a thin wrapper over a `tokenizers` `tokenizer.json`.

`Tokenizer` reads the HF fast-tokenizer layout (`tokenizer.json` plus the optional `tokenizer_config.json`,
`special_tokens_map.json`, `generation_config.json`, `config.json`), batches prompts with left padding for
generation, and writes back a directory that `transformers.AutoTokenizer` loads. `IncrementalDecoder` turns a
stream of generated ids into text pieces without ever emitting half a UTF-8 character.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import tokenizers

from tfgen.text import chat_template as chat_templates
from tfgen.gguf import is_gguf_path, refuse_hub_options
from tfgen.keras_hub.presets import is_keras_hub_preset
from tfgen.text.tokenizer_files import load_backend, resolve_checkpoint_directory, special_tokens_from_files
from tfgen.value_types import is_integer

_PADDING_SIDES = ("left", "right")
_RETURN_TENSORS = ("np", "tf", None)


class Tokenizer:
    """Byte-level BPE (or any `tokenizers` model) tokenizer with generation-friendly batching.

    Args:
        tokenizer: the backend `tokenizers.Tokenizer`. It is copied (not modified) when it needs changes: any
            padding/truncation stored in it is dropped (this class pads and truncates itself), and configured special
            tokens that are plain vocabulary entries get registered as special added tokens, as HF does, so they are
            never split and `skip_special_tokens` drops them.
        bos_token, eos_token, pad_token: special token strings; each must be in the vocabulary (`ValueError`
            otherwise). Without a pad token, `pad_token_id` falls back to the eos id (GPT-2 practice: padded
            positions are masked out, so which id fills them does not matter).
        padding_side: "left" (default; generation appends after the last column, so prompts must end there) or
            "right". Truncation follows it: with left padding the *last* `max_length` tokens are kept, since the end
            of a prompt is what the next token depends on; with right padding the first ones are kept.
        chat_template: the model's Jinja chat template (HF's `chat_template`), or None.
    """

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        padding_side: str = "left",
        chat_template: str | None = None,
    ):
        if not isinstance(tokenizer, tokenizers.Tokenizer):
            raise TypeError(f"tokenizer must be a tokenizers.Tokenizer, got {type(tokenizer).__name__}")
        self._special_tokens = {"bos": bos_token, "eos": eos_token, "pad": pad_token}
        for name, content in self._special_tokens.items():
            if content is not None and (not isinstance(content, str) or tokenizer.token_to_id(content) is None):
                raise ValueError(f"{name}_token {content!r} is not in the tokenizer's vocabulary")
        self._tokenizer = _prepared_backend(tokenizer, [t for t in self._special_tokens.values() if t is not None])
        self.padding_side = padding_side
        if chat_template is not None and not isinstance(chat_template, str):
            raise TypeError(f"chat_template must be a Jinja template string or None, got {type(chat_template).__name__}")
        self.chat_template = chat_template

    @classmethod
    def from_pretrained(
        cls,
        path_or_repo_id: str | os.PathLike,
        *,
        revision: str | None = None,
        cache_dir: str | os.PathLike | None = None,
        token: str | bool | None = None,
        local_files_only: bool | None = None,
        padding_side: str = "left",
    ) -> Tokenizer:
        """Loads a tokenizer from a local directory, a Hugging Face Hub repo id, or a GGUF file (a path ending in
        `.gguf`: the vocabulary, special tokens and chat template stored in it; see `tfgen.gguf.tokenizer`).

        Special tokens come from `tokenizer_config.json`, then `special_tokens_map.json`, then the padding stored in
        `tokenizer.json` (pad only); a token still missing is looked up by id in `generation_config.json`, then
        `config.json` (`eos_token_id` lists use their first id). `padding_side` is an argument rather than read from
        `tokenizer_config.json`, whose value is usually the training setting ("right") and wrong for generation.
        Hub downloads fetch only the files above; `local_files_only=None` means "only if HF_HUB_OFFLINE is set". A GGUF
        file is read from its local path: `revision`, `cache_dir` and `token` are refused with it (ValueError).

        Raises:
            OSError: the path is not a directory holding `tokenizer.json` and no hub snapshot with it could be
                found (unknown id, offline without a cached copy, ...); the message names `path_or_repo_id`. Also,
                naming the file, when one of the files is malformed (not JSON, not an object, a `tokenizer.json`
                that the `tokenizers` library rejects); a special-token entry of the wrong type is a ValueError.
        """
        if is_gguf_path(path_or_repo_id):
            refuse_hub_options(path_or_repo_id, revision=revision, cache_dir=cache_dir, token=token)
            from tfgen.gguf.tokenizer import load_gguf_tokenizer  # lazy: imports gguf

            return load_gguf_tokenizer(path_or_repo_id, padding_side=padding_side)
        if is_keras_hub_preset(path_or_repo_id):
            refuse_hub_options(path_or_repo_id, "keras-hub preset", revision=revision, cache_dir=cache_dir, token=token)
            from tfgen.keras_hub.presets import load_preset_tokenizer  # lazy: imports keras-hub

            return load_preset_tokenizer(path_or_repo_id, padding_side=padding_side)
        directory = resolve_checkpoint_directory(
            os.fspath(path_or_repo_id), revision, cache_dir, token, local_files_only
        )
        tokenizer_path = os.path.join(directory, "tokenizer.json")
        if not os.path.isfile(tokenizer_path):
            raise OSError(f"no tokenizer.json in {os.fspath(path_or_repo_id)!r} (looked in {directory})")
        backend = load_backend(tokenizer_path)
        special_tokens = special_tokens_from_files(directory, backend)
        chat_template = chat_templates.read_chat_template(directory)
        return cls(backend, padding_side=padding_side, chat_template=chat_template, **special_tokens)

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
    def backend_tokenizer(self) -> tokenizers.Tokenizer:
        """The `tokenizers.Tokenizer` behind this one (HF's name for it); do not modify it."""
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce, added tokens included (HF's `len(tokenizer)`)."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

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
        return self._token_id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self._token_id(self.eos_token)

    @property
    def pad_token_id(self) -> int | None:
        """Id used to fill padded positions: the pad token's, else the eos token's (GPT-2 practice), else None."""
        return self._token_id(self.pad_token)

    def _token_id(self, content: str | None) -> int | None:
        return None if content is None else self._tokenizer.token_to_id(content)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of one string (special tokens per the tokenizer's post-processor when `add_special_tokens`)."""
        check_text(text, "text")
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

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
        _check_positive_int(pad_to_multiple_of, "pad_to_multiple_of")
        _check_positive_int(max_length, "max_length")
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

    def _encode_batch(self, texts: Sequence[str], add_special_tokens: bool, max_length: int | None) -> list[list[int]]:
        """Token ids per text, truncated to `max_length` (special tokens included) when given."""
        # Truncate before the post-processor adds special tokens, so a BOS survives keeping the last tokens.
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        if max_length is not None:
            special_count = self._tokenizer.num_special_tokens_to_add(False) if add_special_tokens else 0
            if max_length < special_count:
                raise ValueError(f"max_length={max_length} leaves no room for the {special_count} special tokens")
            for encoding in encodings:
                encoding.truncate(max_length - special_count, direction=self._padding_side)
        return [self._tokenizer.post_process(e, add_special_tokens=add_special_tokens).ids for e in encodings]

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        """Text of `ids` (an int, a list, or a 1-D numpy array / tensor of ints), without clean-up of spaces."""
        return self._tokenizer.decode(as_id_list(ids, "ids"), skip_special_tokens=skip_special_tokens)

    def batch_decode(self, batch: Any, skip_special_tokens: bool = False) -> list[str]:
        """Texts of each row of `batch` (a list of id lists, or a 2-D numpy array / tensor `[B, T]`)."""
        if getattr(batch, "ndim", 2) != 2:
            raise ValueError(f"batch must be 2-D [batch, length], got shape {tuple(batch.shape)}")
        rows = [as_id_list(row, "batch row") for row in batch]
        return self._tokenizer.decode_batch(rows, skip_special_tokens=skip_special_tokens)

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
        `truncation`, `max_length` and `return_tensors` act as in `__call__` (whose padding side applies).

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
        )
        if not tokenize:
            return text
        encoded = self(text, padding=padding, truncation=truncation, max_length=max_length, add_special_tokens=False,
                       return_tensors=return_tensors)
        if isinstance(text, str) and return_tensors is None:
            encoded = {key: rows[0] for key, rows in encoded.items()}  # one conversation: one flat list, as in HF
        return encoded if return_dict else encoded["input_ids"]

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Writes `tokenizer.json`, a `tokenizer_config.json` that `transformers.AutoTokenizer` loads as a
        `PreTrainedTokenizerFast` with the same ids, special tokens, padding and truncation sides, and the chat
        template as `chat_template.jinja`.

        The eos fallback for padding is written as an explicit `pad_token`, so HF can pad the same way.
        """
        os.makedirs(directory, exist_ok=True)
        self._tokenizer.save(os.path.join(directory, "tokenizer.json"))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "padding_side": self._padding_side,
            "truncation_side": self._padding_side,
            "clean_up_tokenization_spaces": False,
        }
        for name, content in (("bos", self.bos_token), ("eos", self.eos_token), ("pad", self.pad_token)):
            if content is not None:
                config[f"{name}_token"] = content
        # PreTrainedTokenizerFast overwrites the pre-tokenizer's add_prefix_space with this key (default False).
        if self._tokenizer.pre_tokenizer is not None:
            pre_tokenizer_state = json.loads(self._tokenizer.pre_tokenizer.__getstate__())
            if "add_prefix_space" in pre_tokenizer_state:
                config["add_prefix_space"] = pre_tokenizer_state["add_prefix_space"]
        with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as file:
            json.dump(config, file, indent=2, ensure_ascii=False)
        chat_templates.write_chat_template(directory, self.chat_template)


class IncrementalDecoder:
    """Streams generated ids as text: each `push` returns the text completed since the previous one.

    Text ending in U+FFFD (an incomplete multi-byte character) is held back until a later id completes it, and
    `"".join(pushes) + flush() == tokenizer.decode(all_ids, skip_special_tokens)`. Each push decodes only a short
    window (the ids of the last emitted piece, for context such as word-initial spaces, plus the pending ids), so
    its cost does not grow with the stream.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        if not isinstance(tokenizer, Tokenizer):
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


def _prepared_backend(backend: tokenizers.Tokenizer, special_tokens: Iterable[str]) -> tokenizers.Tokenizer:
    """`backend`, or a copy without stored padding/truncation and with `special_tokens` registered as special."""
    registered = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
    unregistered = [content for content in dict.fromkeys(special_tokens) if content not in registered]
    if backend.padding is None and backend.truncation is None and not unregistered:
        return backend
    backend = copy.deepcopy(backend)
    backend.no_padding()
    backend.no_truncation()
    backend.add_special_tokens([tokenizers.AddedToken(content, special=True) for content in unregistered])
    return backend


def check_text(text: Any, name: str) -> None:
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a string, got {type(text).__name__}")


def _check_positive_int(value: Any, name: str) -> None:
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
