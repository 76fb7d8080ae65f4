"""tfgen.text.tokenizer against tiny byte-level BPE tokenizers trained here, with HF transformers as the reference."""

import itertools
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from tfgen.text.tokenizer import Tokenizer
from tfgen.text.tokenizer_base import IncrementalDecoder

_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "café", "crème", "brûlée", "naïve",
          "über", "hello", "world", "model", "token", "stream", "日本", "語"]
_CORPUS = [" ".join(words) for words in itertools.permutations(_WORDS[:8], 3)] + [" ".join(_WORDS)] * 5
# Emoji and rarer characters the tiny BPE never merged, so they split into several byte tokens.
TEXTS = [
    "the quick brown fox",
    "café crème 🦄 fin",
    "naïve 🙂🙃 Straße, ½ ∑",
    "日本語のテキスト",
    "  spaced   out  ",
    "x",
]


def _train_backend(special_tokens, add_prefix_space=False, bos=None):
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=special_tokens, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(_CORPUS, trainer)
    if bos is None:
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, backend.token_to_id(bos))])
    return backend


def _write_checkpoint(directory, backend, **json_files):
    directory.mkdir(parents=True, exist_ok=True)
    backend.save(str(directory / "tokenizer.json"))
    for name, content in json_files.items():
        (directory / f"{name}.json").write_text(json.dumps(content))
    return str(directory)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """GPT-2 layout: one special token, special ids only in config.json, no pad token."""
    backend = _train_backend(["<|endoftext|>"])
    eos_id = backend.token_to_id("<|endoftext|>")
    return _write_checkpoint(tmp_path_factory.mktemp("byte_bpe"), backend,
                             config={"bos_token_id": eos_id, "eos_token_id": eos_id})


@pytest.fixture(scope="module")
def bos_dir(tmp_path_factory):
    """Llama-like layout: the post-processor adds <s>; tokens named in tokenizer_config.json (one as a dict)."""
    backend = _train_backend(["<s>", "</s>", "<pad>"], bos="<s>")
    return _write_checkpoint(tmp_path_factory.mktemp("bos"), backend, tokenizer_config={
        "bos_token": {"__type": "AddedToken", "content": "<s>", "special": True},
        "eos_token": "</s>", "pad_token": "<pad>", "padding_side": "right"})


@pytest.fixture(scope="module")
def gpt2(gpt2_dir):
    return Tokenizer.from_pretrained(gpt2_dir)


@pytest.fixture(scope="module")
def bos_tokenizer(bos_dir):
    return Tokenizer.from_pretrained(bos_dir)


def _hf_reference(directory, **kwargs):
    return PreTrainedTokenizerFast.from_pretrained(directory, padding_side="left", truncation_side="left", **kwargs)


def test_special_tokens_come_from_the_checkpoint_files(gpt2, bos_tokenizer, gpt2_dir):
    backend = tokenizers.Tokenizer.from_file(os.path.join(gpt2_dir, "tokenizer.json"))
    eos_id = backend.token_to_id("<|endoftext|>")
    assert (gpt2.bos_token_id, gpt2.eos_token_id) == (eos_id, eos_id)
    assert gpt2.pad_token_id == eos_id and gpt2.pad_token == "<|endoftext|>"  # GPT-2 style eos fallback
    assert gpt2.vocab_size == backend.get_vocab_size(with_added_tokens=True) > 300
    assert [bos_tokenizer.bos_token, bos_tokenizer.eos_token, bos_tokenizer.pad_token] == ["<s>", "</s>", "<pad>"]
    assert bos_tokenizer.pad_token_id != bos_tokenizer.eos_token_id
    # The file's training-time "right" is not used; generation needs left padding.
    assert gpt2.padding_side == bos_tokenizer.padding_side == "left"


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_round_trip(gpt2, bos_tokenizer, text):
    assert gpt2.decode(gpt2.encode(text)) == text
    ids = bos_tokenizer.encode(text)
    assert ids[0] == bos_tokenizer.bos_token_id and ids[1:] == bos_tokenizer.encode(text, add_special_tokens=False)
    assert bos_tokenizer.decode(ids, skip_special_tokens=True) == text
    assert bos_tokenizer.decode(ids).startswith("<s>")


