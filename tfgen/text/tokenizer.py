"""`Tokenizer`: text <-> token ids over HF fast-tokenizer files (`tokenizer.json` through the `tokenizers` library).

`Tokenizer` reads the HF fast-tokenizer layout (`tokenizer.json` plus the optional `tokenizer_config.json`,
`special_tokens_map.json`, `generation_config.json`, `config.json`, the chat template), batches prompts with left
padding for generation (`tfgen.text.tokenizer_base.BaseTokenizer`), and writes back a directory that
`transformers.AutoTokenizer` loads. Other sources (a GGUF file, a keras-hub preset) are `tfgen.AutoTokenizer`'s to pick.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import tokenizers

from tfgen.local_files import file_present
from tfgen.text import chat_template as chat_templates
from tfgen.text.tokenizer_base import BaseTokenizer, as_id_list, check_text
from tfgen.text.tokenizer_files import (
    context_length_from_files,
    load_backend,
    resolve_checkpoint_directory,
    special_tokens_from_files,
)


class Tokenizer(BaseTokenizer):
    """Byte-level BPE (or any `tokenizers` model) tokenizer with generation-friendly batching.

    Args:
        tokenizer: the backend `tokenizers.Tokenizer`. It is copied (not modified) when it needs changes: any
            padding/truncation stored in it is dropped (this class pads and truncates itself), and configured special
            tokens that are plain vocabulary entries get registered as special added tokens, as HF does, so they are
            never split and `skip_special_tokens` drops them.
        bos_token, eos_token, pad_token: special token strings; each must be in the vocabulary (`ValueError`
            otherwise).
        padding_side, chat_template: see `BaseTokenizer`.
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
        special_tokens = {"bos": bos_token, "eos": eos_token, "pad": pad_token}
        for name, content in special_tokens.items():
            if content is not None and (not isinstance(content, str) or tokenizer.token_to_id(content) is None):
                raise ValueError(f"{name}_token {content!r} is not in the tokenizer's vocabulary")
        super().__init__(special_tokens, padding_side=padding_side, chat_template=chat_template)
        self._tokenizer = _prepared_backend(tokenizer, [t for t in special_tokens.values() if t is not None])

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
        """Loads a tokenizer from a local directory or a Hugging Face Hub repo id holding `tokenizer.json` (a GGUF file
        or a keras-hub preset: `tfgen.AutoTokenizer.from_pretrained`, which also takes these).

        Special tokens come from `tokenizer_config.json`, then `special_tokens_map.json`, then the padding stored in
        `tokenizer.json` (pad only); a token still missing is looked up by id in `generation_config.json`, then
        `config.json` (`eos_token_id` lists use their first id). `padding_side` is an argument rather than read from
        `tokenizer_config.json`, whose value is usually the training setting ("right") and wrong for generation.
        Hub downloads fetch only the files above; `local_files_only=None` means "only if HF_HUB_OFFLINE is set".

        Raises:
            OSError: the path is not a directory holding `tokenizer.json` and no hub snapshot with it could be
                found (unknown id, offline without a cached copy, ...); the message names `path_or_repo_id`. Also,
                naming the file, when one of the files is malformed (not JSON, not an object, a `tokenizer.json`
                that the `tokenizers` library rejects); a special-token entry of the wrong type is a ValueError.
        """
        if os.path.isfile(path_or_repo_id):
            # A file is never a Hub id: say what to do rather than what the Hub lookup of a file path would say.
            raise OSError(f"{os.fspath(path_or_repo_id)!r} is a file, not a folder of tokenizer files; a GGUF file's "
                          "tokenizer loads with tfgen.AutoTokenizer.from_pretrained")
        directory = resolve_checkpoint_directory(
            os.fspath(path_or_repo_id), revision, cache_dir, token, local_files_only
        )
        tokenizer_path = os.path.join(directory, "tokenizer.json")
        if not file_present(tokenizer_path, "the tokenizer file"):
            raise OSError(f"no tokenizer.json in {os.fspath(path_or_repo_id)!r} (looked in {directory}); a GGUF file "
                          "or a keras-hub preset loads with tfgen.AutoTokenizer.from_pretrained")
        backend = load_backend(tokenizer_path)
        special_tokens = special_tokens_from_files(directory, backend)
        chat_template = chat_templates.read_chat_template(directory)
        tokenizer = cls(backend, padding_side=padding_side, chat_template=chat_template, **special_tokens)
        tokenizer.chat_template_origin = chat_templates.chat_template_origin(directory)
        tokenizer.context_length = context_length_from_files(directory)
        return tokenizer

    @property
    def backend_tokenizer(self) -> tokenizers.Tokenizer:
        """The `tokenizers.Tokenizer` behind this one (HF's name for it); do not modify it."""
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce, added tokens included (HF's `len(tokenizer)`)."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, content: str) -> int | None:
        return self._tokenizer.token_to_id(content)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of one string (special tokens per the tokenizer's post-processor when `add_special_tokens`)."""
        check_text(text, "text")
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

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

    def in_graph(self, vocab_size: int):
        """The exported `generate_text` signature's tokenizer as TF ops: byte-level BPE (`tfgen.text.in_graph`) or
        SentencePiece-style BPE with byte fallback (`tfgen.text.sentencepiece_graph`)."""
        # Imported here, not at the top: they load TensorFlow, which tokenizing never needs.
        definition = json.loads(self._tokenizer.to_str())
        if (definition.get("model") or {}).get("byte_fallback"):
            from tfgen.text.sentencepiece_graph import SentencePieceInGraphTokenizer

            return SentencePieceInGraphTokenizer(self, definition, vocab_size)
        from tfgen.text.in_graph import BytePairInGraphTokenizer

        return BytePairInGraphTokenizer(self, vocab_size)

    def in_graph_problem(self) -> str | None:
        from tfgen.text.byte_level_spec import byte_level_spec
        from tfgen.text.sentencepiece_graph import sentencepiece_problem

        definition = json.loads(self._tokenizer.to_str())
        if (definition.get("model") or {}).get("byte_fallback"):
            problem = sentencepiece_problem(definition)
            return None if problem is None else f"the tokenizer has no exact in-graph form for: {problem}"
        try:
            byte_level_spec(definition)
        except ValueError as error:
            return f"the tokenizer has no exact in-graph form for: {error}"
        return None


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
