"""tfgen.stopping.stop_strings against transformers' StopStringCriteria: the same tables, the same hits row by row."""

import itertools
import random

import numpy as np
import pytest
import tensorflow as tf
import tokenizers
import torch
from tokenizers import decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.generation.stopping_criteria import StopStringCriteria

from tfgen.hub import default_model as defaults
from tfgen.stopping.stop_strings import stop_string_hits, stop_string_tables, tail_window
from tfgen.text.tokenizer import Tokenizer

_STDLIB_STOPS = ["stop", " def", "\n\n", "):", "x"]
# The tiny tokenizer merged "é", "ü" and "語" into whole-character tokens but split "ï" across two byte tokens.
_MULTIBYTE_STOPS = ["café", " über", "語", "naïve", "stop"]
_MULTIBYTE_WORDS = ["the", "quick", "brown", "fox", "stop", "stopper", "café", "crème", "naïve", "über", "日本", "語"]
_DOCSTRING_PIECES = ["st", "op", "stop", "opera", "sto", "pper", "las", "topper", "s", "to", "pped", "at", "tion"]


def _pair(directory):
    """(tfgen Tokenizer, equivalent HF PreTrainedTokenizerFast) of a directory holding tokenizer.json."""
    return Tokenizer.from_pretrained(directory), PreTrainedTokenizerFast(tokenizer_file=f"{directory}/tokenizer.json")


@pytest.fixture(scope="module")
def stdlib():
    return _pair(defaults.DEFAULT_MODEL)


@pytest.fixture(scope="module")
def multibyte(tmp_path_factory):
    """A tiny byte-level BPE whose vocabulary holds multi-byte characters."""
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    corpus = [" ".join(words) for words in itertools.permutations(_MULTIBYTE_WORDS[:7], 3)]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(corpus + [" ".join(_MULTIBYTE_WORDS)] * 5, trainer)
    directory = tmp_path_factory.mktemp("multibyte")
    backend.save(str(directory / "tokenizer.json"))
    return _pair(directory)


@pytest.fixture(scope="module")
def docstring_vocab(tmp_path_factory):
    """One token per piece of StopStringCriteria's docstring examples, decoded by plain concatenation."""
    vocab = {piece: index for index, piece in enumerate(["[UNK]", "abcdef", *_DOCSTRING_PIECES])}
    backend = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.decoder = decoders.Fuse()
    directory = tmp_path_factory.mktemp("docstring")
    backend.save(str(directory / "tokenizer.json"))
    return _pair(directory)


def _hf_hits(hf_tokenizer, stop_strings, rows):
    """HF's verdict per row, each row alone so that rows of any length are HF's own shorter input_ids."""
    criteria = StopStringCriteria(hf_tokenizer, stop_strings)
    return [bool(criteria(torch.tensor([row]), None)[0]) for row in rows]


def _left_padded(rows, width):
    """int32 [B, width]: each row's last `width` ids, -1 before the row's start."""
    batch = np.full((len(rows), width), -1, np.int32)
    for index, row in enumerate(rows):
        tail = row[-width:]
        batch[index, width - len(tail):] = tail
    return batch


def _encode_pieces(tokenizer, pieces):
    return [token_id for piece in pieces for token_id in tokenizer.encode(piece, add_special_tokens=False)]


