"""In-graph byte-level BPE tokenizers (`tfgen.text.split_graph`, `tfgen.text.in_graph`): RE2 splits equal HF
`tokenizers`' (Oniguruma) on a varied corpus, ids equal the host tokenizer's (itself equal to HF's, see
tests/test_gguf_tokenizer.py) for SmolLM2's real vocabulary and for the smollm / llama-bpe / qwen2 / gpt-2 / default
pre-tokenizers and for SentencePiece-style BPE with byte fallback (`tfgen.text.sentencepiece_graph`), and `tfgen
export` of a GGUF file with the smollm pre-tokenizer answers `generate_text` like in-process generation; tokenizers
without an exact in-graph form are refused, and the export leaves the text signatures out saying why."""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
import tokenizers
from gguf_files import build_hf_model, byte_level_vocabulary, write_gguf
from tokenizers import pre_tokenizers

from tfgen.auto.tokenizer import AutoTokenizer
from tfgen.text.split_patterns import BYTE_LEVEL_SPLIT, GPT2_SPLIT, LLAMA3_SPLIT, QWEN2_SPLIT

tf = pytest.importorskip("tensorflow")
pytest.importorskip("tensorflow_text")

# Code, scripts and languages, emoji, white-space and digit runs, contractions, special and user-defined tokens.
BASE = [
    "Hello world!! 12345 can't I'M", "def add(a, b):\n    return a + b  # it's, we'll, they're, I'd\n\n",
    "  leading spaces and trailing   ", "\t\ttabs\t \t x", "a  \n  b", "a\n\n b", "a \n\n  b", "!\n\nb", "x!\n \n  y",
    "Café déjà vu — naïve 東京 Zürich", "emoji 🙂🚀 mixed 👩‍👩‍👧 text", "Привет, мир! Как дела?", "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया ६७८", "こんにちは世界。日本語のテキスト", "한국어 텍스트입니다", "Ελληνικά κείμενα",
    "1234567890 3.14159 1,000,000 ١٢٣ ⅫⅣ ½", "IT'S WE'LL THEY'RE I'D 'S 'ſ 'T",
    "nbsp\u00a0here\u00a0\u00a0x thin\u2009sp\u3000ideo", "line\r\nwindows\r\n\r\n",
    "\u000bvt\u000cff\u0085nel\u2028ls",
    "   ", "", "x", " ", "\n", "end   ", "e\u0301 (combining) Å vs Å", "ﬁ ligature ＡＢＣ full width",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text<|im_end|><|im_end|>", "<|im_start|><|im_start|> x", "<tool_call>{\"a\": 1}</tool_call>",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * 2;\n}\n", "SELECT * FROM t WHERE a >= 10 AND b != 'x';",
    "$$$ %%% ^^^ ~~~ |||", "  \t\n  \t\n   x", "a\u3000\u3000b",
    # Bytes without a token of their own in SmolLM2's vocabulary: dropped before merging, as HF's BPE drops them.
    "!\x04!", "x \x04\x13 y", "\U00040000abc",
]
_ALPHABET = list("abcXYZ019 \t\n\r'!?.,-_<>|") + ["\u00a0", "é", "東", "🙂", "٣", "ſ", "\u2009", "<|im_end|>", "'s"]
_RANDOM = random.Random(0)
CORPUS = BASE + ["".join(_RANDOM.choice(_ALPHABET) for _ in range(_RANDOM.randint(1, 24))) for _ in range(160)]
VOCAB = len(byte_level_vocabulary()[0])


@pytest.mark.parametrize("pattern", [GPT2_SPLIT, BYTE_LEVEL_SPLIT, LLAMA3_SPLIT, QWEN2_SPLIT, r"\p{N}",
                                     r"[\p{P}\$\+<=>\^~\|]+"])
def test_re2_splits_equal_oniguruma_splits(pattern):
    from tfgen.text.split_graph import in_graph_split, split_rows

    reference = pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="isolated")
    got = split_rows(tf.constant(CORPUS), *in_graph_split(pattern)).to_list()
    for text, pieces in zip(CORPUS, got):
        assert [piece.decode() for piece in pieces] == [piece for piece, _ in reference.pre_tokenize_str(text)], text


def _file(tmp_path, pre, arch="llama", **options):
    model = build_hf_model(arch, VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1)
    return write_gguf(tmp_path / f"{pre}.gguf", model, arch=arch, pre=pre, **options)


def _assert_ids_equal(tokenizer):
    got = tokenizer.in_graph(tokenizer.vocab_size).tokenize(tf.constant(CORPUS)).to_list()
    for text, ids in zip(CORPUS, got):
        assert ids == tokenizer.encode(text), text


@pytest.mark.parametrize("pre, arch", [("smollm", "llama"), ("llama-bpe", "llama"), ("qwen2", "qwen2"),
                                       ("gpt-2", "llama"), ("default", "llama")])
