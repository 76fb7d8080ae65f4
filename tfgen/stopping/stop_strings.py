"""Stop strings: host-side tables over the vocabulary, and an XLA-compilable matcher over the last tokens.

A row stops once its decoded text *ends with* a stop string, even when the string spans several tokens, starts inside
the oldest token it touches or ends inside the newest one ("overhangs"), with the semantics of transformers'
`StopStringCriteria`: the stop string must overlap the newest token, so text that merely contains it further back
does not stop a row again. Matching is done with table look-ups instead of string operations, so it runs inside a
compiled decode loop:

* `stop_string_tables` walks the vocabulary once on the host. For each token id and stop string it records the
  token's *clean text* length, the "end overlaps" (how many characters of the string's end the token's start can
  hold, if it is the newest token) and the "valid positions" (how many characters of the string, counted from its
  end, may already be matched when the token, as an older token, is laid to their left).
* `stop_string_hits` walks each row's tail newest to oldest, summing token lengths from each possible end overlap and
  checking that every older token fits at the running sum; a sum reaching the string's length is a hit.
"""

from __future__ import annotations

import collections
import threading
import weakref
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from tfgen.text.token_text import token_clean_texts
from tfgen.text.tokenizer_base import BaseTokenizer
from tfgen.value_types import is_integer

_TABLE_CACHE_SIZE = 8


@dataclass(frozen=True, eq=False)
class _Vocabulary:
    """A tokenizer's clean texts (index = token id), indexed by character to find candidate tokens quickly.

    Equal when the texts are, with the texts' hash computed once: it keys the tables cache, and hashing 50k
    strings on every look-up would cost a millisecond.
    """

    texts: tuple[str, ...]
    ids_ending_with: dict[str, list[int]]
    ids_containing: dict[str, list[int]]  # each id once per distinct character of its text
    empty_ids: list[int]
    texts_hash: int

    def __hash__(self) -> int:
        return self.texts_hash

    def __eq__(self, other) -> bool:
        return isinstance(other, _Vocabulary) and (self is other or self.texts == other.texts)


_cache_lock = threading.Lock()
# Tokenizer -> its _Vocabulary; the vocabulary walk is paid once per tokenizer object.
_vocabulary_by_tokenizer: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# (_Vocabulary, stop strings, vocab_size) -> StopStringTables, least recently used first.
_tables_cache: collections.OrderedDict = collections.OrderedDict()


