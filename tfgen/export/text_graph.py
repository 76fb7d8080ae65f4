"""Byte-level BPE tokenization as TF ops, for the exported `generate_text` signature."""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import tensorflow as tf


def in_graph_tokenizer(tokenizer, vocab_size: int):
    """The in-graph form of `tokenizer`: its own (a keras-hub tokenizer's, `tokenizer.in_graph`) when it has one,
    else an `InGraphTokenizer`."""
    own = getattr(tokenizer, "in_graph", None)
    return own(vocab_size) if own is not None else InGraphTokenizer(tokenizer, vocab_size)


def text_signature_functions(text) -> dict:
    """`text_tokenize` (text string `[B]` -> left-padded input_ids / attention_mask `[B, T]`) and
    `text_detokenize` (sequences int32 `[B, T + N]`, prompt width int32 scalar, sequence_lengths `[B]` -> the
    generated text `[B]`) of an in-graph tokenizer `text`: the halves of `generate_text`, for a driver streaming
    text (`tfgen serve`)."""

    def tokenize(inputs):
        input_ids, attention_mask = text.encode(inputs["text"])
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def detokenize(inputs):
        return {"text": text.decode(inputs["sequences"], inputs["width"], inputs["sequence_lengths"])}

    text_spec = {"text": tf.TensorSpec([None], tf.string, name="text")}
    decode_spec = {"sequences": tf.TensorSpec([None, None], tf.int32, name="sequences"),
                   "width": tf.TensorSpec([], tf.int32, name="width"),
                   "sequence_lengths": tf.TensorSpec([None], tf.int32, name="sequence_lengths")}
    return {
        "text_tokenize": tf.function(tokenize, input_signature=[text_spec], autograph=False).get_concrete_function(),
        "text_detokenize": tf.function(detokenize, input_signature=[decode_spec],
                                       autograph=False).get_concrete_function(),
    }


class InGraphTokenizer:
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