def _random_rows(tokenizer, words, max_token_len, seed, count=150):
    """Rows whose text mixes stop strings, near misses and noise, tokenized in randomly cut pieces (so token
    boundaries fall inside stop strings), then cut to a random tail; plus rows of random ids, some out of range."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        text = "".join(rng.choice(words) for _ in range(rng.randint(1, 5)))
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 3))))
        ids = _encode_pieces(tokenizer, [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])])
        rows.append(ids[-rng.randint(1, max_token_len + 2):])
    for _ in range(count // 3):
        rows.append([rng.randrange(tokenizer.vocab_size + 3) for _ in range(rng.randint(1, max_token_len + 2))])
    return rows


@pytest.mark.parametrize("fixture, stop_strings", [
    ("stdlib", _STDLIB_STOPS), ("stdlib", "x"), ("stdlib", ["stopstop", " stop"]),
    ("multibyte", _MULTIBYTE_STOPS), ("docstring_vocab", ["stop"]),
])
def test_tables_equal_hf(request, fixture, stop_strings):
    """The packed tables hold, for every token, the same valid positions, end overlaps and length as transformers'
    dense `embedding_vec` (read as sets: HF repeats an overlap when a token holds the string twice)."""
    tokenizer, hf_tokenizer = request.getfixturevalue(fixture)
    tables = stop_string_tables(tokenizer, stop_strings)
    criteria = StopStringCriteria(hf_tokenizer, stop_strings)
    assert tables.max_token_len == criteria.maximum_token_len
    dense = criteria.embedding_vec.numpy()
    assert dense.shape[0] == tables.vocab_rows
    num_strings = len(tables.stop_strings)
    positions, overlaps = criteria.max_valid_positions, criteria.max_valid_end_lens
    for token_id, row in enumerate(dense):
        expected_positions = [set(row[i * positions:(i + 1) * positions].tolist()) - {-1} for i in range(num_strings)]
        start = num_strings * positions
        expected_overlaps = [set(row[start + i * overlaps:start + (i + 1) * overlaps].tolist()) - {-1}
                             for i in range(num_strings)]
        assert tables.token_facts(token_id) == (expected_positions, expected_overlaps), token_id
        assert tables.token_lengths[token_id] == max(row[-1], 0)


@pytest.mark.parametrize("pieces, expected", [
    (["st", "op"], True), (["stop"], True), (["st", "opera"], True), (["sto", "pper"], True),
    (["las", "topper"], True), (["s", "to", "pped"], True), (["at", "s", "to", "pped"], True),
    (["stop", "at"], False), (["st", "op", "at"], False), (["st", "opera", "tion"], False), (["to", "pped"], False),
])
def test_docstring_examples(docstring_vocab, pieces, expected):
    tokenizer, hf_tokenizer = docstring_vocab
    ids = _encode_pieces(tokenizer, pieces)
    assert len(ids) == len(pieces)
    tables = stop_string_tables(tokenizer, "stop")
    hits = stop_string_hits(tables, _left_padded([ids], tables.max_token_len + 2)).numpy()
    assert hits.tolist() == [expected] == _hf_hits(hf_tokenizer, "stop", [ids])


@pytest.mark.parametrize("fixture, stop_strings, words", [
    ("stdlib", _STDLIB_STOPS,
     ["stop", "sto", "pper", " def", "def", "\n", "\n\n", "):", ")", ":", "x", "xx", " ", "self", "return", "top"]),
    ("multibyte", _MULTIBYTE_STOPS,
     ["café", "caf", "é", " über", "über", "語", "日本", "naïve", "na", "ïve", "stop", " ", "the", "fox", "e"]),
])
def test_hits_match_hf_row_by_row(request, fixture, stop_strings, words):
    tokenizer, hf_tokenizer = request.getfixturevalue(fixture)
    tables = stop_string_tables(tokenizer, stop_strings)
    rows = _random_rows(tokenizer, words, tables.max_token_len, seed=len(fixture))
    expected = _hf_hits(hf_tokenizer, stop_strings, rows)
    assert 0.1 < np.mean(expected) < 0.9  # both outcomes are well represented
    assert any(len(row) < tables.max_token_len and hit for row, hit in zip(rows, expected))
    # The exact tail, and a wider window whose extra (older) columns the matcher must ignore.
    for width in (tables.max_token_len, tables.max_token_len + 3):
        hits = stop_string_hits(tables, _left_padded(rows, width)).numpy()
        mismatches = [(rows[i], hits[i]) for i in range(len(rows)) if hits[i] != expected[i]]
        assert not mismatches


def test_compiled_hits_equal_eager(stdlib):
    tokenizer, _ = stdlib
    tables = stop_string_tables(tokenizer, _STDLIB_STOPS)
    rows = _random_rows(tokenizer, ["stop", " def", "\n\n", "):", "x", "sto", "pper", "  "], tables.max_token_len, 3)
    tail_ids = tf.constant(_left_padded(rows, tables.max_token_len))
    # An unknown batch size, as in a program traced once for every batch.
    compiled = tf.function(lambda ids: stop_string_hits(tables, ids), jit_compile=True,
                           input_signature=[tf.TensorSpec([None, tables.max_token_len], tf.int32)])
    expected = stop_string_hits(tables, tail_ids).numpy()
    assert expected.any() and not expected.all()
    np.testing.assert_array_equal(compiled(tail_ids).numpy(), expected)
    np.testing.assert_array_equal(compiled(tail_ids[:5]).numpy(), expected[:5])


def test_tail_window():
    sequences = tf.reshape(tf.range(30, dtype=tf.int64), [3, 10])
    compiled = tf.function(tail_window, jit_compile=True)
    for window in (tail_window, lambda *args: compiled(*args[:3], width=args[3])):
        last = window(sequences, tf.constant(9), tf.constant(0), 4).numpy()
        np.testing.assert_array_equal(last, [[6, 7, 8, 9], [16, 17, 18, 19], [26, 27, 28, 29]])
        before_start = window(sequences, tf.constant(2), tf.constant(0), 5).numpy()
        np.testing.assert_array_equal(before_start[0], [-1, -1, 0, 1, 2])
        first_valid = window(sequences, tf.constant(6), tf.constant(5), 4).numpy()
        np.testing.assert_array_equal(first_valid[1], [-1, -1, 15, 16])
        per_row = window(sequences, tf.constant(6), tf.constant([0, 4, 6]), 4).numpy()
        np.testing.assert_array_equal(per_row, [[3, 4, 5, 6], [-1, 14, 15, 16], [-1, -1, -1, 26]])
        assert last.dtype == np.int32


def test_decode_loop_use_matches_hf_at_every_step(multibyte):
    """tail_window + stop_string_hits in one compiled function, stepped over a left-padded buffer like a decode
    loop, agree with HF run on each row's real tokens so far."""
    tokenizer, hf_tokenizer = multibyte
    tables = stop_string_tables(tokenizer, _MULTIBYTE_STOPS)
    texts = ["the café", "fox über naïve", "語", "stop the fox"]
    rows = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    length = max(map(len, rows))
    buffer = np.full((len(rows), length), tokenizer.pad_token_id or 0, np.int32)
    starts = np.array([length - len(row) for row in rows], np.int32)
    for index, row in enumerate(rows):
        buffer[index, starts[index]:] = row

    @tf.function(jit_compile=True)
    def step_hits(sequences, end_index, first_valid):
        return stop_string_hits(tables, tail_window(sequences, end_index, first_valid, tables.max_token_len))

    for end_index in range(length):
        hits = step_hits(tf.constant(buffer), tf.constant(end_index), tf.constant(starts)).numpy()
        for index in range(len(rows)):
            real = buffer[index, starts[index]:end_index + 1].tolist()
            assert hits[index] == (bool(real) and _hf_hits(hf_tokenizer, _MULTIBYTE_STOPS, [real])[0])


