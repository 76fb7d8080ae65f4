"""`KerasHubTokenizer`: a keras-hub preprocessor's tokenizer as a tfgen tokenizer (`BaseTokenizer`: left padding,
truncation, decoding, stop strings, streaming), so text goes in and out as keras-hub's own `generate()` handles it."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfgen.keras_hub.presets import keras_hub_module
from tfgen.text.in_graph import InGraphTokenizer
from tfgen.text.tokenizer_base import BaseTokenizer, as_id_list, check_text


class KerasHubTokenizer(BaseTokenizer):
    """Tokenizes with `preprocessor.tokenizer` (a keras-hub BytePair or SentencePiece tokenizer, TF ops): the ids of
    keras-hub's `generate()`, which adds the start token when the preprocessor's `add_start_token` is set (as
    `add_special_tokens=True` does here) and never the end token.

    `stop_token_ids` are the ids keras-hub's `generate(stop_token_ids="auto")` stops at; `pad_token_id` is the
    tokenizer's. `layer` is the keras-hub tokenizer itself (the exported `generate_text` signature runs it in the
    graph). There is no chat template (keras-hub keeps none); `apply_chat_template(chat_template=...)` takes one.
    """

    def __init__(self, preprocessor, padding_side: str = "left"):
        self.layer = preprocessor.tokenizer
        self._add_start_token = bool(getattr(preprocessor, "add_start_token", False))
        layer = self.layer
        self._ids = {
            "bos": getattr(layer, "start_token_id", None),
            "eos": getattr(layer, "end_token_id", None),
            "pad": getattr(layer, "pad_token_id", None),
        }
        super().__init__(
            {name: None if token_id is None else str(layer.id_to_token(token_id))
             for name, token_id in self._ids.items()},
            padding_side=padding_side,
        )
        self.stop_token_ids = [i for i in (self._ids["eos"], getattr(layer, "end_token2_id", None)) if i is not None]
        self.special_ids = np.array(sorted(set(getattr(layer, "special_token_ids", []) or [])), np.int64)

    @classmethod
    def from_preset(cls, path, padding_side: str = "left") -> KerasHubTokenizer:
        """The tokenizer of a keras-hub preset directory's causal-LM preprocessor (OSError when it has none)."""
        keras_hub = keras_hub_module()
        try:
            preprocessor = keras_hub.models.CausalLMPreprocessor.from_preset(os.fspath(path))
        except ValueError as error:
            raise OSError(f"{os.fspath(path)!r}: no causal-LM preprocessor in this keras-hub preset: {error}") from None
        return cls(preprocessor, padding_side=padding_side)

    @property
    def vocab_size(self) -> int:
        return int(self.layer.vocabulary_size())

    @property
    def pad_token_id(self) -> int | None:
        """The tokenizer's pad id, else the end token's."""
        return self._ids["pad"] if self._ids["pad"] is not None else self._ids["eos"]

    def token_to_id(self, content: str) -> int | None:
        return int(self.layer.token_to_id(content))

    def start_ids(self, add_special_tokens: bool) -> list[int]:
        """The ids put before a text's own: the start token when `add_special_tokens` and the preprocessor adds it."""
        return [self._ids["bos"]] if add_special_tokens and self._add_start_token and self._ids["bos"] is not None \
            else []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of one string, with the start token when `add_special_tokens` and the preprocessor adds it."""
        check_text(text, "text")
        return self._encode_batch([text], add_special_tokens, None)[0]

    def _encode_batch(self, texts: Sequence[str], add_special_tokens: bool, max_length: int | None) -> list[list[int]]:
        start = self.start_ids(add_special_tokens)
        tokenized = self.layer.tokenize(list(texts))
        # A RaggedTensor (TF workflow) or nested lists / arrays (keras-hub's Python workflow).
        tokenized = tokenized.to_list() if hasattr(tokenized, "to_list") else tokenized
        rows = [[int(i) for i in np.asarray(row).reshape(-1)] for row in tokenized]
        if max_length is not None:
            if max_length < len(start):
                raise ValueError(f"max_length={max_length} leaves no room for the {len(start)} special tokens")
            keep = max_length - len(start)
            rows = [(row[len(row) - keep:] if keep else []) if self._padding_side == "left" else row[:keep]
                    for row in rows]
        return [start + row for row in rows]

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        """Text of `ids` (an int, a list, or a 1-D array / tensor of ints)."""
        return self.batch_decode([as_id_list(ids, "ids")], skip_special_tokens)[0]

    def batch_decode(self, batch: Any, skip_special_tokens: bool = False) -> list[str]:
        """Texts of each row of `batch` (a list of id lists, or a 2-D array / tensor `[B, T]`); bytes that do not
        form UTF-8 (a character cut between tokens) become U+FFFD."""
        if getattr(batch, "ndim", 2) != 2:
            raise ValueError(f"batch must be 2-D [batch, length], got shape {tuple(batch.shape)}")
        rows = [as_id_list(row, "batch row") for row in batch]
        if skip_special_tokens and self.special_ids.size:
            rows = [[i for i in row if i not in self.special_ids] for row in rows]
        if not rows:
            return []
        texts = self.layer.detokenize(tf.ragged.constant(rows, dtype=tf.int32, ragged_rank=1))
        texts = tf.strings.unicode_transcode(texts, "UTF-8", "UTF-8", errors="replace")
        return [text.decode("utf-8") for text in texts.numpy().tolist()]

    def in_graph(self, vocab_size: int) -> KerasHubInGraphTokenizer:
        """The exported `generate_text` signature's tokenizer: this one's keras-hub layer, run in the graph."""
        return KerasHubInGraphTokenizer(self, vocab_size)

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Writes the keras-hub tokenizer as keras-hub saves it (its config as `tokenizer.json` and its assets:
        vocabulary and merges, or the SentencePiece proto) plus `tfgen_tokenizer.json` (start token use, padding
        side, stop ids). A batch job hashes these files to record which tokenizer wrote its text; to load a model
        with its tokenizer, save the model instead (`causal_lm.save_to_preset`)."""
        import keras

        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "tokenizer.json"), "w", encoding="utf-8") as file:
            json.dump(keras.saving.serialize_keras_object(self.layer), file, indent=2, sort_keys=True)
        self.layer.save_assets(os.fspath(directory))
        settings = {"add_start_token": self._add_start_token, "padding_side": self._padding_side,
                    "stop_token_ids": self.stop_token_ids, "pad_token_id": self.pad_token_id}
        with open(os.path.join(directory, "tfgen_tokenizer.json"), "w", encoding="utf-8") as file:
            json.dump(settings, file, indent=2, sort_keys=True)


class KerasHubInGraphTokenizer(InGraphTokenizer):
    """A `KerasHubTokenizer` as TF ops for the `generate_text` signature: its keras-hub layer (TF Text ops, which
    stock TF Serving links in), with the start token the preprocessor adds."""

    def __init__(self, tokenizer: KerasHubTokenizer, vocab_size: int):
        if tokenizer.vocab_size > vocab_size:
            raise ValueError(f"tokenizer: it has {tokenizer.vocab_size} ids, the model {vocab_size}")
        self.layer = tokenizer.layer
        self.start_ids = tf.constant(tokenizer.start_ids(True), tf.int32)
        self.special_ids = np.array(tokenizer.special_ids.tolist() or [-1], np.int32)
        self.pad_token_id = tokenizer.pad_token_id or 0

    def tokenize(self, text: tf.Tensor) -> tf.RaggedTensor:
        ragged = tf.cast(self.layer.tokenize(text), tf.int32)
        start = tf.RaggedTensor.from_tensor(tf.tile(self.start_ids[tf.newaxis], [tf.shape(text)[0], 1]))
        return tf.concat([start, ragged], axis=1)
