"""The tokenizer rebuilt from a GGUF file (tfgen/gguf/tokenizer.py): the same ids as HF's tokenizer built from the
same file where HF follows llama.cpp, llama.cpp's splits per `tokenizer.ggml.pre`, special / added tokens,
bos / eos handling and the `AutoTokenizer.from_pretrained` hook."""

from __future__ import annotations

import gguf
import pytest
from gguf_files import TEXTS, USER_TOKEN, build_hf_model, byte_level_vocabulary, sentencepiece_vocabulary, write_gguf

from tfgen.auto.tokenizer import AutoTokenizer
from tfgen.gguf.files import open_gguf
from tfgen.gguf.tokenizer import PRE_TOKENIZERS, build_backend, byte_level_pre_tokenizer

VOCAB = len(byte_level_vocabulary()[0])
SPM_VOCAB = len(sentencepiece_vocabulary()[0])
STR, BOOL = gguf.GGUFValueType.STRING, gguf.GGUFValueType.BOOL


def _file(tmp_path, arch="llama", name="m.gguf", **options):
    model = build_hf_model(arch, SPM_VOCAB if options.get("tokenizer") == "llama" else VOCAB, hidden_size=32,
                           intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    return write_gguf(tmp_path / name, model, arch=arch, **options)


def _hf_tokenizer(path):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.parametrize("arch, options", [
    # HF's GGUF converter splits every byte-level llama file with GPT-2's regex: llama.cpp's "gpt-2".
    ("llama", dict(pre="gpt-2")),
    # ... and Qwen2 files with Qwen2's regex (after NFC), as llama.cpp's "qwen2" does.
    ("qwen2", dict(pre="qwen2")),
    ("qwen3", dict(pre="qwen2")),
    # SentencePiece: score-ranked merges, byte fallback, "▁" for spaces, a space prefix after special tokens.
    ("llama", dict(tokenizer="llama", pre=None, add_bos=None)),
])
def test_ids_equal_transformers_tokenizer_from_the_same_file(tmp_path, arch, options):
    path = _file(tmp_path, arch, **options)
    ours, theirs = AutoTokenizer.from_pretrained(path), _hf_tokenizer(path)
    texts = TEXTS + ["<s>inline</s> special", "x" * 40, ""] if options.get("tokenizer") == "llama" else TEXTS
    for text in texts:
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == theirs(text, add_special_tokens=False)["input_ids"], text
        if options.get("tokenizer") == "llama" or arch != "llama":
            assert ours.decode(ids) == theirs.decode(ids), text
            assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True), text
        else:
            # HF decodes byte-level llama files with SentencePiece's steps too, dropping a leading space; llama.cpp
            # and tfgen give the text back.
            assert ours.decode(ids) == text
    if options.get("tokenizer") == "llama":  # SentencePiece files add bos unless told otherwise, as HF does
        assert ours.encode("Hello") == theirs("Hello")["input_ids"] and ours.encode("Hello")[0] == 1


def test_byte_level_text_round_trips_and_specials(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(_file(tmp_path, pre="smollm"))
    for text in TEXTS:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<|im_start|>", "<|im_end|>",
                                                                               "<|endoftext|>")
    assert tokenizer.chat_template.startswith("{% for m in messages %}")
    # CONTROL tokens are special (never split, dropped when skipping specials); USER_DEFINED ones are never split
    # but stay in the text.
    ids = tokenizer.encode(f"<|im_start|>call {USER_TOKEN}x", add_special_tokens=False)
    assert ids[0] == 1 and VOCAB - 1 in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == f"call {USER_TOKEN}x"


def test_add_bos_and_eos_tokens(tmp_path):
    eos = {"tokenizer.ggml.add_eos_token": (True, BOOL)}
    tokenizer = AutoTokenizer.from_pretrained(_file(tmp_path, add_bos=True, metadata=eos))
    body = tokenizer.encode("Hello world", add_special_tokens=False)
    assert tokenizer.encode("Hello world") == [1, *body, 2]
    assert tokenizer(["Hello world"], max_length=3, truncation=True)["input_ids"].tolist() == [[1, body[-1], 2]]
    # llama.cpp adds bos by default for Llama 3's pre-tokenizer, not for GPT-2's.
    llama3 = AutoTokenizer.from_pretrained(_file(tmp_path, name="l3.gguf", pre="llama-bpe", add_bos=None))
    assert llama3.encode("a")[0] == 1
    assert AutoTokenizer.from_pretrained(_file(tmp_path, name="g2.gguf", pre="gpt-2", add_bos=None)).encode("a")[0] != 1


