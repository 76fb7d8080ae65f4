"""Stop-string tables sized by what the vocabulary can match: host-side, built once per vocabulary and stop strings.

transformers' `StopStringCriteria` keeps one dense int32 row per token with `S * (P + E)` columns (`S` stop strings,
`P` the most valid positions and `E` the most end overlaps any token has): `P` grows with the longest string and the
row width with the count, so one 10k-character string costs `vocab * 10k` ints and its matcher compares every tail
token with every position (the square of the length). These tables keep the same facts sparsely:

* *positions*: a stop string `s` of length `n` has the positions `(s, m)` for `m` in `1 .. n - 1` (characters matched
  from its end); position `(s, m)` has the code `offsets[s] + m` (codes `offsets[s]`, `m = 0`, are never valid).
  A token can only sit right before `m` matched characters if its text's last character is `s[n - m - 1]`, so the
  positions are grouped by that character, and each group is a bit matrix `[tokens ending with it that fit
  somewhere, positions of the group]`, packed into `bits`. A token with an empty text fits everywhere (`fits_anywhere`).
* *end overlaps*: the `(stop string, overlap)` pairs of each token, in CSR form (`end_start`, `end_count` index
  `end_string` / `end_overlap`): the matcher makes one attempt per pair of the newest token.

Their size is the number of (token, position) bits the vocabulary can actually set, plus one int per end overlap that
exists, plus a few ints per token and per character: linear in the total stop-string characters, never its square.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np

#: The most stop-string characters (all strings together) one call may set; more is refused before any table is
#: built. The tables and the matcher grow linearly with it (the matcher's tail is as wide as the longest string).
MAX_STOP_STRING_CHARACTERS = 32_768


@dataclass(frozen=True, eq=False)
class Vocabulary:
    """A tokenizer's clean texts (index = token id) and the indexes the builder looks tokens up by.

    Equal when the texts are, with the texts' hash computed once: it keys the tables cache, and hashing 50k
    strings on every look-up would cost a millisecond.
    """

    texts: tuple[str, ...]
    ids_by_text: dict[str, np.ndarray]  # non-empty text -> the ids spelling it
    text_lengths: tuple[int, ...]  # the distinct non-empty text lengths, increasing
    empty_ids: np.ndarray
    texts_hash: int

    def __hash__(self) -> int:
        return self.texts_hash

    def __eq__(self, other) -> bool:
        return isinstance(other, Vocabulary) and (self is other or self.texts == other.texts)

    @classmethod
    def of(cls, texts: tuple[str, ...]) -> Vocabulary:
        """Indexes `texts` (one walk over the vocabulary)."""
        ids_by_text = collections.defaultdict(list)
        for token_id, text in enumerate(texts):
            ids_by_text[text].append(token_id)
        empty_ids = np.array(ids_by_text.pop("", []), np.int64)
        return cls(texts, {text: np.array(ids, np.int64) for text, ids in ids_by_text.items()},
                   tuple(sorted({len(text) for text in ids_by_text})), empty_ids, hash(texts))


@dataclass(frozen=True, eq=False)
class StopStringTables:
    """Everything `stop_string_hits` needs for one vocabulary and one tuple of stop strings (see the module
    docstring for the layout). Per-token arrays have `vocab_rows` entries; the last one is a dummy that matches
    nothing (ids outside the table and the -1 columns of a tail window are looked up there). Instances compare and
    hash by identity; the builder's cache hands out one instance per key, so an instance can key a compiled program.
    """

    stop_strings: tuple[str, ...]
    token_lengths: np.ndarray  # int32 [vocab_rows]: each token's clean text length
    fits_anywhere: np.ndarray  # bool [vocab_rows]: empty texts, which fit at every position
    token_group: np.ndarray  # int32 [vocab_rows]: the position group of the token's bit row, -1 for none
    token_bit_base: np.ndarray  # int64 [vocab_rows]: index in `bits` of the token's row's first bit
    position_group: np.ndarray  # int32 [total characters]: each position code's group, -2 for code m = 0
    position_column: np.ndarray  # int32 [total characters]: the code's column in its group
    position_offsets: np.ndarray  # int32 [S]: code of each string's position 0
    bits: np.ndarray  # uint8: the groups' bit matrices, little-endian bit order, row-major
    end_start: np.ndarray  # int32 [vocab_rows]
    end_count: np.ndarray  # int32 [vocab_rows]
    end_string: np.ndarray  # int32 [end overlaps]
    end_overlap: np.ndarray  # int32 [end overlaps]

    @property
    def num_stop_strings(self) -> int:
        return len(self.stop_strings)

    @property
    def max_token_len(self) -> int:
        """Tail width `M` the matcher needs: the longest stop string's length (at least one character per token)."""
        return max(len(stop_string) for stop_string in self.stop_strings)

    @property
    def max_attempts(self) -> int:
        """The most end overlaps one token has: the matcher's attempts per row."""
        return int(self.end_count.max())

    @property
    def vocab_rows(self) -> int:
        """Entries of the per-token arrays: the covered ids plus the dummy."""
        return len(self.token_lengths)

    @property
    def stop_string_lengths(self) -> np.ndarray:
        """int32 `[S]`: each stop string's length in characters."""
        return np.array([len(stop_string) for stop_string in self.stop_strings], np.int32)

    @property
    def nbytes(self) -> int:
        """Bytes of all the arrays (what the matcher embeds in a program)."""
        return sum(value.nbytes for value in vars(self).values() if isinstance(value, np.ndarray))

    def token_facts(self, token_id: int) -> tuple[list[set[int]], list[set[int]]]:
        """(valid positions, end overlaps) of `token_id`, one set per stop string, read back from the packed form
        (for tests and debugging: the same facts as a row of transformers' `embedding_vec`)."""
        positions = [set() for _ in self.stop_strings]
        for index, (stop_string, offset) in enumerate(zip(self.stop_strings, self.position_offsets)):
            for matched in range(1, len(stop_string)):
                code = offset + matched
                if self.fits_anywhere[token_id] or (self.token_group[token_id] == self.position_group[code]
                                                    and self._bit(token_id, code)):
                    positions[index].add(matched)
        overlaps = [set() for _ in self.stop_strings]
        start = self.end_start[token_id]
        for entry in range(start, start + self.end_count[token_id]):
            overlaps[self.end_string[entry]].add(int(self.end_overlap[entry]))
        return positions, overlaps

    def _bit(self, token_id: int, code: int) -> bool:
        bit = int(self.token_bit_base[token_id]) + int(self.position_column[code])
        return bool((self.bits[bit >> 3] >> (bit & 7)) & 1)


