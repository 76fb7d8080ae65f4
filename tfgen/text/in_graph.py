"""Tokenizers as TF ops, for the exported `generate_text` signature (stock TF Serving links TF Text's ops in).

`InGraphTokenizer` pads and decodes in the graph around a subclass's `tokenize`: `BytePairInGraphTokenizer` runs a
byte-level BPE `tfgen.Tokenizer` (GPT-2, SmolLM2, Llama 3, Qwen2 and other pre-tokenizers with an exact RE2 form,
`tfgen.text.byte_level_spec`) with TF Text's regex splits and keras-hub's BPE merges; the keras-hub tokenizer runs its
own layer (`tfgen.keras_hub.tokenizer`).
"""

from __future__ import annotations

import json

import numpy as np
import tensorflow as tf

from tfgen.text.byte_level_spec import byte_level_spec, byte_level_text
from tfgen.text.split_graph import literal, replace_rows, split_rows


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

    def _around_added_tokens(self, text: tf.Tensor, encode_parts) -> tf.RaggedTensor:
        """int32 ids `[B, (T)]` of string `[B]` text: the added tokens (`self.added_pattern`, `self.added_ids`)
        matched first, as HF does, `encode_parts` (string `[P]` -> ids `[P, (T)]`) on the text between them, and
        `self.prefix_ids` / `self.suffix_ids` (the post-processor's bos / eos) around."""
        texts = tf.reshape(text, [-1])
        if self.added_pattern is None:
            parts = tf.RaggedTensor.from_tensor(texts[:, None])
        else:
            parts = split_rows(texts, self.added_pattern, None)
        flat = parts.flat_values
        per_part = encode_parts(flat)
        if self.added_ids is not None:
            added = self.added_ids.lookup(flat)
            per_part = replace_rows(per_part, added >= 0, added)
        tokens = tf.RaggedTensor.from_row_splits(per_part.flat_values,
                                                 tf.gather(per_part.row_splits, parts.row_splits))
        if not self.prefix_ids and not self.suffix_ids:
            return tokens
        rows = tf.shape(texts, out_type=tf.int64)[0]
        around = [tf.RaggedTensor.from_tensor(tf.tile(tf.constant([list(ids)], tf.int32), [rows, 1]))
                  for ids in (self.prefix_ids, self.suffix_ids)]
        return tf.concat([around[0], tokens, around[1]], axis=1)

    def _added_token_table(self, added: dict[str, int]) -> None:
        """Sets `added_pattern` (longest first, so a match is the longest, as HF's) and `added_ids` for `added`."""
        self.added_pattern = "|".join(literal(token) for token in sorted(added, key=len, reverse=True)) or None
        self.added_ids = None if not added else tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(list(added), list(added.values()), tf.string, tf.int32), -1)
        self.layer.added_ids = self.added_ids  # tracked with the layer, so the export saves the table

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
    """A byte-level BPE `tfgen.Tokenizer` as TF ops: added tokens matched first, the pre-tokenizer's splits in RE2
    (`tfgen.text.split_graph`, exact for GPT-2's, SmolLM2's, Llama 3's and Qwen2's), BPE merges and the byte mapping
    by keras-hub's BytePairTokenizer layer, then the post-processor's bos / eos."""

    def __init__(self, tokenizer, vocab_size: int):
        try:
            import keras_hub
        except ImportError as error:
            raise ImportError(
                "the generate_text signature tokenizes with keras-hub's BytePairTokenizer: pip install 'tfgen[text]'"
            ) from error
        try:
            spec = byte_level_spec(json.loads(tokenizer.backend_tokenizer.to_str()))
        except ValueError as error:
            raise ValueError(
                f"tokenizer: generate_text needs a byte-level BPE tokenizer whose every step has an exact TF form; "
                f"this one has no exact in-graph form for: {error}. Export without generate_text "
                "(tfgen export --no-text) and tokenize on the client."
            ) from None
        if max(spec.vocabulary.values()) >= vocab_size:
            raise ValueError(f"tokenizer: its ids go up to {max(spec.vocabulary.values())}, the model has {vocab_size}")
        self.spec = spec
        self.layer = _merging_layer(keras_hub)(
            vocabulary=spec.vocabulary, merges=spec.merges, unsplittable_tokens=[], dtype="int32")
        if spec.ignore_merges:
            # A piece spelled by a vocabulary token is that token: seed the layer's piece -> tokens cache with them.
            pieces = {byte_level_text(token): token for token in spec.vocabulary if token not in spec.added}
            pieces.pop(None, None)
            self.layer.cache.insert(tf.constant(list(pieces)), tf.constant(list(pieces.values())))
        self._added_token_table(spec.added)
        self.prefix_ids, self.suffix_ids = spec.prefix_ids, spec.suffix_ids
        self.special_ids = np.array(spec.special_ids or [-1], np.int32)
        self.pad_token_id = tokenizer.pad_token_id or 0

    def tokenize(self, text: tf.Tensor) -> tf.RaggedTensor:
        """int32 ids `[B, (T)]` of string `[B]` text: added tokens, then BPE of the pre-tokenizer's pieces, between
        the post-processor's ids."""
        return self._around_added_tokens(text, self._encode_parts)

    def _encode_parts(self, parts: tf.Tensor) -> tf.RaggedTensor:
        """int32 ids `[P, (T)]` of text parts `[P]` holding no added token."""
        pieces = tf.RaggedTensor.from_tensor((tf_text_normalize(parts) if self.spec.nfc else parts)[:, None])
        for pattern, cut in self.spec.splits:
            pieces = pieces.with_flat_values(split_rows(pieces.flat_values, pattern, cut)).merge_dims(1, 2)
        ids = self.layer.piece_ids(pieces.flat_values)
        return tf.RaggedTensor.from_row_splits(ids.flat_values, tf.gather(ids.row_splits, pieces.row_splits))


