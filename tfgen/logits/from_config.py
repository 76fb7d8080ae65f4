"""Reading a `GenerationConfig` into the processor pipeline: its static `ProcessorSpec` and its run-time knobs.

Which processors run follows HF transformers 4.55.4's `GenerationMixin._get_logits_processor`; options HF would
reject when it builds a processor are rejected here (ValueError) before anything is compiled. Everything here is
plain Python and numpy: the knob arrays are fed to the compiled program, which never sees the config.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from tfgen.config.knobs import KNOBS, padded_token_ids
from tfgen.logits.processors import ProcessorSpec
from tfgen.structured.automaton import structured_option
from tfgen.value_types import is_integer, is_real

# The smallest static top-k candidate count (a power of two); see `ProcessorSpec.top_k_cap`.
_MIN_TOP_K_CAP = 64

def _option(config, name: str) -> Any:
    """The config's attribute `name`, None when it has none (a config may be any object with HF's names)."""
    return getattr(config, name, None)


def _token_ids(value, name: str, vocab_size: int) -> tuple[int, ...]:
    """An int / list of ints / None as a tuple of ids, each checked to be in [0, vocab_size)."""
    if value is None:
        return ()
    ids = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if any(not is_integer(i) or not 0 <= i < vocab_size for i in ids):
        raise ValueError(f"{name} must hold token ids in [0, {vocab_size}), got {value!r}")
    return tuple(int(i) for i in ids)


def _positive_int(value, name: str) -> int:
    if not is_integer(value) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _token_sequences(value, name: str, vocab_size: int) -> list[tuple[int, ...]]:
    """A list of non-empty token-id lists as a de-duplicated list of tuples (first occurrence order)."""
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{name} must be a non-empty list of lists of token ids, got {value!r}")
    sequences = []
    for sequence in value:
        if not isinstance(sequence, (list, tuple)) or not sequence:
            raise ValueError(f"{name} must be a non-empty list of non-empty lists of token ids, got {value!r}")
        sequences.append(_token_ids(list(sequence), name, vocab_size))
    return list(dict.fromkeys(sequences))


def _sequence_bias_items(value, vocab_size: int) -> dict[tuple[int, ...], float]:
    """HF's two `sequence_bias` forms ({(ids...): bias} or [[ids, bias], ...]) as {ids: bias}; later wins."""
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        pairs = [tuple(pair) for pair in value]
    else:
        raise ValueError(f"sequence_bias must be a dict {{(ids...): bias}} or a list of [ids, bias], got {value!r}")
    if not pairs:
        raise ValueError("sequence_bias must not be empty")
    items = {}
    for sequence, bias in pairs:
        if not isinstance(sequence, (list, tuple)) or not sequence:
            raise ValueError(f"sequence_bias keys must be non-empty token-id sequences, got {sequence!r}")
        if not is_real(bias) or math.isnan(bias):
            raise ValueError(f"sequence_bias: the bias of {tuple(sequence)} must be a number (not NaN), got {bias!r}")
        items[_token_ids(list(sequence), "sequence_bias", vocab_size)] = float(bias)
    return items


_WARPERS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")
# Processors present in every program, and warpers present in every sampling program, with neutral knob values
# when the config leaves them off: a server switches them per request, which must never select a new program.
# Their neutral values leave the scores bit for bit as they were (x / 1.0, x * 1.0, no token dropped).
_ALWAYS_ON = ("repetition_penalty",)
_ALWAYS_ON_WHEN_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "typical_p")

# name: when HF builds the processor (the valid values are the knob schema's, `tfgen.config.knobs`).
_FLOAT_OPTIONS: dict[str, Callable[[float], bool]] = {
    "repetition_penalty": lambda v: v != 1.0,
    "encoder_repetition_penalty": lambda v: v != 1.0,
    "temperature": lambda v: v != 1.0,
    "top_p": lambda v: v < 1.0,
    "min_p": lambda v: True,
    "typical_p": lambda v: v < 1.0,
    "epsilon_cutoff": lambda v: 0 < v < 1,
    "eta_cutoff": lambda v: 0 < v < 1,
}