def checked_size(stop_strings: tuple[str, ...]) -> None:
    """ValueError naming `stop_strings` and `MAX_STOP_STRING_CHARACTERS` when the strings hold more characters."""
    total = sum(len(stop_string) for stop_string in stop_strings)
    if total > MAX_STOP_STRING_CHARACTERS:
        raise ValueError(
            f"stop_strings: {len(stop_strings)} strings of {total} characters in all, over the limit of "
            f"{MAX_STOP_STRING_CHARACTERS} characters (tfgen.stopping.stop_tables.MAX_STOP_STRING_CHARACTERS): "
            "the stop-string tables and the matcher's tail grow with it")


def _suffix_index(vocabulary: Vocabulary, wanted: set[str], vocab_size: int) -> dict[str, list[int]]:
    """{string in `wanted`: ids below `vocab_size` whose text ends with it and is longer}."""
    found = collections.defaultdict(list)
    longest = max((len(string) for string in wanted), default=0)
    for token_id, text in enumerate(vocabulary.texts[:vocab_size]):
        for length in range(1, min(len(text) - 1, longest) + 1):
            if text[-length:] in wanted:
                found[text[-length:]].append(token_id)
    return found


def _prefix_index(vocabulary: Vocabulary, wanted: set[str], vocab_size: int) -> dict[str, list[int]]:
    """{string in `wanted`: ids below `vocab_size` whose text starts with it}."""
    found = collections.defaultdict(list)
    longest = max((len(string) for string in wanted), default=0)
    for token_id, text in enumerate(vocabulary.texts[:vocab_size]):
        for length in range(1, min(len(text), longest) + 1):
            if text[:length] in wanted:
                found[text[:length]].append(token_id)
    return found


def _containing_index(vocabulary: Vocabulary, wanted: set[str], vocab_size: int) -> dict[str, list[int]]:
    """{string in `wanted`: ids below `vocab_size` whose text contains it}."""
    found = collections.defaultdict(list)
    lengths = sorted({len(string) for string in wanted})
    for token_id, text in enumerate(vocabulary.texts[:vocab_size]):
        for length in lengths:
            if length > len(text):
                break
            for string in {text[start:start + length] for start in range(len(text) - length + 1)} & wanted:
                found[string].append(token_id)
    return found


def _ids_below(ids, vocab_size: int) -> np.ndarray:
    ids = np.asarray(ids, np.int64)
    return ids[ids < vocab_size]


def _position_pairs(vocabulary: Vocabulary, stop_strings: tuple[str, ...], offsets: np.ndarray, vocab_size: int):
    """{last character: ([position codes], [id arrays])}: the tokens that fit right before each position.

    A token fits before `m` matched characters of a string of length `n` (`j = n - m` characters left of it) when
    its text equals `s[j - len(text):j]`, or, longer than `j`, ends with `s[:j]` (it overhangs the string's start).
    """
    longest = vocabulary.text_lengths[-1] if vocabulary.text_lengths else 0
    overhanging = _suffix_index(
        vocabulary, {s[:left] for s in stop_strings for left in range(1, min(len(s), longest))}, vocab_size)
    groups = collections.defaultdict(lambda: ([], []))
    for index, stop_string in enumerate(stop_strings):
        for left in range(1, len(stop_string)):
            ids = [vocabulary.ids_by_text.get(stop_string[left - length:left], ())
                   for length in vocabulary.text_lengths if length <= left]
            ids.append(overhanging.get(stop_string[:left], ()))
            ids = _ids_below(np.concatenate([np.asarray(found, np.int64) for found in ids]), vocab_size)
            codes, id_lists = groups[stop_string[left - 1]]
            codes.append(int(offsets[index]) + len(stop_string) - left)
            id_lists.append(ids)
    return groups