@dataclass(frozen=True, eq=False)
class StopStringTables:
    """Everything `stop_string_hits` needs, precomputed for one vocabulary and one tuple of stop strings.

    `table` is int32 `[vocab_rows, width]` with `width = S * max_valid_positions + S * max_end_overlaps + 1` for
    `S = len(stop_strings)`, the layout of transformers' `StopStringCriteria.embedding_vec`. Row `i` describes token
    id `i`; each list is padded with -1, which no count ever equals:

    * columns `[i * P, (i + 1) * P)` (`P = max_valid_positions`): the valid positions of stop string `i` (length
      `n`): each count `m` in `1 .. n - 1` of characters matched from the string's end such that the token fits
      right before them, `text.endswith(string[max(0, n - m - len(text)):n - m])` (it may overhang the start);
    * columns `[S * P + i * E, S * P + (i + 1) * E)` (`E = max_end_overlaps`): its end overlaps, `min(k, n)` for
      each `k` in increasing order such that `text[:k]` ends with the string's last `min(k, n)` characters (the
      token may overhang the string's end);
    * the last column: the length of the token's clean text.

    The last row (`vocab_rows - 1`) is a dummy of -1s that matches nothing: ids outside the table and the -1 columns
    of a tail window are looked up there. Instances compare and hash by identity; the builder's cache hands out one
    instance per key, so an instance can key a compiled program.
    """

    stop_strings: tuple[str, ...]
    table: np.ndarray
    max_valid_positions: int
    max_end_overlaps: int

    @property
    def num_stop_strings(self) -> int:
        return len(self.stop_strings)

    @property
    def max_token_len(self) -> int:
        """Tail width `M` the matcher needs: the longest stop string's length (at least one character per token)."""
        return max(len(stop_string) for stop_string in self.stop_strings)

    @property
    def vocab_rows(self) -> int:
        """Rows of `table`: the covered ids plus the dummy row."""
        return self.table.shape[0]

    @property
    def stop_string_lengths(self) -> np.ndarray:
        """int32 `[S]`: each stop string's length in characters."""
        return np.array([len(stop_string) for stop_string in self.stop_strings], np.int32)


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
        ValueError: `stop_strings` is empty, holds a non-string or an empty string, or holds a string that no token
            of the vocabulary can end (such a string could never be detected); the message names `stop_strings`.
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
    tables = _build_tables(vocabulary, stop_strings, vocab_size)
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
    num_strings, positions, overlaps = tables.num_stop_strings, tables.max_valid_positions, tables.max_end_overlaps
    table = tf.constant(tables.table)
    dummy_row = tables.vocab_rows - 1
    # Newest token first: matching grows from the string's end towards its start.
    newest_first = tf.reverse(tf.cast(tail_ids[:, -tables.max_token_len:], tf.int32), axis=[1])
    newest_first = tf.where((newest_first < 0) | (newest_first >= dummy_row), dummy_row, newest_first)
    rows = tf.gather(table, newest_first)  # [B, T, table width] with T = min(W, M)
    batch, steps = tf.shape(rows)[0], rows.shape[1]

    # [B, 1, S, E]: the newest token's possible end overlaps, one matching attempt per slot.
    end_overlaps = tf.reshape(
        rows[:, :1, num_strings * positions:-1], [batch, 1, num_strings, overlaps])
    # [B, T - 1, S, P]: where each older token may sit, in characters matched so far.
    valid_positions = tf.reshape(rows[:, 1:, :num_strings * positions], [batch, steps - 1, num_strings, positions])
    older_lengths = tf.broadcast_to(rows[:, 1:, -1:, tf.newaxis], [batch, steps - 1, num_strings, overlaps])
    # [B, T, S, E]: characters of the string covered once each token is laid down, per attempt.
    matched = tf.cumsum(tf.concat([end_overlaps, older_lengths], axis=1), axis=1)
    starts = end_overlaps > 0
    # An older token fits if the characters matched before it are one of its valid positions.
    fits = tf.reduce_any(matched[:, :-1, :, :, tf.newaxis] == valid_positions[:, :, :, tf.newaxis, :], axis=-1)
    consistent = tf.concat([starts, fits], axis=1)
    # An attempt only counts up to its first token that does not fit.
    unbroken = tf.cumsum(tf.cast(~consistent, tf.int32), axis=1) == 0
    best = tf.reduce_max(tf.where(unbroken, matched, 0), axis=[1, 3])  # [B, S]
    return tf.reduce_any(best >= tf.constant(tables.stop_string_lengths)[tf.newaxis, :], axis=-1)


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
    return tuple(strings)


def _vocabulary(tokenizer: BaseTokenizer) -> _Vocabulary:
    """The clean texts of `tokenizer` and their character index, built once per tokenizer object (a tokenizer's
    vocabulary and decoder never change)."""
    if not isinstance(tokenizer, BaseTokenizer):
        raise TypeError(f"tokenizer must be a tfgen Tokenizer, got {type(tokenizer).__name__}")
    with _cache_lock:
        vocabulary = _vocabulary_by_tokenizer.get(tokenizer)
    if vocabulary is None:
        texts = token_clean_texts(tokenizer)
        ids_ending_with, ids_containing = collections.defaultdict(list), collections.defaultdict(list)
        for token_id, text in enumerate(texts):
            if text:
                ids_ending_with[text[-1]].append(token_id)
            for character in set(text):
                ids_containing[character].append(token_id)
        empty_ids = [token_id for token_id, text in enumerate(texts) if not text]
        vocabulary = _Vocabulary(texts, dict(ids_ending_with), dict(ids_containing), empty_ids, hash(texts))
        with _cache_lock:
            _vocabulary_by_tokenizer[tokenizer] = vocabulary
    return vocabulary