# Splits before BPE, per llama.cpp's regexes for each pre-tokenizer (byte-level pieces: "Ġ" is a space).
SPLITS = {
    "gpt-2": ["Hello", "Ġworld", "!!", "Ġ12345", "Ġcan", "'t", "ĠI", "'", "M"],
    "smollm": ["Hello", "Ġworld", "!!", "Ġ", "1", "2", "3", "4", "5", "Ġcan", "'t", "ĠI", "'", "M"],
    "llama-bpe": ["Hello", "Ġworld", "!!", "Ġ", "123", "45", "Ġcan", "'t", "ĠI", "'M"],
    "qwen2": ["Hello", "Ġworld", "!!", "Ġ", "1", "2", "3", "4", "5", "Ġcan", "'t", "ĠI", "'M"],
    "default": ["Hello", "Ġworld", "!!", "Ġ", "123", "45", "Ġcan", "'", "t", "ĠI", "'", "M"],
}


@pytest.mark.parametrize("pre", sorted(SPLITS))
def test_pre_tokenizer_splits_as_llama_cpp(pre):
    pieces = byte_level_pre_tokenizer(PRE_TOKENIZERS[pre]).pre_tokenize_str("Hello world!! 12345 can't I'M")
    assert [piece for piece, _ in pieces] == SPLITS[pre]


def test_every_known_pre_tokenizer_builds():
    for spec in PRE_TOKENIZERS.values():
        assert byte_level_pre_tokenizer(spec).pre_tokenize_str("a 1")


def test_unsupported_tokenizer_metadata(tmp_path):
    cases = [
        ({"tokenizer.ggml.model": ("bert", STR)}, r"tokenizer model 'bert'.*supported: \['gpt2', 'llama'\]"),
        ({"tokenizer.ggml.pre": ("deepseek-coder", STR)}, r"pre-tokenizer 'deepseek-coder'.*supported: \["),
        ({"tokenizer.ggml.merges": (["a b c"], gguf.GGUFValueType.ARRAY)}, "merges entry 'a b c' is not two tokens"),
        ({"tokenizer.ggml.merges": (["zz qq"], gguf.GGUFValueType.ARRAY)}, "does not make a valid tokenizer"),
        ({"tokenizer.ggml.tokens": (["a", "b", "a"] * (VOCAB // 3) + ["c"] * (VOCAB % 3), gguf.GGUFValueType.ARRAY)},
         r"repeats tokens: \['a', 'b'"),
        # An id within the model's vocabulary (llama.vocab_size) but past the tokenizer's tokens.
        ({"llama.vocab_size": (VOCAB + 8, gguf.GGUFValueType.UINT32),
          "tokenizer.ggml.eos_token_id": (VOCAB + 3, gguf.GGUFValueType.UINT32)},
         rf"eos_token_id is {VOCAB + 3}, outside the {VOCAB} tokens of tokenizer.ggml.tokens"),
    ]
    for index, (metadata, match) in enumerate(cases):
        path = _file(tmp_path, name=f"bad{index}.gguf", metadata=metadata)
        with pytest.raises(ValueError, match=match) as raised:
            AutoTokenizer.from_pretrained(path)
        assert f"bad{index}.gguf" in str(raised.value)
    with pytest.raises(OSError, match="absent.gguf"):
        AutoTokenizer.from_pretrained(tmp_path / "absent.gguf")


def test_build_backend_reports_special_tokens(tmp_path):
    backend, special = build_backend(open_gguf(_file(tmp_path, tokenizer="llama", pre=None, add_bos=None)))
    assert special == {"bos_token": "<s>", "eos_token": "</s>", "pad_token": None}
    assert backend.get_vocab_size() == SPM_VOCAB


def test_hub_options_are_refused_with_a_gguf_file(tmp_path):
    """A GGUF file is read from its local path: Hub options could not act on it, so they are refused, not ignored;
    `local_files_only` (a GGUF file never touches the network) is honoured whatever its value."""
    path = _file(tmp_path)
    for option, value in (("revision", "v2"), ("cache_dir", tmp_path), ("token", "hf_x")):
        with pytest.raises(ValueError, match=rf"{option} is a Hub option.*m.gguf"):
            AutoTokenizer.from_pretrained(path, **{option: value})
    with pytest.raises(ValueError, match=r"revision, token are Hub options"):
        AutoTokenizer.from_pretrained(tmp_path / "absent.gguf", revision="main", token=False)
    assert AutoTokenizer.from_pretrained(path, local_files_only=True).vocab_size == VOCAB


def test_tokenizer_of_hf_files_points_a_gguf_file_to_auto_tokenizer(tmp_path, monkeypatch):
    """`Tokenizer` reads HF tokenizer files only: given a file, it says which loader takes it, without asking the
    Hub about a local path."""
    import huggingface_hub

    from tfgen.text.tokenizer import Tokenizer

    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda **options: pytest.fail("asked the Hub"))
    path = _file(tmp_path)
    with pytest.raises(OSError, match=r"m\.gguf' is a file.*tfgen\.AutoTokenizer\.from_pretrained"):
        Tokenizer.from_pretrained(path)
    assert AutoTokenizer.from_pretrained(path).vocab_size == VOCAB