def _active_options(config, vocab_size: int) -> dict[str, Any]:
    """Each supported option's validated value when HF's `_get_logits_processor` would build its processor
    (ignoring `do_sample`, which only gates the warpers), else None. Like HF, warper values are only
    validated with `do_sample`."""
    do_sample = bool(_option(config, "do_sample"))
    eos = _token_ids(_option(config, "eos_token_id"), "eos_token_id", vocab_size)
    active: dict[str, Any] = {"eos_token_id": eos}

    for name, builds in _FLOAT_OPTIONS.items():
        value = _option(config, name)
        active[name] = None if value is None or not builds(value) else float(value)
        if active[name] is not None and (do_sample or name not in _WARPERS) and not KNOBS[name].is_valid(value):
            raise ValueError(f"{name} must be {KNOBS[name].requirement}, got {value!r}")
    for name in ("no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "min_length", "min_new_tokens", "top_k"):
        value = _option(config, name)
        builds = value is not None and (value != 0 if name == "top_k" else value > 0)
        if name in ("min_length", "min_new_tokens"):
            builds = builds and bool(eos)
        checked = do_sample or name not in _WARPERS
        active[name] = (_positive_int(value, name) if checked else int(value)) if builds else None
    for name in ("forced_eos_token_id", "suppress_tokens", "begin_suppress_tokens"):
        value = _option(config, name)
        active[name] = None if value is None else _token_ids(value, name, vocab_size)
    forced_bos = _option(config, "forced_bos_token_id")
    active["forced_bos_token_id"] = (
        None if forced_bos is None else _token_ids([forced_bos], "forced_bos_token_id", vocab_size)[0]
    )
    for name in ("remove_invalid_values", "renormalize_logits"):
        active[name] = True if _option(config, name) is True else None

    bias = _option(config, "sequence_bias")
    active["sequence_bias"] = None if bias is None else _sequence_bias_items(bias, vocab_size)
    bad_words = _option(config, "bad_words_ids")
    if bad_words is not None:
        # HF drops bans of a lone eos token (they would keep a row from ever finishing).
        eos_alone = {(token,) for token in eos}
        bad_words = tuple(s for s in _token_sequences(bad_words, "bad_words_ids", vocab_size) if s not in eos_alone)
        if not bad_words:
            raise ValueError("bad_words_ids only bans eos tokens, which are never banned: nothing is left")
    active["bad_words_ids"] = bad_words
    decay = _option(config, "exponential_decay_length_penalty")
    if decay is not None:
        if not isinstance(decay, (list, tuple)) or len(decay) != 2:
            raise ValueError(f"exponential_decay_length_penalty must be (start_index, decay_factor), got {decay!r}")
        if not eos:
            raise ValueError("exponential_decay_length_penalty needs an eos_token_id")
        start, factor = decay
        if not is_integer(start) or not 0 <= start < 2**31:
            raise ValueError(f"exponential_decay_length_penalty: start_index must be an integer in [0, 2**31), "
                             f"got {start!r}")
        if not is_real(factor) or not (
            math.isfinite(factor) and factor > 0
        ):
            raise ValueError(f"exponential_decay_length_penalty: decay_factor must be a finite number > 0, "
                             f"got {factor!r}")
        decay = (int(start), float(factor))
    active["exponential_decay_length_penalty"] = decay
    return active


def processor_spec_from_config(config, vocab_size: int, *, num_beams: int = 1) -> ProcessorSpec:
    """The static processor pipeline HF 4.55.4's `_get_logits_processor` builds for `config` (HF attribute
    names; `eos_token_id` int, list or None). Warpers only with `do_sample`; beam sampling sets HF's
    min_tokens_to_keep (number of eos ids + 1). Raises ValueError for unsupported options or invalid values."""
    active = _active_options(config, vocab_size)
    do_sample = bool(_option(config, "do_sample"))
    def is_on(name):
        if name in _ALWAYS_ON or (do_sample and name in _ALWAYS_ON_WHEN_SAMPLING):
            return True
        return active[name] is not None and (do_sample or name not in _WARPERS)

    min_tokens_to_keep = 1
    # Only the warpers read it, so it stays 1 (one program key) unless sampling: HF keeps a non-eos
    # continuation alive for every sampled beam.
    if num_beams > 1 and do_sample:
        min_tokens_to_keep = len(active["eos_token_id"]) + 1 if active["eos_token_id"] else 2
    top_k_cap = 0
    if is_on("top_k"):
        wanted = max(active["top_k"] or 0, min_tokens_to_keep, _MIN_TOP_K_CAP)
        top_k_cap = 1 << (wanted - 1).bit_length()
        top_k_cap = 0 if top_k_cap >= vocab_size else top_k_cap
    return ProcessorSpec(
        sequence_bias=tuple(active["sequence_bias"] or ()),
        no_repeat_ngram_size=active["no_repeat_ngram_size"] or 0,
        encoder_no_repeat_ngram_size=active["encoder_no_repeat_ngram_size"] or 0,
        bad_words_ids=active["bad_words_ids"] or (),
        top_k_cap=top_k_cap,
        min_tokens_to_keep=min_tokens_to_keep,
        grammar=structured_option(config) is not None,
        **{
            name: is_on(name)
            for name in (
                "repetition_penalty", "encoder_repetition_penalty", "min_length", "min_new_tokens",
                "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
                "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "renormalize_logits",
                *_WARPERS,
            )
        },
    )


def processor_knobs_from_config(config, batch_size: int, vocab_size: int) -> dict[str, np.ndarray]:
    """The run-time values of every processor, as numpy arrays (neutral where the option is off).

    Dtypes, neutral values and which knobs are per row (`[batch_size]`) come from `tfgen.config.knobs.KNOBS`.
    sequence_bias is float32 `[batch_size, S]` (S = number of biased sequences, in `ProcessorSpec.sequence_bias`
    order); eos_token_ids and forced_eos_token_ids int32 `[E]` (E a positive multiple of 4; -1 pads and never
    matches); forced_bos_token_id an int32 scalar (-1 = none); suppress_tokens and begin_suppress_tokens bool
    `[vocab_size]` masks.
    """
    active = _active_options(config, vocab_size)

    def rows(name, value=None):
        return KNOBS[name].fill(batch_size, value)

    def vocab_mask(values):
        mask = np.zeros([vocab_size], bool)
        mask[list(values or ())] = True
        return mask

    decay_start, decay_factor = active["exponential_decay_length_penalty"] or (0, 1.0)
    bias = active["sequence_bias"] or {}
    knobs = {name: rows(name, active[name]) for name in (*_WARPERS, "repetition_penalty", "min_length",
                                                        "min_new_tokens")}
    if active["encoder_repetition_penalty"] is not None:
        knobs["encoder_repetition_penalty"] = rows("encoder_repetition_penalty", active["encoder_repetition_penalty"])
    forced_bos = active["forced_bos_token_id"]
    return {
        **knobs,
        "exponential_decay_start": rows("exponential_decay_start", decay_start),
        "exponential_decay_factor": rows("exponential_decay_factor", decay_factor),
        "sequence_bias": np.tile(np.array(list(bias.values()), np.float32).reshape(1, -1), [batch_size, 1]),
        "eos_token_ids": padded_token_ids(active["eos_token_id"]),
        "forced_bos_token_id": np.array(-1 if forced_bos is None else forced_bos, np.int32),
        "forced_eos_token_ids": padded_token_ids(active["forced_eos_token_id"]),
        "suppress_tokens": vocab_mask(active["suppress_tokens"]),
        "begin_suppress_tokens": vocab_mask(active["begin_suppress_tokens"]),
    }