def _valid_positions(vocabulary: _Vocabulary, stop_string: str, vocab_size: int) -> dict[int, list[int]]:
    """{token id: its valid positions in `stop_string`} for the ids below `vocab_size` that have any.

    Position `matched` is valid for a token whose text ends with `stop_string[:length - matched]`'s last
    `len(text)` characters (all of them when the text is longer: it overhangs the string's start). An empty text
    fits everywhere.
    """
    length = len(stop_string)
    # Only tokens whose last character sits right before `matched` characters can fit there.
    positions_by_character = collections.defaultdict(list)
    for matched in range(1, length):
        positions_by_character[stop_string[length - matched - 1]].append(matched)
    valid = {token_id: list(range(1, length)) for token_id in vocabulary.empty_ids if token_id < vocab_size}
    for character, positions in positions_by_character.items():
        for token_id in vocabulary.ids_ending_with.get(character, ()):
            text = vocabulary.texts[token_id]
            fitting = [matched for matched in positions
                       if text.endswith(stop_string[max(0, length - matched - len(text)):length - matched])]
            if fitting and token_id < vocab_size:
                valid[token_id] = fitting
    return valid


def _end_overlaps(vocabulary: _Vocabulary, stop_string: str, vocab_size: int) -> dict[int, list[int]]:
    """{token id: its end overlaps with `stop_string`} for the ids below `vocab_size` that have any.

    For each prefix `text[:k]` ending with the string's last `k` characters (or with the whole string when
    `k > len(stop_string)`: the token holds it and overhangs its end), the overlap `min(k, len(stop_string))`, in
    increasing `k` (a token holding the string twice lists it twice, as transformers does).
    """
    length, last_character = len(stop_string), stop_string[-1]
    overlaps = {}
    for token_id in vocabulary.ids_containing.get(last_character, ()):
        text = vocabulary.texts[token_id]
        found = [min(prefix_length, length) for prefix_length in range(1, len(text) + 1)
                 if text[prefix_length - 1] == last_character
                 and text[:prefix_length].endswith(stop_string[max(0, length - prefix_length):])]
        if found and token_id < vocab_size:
            overlaps[token_id] = found
    return overlaps


def _build_tables(vocabulary: _Vocabulary, stop_strings: tuple[str, ...], vocab_size: int) -> StopStringTables:
    """Looks every stop string up in the vocabulary and packs the results (see `StopStringTables` for the layout)."""
    positions = [_valid_positions(vocabulary, stop_string, vocab_size) for stop_string in stop_strings]
    overlaps = [_end_overlaps(vocabulary, stop_string, vocab_size) for stop_string in stop_strings]
    endless = [stop_string for stop_string, found in zip(stop_strings, overlaps) if not found]
    if endless:
        raise ValueError(f"stop_strings {endless!r}: no token of the vocabulary can end these strings (they hold "
                         "characters no token decodes to on its own), so they could never be detected")
    # Single-character strings have no valid positions at all; keep one (-1) column so the layout stays uniform.
    max_positions = max([1] + [len(found) for per_token in positions for found in per_token.values()])
    max_overlaps = max(len(found) for per_token in overlaps for found in per_token.values())
    num_strings = len(stop_strings)
    table = np.full((vocab_size + 1, num_strings * (max_positions + max_overlaps) + 1), -1, np.int32)
    for string_index in range(num_strings):
        positions_start = string_index * max_positions
        overlaps_start = num_strings * max_positions + string_index * max_overlaps
        for token_id, found in positions[string_index].items():
            table[token_id, positions_start:positions_start + len(found)] = found
        for token_id, found in overlaps[string_index].items():
            table[token_id, overlaps_start:overlaps_start + len(found)] = found
    texts = vocabulary.texts[:vocab_size]
    table[:len(texts), -1] = [len(text) for text in texts]
    table.setflags(write=False)
    return StopStringTables(stop_strings, table, max_positions, max_overlaps)
