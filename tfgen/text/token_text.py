"""What text each token id adds in the middle of generated text: its characters (`token_clean_texts`, what stop
strings are matched over) and its bytes (`token_bytes`, what a structured-output automaton is built over).

A constraint on the output text (a regex) becomes a constraint on token ids only once every id's bytes are
known. Byte-level BPE tokenizers (GPT-2, SmolLM2, Llama 3, Qwen) spell bytes with GPT-2's printable characters;
SentencePiece-style ones (Llama 2, Mistral) write a space as "▁" and odd bytes as `<0xAB>` pieces. Special and
added tokens are left out: they are control tokens, not text, and an eos is allowed by the automaton's accepting
states instead.
"""

from __future__ import annotations

import json
import re

import numpy as np

# Text decoded in front of every token so that the token's own text is what it adds in context (leading spaces,
# byte-level pieces); the same prefix as transformers, so the clean texts, and so the stop-string tables, agree with it.
_CONTEXT_PREFIX = "abcdef"
_SENTENCEPIECE_SPACE = "▁"
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable character for each byte, inverted: {character: byte}."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    characters = {byte: byte for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in characters:
            characters[byte] = 256 + shifted
            shifted += 1
    return {chr(code): byte for byte, code in characters.items()}


def _decoder_types(decoder: dict | None) -> set[str]:
    """The `type` of a tokenizer.json decoder and of every decoder inside a `Sequence`."""
    if not decoder:
        return set()
    types = {decoder.get("type")}
    for inner in decoder.get("decoders") or ():
        types |= _decoder_types(inner)
    return types


def token_bytes(tokenizer) -> dict[int, bytes]:
    """{token id: the bytes it adds to the text} for every id of `tokenizer` that spells text (special and added
    tokens left out).

    `tokenizer` is a `tfgen.Tokenizer` (read through its `tokenizers` backend), or any tokenizer without one (a
    keras-hub one: `backend_tokenizer` None): each id is then decoded after a fixed prefix, and ids whose text is not
    whole characters (parts of a multi-byte character) are left out, so the automaton never uses them.
    """
    backend = tokenizer.backend_tokenizer
    if backend is None:
        return _decoded_token_bytes(tokenizer)
    decoder_types = _decoder_types(json.loads(backend.to_str()).get("decoder"))
    control_ids = set(backend.get_added_tokens_decoder())
    alphabet = byte_level_alphabet() if "ByteLevel" in decoder_types else None
    spelled = {}
    for piece, token_id in backend.get_vocab(with_added_tokens=False).items():
        if token_id in control_ids:
            continue
        if alphabet is not None:
            if all(character in alphabet for character in piece):
                spelled[token_id] = bytes(alphabet[character] for character in piece)
            continue
        byte_piece = _BYTE_PIECE.fullmatch(piece) if "ByteFallback" in decoder_types else None
        if byte_piece:
            spelled[token_id] = bytes([int(byte_piece.group(1), 16)])
        else:
            # SentencePiece's leading-space convention (a decoder that strips the very first space still writes it
            # in the middle of the text, which is where generated tokens go).
            spelled[token_id] = piece.replace(_SENTENCEPIECE_SPACE, " ").encode("utf-8")
    return {token_id: text for token_id, text in spelled.items() if text}


def _decoded_token_bytes(tokenizer) -> dict[int, bytes]:
    """`token_bytes` of a tokenizer known only by its decoding (see there)."""
    texts = token_clean_texts(tokenizer)
    special = {getattr(tokenizer, name, None) for name in ("bos_token_id", "eos_token_id", "pad_token_id")}
    return {
        token_id: text.encode("utf-8")
        for token_id, text in enumerate(texts)
        if text and "\ufffd" not in text and token_id not in special
    }


def token_clean_texts(tokenizer) -> tuple[str, ...]:
    """The text each id `0 .. tokenizer.vocab_size - 1` adds when decoded after other text (uncached).

    Decoding a token alone can drop or add a leading space, or mangle byte-level pieces; decoding it after a fixed
    prefix and cutting the prefix's text off gives what it contributes in the middle of generated text.
    """
    prefix_ids = tokenizer.encode(_CONTEXT_PREFIX, add_special_tokens=False)
    # One [prefix..., id] row per id, as a 2-D array: batch_decode converts numpy rows faster than lists.
    rows = np.empty((tokenizer.vocab_size, len(prefix_ids) + 1), np.int64)
    rows[:, :-1], rows[:, -1] = prefix_ids, np.arange(len(rows))
    texts = tokenizer.batch_decode(rows)
    if any(_CONTEXT_PREFIX not in text for text in texts):
        # A tokenizer that cannot spell the prefix (a word-level vocabulary without it, say) joins tokens with
        # its decoder's separator: a token's text is then its own decoding. (HF raises for such tokenizers.)
        return tuple(tokenizer.batch_decode(np.arange(len(rows))[:, None]))
    return tuple(text[text.find(_CONTEXT_PREFIX) + len(_CONTEXT_PREFIX):] for text in texts)