def test_left_padding_puts_tokens_at_the_end_and_masks_the_rest(gpt2):
    batch = gpt2(TEXTS)
    lengths = [len(gpt2.encode(text)) for text in TEXTS]
    assert batch["input_ids"].dtype == batch["attention_mask"].dtype == np.int32
    assert batch["input_ids"].shape == (len(TEXTS), max(lengths))
    for row, mask, text, length in zip(batch["input_ids"], batch["attention_mask"], TEXTS, lengths):
        pad_count = max(lengths) - length
        assert row[pad_count:].tolist() == gpt2.encode(text)
        assert (row[:pad_count] == gpt2.pad_token_id).all()
        assert mask.tolist() == [0] * pad_count + [1] * length


def test_right_padding_side(gpt2_dir):
    tokenizer = Tokenizer.from_pretrained(gpt2_dir, padding_side="right")
    batch = tokenizer(["x", "the quick brown fox"])
    length = len(tokenizer.encode("x"))
    assert batch["input_ids"][0, :length].tolist() == tokenizer.encode("x")
    assert batch["attention_mask"][0].tolist() == [1] * length + [0] * (batch["input_ids"].shape[1] - length)


def test_a_single_string_is_a_batch_of_one(gpt2):
    batch = gpt2("café crème 🦄 fin")
    assert batch["input_ids"].tolist() == [gpt2.encode("café crème 🦄 fin")]
    assert batch["attention_mask"].tolist() == [[1] * batch["input_ids"].shape[1]]


