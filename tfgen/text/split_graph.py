"""Pre-tokenizer splits as TF / TF Text ops (RE2), giving exactly the pieces HF `tokenizers` (Oniguruma) gives.

Two differences between the engines are bridged here:
- RE2's `\\s` is ASCII only; Oniguruma's is Unicode White_Space, written out as `WHITE_SPACE`.
- RE2 has no lookahead. The one the supported regexes use, `\\s+(?!\\S)` (a run of white space, less its last
  character when a non-space follows, so that character can lead the next piece), is replaced by `\\s+$` after
  cutting the text, before that last character, wherever the original regex ends a match there (`_CUTS`: for each
  known regex, the RE2 pattern whose matches start one character before such a cut). Within the pieces between the
  cuts, `\\s+(?!\\S)` and `\\s+$` match the same text; see docs/export.md.
Regexes with other lookarounds, backreferences, atomic groups or possessive quantifiers are refused (`ValueError`
naming the construct), so an exported tokenizer never differs silently.
"""

from __future__ import annotations

import tensorflow as tf

from tfgen.text.split_patterns import BYTE_LEVEL_SPLIT, GPT2_SPLIT, LLAMA3_SPLIT, QWEN2_SPLIT

# Unicode White_Space: Oniguruma's `\s` (RE2's `\s` is [\t\n\f\r ]).
WHITE_SPACE = r"\t\n\v\f\r\x{85}\p{Z}"
_LOOKAHEAD = r"\s+(?!\S)"
# GPT-2: every white-space run of 2+ characters before a non-space gives back its last character. Llama 3 / Qwen2
# first take white space up to its last line break (`\s*[\r\n]+`), so only runs ending in two non-line-break spaces
# do. Each pattern matches the last two spaces and the non-space; the cut falls after its first character.
_SPACE, _NON_SPACE, _BLANK = f"[{WHITE_SPACE}]", f"[^{WHITE_SPACE}]", r"[\t\v\f\x{85}\p{Z}]"
_CUTS = {
    GPT2_SPLIT: _SPACE * 2 + _NON_SPACE,
    BYTE_LEVEL_SPLIT: _SPACE * 2 + _NON_SPACE,
    LLAMA3_SPLIT: _BLANK * 2 + _NON_SPACE,
    QWEN2_SPLIT: _BLANK * 2 + _NON_SPACE,
}
_UNSUPPORTED = {"(?=": "lookahead", "(?!": "lookahead", "(?<": "lookbehind or named group", "(?>": "atomic group",
                "++": "possessive quantifier", "*+": "possessive quantifier", "?+": "possessive quantifier"}
# Oniguruma escapes whose RE2 meaning differs (ASCII-only classes, anchors, backreferences...).
_UNSUPPORTED_ESCAPES = "dDwWbBhHkKRXAzZGg0123456789"


def in_graph_split(pattern: str) -> tuple[str, str | None]:
    """(RE2 pattern, RE2 cut pattern or None) splitting exactly like the Oniguruma `pattern` does as an isolating
    split; `ValueError` naming the construct when there is no exact RE2 form."""
    cut = None
    if _LOOKAHEAD in pattern:
        cut = _CUTS.get(pattern)
        if cut is None:
            raise ValueError(f"the pre-tokenizer regex {pattern!r} uses `\\s+(?!\\S)` (a lookahead, which RE2 lacks) "
                             "in a regex tfgen has no exact RE2 form of")
        pattern = pattern.replace(_LOOKAHEAD, r"\s+$")
    for construct, name in _UNSUPPORTED.items():
        if construct in pattern:
            raise ValueError(f"the pre-tokenizer regex {pattern!r} uses {construct!r} ({name}), which RE2 lacks")
    return _unicode_spaces(pattern), cut


def literal(text: str) -> str:
    """An RE2 pattern matching `text` literally (every character as `\\x{...}`)."""
    return "".join(f"\\x{{{ord(character):x}}}" for character in text)


def _unicode_spaces(pattern: str) -> str:
    """`pattern` with `\\s` / `\\S` spelled as Unicode White_Space, in and out of character classes."""
    out, index, in_class = [], 0, False
    while index < len(pattern):
        character = pattern[index]
        if character == "\\":
            escaped = pattern[index + 1]
            if escaped == "s":
                out.append(WHITE_SPACE if in_class else f"[{WHITE_SPACE}]")
            elif escaped == "S" and not in_class:
                out.append(f"[^{WHITE_SPACE}]")
            elif escaped == "S" or escaped in _UNSUPPORTED_ESCAPES:
                raise ValueError(f"the pre-tokenizer regex {pattern!r} uses \\{escaped}, whose meaning RE2 does not "
                                 "share")
            else:
                out.append(pattern[index:index + 2])
            index += 2
            continue
        if character == "[" and in_class:
            raise ValueError(f"the pre-tokenizer regex {pattern!r} nests character classes, which RE2 lacks")
        in_class = (in_class or character == "[") and not (in_class and character == "]")
        out.append(character)
        index += 1
    return "".join(out)


def split_rows(texts: tf.Tensor, pattern: str, cut: str | None) -> tf.RaggedTensor:
    """string `[N]` -> `[N, (M)]`: each text cut into the matches of `pattern` and the text between them (an
    isolating split), first cut before the characters `cut`'s matches start with (see the module docstring)."""
    import tensorflow_text as tf_text

    if cut is None:
        return tf_text.regex_split(texts, pattern, pattern)
    segments = _cut(texts, cut)
    pieces = tf_text.regex_split(segments.flat_values, pattern, pattern)
    return tf.RaggedTensor.from_row_splits(pieces.values, tf.gather(pieces.row_splits, segments.row_splits))


def _cut(texts: tf.Tensor, cut: str) -> tf.RaggedTensor:
    """string `[N]` -> `[N, (K)]`: each text cut after the first character of every match of `cut`."""
    import tensorflow_text as tf_text

    tokens, begins, _ = tf_text.regex_split_with_offsets(texts, cut, cut)
    matched = tf.ragged.map_flat_values(tf.strings.regex_full_match, tokens, cut)
    first = tf.ragged.map_flat_values(
        lambda t: tf.cast(tf.strings.length(tf.strings.substr(t, 0, 1, unit="UTF8_CHAR")), tf.int64), tokens)
    cuts = tf.ragged.boolean_mask(begins + first, matched)
    ends = tf.cast(tf.strings.length(texts), tf.int64)[:, None]
    starts = tf.concat([tf.zeros_like(ends), cuts], axis=1)
    stops = tf.concat([cuts, ends], axis=1)
    sources = tf.gather(texts, starts.value_rowids())
    return starts.with_flat_values(
        tf.strings.substr(sources, starts.flat_values, stops.flat_values - starts.flat_values))


def replace_rows(rows: tf.RaggedTensor, replaced: tf.Tensor, values: tf.Tensor) -> tf.RaggedTensor:
    """`rows` `[N, (M)]` with row i replaced by `[values[i]]` where bool `replaced[i]`."""
    own = rows.values
    lengths = tf.where(replaced, tf.ones_like(rows.row_lengths()), rows.row_lengths())
    starts = tf.where(replaced, tf.cast(tf.size(own), tf.int64) + tf.range(tf.size(replaced, tf.int64)),
                      rows.row_starts())
    indices = tf.ragged.range(starts, starts + lengths)
    return indices.with_flat_values(tf.gather(tf.concat([own, values], 0), indices.flat_values))
