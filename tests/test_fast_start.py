"""Fast starts (issue 31): the GGUF load cache (`tfgen.gguf.load_cache`) gives a model and tokenizer identical to a
fresh load, serves a second load without parsing the file, rebuilds a damaged entry, and never serves another file's
entry; `tfgen generate --verbose` ends with a timings line. Speed itself is measured in
`benchmarks/fast_start.py`, not asserted here."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
from gguf_files import TEXTS, build_hf_model, byte_level_vocabulary, write_gguf

from tfgen.auto.models import AutoModelForCausalLM
from tfgen.auto.tokenizer import AutoTokenizer
from tfgen.cli import main
from tfgen.gguf import load_cache

VOCAB = len(byte_level_vocabulary()[0])
IDS = np.array([[5, 17, 42, 8, 99, 3]], dtype=np.int32)


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "m.gguf"
    return write_gguf(path, build_hf_model("llama", VOCAB), arch="llama", qtype="Q4_1")


@pytest.fixture(scope="module")
def fresh(gguf_path):
    """The tokenizer and model loaded from the file itself (the cache off, as conftest sets it)."""
    return AutoTokenizer.from_pretrained(gguf_path), AutoModelForCausalLM.from_pretrained(gguf_path)


@pytest.fixture
def cache_on(monkeypatch, tmp_path):
    monkeypatch.setenv(load_cache.ENABLE_VARIABLE, "1")
    monkeypatch.setenv("TFGEN_CACHE_DIR", str(tmp_path / "cache"))
    load_cache.counters.clear()
    return tmp_path / "cache" / "gguf"


def _load(path):
    return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)


def _assert_same(loaded, fresh):
    tokenizer, model = loaded
    fresh_tokenizer, fresh_model = fresh
    assert [np.asarray(tokenizer(text)["input_ids"]).tolist() for text in TEXTS] == [
        np.asarray(fresh_tokenizer(text)["input_ids"]).tolist() for text in TEXTS]
    assert tokenizer.chat_template == fresh_tokenizer.chat_template
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token, tokenizer.context_length) == (
        fresh_tokenizer.bos_token, fresh_tokenizer.eos_token, fresh_tokenizer.pad_token, fresh_tokenizer.context_length)
    assert model.config.to_dict() == fresh_model.config.to_dict()
    weights, fresh_weights = model.hf_state_dict(), fresh_model.hf_state_dict()
    assert weights.keys() == fresh_weights.keys()
    for name in weights:
        np.testing.assert_array_equal(weights[name], fresh_weights[name], err_msg=name)
    np.testing.assert_array_equal(model(IDS).logits.numpy(), fresh_model(IDS).logits.numpy())


def _refuse_parsing(monkeypatch):
    """Makes any parse of a GGUF file fail: a load that still works came from the cache."""
    def parse(*args, **kwargs):
        raise AssertionError("the GGUF file was parsed")
    monkeypatch.setattr("tfgen.gguf.load_cache.open_gguf", parse)
    monkeypatch.setattr("tfgen.gguf.tokenizer.open_gguf", parse)


def test_a_second_load_comes_from_the_cache_and_equals_a_fresh_load(gguf_path, fresh, cache_on, monkeypatch):
    _assert_same(_load(gguf_path), fresh)  # builds and stores
    assert load_cache.counters == {("tokenizer", "stored"): 1, ("model", "stored"): 1}
    assert sorted(path.name for path in cache_on.iterdir()) == [load_cache.file_digest(gguf_path)]
    _refuse_parsing(monkeypatch)
    _assert_same(_load(gguf_path), fresh)
    assert load_cache.counters[("tokenizer", "hit")] == load_cache.counters[("model", "hit")] == 1


def test_a_copy_of_the_file_elsewhere_uses_the_same_entry(gguf_path, fresh, cache_on, monkeypatch, tmp_path):
    _load(gguf_path)
    copy = tmp_path / "elsewhere.gguf"
    copy.write_bytes(gguf_path.read_bytes())
    _refuse_parsing(monkeypatch)
    _assert_same(_load(copy), fresh)


def test_another_file_at_the_same_path_is_not_served_the_old_entry(tmp_path, cache_on):
    path = write_gguf(tmp_path / "m.gguf", build_hf_model("llama", VOCAB, seed=1), arch="llama", qtype="Q8_0")
    first = _load(path)[1].hf_state_dict()
    path = write_gguf(tmp_path / "m.gguf", build_hf_model("llama", VOCAB, seed=2), arch="llama", qtype="Q8_0")
    second = _load(path)[1].hf_state_dict()
    assert not np.array_equal(first["model.embed_tokens.weight"], second["model.embed_tokens.weight"])
    assert load_cache.counters[("model", "hit")] == 0 and len(list(cache_on.iterdir())) == 2


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def _replace_with_a_link(path):
    target = path.with_name("elsewhere")
    path.rename(target)
    path.symlink_to(target)


@pytest.mark.parametrize("file_name, damage", [
    ("weights.safetensors", _flip_a_byte),
    ("weights.safetensors", lambda path: path.write_bytes(path.read_bytes()[:1000])),
    ("weights.safetensors", _replace_with_a_link),
    ("weights.safetensors", lambda path: path.unlink()),
    ("model.meta.json", lambda path: path.write_text('{"format": 1, "data": {"config": {}}')),
    ("model.meta.json", lambda path: path.write_text(path.read_text().replace('"hidden_size": 64',
                                                                              '"hidden_size": 32'))),
    ("tokenizer.json", _flip_a_byte),
    ("tokenizer.meta.json", lambda path: path.write_text(path.read_text().replace("<|endoftext|>", "<|im_end|>"))),
], ids=["flipped-weights", "truncated-weights", "linked-weights", "missing-weights", "broken-json",
        "edited-config", "flipped-tokenizer", "edited-special-token"])
def test_a_damaged_entry_is_rebuilt(gguf_path, fresh, cache_on, caplog, file_name, damage):
    _load(gguf_path)
    damage(cache_on / load_cache.file_digest(gguf_path) / file_name)
    with caplog.at_level(logging.WARNING, logger="tfgen.gguf.load_cache"):
        _assert_same(_load(gguf_path), fresh)
    part = file_name.split(".")[0].replace("weights", "model")
    assert load_cache.counters[(part, "rebuilt")] == 1
    assert f"the {part} part of entry" in caplog.text and "building it again" in caplog.text
    load_cache.counters.clear()
    _assert_same(_load(gguf_path), fresh)  # stored again
    assert load_cache.counters[("tokenizer", "hit")] == load_cache.counters[("model", "hit")] == 1


def test_a_folder_others_may_write_is_not_used(gguf_path, fresh, cache_on, caplog):
    _load(gguf_path)
    (cache_on / load_cache.file_digest(gguf_path)).chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="tfgen.gguf.load_cache"):
        _assert_same(_load(gguf_path), fresh)
    assert "another user owns it or may write to it" in caplog.text
    assert load_cache.counters[("model", "hit")] == 0


def test_the_cache_off_writes_nothing(gguf_path, fresh, cache_on, monkeypatch):
    monkeypatch.setenv(load_cache.ENABLE_VARIABLE, "0")
    _assert_same(_load(gguf_path), fresh)
    assert not cache_on.exists() and not load_cache.counters


SUMMARY = re.compile(
    r"^tfgen: load \d+\.\d\d s \| compile \+ prompt \d+\.\d\d s \((compiled|program from the XLA cache), tracing "
    r"included\) \| prompt (\d+) tokens \| generated (\d+) tokens( in \d+\.\d\d s, \d+\.\d tokens/s)? \| total "
    r"\d+\.\d\d s$", re.MULTILINE)


@pytest.mark.parametrize("flags", [[], ["--no-stream"]], ids=["streaming", "no-stream"])
def test_verbose_ends_with_the_timings_line(gguf_path, fresh, capsys, flags):
    tokenizer = fresh[0]
    prompt_tokens = np.asarray(tokenizer("Hello world")["input_ids"]).size
    assert main(["generate", "--model", str(gguf_path), "Hello world", "--max-new-tokens", "12", "--greedy", "--raw",
                 "--verbose", *flags]) == 0
    match = SUMMARY.search(capsys.readouterr().err)
    assert match, "no timings line"
    assert match.group(1) == "compiled"  # conftest turns the compile cache off
    assert int(match.group(2)) == prompt_tokens and 1 <= int(match.group(3)) <= 12


def test_without_verbose_there_is_no_timings_line(gguf_path, capsys):
    assert main(["generate", "--model", str(gguf_path), "Hello world", "--max-new-tokens", "3", "--greedy",
                 "--no-stream", "--no-jit"]) == 0
    assert "tfgen: load" not in capsys.readouterr().err
