"""Tokenizers as TF ops, for the exported `generate_text` signature (stock TF Serving links TF Text's ops in).

`InGraphTokenizer` pads and decodes in the graph around a subclass's `tokenize`: `BytePairInGraphTokenizer` runs a
GPT-2 style byte-level BPE `tfgen.Tokenizer` through keras-hub's BytePairTokenizer; the keras-hub tokenizer runs its
own layer (`tfgen.keras_hub.tokenizer`).
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import tensorflow as tf


class InGraphTokenizer:
    """Text in, left-padded ids out, and generated ids back to text, in TF ops. A subclass sets `layer` (a
    keras-hub tokenizer layer: `tokenize` / `detokenize`), `special_ids` int32 `[K]` (skipped when decoding; `[-1]`
    when none) and `pad_token_id`, and may add tokens in `tokenize`."""

    layer: object
    special_ids: np.ndarray
    pad_token_id: int

    def tokenize(self, text: tf.Tensor) -> tf.RaggedTensor:
        """int32 ids `[B, (T)]` of string `[B]` text, special tokens included."""
        return self.layer.tokenize(text)

    def encode(self, text: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Left-padded int32 `[B, T]` ids and mask for string `[B]` text."""
        ragged = tf.cast(self.tokenize(text), tf.int32)
        lengths = tf.cast(ragged.row_lengths(), tf.int32)
        width = tf.maximum(tf.reduce_max(lengths), 1)
        right_padded = ragged.to_tensor(default_value=self.pad_token_id)
        source = tf.range(width)[None, :] - (width - lengths)[:, None]
        mask = source >= 0
        ids = tf.gather(right_padded, tf.maximum(source, 0), batch_dims=1)
        return tf.where(mask, ids, self.pad_token_id), tf.cast(mask, tf.int32)

    def decode(self, sequences: tf.Tensor, width: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
        """string `[B]`: each row's generated tokens (special tokens skipped) as valid UTF-8."""
        generated = sequences[:, width:]
        steps = tf.range(tf.shape(generated)[1])
        special = tf.reduce_any(generated[:, :, None] == self.special_ids[None, None, :], axis=-1)
        keep = (steps[None, :] < (lengths - width)[:, None]) & ~special
        text = self.layer.detokenize(tf.ragged.boolean_mask(generated, keep))
        # Byte-level tokens can end inside a UTF-8 character; JSON clients need valid text.
        return tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace")


class BytePairInGraphTokenizer(InGraphTokenizer):
    """A byte-level BPE `tfgen.Tokenizer` as TF ops (keras-hub's BytePairTokenizer, TF Text's regex split)."""

    def __init__(self, tokenizer, vocab_size: int):
        try:
            import keras_hub
        except ImportError as error:
            raise ImportError(
                "the generate_text signature tokenizes with keras-hub's BytePairTokenizer: pip install 'tfgen[text]'"
            ) from error
        with tempfile.TemporaryDirectory() as directory:
            tokenizer.save_pretrained(directory)
            with open(os.path.join(directory, "tokenizer.json"), encoding="utf-8") as file:
                definition = json.load(file)
        model, pre_tokenizer = definition.get("model") or {}, definition.get("pre_tokenizer") or {}
        unsupported = {
            "model": model.get("type") != "BPE" or any(model.get(k) for k in (
                "dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback", "ignore_merges")),
            "pre_tokenizer": pre_tokenizer.get("type") != "ByteLevel" or not pre_tokenizer.get("use_regex", True),
            "normalizer": definition.get("normalizer") is not None,
            "post_processor": (definition.get("post_processor") or {"type": "ByteLevel"})["type"] != "ByteLevel",
        }
        if any(unsupported.values()):
            raise ValueError(
                "tokenizer: generate_text supports GPT-2 style byte-level BPE only (BPE model, ByteLevel pre-tokenizer"
                f" with its regex, no normalizer, no added bos/eos); this one differs in: "
                f"{', '.join(name for name, bad in unsupported.items() if bad)}. Export without generate_text "
                "(tfgen export --no-text) and tokenize on the client."
            )
        added = definition.get("added_tokens") or []
        vocabulary = {**model["vocab"], **{token["content"]: token["id"] for token in added}}
        if max(vocabulary.values()) >= vocab_size:
            raise ValueError(f"tokenizer: its ids go up to {max(vocabulary.values())}, the model has {vocab_size}")
        special = [token for token in added if token.get("special")]
        self.layer = keras_hub.tokenizers.BytePairTokenizer(
            vocabulary=vocabulary,
            merges=[merge if isinstance(merge, str) else " ".join(merge) for merge in model["merges"]],
            add_prefix_space=bool(pre_tokenizer.get("add_prefix_space", False)),
            unsplittable_tokens=[token["content"] for token in special],
            dtype="int32",
        )
        self.special_ids = np.array([token["id"] for token in special] or [-1], np.int32)
        self.pad_token_id = tokenizer.pad_token_id or 0
