"""SentencePiece-style BPE with byte fallback (Llama 2, Mistral, TinyLlama GGUF files) as TF ops: TF Text's
`SentencepieceTokenizer` over a SentencePiece model written from the `tokenizer.json` (pieces, their types and
scores that rank them as the BPE merges do, byte fallback, the "▁" space handling), after added tokens are matched
in the text, as HF does (each piece between them gets the "▁" prefix, as HF's per-piece normaliser gives it)."""

from __future__ import annotations

import re
import struct

import numpy as np
import tensorflow as tf

from tfgen.text.byte_level_spec import post_processor_ids
from tfgen.text.in_graph import InGraphTokenizer

# SentencePiece's piece types and BPE model type (sentencepiece_model.proto).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _BYTE, _BPE = 1, 2, 3, 4, 6, 2
_DECODER = [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}]


def sentencepiece_problem(definition: dict) -> str | None:
    """Why a byte-fallback BPE `tokenizer.json` has no SentencePiece form here, or None."""
    model = definition.get("model") or {}
    steps = (definition.get("normalizer") or {}).get("normalizers") or []
    prefix = steps[:1] == [{"type": "Prepend", "prepend": "\u2581"}]
    space = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    decoder = _DECODER + ([{"type": "Strip", "content": " ", "start": 1, "stop": 0}] if prefix else [])
    problems = [
        "model" if model.get("type") != "BPE" or model.get("dropout") or model.get("ignore_merges") else "",
        "normalizer" if steps[int(prefix):] != [space] else "",
        "pre-tokenizer" if definition.get("pre_tokenizer") is not None else "",
        "decoder" if (definition.get("decoder") or {}).get("decoders") != decoder else "",
        "added tokens" if any(token.get(flag) for token in definition.get("added_tokens") or []
                              for flag in ("lstrip", "rstrip", "single_word")) else "",
    ]
    problems = [problem for problem in problems if problem]
    return None if not problems else f"SentencePiece-style BPE with a {', '.join(problems)} unlike Llama's"


def sentencepiece_model(definition: dict) -> bytes:
    """A serialized SentencePiece `ModelProto` with the ids and merge order of a byte-fallback BPE tokenizer.json."""
    model = definition["model"]
    added = {token["content"]: token for token in definition.get("added_tokens") or []}
    scores: dict[str, float] = {}
    for rank, merge in enumerate(model.get("merges", [])):
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        scores.setdefault(left + right, -float(rank))  # SentencePiece merges the highest-scoring piece first
    pieces = b""
    for token, token_id in sorted(model["vocab"].items(), key=lambda item: item[1]):
        if token in added:
            kind = _UNKNOWN if token == model.get("unk_token") else _CONTROL if added[token].get("special") \
                else _USER_DEFINED
        else:
            kind = _BYTE if re.fullmatch(r"<0x[0-9A-F]{2}>", token) else _NORMAL
        score = scores.get(token, -float(len(scores) + token_id))
        pieces += _field(1, _field(1, token.encode("utf-8")) + _field(2, score) + _field(3, kind))
    unk_id = model["vocab"].get(model.get("unk_token"), 0)
    trainer = _field(3, _BPE) + _field(35, 1) + _field(40, unk_id) + _field(41, -1) + _field(42, -1) + _field(43, -1)
    normalizer = _field(1, b"identity") + _field(3, int(sentencepiece_model_prefix(definition))) + _field(4, 0) \
        + _field(5, 1)
    return pieces + _field(2, trainer) + _field(3, normalizer)


def sentencepiece_model_prefix(definition: dict) -> bool:
    """Whether the tokenizer puts "▁" before the text (SentencePiece's dummy prefix; the decoder strips a space)."""
    return (definition["normalizer"]["normalizers"][0].get("type") == "Prepend")


class _SentencePieceLayer(tf.Module):
    """TF Text's SentencepieceTokenizer for ids, and HF's decoding of them (each piece's text, "▁" as a space, byte
    pieces as their byte, one leading space stripped after a dummy prefix): SentencePiece's own strips them all.
    Unlike HF, a run of byte pieces that is not valid UTF-8 keeps its valid bytes (`InGraphTokenizer.decode`
    replaces only the invalid ones with U+FFFD; HF replaces the run's every byte)."""

    def __init__(self, sentencepiece, vocabulary: dict[str, int], strip: bool):
        super().__init__()
        self.sentencepiece = sentencepiece
        texts = [bytes([int(token[3:5], 16)]) if re.fullmatch(r"<0x[0-9A-F]{2}>", token)
                 else token.replace("\u2581", " ").encode("utf-8") for token in vocabulary]
        self.pieces = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            tf.constant(list(vocabulary.values()), tf.int32), tf.constant(texts, tf.string)), "")
        self.strip = strip

    def tokenize(self, texts: tf.Tensor) -> tf.RaggedTensor:
        return self.sentencepiece.tokenize(texts)

    def detokenize(self, ids: tf.RaggedTensor) -> tf.Tensor:
        """string `[B]` of int32 ids `[B, (T)]`."""
        text = tf.strings.reduce_join(tf.ragged.map_flat_values(self.pieces.lookup, ids), axis=-1)
        return tf.strings.regex_replace(text, "^ ", "", replace_global=False) if self.strip else text


def _field(number: int, value) -> bytes:
    """One protobuf field: bytes (length-delimited), float (fixed32) or int (varint)."""
    if isinstance(value, bytes):
        return _varint(number << 3 | 2) + _varint(len(value)) + value
    if isinstance(value, float):
        return _varint(number << 3 | 5) + struct.pack("<f", value)
    return _varint(number << 3) + _varint(value)


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative ints as protobuf writes them: ten bytes of two's complement
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


class SentencePieceInGraphTokenizer(InGraphTokenizer):
    """A byte-fallback BPE `tfgen.Tokenizer` (Llama 2 style) as TF Text's SentencepieceTokenizer."""

    def __init__(self, tokenizer, definition: dict, vocab_size: int):
        import tensorflow_text as tf_text

        problem = sentencepiece_problem(definition)
        if problem is not None:
            raise ValueError(f"tokenizer: generate_text has no exact in-graph form for: {problem}. Export without "
                             "generate_text (tfgen export --no-text) and tokenize on the client.")
        vocabulary = definition["model"]["vocab"]
        if max(vocabulary.values()) >= vocab_size:
            raise ValueError(f"tokenizer: its ids go up to {max(vocabulary.values())}, the model has {vocab_size}")
        self.layer = _SentencePieceLayer(
            tf_text.SentencepieceTokenizer(model=sentencepiece_model(definition), out_type=tf.int32), vocabulary,
            strip=bool(sentencepiece_model_prefix(definition)))
        self._added_token_table({token["content"]: token["id"] for token in definition.get("added_tokens") or []})
        problems: list[str] = []
        self.prefix_ids, self.suffix_ids = post_processor_ids(definition.get("post_processor"), problems)
        if problems:
            raise ValueError(f"tokenizer: generate_text has no exact in-graph form for: {'; '.join(problems)}")
        special = [token["id"] for token in definition.get("added_tokens") or [] if token.get("special")]
        self.special_ids = np.array(special or [-1], np.int32)
        self.pad_token_id = tokenizer.pad_token_id or 0

    def tokenize(self, text: tf.Tensor) -> tf.RaggedTensor:
        """int32 ids `[B, (T)]` of string `[B]` text: added tokens, SentencePiece on the text between them, and the
        post-processor's ids around."""
        return self._around_added_tokens(text, self.layer.tokenize)