def test_vocab_size_rows_and_cache(stdlib):
    tokenizer, _ = stdlib
    tables = stop_string_tables(tokenizer, ["stop", " def"])
    assert tables.vocab_rows == tokenizer.vocab_size + 1
    assert stop_string_tables(tokenizer, ("stop", " def")) is tables
    assert stop_string_tables(Tokenizer.from_pretrained(defaults.DEFAULT_MODEL), ["stop", " def"]) is tables
    wider = stop_string_tables(tokenizer, ["stop", " def"], vocab_size=tokenizer.vocab_size + 60)
    assert wider.vocab_rows == tokenizer.vocab_size + 61
    for token_id in range(tokenizer.vocab_size + 61):
        facts = wider.token_facts(token_id)
        assert facts == (tables.token_facts(token_id) if token_id < tokenizer.vocab_size else ([set(), set()],) * 2)
    narrower = stop_string_tables(tokenizer, ["stop", " def"], vocab_size=1000)
    assert narrower.vocab_rows == 1001 and narrower.token_facts(1000) == ([set(), set()],) * 2
    assert all(narrower.token_facts(token_id) == tables.token_facts(token_id) for token_id in range(1000))
    stop_id = tokenizer.encode("stop", add_special_tokens=False)
    hits = stop_string_hits(wider, _left_padded([stop_id, stop_id + [tokenizer.vocab_size + 10]], 4)).numpy()
    assert hits.tolist() == [True, False]


@pytest.mark.parametrize("stop_strings, message", [
    ([], "must not be an empty list"), (["stop", 3], "only strings"), (["stop", ""], "empty string"),
    (b"stop", "string or a list"), ("é", "no token"), (["stop", "日本"], r"\['日本'\]"),
])
def test_errors_name_stop_strings(stdlib, stop_strings, message):
    with pytest.raises(ValueError, match=message) as raised:
        stop_string_tables(stdlib[0], stop_strings)
    assert "stop_strings" in str(raised.value)


def test_string_no_token_ends_also_fails_in_hf_when_it_is_the_only_one(stdlib):
    # The stdlib vocabulary merged no multi-byte character: their bytes decode to U+FFFD alone, so "é" is unreachable.
    with pytest.raises(ValueError, match="unable to identify tokens"):
        StopStringCriteria(stdlib[1], ["é"])