def test_pad_to_multiple_of_rounds_the_length_up(gpt2):
    longest = max(len(gpt2.encode(text)) for text in TEXTS)
    batch = gpt2(TEXTS, pad_to_multiple_of=8)
    assert batch["input_ids"].shape[1] == -(-longest // 8) * 8 > longest
    assert batch["attention_mask"].sum(axis=1).tolist() == [len(gpt2.encode(text)) for text in TEXTS]
    assert gpt2(["x"], padding="max_length", max_length=10, pad_to_multiple_of=4)["input_ids"].shape == (1, 12)


def test_truncation_keeps_the_end_of_left_padded_prompts(gpt2, bos_tokenizer, gpt2_dir):
    text = "the quick brown fox jumps over the lazy dog"
    assert gpt2(text, truncation=True, max_length=3)["input_ids"][0].tolist() == gpt2.encode(text)[-3:]
    # Special tokens count towards max_length and survive truncation.
    truncated = bos_tokenizer(text, truncation=True, max_length=3)["input_ids"][0].tolist()
    assert truncated == [bos_tokenizer.bos_token_id] + bos_tokenizer.encode(text, add_special_tokens=False)[-2:]
    right = Tokenizer.from_pretrained(gpt2_dir, padding_side="right")
    assert right(text, truncation=True, max_length=3)["input_ids"][0].tolist() == right.encode(text)[:3]


def test_return_tensors(gpt2):
    numpy_batch = gpt2(TEXTS[:3])
    tf_batch = gpt2(TEXTS[:3], return_tensors="tf")
    list_batch = gpt2(TEXTS[:3], return_tensors=None)
    for key in ("input_ids", "attention_mask"):
        assert isinstance(tf_batch[key], tf.Tensor) and tf_batch[key].dtype == tf.int32
        np.testing.assert_array_equal(tf_batch[key].numpy(), numpy_batch[key])
        assert list_batch[key] == numpy_batch[key].tolist()
    unpadded = gpt2(TEXTS[:2], padding=False, return_tensors=None)
    assert unpadded["input_ids"] == [gpt2.encode(text) for text in TEXTS[:2]]


@pytest.mark.parametrize("checkpoint", ["gpt2_dir", "bos_dir"])
@pytest.mark.parametrize("options", [{}, {"pad_to_multiple_of": 8}, {"truncation": True, "max_length": 4},
                                     {"padding": "max_length", "max_length": 40}, {"add_special_tokens": False}])
def test_matches_transformers_fast_tokenizer(request, checkpoint, options):
    directory = request.getfixturevalue(checkpoint)
    ours = Tokenizer.from_pretrained(directory)
    reference = _hf_reference(directory, **({"eos_token": ours.eos_token, "pad_token": ours.eos_token}
                                            if checkpoint == "gpt2_dir" else {}))
    expected = reference(TEXTS, **{"padding": True, **options}, return_tensors="np")
    actual = ours(TEXTS, **options)
    np.testing.assert_array_equal(actual["input_ids"], expected["input_ids"])
    np.testing.assert_array_equal(actual["attention_mask"], expected["attention_mask"])
    assert ours.vocab_size == len(reference)
    for ids, skip in itertools.product(expected["input_ids"], [False, True]):
        assert ours.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("add_prefix_space", [False, True])
def test_save_pretrained_loads_in_auto_tokenizer(tmp_path, add_prefix_space):
    backend = _train_backend(["<|endoftext|>"], add_prefix_space=add_prefix_space)
    ours = Tokenizer(backend, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    ours.save_pretrained(tmp_path / "saved")
    reference = AutoTokenizer.from_pretrained(tmp_path / "saved")
    assert isinstance(reference, PreTrainedTokenizerFast) and reference.padding_side == "left"
    assert (reference.bos_token_id, reference.eos_token_id, reference.pad_token_id) == (
        ours.bos_token_id, ours.eos_token_id, ours.pad_token_id)
    for options in ({}, {"truncation": True, "max_length": 4}):
        expected = reference(TEXTS, padding=True, return_tensors="np", **options)
        np.testing.assert_array_equal(ours(TEXTS, **options)["input_ids"], expected["input_ids"])
        np.testing.assert_array_equal(ours(TEXTS, **options)["attention_mask"], expected["attention_mask"])
    reloaded = Tokenizer.from_pretrained(tmp_path / "saved")
    assert reloaded(TEXTS)["input_ids"].tolist() == ours(TEXTS)["input_ids"].tolist()


def test_constructor_copies_instead_of_changing_the_backend(gpt2_dir):
    backend = tokenizers.Tokenizer.from_file(os.path.join(gpt2_dir, "tokenizer.json"))
    backend.enable_padding(length=64, pad_id=0)
    backend.enable_truncation(max_length=2)
    tokenizer = Tokenizer(backend, eos_token="<|endoftext|>")
    text = "the quick brown fox jumps"
    assert tokenizer(text)["input_ids"][0].tolist() == tokenizer.encode(text)
    assert len(tokenizer.encode(text)) > 2
    assert backend.padding is not None and backend.truncation is not None


def test_plain_vocabulary_token_used_as_eos_becomes_special(gpt2_dir):
    backend = tokenizers.Tokenizer.from_file(os.path.join(gpt2_dir, "tokenizer.json"))
    merged_word = next(token for token in backend.get_vocab() if token.startswith("Ġ") and len(token) > 3)
    tokenizer = Tokenizer(backend, eos_token=merged_word)
    eos_id = backend.token_to_id(merged_word)
    assert tokenizer.eos_token_id == eos_id
    assert tokenizer.decode([eos_id], skip_special_tokens=True) == ""
    assert backend.decode([eos_id], skip_special_tokens=True) != ""  # the caller's backend is untouched


def test_decode_accepts_lists_arrays_and_tensors(gpt2):
    ids = gpt2.encode("naïve 🙂🙃 Straße")
    expected = gpt2.decode(ids)
    assert gpt2.decode(np.array(ids, np.int64)) == gpt2.decode(tf.constant(ids, tf.int32)) == expected
    batch = gpt2(TEXTS[:3])["input_ids"]
    per_row = [gpt2.decode(row, skip_special_tokens=True) for row in batch.tolist()]
    assert gpt2.batch_decode(batch, skip_special_tokens=True) == per_row == TEXTS[:3]
    assert gpt2.batch_decode(tf.constant(batch), skip_special_tokens=True) == per_row
    assert gpt2.batch_decode([gpt2.encode("x"), ids]) == ["x", expected]


def _stream(decoder, ids, chunk_size):
    pieces = [decoder.push(ids[start:start + chunk_size]) for start in range(0, len(ids), chunk_size)]
    return pieces, decoder.flush()


@pytest.mark.parametrize("chunk_size", [1, 3])
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_incremental_decoder_matches_full_decode(gpt2, chunk_size, skip_special_tokens):
    eos = [gpt2.eos_token_id]
    ids = list(itertools.chain.from_iterable(gpt2.encode(text) + eos for text in TEXTS))
    # The stream must really cut characters in half for the hold-back to be exercised.
    assert any(gpt2.decode([token]).endswith("\ufffd") for token in ids)
    pieces, rest = _stream(IncrementalDecoder(gpt2, skip_special_tokens=skip_special_tokens), ids, chunk_size)
    assert not any("\ufffd" in piece for piece in pieces)
    assert "".join(pieces) + rest == gpt2.decode(ids, skip_special_tokens=skip_special_tokens)
    assert ("<|endoftext|>" in "".join(pieces)) != skip_special_tokens


def test_incremental_decoder_flush_returns_held_back_bytes_and_resets(gpt2):
    ids = gpt2.encode("🦄")
    assert len(ids) > 1
    decoder = IncrementalDecoder(gpt2)
    assert decoder.push(ids[:-1]) == ""
    assert decoder.flush() == gpt2.decode(ids[:-1])
    assert decoder.push(gpt2.encode("fox")) == "fox"


def test_incremental_decoder_decodes_a_bounded_window(gpt2, monkeypatch):
    decoded_lengths = []
    decode = gpt2.decode

    def spy(ids, skip_special_tokens=False):
        decoded_lengths.append(len(ids))
        return decode(ids, skip_special_tokens)

    ids = gpt2.encode(" ".join(TEXTS) * 20)
    decoder = IncrementalDecoder(gpt2)
    monkeypatch.setattr(gpt2, "decode", spy)
    text = "".join(decoder.push(token) for token in ids) + decoder.flush()
    monkeypatch.undo()
    assert text == gpt2.decode(ids, skip_special_tokens=True)
    assert len(ids) > 400 and max(decoded_lengths) <= 8


def test_offline_unknown_repo_raises_oserror(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="nobody-here/no-such-model"):
        Tokenizer.from_pretrained("nobody-here/no-such-model", cache_dir=tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(OSError, match="nobody-here/no-such-model"):
        Tokenizer.from_pretrained("nobody-here/no-such-model", cache_dir=tmp_path, local_files_only=True)


def test_missing_local_files_raise_oserror(tmp_path):
    with pytest.raises(OSError, match="no tokenizer.json"):
        Tokenizer.from_pretrained(tmp_path)
    with pytest.raises(OSError, match="does/not/exist"):
        Tokenizer.from_pretrained(str(tmp_path / "does/not/exist"))


def test_offline_loads_a_cached_hub_snapshot(tmp_path, monkeypatch, gpt2_dir, gpt2):
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_cache = tmp_path / "models--some-org--tiny-gpt2"
    (repo_cache / "refs").mkdir(parents=True)
    (repo_cache / "refs" / "main").write_text(commit)
    snapshot = repo_cache / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in os.listdir(gpt2_dir):
        (snapshot / name).write_bytes(open(os.path.join(gpt2_dir, name), "rb").read())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cached = Tokenizer.from_pretrained("some-org/tiny-gpt2", cache_dir=tmp_path)
    assert cached(TEXTS)["input_ids"].tolist() == gpt2(TEXTS)["input_ids"].tolist()
    assert cached.eos_token_id == gpt2.eos_token_id


@pytest.mark.parametrize("call, error, name", [
    (lambda t: t("x", return_tensors="pt"), ValueError, "return_tensors"),
    (lambda t: t("x", pad_to_multiple_of=0), ValueError, "pad_to_multiple_of"),
    (lambda t: t("x", pad_to_multiple_of=True), ValueError, "pad_to_multiple_of"),
    (lambda t: t("x", padding=False, pad_to_multiple_of=8), ValueError, "pad_to_multiple_of"),
    (lambda t: t("x", truncation=True), ValueError, "max_length"),
    (lambda t: t("x", max_length=-1), ValueError, "max_length"),
    (lambda t: t("the quick brown fox", padding="max_length", max_length=1), ValueError, "truncation"),
    (lambda t: t(TEXTS, padding=False), ValueError, "padding"),
    (lambda t: t("x", padding="sideways"), ValueError, "padding"),
    (lambda t: t(123), TypeError, "text"),
    (lambda t: t(["x", None]), TypeError, "text"),
    (lambda t: t([]), TypeError, "text"),
    (lambda t: t.encode(b"bytes"), TypeError, "text"),
    (lambda t: t.decode([[1, 2]]), ValueError, "ids"),
    (lambda t: t.decode([0.5]), ValueError, "ids"),
    (lambda t: t.batch_decode(np.array([1, 2])), ValueError, "batch"),
    (lambda t: setattr(t, "padding_side", "middle"), ValueError, "padding_side"),
    (lambda t: Tokenizer(t), TypeError, "tokenizer"),
    (lambda t: IncrementalDecoder("not a tokenizer"), TypeError, "tokenizer"),
])
def test_bad_arguments_raise(gpt2_dir, call, error, name):
    with pytest.raises(error, match=name):
        call(Tokenizer.from_pretrained(gpt2_dir))


def test_unknown_special_token_raises(gpt2_dir):
    backend = tokenizers.Tokenizer.from_file(os.path.join(gpt2_dir, "tokenizer.json"))
    with pytest.raises(ValueError, match="eos_token"):
        Tokenizer(backend, eos_token="<|endoftex|>")
