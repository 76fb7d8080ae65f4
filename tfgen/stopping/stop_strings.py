"""Stop strings: tables over the vocabulary (`stop_tables`), and an XLA-compilable matcher over the last tokens.

A row stops once its decoded text *ends with* a stop string, even when the string spans several tokens, starts inside
the oldest token it touches or ends inside the newest one ("overhangs"), with the semantics of transformers'
`StopStringCriteria`: the stop string must overlap the newest token, so text that merely contains it further back
does not stop a row again. Matching is done with table look-ups instead of string operations, so it runs inside a
compiled decode loop:

* `stop_string_tables` checks the strings (at most `stop_tables.MAX_STOP_STRING_CHARACTERS` characters in all) and
  builds, once per vocabulary and strings, each token's clean text length, its "end overlaps" (how many characters
  of a string's end the token's start can hold, if it is the newest token) and its "valid positions" (how many
  characters of a string, counted from its end, may already be matched when the token, as an older token, is laid
  to their left), sized by what the vocabulary can match (see `tfgen.stopping.stop_tables`).
* `stop_string_hits` makes one attempt per end overlap of each row's newest token, walks the older tokens newest to
  oldest summing their lengths, and checks with one bit look-up that every older token fits at the running sum; a
  sum reaching the attempt's string length is a hit. Its work is `tail x attempts`, linear in the string length.
"""

from __future__ import annotations

import collections
import threading
import weakref

import tensorflow as tf

from tfgen.stopping.stop_tables import (
    StopStringTables,
    Vocabulary,
    build_tables,
    checked_size,
)
from tfgen.text.token_text import token_clean_texts
from tfgen.text.tokenizer_base import BaseTokenizer
from tfgen.value_types import is_integer

_TABLE_CACHE_SIZE = 8

_cache_lock = threading.Lock()
# Tokenizer -> its Vocabulary; the vocabulary walk is paid once per tokenizer object.
_vocabulary_by_tokenizer: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# (Vocabulary, stop strings, vocab_size) -> StopStringTables, least recently used first.
_tables_cache: collections.OrderedDict = collections.OrderedDict()


def stop_string_tables(
    tokenizer: BaseTokenizer, stop_strings: str | list[str] | tuple[str, ...], vocab_size: int | None = None
) -> StopStringTables:
    """Builds (or fetches from a small LRU cache) the matcher tables of `stop_strings` for `tokenizer`'s vocabulary.

    Args:
        tokenizer: the `tfgen.Tokenizer` whose ids the model generates.
        stop_strings: one string or a non-empty list / tuple of non-empty strings (order and duplicates are kept).
        vocab_size: ids the model can produce (its logits width); the table has `vocab_size + 1` rows. Ids the
            tokenizer does not know get all -1 rows (they match nothing), tokenizer ids at or over it are left out.
            Defaults to `tokenizer.vocab_size`.

    Raises:
        ValueError: `stop_strings` is empty, holds a non-string or an empty string, holds more than
            `MAX_STOP_STRING_CHARACTERS` characters in all (checked before the vocabulary is read), or holds a string
            that no token of the vocabulary can end (such a string could never be detected); the message names
            `stop_strings`.
    """
    stop_strings = _checked_stop_strings(stop_strings)
    if vocab_size is not None and (
            not is_integer(vocab_size) or vocab_size <= 0):
        raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
    vocabulary = _vocabulary(tokenizer)
    # len(texts), not tokenizer.vocab_size, which rebuilds the whole vocabulary (60 ms for 50k tokens) each call.
    vocab_size = len(vocabulary.texts) if vocab_size is None else int(vocab_size)
    key = (vocabulary, stop_strings, vocab_size)
    with _cache_lock:
        tables = _tables_cache.get(key)
        if tables is not None:
            _tables_cache.move_to_end(key)
            return tables
    tables = build_tables(vocabulary, stop_strings, vocab_size)
    with _cache_lock:
        # Another thread may have built the same tables meanwhile: keep one instance per key.
        tables = _tables_cache.setdefault(key, tables)
        _tables_cache.move_to_end(key)
        while len(_tables_cache) > _TABLE_CACHE_SIZE:
            _tables_cache.popitem(last=False)
    return tables