def test_in_graph_ids_equal_the_host_tokenizer(tmp_path, pre, arch):
    # add_bos from llama.cpp's default: llama-bpe files get bos put before the text (TemplateProcessing).
    tokenizer = AutoTokenizer.from_pretrained(_file(tmp_path, pre, arch, add_bos=None))
    _assert_ids_equal(tokenizer)


def test_smollm2_in_graph_ids_equal_the_host_tokenizer():
    from tfgen.hub.pull import pull

    _assert_ids_equal(AutoTokenizer.from_pretrained(pull("smollm2-135m-instruct")))


@pytest.mark.parametrize("pattern, construct", [
    (r"\s+(?!\S)|\w+", "lookahead"), (r"(?=a)b", "lookahead"), (r"\d+", r"\d"), (r"a++", "possessive"),
])
def test_regexes_without_an_exact_re2_form_are_refused(pattern, construct):
    from tfgen.text.split_graph import in_graph_split

    with pytest.raises(ValueError, match=construct.replace("\\", "\\\\")):
        in_graph_split(pattern)


def test_sentencepiece_in_graph_ids_and_text_equal_the_host_tokenizer(tmp_path):
    # Llama 2 style: score-ranked BPE, byte fallback (the tiny vocabulary lacks most characters), "▁" for spaces, a
    # "▁" after every special token, bos added.
    tokenizer = AutoTokenizer.from_pretrained(_file(tmp_path, None, tokenizer="llama", add_bos=None))
    texts = CORPUS + ["<s>inline</s> special<unk>", "x" * 40]
    in_graph = tokenizer.in_graph(tokenizer.vocab_size)
    for text, ids in zip(texts, in_graph.tokenize(tf.constant(texts)).to_list()):
        assert ids == tokenizer.encode(text), text
    rows = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    # What generate_text's decoding does: special ids dropped, the rest detokenized.
    kept = [[token for token in row if token not in in_graph.special_ids] for row in rows]
    decoded = in_graph.layer.detokenize(tf.ragged.constant(kept, tf.int32)).numpy()
    assert [text.decode() for text in decoded] == tokenizer.batch_decode(rows, skip_special_tokens=True)


def test_a_tokenizer_without_an_in_graph_form_is_refused_and_the_export_leaves_text_out(model_dir, tmp_path,
                                                                                        caplog, monkeypatch):
    import tfgen.export
    from tfgen.cli import main

    tokenizer = AutoTokenizer.from_pretrained(model_dir)  # word-level
    assert "model type 'WordLevel'" in tokenizer.in_graph_problem()
    with pytest.raises(ValueError, match="no exact in-graph form for: model type 'WordLevel'"):
        tokenizer.in_graph(10_000)
    # Asked for by name: refused in one line; by default: exported without it, saying why.
    assert main(["export", "--model", model_dir, str(tmp_path / "named"), "--signatures", "generate_text"]) == 2
    exported = {}
    # Writing every signature takes long; what matters is what the command asks the exporter for.
    monkeypatch.setattr(tfgen.export, "export_saved_model",
                        lambda model, out, **options: exported.update(options) or out)
    with caplog.at_level(logging.WARNING, logger="tfgen"):
        assert main(["export", "--model", model_dir, str(tmp_path / "out")]) == 0
    assert "no generate_text signature" in caplog.text and "WordLevel" in caplog.text
    assert exported["text"] is False and exported["tokenizer"] is not None and exported["signatures"] is None


@pytest.fixture(scope="module")
def smollm_export(tmp_path_factory):
    from tfgen.commands.export import export_model

    folder = tmp_path_factory.mktemp("smollm")
    path = _file(folder, "smollm", add_bos=None)
    export_model(str(path), str(folder / "out"), signatures=["generate_text"], max_new_tokens=6,
                 jit_compile=False)
    return path, tf.saved_model.load(str(folder / "out" / "1"))


def test_exported_generate_text_answers_like_in_process_generation(smollm_export):
    from tfgen.auto.models import AutoModelForCausalLM

    path, loaded = smollm_export
    tokenizer = AutoTokenizer.from_pretrained(path)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "What is 12345 + 678?  Café 🙂"}],
                                         tokenize=False, add_generation_prompt=True)
    texts = [chat, "digits 2024  and   spaces<|im_end|>"]
    tokenized = loaded.signatures["text_tokenize"](text=tf.constant(texts))
    batch = tokenizer(texts)
    np.testing.assert_array_equal(tokenized["input_ids"].numpy(), batch["input_ids"])
    np.testing.assert_array_equal(tokenized["attention_mask"].numpy(), batch["attention_mask"])
    model = AutoModelForCausalLM.from_pretrained(path)
    assert not model.generation_config.do_sample
    sequences = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=6,
                               jit_compile=False).numpy()
    expected = tokenizer.batch_decode(sequences[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    served = loaded.signatures["generate_text"](text=tf.constant(texts))["text"].numpy()
    assert [text.decode() for text in served] == expected