def _merging_layer(keras_hub):
    """keras-hub's BytePairTokenizer with `piece_ids`: BPE of pieces split elsewhere (here, by the exact splits)."""

    class MergingBytePairTokenizer(keras_hub.tokenizers.BytePairTokenizer):
        def piece_ids(self, pieces: tf.Tensor) -> tf.RaggedTensor:
            """int32 ids `[N, (T)]` of raw text pieces `[N]`, through the layer's cache of merged pieces."""
            cached = self.cache.lookup(pieces)
            unseen = (cached == "") & (pieces != "")

            def merge_unseen():
                self._bpe_merge_and_update_cache_tf(tf.boolean_mask(pieces, unseen))
                return self.cache.lookup(pieces)

            merged = tf.cond(tf.reduce_any(unseen), merge_unseen, lambda: cached)
            ids = tf.cast(self.token_to_id_map.lookup(tf.strings.split(merged, sep=" ")), tf.int32)
            return tf.ragged.boolean_mask(ids, ids >= 0)  # a piece of dropped bytes only merges to ""

        def _bpe_merge_and_update_cache_tf(self, tokens):
            """keras-hub's, less the bytes without a token of their own, which HF's BPE (no unk token) drops
            before merging."""
            characters = self.byte2unicode.lookup(tf.strings.bytes_split(tokens))
            characters = tf.ragged.boolean_mask(characters, self.token_to_id_map.lookup(characters) >= 0)
            merged = tf.strings.reduce_join(self._bpe_merge_tf(characters), axis=1, separator=" ")
            self.cache.insert(tokens, merged)

    return MergingBytePairTokenizer


def tf_text_normalize(texts: tf.Tensor) -> tf.Tensor:
    """NFC of string `[N]` texts (TF Text's ICU normaliser)."""
    import tensorflow_text as tf_text

    return tf_text.normalize_utf8(texts, "NFC")
