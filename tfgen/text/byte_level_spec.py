"""What an in-graph byte-level BPE tokenizer needs from a `tokenizer.json`: `ByteLevelSpec`, or a `ValueError` naming
every part that has no exact in-graph form (`tfgen.text.in_graph.BytePairInGraphTokenizer` runs the spec)."""

from __future__ import annotations

import dataclasses

from tfgen.text.split_graph import in_graph_split, literal
from tfgen.text.split_patterns import BYTE_LEVEL_SPLIT
from tfgen.text.token_text import byte_level_alphabet


@dataclasses.dataclass(frozen=True)
class ByteLevelSpec:
    """A byte-level BPE tokenizer, as RE2 patterns and tables.

    Attributes:
        vocabulary: token -> id, added tokens included.
        merges: "left right" merge rules, highest priority first.
        splits: (RE2 pattern, RE2 cut pattern or None) per pre-tokenizer split, applied one after the other
            (`tfgen.text.split_graph.split_rows`).
        added: added tokens (special or not) -> id, matched in the raw text before anything else.
        special_ids: ids of the special added tokens (skipped when decoding).
        nfc: whether text is NFC-normalised before splitting (added tokens are matched before).
        ignore_merges: a piece that is itself in the vocabulary is one token.
        prefix_ids, suffix_ids: ids the post-processor puts before and after the tokens (bos / eos).
    """

    vocabulary: dict[str, int]
    merges: list[str]
    splits: tuple[tuple[str, str | None], ...]
    added: dict[str, int]
    special_ids: tuple[int, ...]
    nfc: bool = False
    ignore_merges: bool = False
    prefix_ids: tuple[int, ...] = ()
    suffix_ids: tuple[int, ...] = ()


def byte_level_spec(definition: dict) -> ByteLevelSpec:
    """The spec of a parsed `tokenizer.json`; `ValueError` listing what has no exact in-graph form."""
    problems: list[str] = []
    model = definition.get("model") or {}
    if model.get("byte_fallback"):
        raise ValueError("SentencePiece-style BPE with byte fallback (Llama 2, Mistral, TinyLlama), which tfgen does "
                         "not build in the graph yet")
    if model.get("type") != "BPE":
        problems.append(f"model type {model.get('type')!r} (BPE only)")
    for option in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(option):
            problems.append(f"BPE {option}")
    nfc = _normalizer(definition.get("normalizer"), problems)
    splits = _pre_tokenizer_splits(definition.get("pre_tokenizer"), problems)
    prefix, suffix = post_processor_ids(definition.get("post_processor"), problems)
    if (definition.get("decoder") or {}).get("type") != "ByteLevel":
        problems.append(f"decoder {(definition.get('decoder') or {}).get('type')!r} (ByteLevel only)")
    added_tokens = definition.get("added_tokens") or []
    for token in added_tokens:
        flags = [flag for flag in ("lstrip", "rstrip", "single_word") if token.get(flag)]
        if nfc and token.get("normalized"):
            flags.append("normalized")
        if flags:
            problems.append(f"added token {token['content']!r} with {', '.join(flags)}")
    if problems:
        raise ValueError("; ".join(problems))
    vocabulary = {**model["vocab"], **{token["content"]: token["id"] for token in added_tokens}}
    return ByteLevelSpec(
        vocabulary=vocabulary,
        merges=[merge if isinstance(merge, str) else " ".join(merge) for merge in model.get("merges", [])],
        splits=tuple(splits), added={token["content"]: token["id"] for token in added_tokens},
        special_ids=tuple(token["id"] for token in added_tokens if token.get("special")), nfc=nfc,
        ignore_merges=bool(model.get("ignore_merges")), prefix_ids=tuple(prefix), suffix_ids=tuple(suffix),
    )


def _normalizer(normalizer: dict | None, problems: list[str]) -> bool:
    """Whether the normalizer is NFC (None: none); anything else is a problem."""
    if normalizer is None:
        return False
    if normalizer.get("type") == "NFC":
        return True
    problems.append(f"normalizer {normalizer.get('type')!r} (none or NFC only)")
    return False


def _pre_tokenizer_splits(pre_tokenizer: dict | None, problems: list[str]) -> list[tuple[str, str | None]]:
    """The RE2 splits of a pre-tokenizer that ends with the ByteLevel mapping (a Sequence of Split / Digits steps)."""
    steps = (pre_tokenizer or {}).get("pretokenizers") if (pre_tokenizer or {}).get("type") == "Sequence" \
        else [pre_tokenizer or {}]
    if not steps or steps[-1].get("type") != "ByteLevel":
        problems.append("pre-tokenizer without a final ByteLevel step")
        return []
    patterns = []
    for step in steps[:-1]:
        kind = step.get("type")
        if kind == "Digits":
            patterns.append(r"\p{N}" if step.get("individual_digits") else r"\p{N}+")
        elif kind == "Split" and step.get("behavior") == "Isolated" and not step.get("invert"):
            pattern = step.get("pattern") or {}
            patterns.append(pattern["Regex"] if "Regex" in pattern else literal(pattern.get("String", "")))
        else:
            problems.append(f"pre-tokenizer step {kind!r} ({step.get('behavior')}) (isolating Split and Digits only)")
    if steps[-1].get("add_prefix_space"):
        problems.append("ByteLevel add_prefix_space")
    if steps[-1].get("use_regex", True):
        patterns.append(BYTE_LEVEL_SPLIT)
    splits = []
    for pattern in patterns:
        try:
            splits.append(in_graph_split(pattern))
        except ValueError as error:
            problems.append(str(error))
    return splits


def post_processor_ids(processor: dict | None, problems: list[str]) -> tuple[list[int], list[int]]:
    """Ids put before and after the tokens of one text: a TemplateProcessing's special tokens around `$A`
    (what has no such form is added to `problems`)."""
    if processor is None or processor.get("type") == "ByteLevel":
        return [], []
    if processor.get("type") == "Sequence":
        prefix, suffix = [], []
        for inner in processor.get("processors", []):
            before, after = post_processor_ids(inner, problems)
            prefix, suffix = prefix + before, after + suffix
        return prefix, suffix
    if processor.get("type") != "TemplateProcessing":
        problems.append(f"post-processor {processor.get('type')!r}")
        return [], []
    prefix, suffix, seen_sequence = [], [], False
    for item in processor.get("single", []):
        if "Sequence" in item:
            seen_sequence = True
        else:
            ids = processor["special_tokens"][item["SpecialToken"]["id"]]["ids"]
            (suffix if seen_sequence else prefix).extend(ids)
    return prefix, suffix


def byte_level_text(token: str) -> bytes | None:
    """The bytes a byte-level token stands for (None when it has a character outside the byte alphabet)."""
    try:
        return bytes(_UNICODE_TO_BYTE[character] for character in token)
    except KeyError:
        return None


_UNICODE_TO_BYTE = byte_level_alphabet()