def stop_string_hits(tables: StopStringTables, tail_ids: tf.Tensor) -> tf.Tensor:
    """Whether each row's text ends with one of the stop strings (TF ops only, static shapes, XLA-compilable).

    Args:
        tables: from `stop_string_tables`.
        tail_ids: int `[B, W]`, each row's last tokens, oldest first and newest last; -1 marks a column before the
            start of the row's text (it matches nothing, like a shorter sequence). `W` must be static; only the
            last `tables.max_token_len` columns are read, and fewer columns mean a shorter tail.

    Returns:
        bool `[B]`.
    """
    tail_ids = tf.convert_to_tensor(tail_ids)
    if tail_ids.shape.rank != 2 or tail_ids.shape[1] is None or tail_ids.shape[1] == 0:
        raise ValueError(f"tail_ids must be [batch, width] with a static width > 0, got shape {tail_ids.shape}")
    dummy_row = tables.vocab_rows - 1
    ids = tf.cast(tail_ids[:, -tables.max_token_len:], tf.int32)
    ids = tf.where((ids < 0) | (ids >= dummy_row), dummy_row, ids)
    newest = ids[:, -1]  # [B]
    older = tf.reverse(ids[:, :-1], axis=[1])  # [B, T - 1], newest first: matching grows towards the string's start

    # [B, W]: one attempt per end overlap of the newest token (its string and how much of its end the token holds).
    slots = tf.range(tables.max_attempts, dtype=tf.int32)
    real = slots < tf.gather(tf.constant(tables.end_count), newest)[:, tf.newaxis]
    entry = tf.minimum(tf.gather(tf.constant(tables.end_start), newest)[:, tf.newaxis] + slots,
                       len(tables.end_string) - 1)
    string = tf.gather(tf.constant(tables.end_string), entry)
    overlap = tf.gather(tf.constant(tables.end_overlap), entry)
    length = tf.gather(tf.constant(tables.stop_string_lengths), string)

    # [B, T - 1, W]: characters matched before and after each older token is laid down, per attempt.
    older_lengths = tf.gather(tf.constant(tables.token_lengths), older)[:, :, tf.newaxis]
    after = overlap[:, tf.newaxis, :] + tf.cumsum(older_lengths, axis=1)
    before = after - older_lengths
    # An older token fits if the characters matched before it are one of its valid positions: its bit is set.
    in_string = (before > 0) & (before < length[:, tf.newaxis, :])
    code = tf.gather(tf.constant(tables.position_offsets), string)[:, tf.newaxis, :] + tf.where(in_string, before, 0)
    bit = (tf.gather(tf.constant(tables.token_bit_base), older)[:, :, tf.newaxis]
           + tf.cast(tf.gather(tf.constant(tables.position_column), code), tf.int64))
    byte = tf.gather(tf.constant(tables.bits), tf.minimum(bit // 8, len(tables.bits) - 1))
    bit_set = tf.bitwise.bitwise_and(tf.bitwise.right_shift(tf.cast(byte, tf.int32), tf.cast(bit % 8, tf.int32)), 1) > 0
    same_group = (tf.gather(tf.constant(tables.token_group), older)[:, :, tf.newaxis]
                  == tf.gather(tf.constant(tables.position_group), code))
    fits = in_string & (tf.gather(tf.constant(tables.fits_anywhere), older)[:, :, tf.newaxis] | (same_group & bit_set))
    # An attempt only counts up to its first token that does not fit.
    unbroken = tf.cumsum(tf.cast(~fits, tf.int32), axis=1) == 0
    reached = (overlap >= length) | tf.reduce_any(unbroken & (after >= length[:, tf.newaxis, :]), axis=1)
    return tf.reduce_any(real & reached, axis=-1)


def tail_window(sequences: tf.Tensor, end_index: tf.Tensor, first_valid: tf.Tensor, width: int) -> tf.Tensor:
    """The `width` tokens of each row ending at column `end_index` (inclusive), oldest first, for `stop_string_hits`.

    Args:
        sequences: int `[B, L]` token buffer (static `L`).
        end_index: int scalar tensor, the newest column to include (`0 <= end_index < L`), or int `[B]`, one per row.
        first_valid: int scalar (or `[B]`, one per row) tensor; columns before it, or before column 0, become -1.
        width: static window width, usually `tables.max_token_len`.

    Returns:
        int32 `[B, width]`.
    """
    sequences = tf.convert_to_tensor(sequences)
    end_index = tf.cast(end_index, tf.int32)
    per_row = end_index.shape.rank == 1
    if per_row:
        end_index = end_index[:, tf.newaxis]
    columns = end_index - (width - 1) + tf.range(width, dtype=tf.int32)  # [width] or [B, width]
    gathered = tf.gather(tf.cast(sequences, tf.int32), tf.maximum(columns, 0), axis=1, batch_dims=int(per_row))
    first_valid = tf.reshape(tf.maximum(tf.cast(first_valid, tf.int32), 0), [-1, 1])  # [1 or B, 1]
    return tf.where(columns >= first_valid, gathered, -1)


def _checked_stop_strings(stop_strings) -> tuple[str, ...]:
    """`stop_strings` as a tuple, after the cheap checks (types, emptiness) that need no vocabulary."""
    strings = (stop_strings,) if isinstance(stop_strings, str) else stop_strings
    if not isinstance(strings, (list, tuple)):
        raise ValueError(f"stop_strings must be a string or a list of strings, got {type(stop_strings).__name__}")
    if not strings:
        raise ValueError("stop_strings must not be an empty list")
    for string in strings:
        if not isinstance(string, str):
            raise ValueError(f"stop_strings must hold only strings, got {type(string).__name__} {string!r}")
        if not string:
            raise ValueError("stop_strings must not hold an empty string (it would match every text)")
    strings = tuple(strings)
    checked_size(strings)
    return strings


def _vocabulary(tokenizer: BaseTokenizer) -> Vocabulary:
    """The clean texts of `tokenizer` and their indexes, built once per tokenizer object (a tokenizer's vocabulary
    and decoder never change)."""
    if not isinstance(tokenizer, BaseTokenizer):
        raise TypeError(f"tokenizer must be a tfgen Tokenizer, got {type(tokenizer).__name__}")
    with _cache_lock:
        vocabulary = _vocabulary_by_tokenizer.get(tokenizer)
    if vocabulary is None:
        vocabulary = Vocabulary.of(token_clean_texts(tokenizer))
        with _cache_lock:
            _vocabulary_by_tokenizer[tokenizer] = vocabulary
    return vocabulary