def _pack_positions(groups, total: int, vocab_rows: int):
    """The per-token and per-position arrays and the packed bits of the position groups."""
    token_group = np.full(vocab_rows, -1, np.int32)
    token_bit_base = np.zeros(vocab_rows, np.int64)
    position_group = np.full(total, -2, np.int32)
    position_column = np.zeros(total, np.int32)
    packed, byte_offset = [np.zeros(1, np.uint8)], 1
    for group, (codes, id_lists) in enumerate(groups.values()):
        position_group[codes] = group
        position_column[codes] = np.arange(len(codes))
        columns = np.repeat(np.arange(len(codes)), [len(ids) for ids in id_lists])
        ids = np.concatenate(id_lists)
        members, rows = np.unique(ids, return_inverse=True)
        matrix = np.zeros((len(members), len(codes)), bool)
        matrix[rows, columns] = True
        token_group[members] = group
        token_bit_base[members] = byte_offset * 8 + np.arange(len(members), dtype=np.int64) * len(codes)
        group_bits = np.packbits(matrix.reshape(-1), bitorder="little")
        packed.append(group_bits)
        byte_offset += len(group_bits)
    return token_group, token_bit_base, position_group, position_column, np.concatenate(packed)


def _end_overlaps(vocabulary: Vocabulary, stop_strings: tuple[str, ...], vocab_size: int):
    """int64 `[N, 3]` rows (token id, string index, overlap), sorted and without repeats.

    A token's start overlaps `k < n` characters of a string's end when its text starts with the string's last `k`
    characters; it holds the whole end (overlap `n`) when its text contains the string.
    """
    longest = vocabulary.text_lengths[-1] if vocabulary.text_lengths else 0
    starting = _prefix_index(
        vocabulary, {s[len(s) - k:] for s in stop_strings for k in range(1, min(len(s) - 1, longest) + 1)}, vocab_size)
    containing = _containing_index(vocabulary, {s for s in stop_strings if len(s) <= longest}, vocab_size)
    triples = [np.zeros((0, 3), np.int64)]
    for index, stop_string in enumerate(stop_strings):
        length = len(stop_string)
        found = [(starting.get(stop_string[length - k:], ()), k) for k in range(1, min(length - 1, longest) + 1)]
        found.append((containing.get(stop_string, ()), length))
        for ids, overlap in found:
            if len(ids):
                ids = np.asarray(ids, np.int64)
                triples.append(np.stack([ids, np.full_like(ids, index), np.full_like(ids, overlap)], axis=1))
    return np.unique(np.concatenate(triples), axis=0)


def build_tables(vocabulary: Vocabulary, stop_strings: tuple[str, ...], vocab_size: int) -> StopStringTables:
    """Looks every stop string up in the vocabulary and packs the results (see the module docstring).

    Raises:
        ValueError: a stop string that no token can end (naming `stop_strings`).
    """
    overlaps = _end_overlaps(vocabulary, stop_strings, vocab_size)
    endless = sorted(set(range(len(stop_strings))) - set(overlaps[:, 1].tolist()))
    if endless:
        raise ValueError(f"stop_strings {[stop_strings[index] for index in endless]!r}: no token of the vocabulary "
                         "can end these strings (they hold characters no token decodes to on its own), so they "
                         "could never be detected")
    vocab_rows = vocab_size + 1
    lengths = np.array([len(stop_string) for stop_string in stop_strings], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32)
    groups = _position_pairs(vocabulary, stop_strings, offsets, vocab_size)
    token_group, token_bit_base, position_group, position_column, bits = _pack_positions(
        groups, int(lengths.sum()), vocab_rows)
    texts = vocabulary.texts[:vocab_size]
    token_lengths = np.zeros(vocab_rows, np.int32)
    token_lengths[:len(texts)] = [len(text) for text in texts]
    fits_anywhere = np.zeros(vocab_rows, bool)
    fits_anywhere[_ids_below(vocabulary.empty_ids, vocab_size)] = True
    end_count = np.bincount(overlaps[:, 0], minlength=vocab_rows).astype(np.int32)
    end_start = (np.cumsum(end_count) - end_count).astype(np.int32)
    arrays = dict(
        token_lengths=token_lengths, fits_anywhere=fits_anywhere, token_group=token_group,
        token_bit_base=token_bit_base, position_group=position_group, position_column=position_column,
        position_offsets=offsets, bits=bits, end_start=end_start, end_count=end_count,
        end_string=overlaps[:, 1].astype(np.int32), end_overlap=overlaps[:, 2].astype(np.int32))
    for array in arrays.values():
        array.setflags(write=False)
    return StopStringTables(stop_strings, **arrays)
