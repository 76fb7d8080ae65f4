"""The tokenizer stored in a GGUF file, rebuilt as a `tokenizers.Tokenizer` and a `tfgen.Tokenizer`.

Two of llama.cpp's tokenizer models are rebuilt:
- `gpt2`: byte-level BPE from `tokenizer.ggml.tokens` and `tokenizer.ggml.merges`, split before BPE the way llama.cpp
  does for the file's `tokenizer.ggml.pre` (see `PRE_TOKENIZERS`);
- `llama`: SentencePiece BPE from the tokens and their `tokenizer.ggml.scores` (merge order = score order), with
  byte fallback and SentencePiece's space handling (spaces become "▁", and one is prepended to the text and after
  every special token unless `tokenizer.ggml.add_space_prefix` is false), as HF does for Llama-2 / TinyLlama files.

Tokens typed CONTROL or UNKNOWN in `tokenizer.ggml.token_type` become special added tokens (never split, dropped
by `skip_special_tokens`), USER_DEFINED ones plain added tokens (never split, kept when decoding): llama.cpp matches
both kinds in the raw text before tokenizing. The bos / eos / pad ids, `add_bos_token` / `add_eos_token` (as a
post-processor) and `tokenizer.chat_template` come from the file too.
"""

from __future__ import annotations

import collections
import dataclasses
import os

import tokenizers
from tokenizers import decoders, normalizers, pre_tokenizers, processors

from tfgen.gguf import load_cache
from tfgen.gguf.config import context_length, token_ids
from tfgen.gguf.files import GGUFFile, open_gguf
from tfgen.text.split_patterns import GPT2_SPLIT, LLAMA3_SPLIT, QWEN2_SPLIT
from tfgen.text.tokenizer import Tokenizer

# gguf's TokenType values.
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED = 1, 2, 3, 4
SUPPORTED_TOKENIZER_MODELS = ("gpt2", "llama")


@dataclasses.dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp splits text before byte-level BPE for one `tokenizer.ggml.pre` value.

    Attributes:
        splits: regular expressions applied one after the other, each cutting every piece of the previous one into
            its matches and the text between them.
        ignore_merges: a piece that is itself in the vocabulary is one token, whatever the merges say (Llama 3).
        nfc: text is NFC-normalised first (Qwen2's tokenizer.json does; llama.cpp does not, HF does).
        add_bos: whether llama.cpp adds bos when the file has no `tokenizer.ggml.add_bos_token`.
    """

    splits: tuple[str, ...]
    ignore_merges: bool = False
    nfc: bool = False
    add_bos: bool = False


_SMOLLM = PreTokenizer((r"\p{N}", GPT2_SPLIT))
_LLAMA3 = PreTokenizer((LLAMA3_SPLIT,), ignore_merges=True, add_bos=True)
_GPT2 = PreTokenizer((GPT2_SPLIT,))
# tokenizer.ggml.pre -> its pre-tokenizer, with llama.cpp's aliases (llama-vocab.cpp) for the same splits.
PRE_TOKENIZERS = {
    # llama.cpp's fallback, also used when a file has no tokenizer.ggml.pre: punctuation runs first.
    "default": PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", GPT2_SPLIT, r"\p{N}+", r"[0-9][0-9][0-9]")),
    "gpt-2": _GPT2, "phi-2": _GPT2, "mpt": _GPT2, "olmo": _GPT2,
    "llama-bpe": _LLAMA3, "llama3": _LLAMA3, "llama-v3": _LLAMA3, "dbrx": _LLAMA3, "smaug-bpe": _LLAMA3,
    "qwen2": PreTokenizer((QWEN2_SPLIT,), nfc=True),
    "smollm": _SMOLLM, "starcoder": _SMOLLM, "refact": _SMOLLM, "codeshell": _SMOLLM, "command-r": _SMOLLM,
}


def load_gguf_tokenizer(path: str | os.PathLike, *, padding_side: str = "left") -> Tokenizer:
    """The `tfgen.Tokenizer` of a GGUF file: its vocabulary, special tokens and chat template. `OSError` naming the
    file when it cannot be read, `ValueError` naming it for an unsupported tokenizer model or pre-tokenizer or
    inconsistent tokenizer metadata. What it builds is kept in the GGUF load cache (`tfgen.gguf.load_cache`), so a
    later load of the same file skips parsing it."""
    digest = load_cache.file_digest(path) if load_cache.enabled() else None
    cached = None if digest is None else load_cache.read_part(digest, "tokenizer")
    if cached is not None:
        data, payload = cached
        backend = tokenizers.Tokenizer.from_str(payload.decode("utf-8"))
    else:
        file = open_gguf(path)
        backend, special_tokens = build_backend(file)
        data = {"special_tokens": special_tokens, "chat_template": file.string("tokenizer.chat_template", None),
                "context_length": context_length(file)}
        if digest is not None:
            load_cache.write_part(digest, "tokenizer", data, backend.to_str().encode("utf-8"))
    tokenizer = Tokenizer(backend, padding_side=padding_side, chat_template=data["chat_template"],
                          **data["special_tokens"])
    tokenizer.chat_template_origin = f"{os.fspath(path)} GGUF metadata tokenizer.chat_template"
    tokenizer.context_length = data["context_length"]
    return tokenizer


def build_backend(file: GGUFFile) -> tuple[tokenizers.Tokenizer, dict[str, str | None]]:
    """The file's tokenizer as a `tokenizers.Tokenizer`, and its `{"bos_token", "eos_token", "pad_token"}` strings."""
    model = file.string("tokenizer.ggml.model")
    if model not in SUPPORTED_TOKENIZER_MODELS:
        raise file.error(f"tokenizer model {model!r} (tokenizer.ggml.model) is not supported; supported: "
                         f"{list(SUPPORTED_TOKENIZER_MODELS)}")
    tokens = file.array("tokenizer.ggml.tokens", str)
    types = file.array("tokenizer.ggml.token_type", int, None)
    if types is not None and len(types) != len(tokens):
        raise file.error(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    types = types or [_NORMAL] * len(tokens)
    vocab = {token: token_id for token_id, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        repeated = sorted(token for token, count in collections.Counter(tokens).items() if count > 1)
        raise file.error(f"tokenizer.ggml.tokens repeats tokens: {repeated[:5]}")
    ids = token_ids(file)  # checked against the model's vocabulary, which may be longer than the tokenizer's
    for name, token_id in ids.items():
        if token_id >= len(tokens):
            raise file.error(f"tokenizer.ggml.{name}_token_id is {token_id}, outside the {len(tokens)} tokens of "
                             f"tokenizer.ggml.tokens")
    if model == "gpt2":
        backend, default_add_bos = _byte_level_backend(file, vocab)
    else:
        backend, default_add_bos = _sentencepiece_backend(file, tokens, types, ids), True
    backend.add_special_tokens([tokenizers.AddedToken(token, special=True, normalized=False)
                                for token, kind in zip(tokens, types) if kind in (_CONTROL, _UNKNOWN)])
    backend.add_tokens([tokenizers.AddedToken(token, special=False, normalized=False)
                        for token, kind in zip(tokens, types) if kind == _USER_DEFINED])
    add_bos = file.boolean("tokenizer.ggml.add_bos_token", default_add_bos)
    add_eos = file.boolean("tokenizer.ggml.add_eos_token", False)
    for name, wanted in (("bos", add_bos), ("eos", add_eos)):
        if wanted and name not in ids:
            raise file.error(f"tokenizer.ggml.add_{name}_token is true but tokenizer.ggml.{name}_token_id is missing")
    backend.post_processor = _special_token_template(
        tokens[ids["bos"]] if add_bos else None, ids.get("bos"), tokens[ids["eos"]] if add_eos else None, ids.get("eos")
    )
    special_tokens = {f"{name}_token": tokens[ids[key]] if key in ids else None
                      for name, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"))}
    return backend, special_tokens


def _byte_level_backend(file: GGUFFile, vocab: dict[str, int]) -> tuple[tokenizers.Tokenizer, bool]:
    """Byte-level BPE with the file's merges and pre-tokenizer; also llama.cpp's default for adding bos."""
    pre_name = file.string("tokenizer.ggml.pre", "default")
    spec = PRE_TOKENIZERS.get(pre_name)
    if spec is None:
        raise file.error(f"pre-tokenizer {pre_name!r} (tokenizer.ggml.pre) is not supported; supported: "
                         f"{sorted(PRE_TOKENIZERS)}")
    merges = []
    for merge in file.array("tokenizer.ggml.merges", str):
        pair = merge.split(" ")
        if len(pair) != 2:
            raise file.error(f"tokenizer.ggml.merges entry {merge!r} is not two tokens separated by a space")
        merges.append((pair[0], pair[1]))
    backend = _tokenizer_of(file, tokenizers.models.BPE, vocab=vocab, merges=merges, ignore_merges=spec.ignore_merges)
    if spec.nfc:
        backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = byte_level_pre_tokenizer(spec)
    backend.decoder = decoders.ByteLevel()
    return backend, spec.add_bos


def byte_level_pre_tokenizer(spec: PreTokenizer) -> pre_tokenizers.PreTokenizer:
    """`spec`'s splits, each isolating its matches within the pieces of the previous one, then the byte-level
    mapping of every piece."""
    steps = [pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="isolated") for pattern in spec.splits[:-1]]
    if spec.splits[-1] == GPT2_SPLIT:
        # tokenizers' own byte-level split is GPT-2's (plus a `\s+` alternative, which only matches text that an
        # isolating split keeps as its own piece anyway). Using it keeps the tokenizer exportable in-graph.
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps += [pre_tokenizers.Split(tokenizers.Regex(spec.splits[-1]), behavior="isolated"),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    return steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)


def _sentencepiece_backend(file: GGUFFile, tokens: list[str], types: list[int], ids: dict[str, int]):
    """SentencePiece BPE: merges ranked by the score of the piece they make, byte fallback, "▁" for spaces."""
    scores = file.array("tokenizer.ggml.scores", float)
    if len(scores) != len(tokens):
        raise file.error(f"tokenizer.ggml.scores has {len(scores)} entries for {len(tokens)} tokens")
    if file.boolean("tokenizer.ggml.remove_extra_whitespaces", False):
        raise file.error("tokenizer.ggml.remove_extra_whitespaces=true (SentencePiece whitespace folding) is not "
                         "supported")
    backend = _tokenizer_of(
        file, tokenizers.models.BPE, vocab={token: i for i, token in enumerate(tokens)},
        merges=merges_from_scores(tokens, scores, types), byte_fallback=True, fuse_unk=True,
        unk_token=tokens[ids["unknown"]] if "unknown" in ids else None,
    )
    add_space_prefix = file.boolean("tokenizer.ggml.add_space_prefix", True)
    spaces = [normalizers.Replace(" ", "\u2581")]
    backend.normalizer = normalizers.Sequence(([normalizers.Prepend("\u2581")] if add_space_prefix else []) + spaces)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if add_space_prefix else []))
    return backend


def merges_from_scores(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """BPE merges equivalent to SentencePiece's BPE encoding, which repeatedly joins the adjacent pair making the
    highest-scoring vocabulary piece: every split of a NORMAL piece into two NORMAL pieces, ranked by the score of
    the piece (higher first; equal scores by lower id, then by split position)."""
    pieces = {token: token_id for token_id, token in enumerate(tokens) if types[token_id] == _NORMAL}
    ranked = []
    for token, token_id in pieces.items():
        for cut in range(1, len(token)):
            if token[:cut] in pieces and token[cut:] in pieces:
                ranked.append((-scores[token_id], token_id, cut))
    ranked.sort()
    return [(tokens[token_id][:cut], tokens[token_id][cut:]) for _, token_id, cut in ranked]


def _tokenizer_of(file: GGUFFile, model_class, **options) -> tokenizers.Tokenizer:
    try:
        return tokenizers.Tokenizer(model_class(**options))
    # The Rust side raises a plain Exception (e.g. a merge naming a token missing from the vocabulary).
    except Exception as error:  # noqa: BLE001 (see above)
        raise file.error(f"the tokenizer metadata does not make a valid tokenizer: {error}") from None


def _special_token_template(bos: str | None, bos_id: int | None, eos: str | None, eos_id: int | None):
    """A post-processor adding `bos` before and `eos` after each sequence (None: not added), or None if neither."""
    if bos is None and eos is None:
        return None

    def sequence(name: str, type_id: int) -> str:
        return " ".join(part for part in (bos and f"{bos}:{type_id}", f"${name}:{type_id}", eos and f"{eos}:{type_id}")
                        if part)
    special = {token: token_id for token, token_id in ((bos, bos_id), (eos, eos_id)) if token is not None}
    return processors.TemplateProcessing(
        single=sequence("A", 0), pair=f"{sequence('A', 0)} {sequence('B', 1)}", special_tokens=list(special.items())
    )
