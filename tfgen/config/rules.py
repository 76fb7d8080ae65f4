"""The validation rules of `GenerationConfig`: the type and range of each option, the shapes of token-id
options, contradictory combinations, and the options that have no effect in the selected mode.

Functions here take any object with `GenerationConfig`'s attributes; `GenerationConfig.validate` runs them.
The ranges of the run-time knobs (temperature, top-k, penalties ...) come from the knob schema, `tfgen.config.knobs`.
Free of TensorFlow (the CLI imports the config without it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfgen.config.knobs import KNOBS
from tfgen.value_types import is_integer, is_real

# The `output_*` flags that only matter with `return_dict_in_generate`.
OUTPUT_FLAGS = ("output_attentions", "output_hidden_states", "output_scores", "output_logits")
_BOOL_FLAGS = ("do_sample", "use_cache", "renormalize_logits", "remove_invalid_values", "return_dict_in_generate",
               *OUTPUT_FLAGS)
_OPTIONAL_BOOL_FLAGS = ("output_logits",)

# Values at which a beam-only option does nothing (HF 4.55 warns when they differ); the sampling-only ones are the
# warpers' defaults (`no_effect_issues`' `sampling_defaults`).
_BEAM_ONLY = {"early_stopping": False, "num_beam_groups": 1, "diversity_penalty": 0.0, "length_penalty": 1.0,
              "constraints": None}


#: The longest draft a speculative program verifies: each drafted token is unrolled into the compiled program.
MAX_DRAFT_TOKENS = 64


def _at_least(bound: float) -> Callable[[Any], bool]:
    return lambda value: value >= bound


# name -> (kind, may be None, range check, what is expected, for messages): the options that are not run-time
# knobs (those are validated from the knob schema, see `_knob_rules`).
_NUMERIC_RULES: dict[str, tuple[type, bool, Callable[[Any], bool], str]] = {
    "max_length": (int, False, _at_least(1), "an integer >= 1"),
    "max_new_tokens": (int, True, _at_least(1), "an integer >= 1"),
    "num_beams": (int, False, _at_least(1), "an integer >= 1"),
    "num_beam_groups": (int, False, _at_least(1), "an integer >= 1"),
    "num_return_sequences": (int, False, _at_least(1), "an integer >= 1"),
    "no_repeat_ngram_size": (int, True, _at_least(0), "an integer >= 0"),
    "encoder_no_repeat_ngram_size": (int, True, _at_least(0), "an integer >= 0"),
    "encoder_repetition_penalty": (float, True, lambda value: value > 0, "a number > 0"),
    "max_time": (float, True, lambda value: value > 0, "a number of seconds > 0"),
    # Assisted generation: draft lengths and the early-exit layer count (checked against the model at request time).
    "prompt_lookup_num_tokens": (int, True, lambda value: 1 <= value <= MAX_DRAFT_TOKENS,
                                 f"an integer from 1 to {MAX_DRAFT_TOKENS}"),
    "num_assistant_tokens": (int, False, lambda value: 1 <= value <= MAX_DRAFT_TOKENS,
                             f"an integer from 1 to {MAX_DRAFT_TOKENS}"),
    "max_matching_ngram_size": (int, True, lambda value: 1 <= value <= 16, "an integer from 1 to 16"),
    "assistant_early_exit": (int, True, _at_least(1), "an integer >= 1"),
}
# Knob attributes HF never sets to None.
_REQUIRED_KNOBS = ("min_length", "length_penalty")
# HF accepts temperature 0 in a config (greedy search ignores it); the knob's "> 0" is checked when sampling.
_CONFIG_RANGES = {
    "temperature": (lambda value: value == 0 or KNOBS["temperature"].is_valid(value),
                    "0 (greedy) or " + KNOBS["temperature"].requirement)
}
# Programs hold counts, lengths and token ids as int32.
_INT32_LIMIT = 2**31


def _knob_rules() -> dict[str, tuple[type, bool, Callable[[Any], bool], str]]:
    """`_NUMERIC_RULES`-shaped rules for the config attributes that are run-time knobs, from `tfgen.config.knobs`."""
    rules = {}
    for knob in KNOBS.values():
        if knob.config_kind is None:
            continue
        in_range, requirement = _CONFIG_RANGES.get(knob.name, (knob.is_valid, knob.requirement))
        kind_words = "an integer" if knob.config_kind is int else "a number"
        rules[knob.name] = (knob.config_kind, knob.name not in _REQUIRED_KNOBS, in_range,
                            f"{kind_words} {requirement}")
    return rules


_NUMERIC_RULES.update(_knob_rules())


def _is_kind(value: Any, kind: type) -> bool:
    """Whether `value` is an integer (`kind` int) or a real number (`kind` float); bools are neither."""
    return is_integer(value) if kind is int else is_real(value)


_TOKEN_ID_SHAPES = {"id": "a token id (an int >= 0)", "list": "a list of token ids (ints >= 0)",
                    "id or list": "a token id or a list of token ids (ints >= 0)"}


def _token_id_list(name: str, value: Any, accepted: str) -> list[int]:
    """Checks that `value` has an `accepted` shape (see `_TOKEN_ID_SHAPES`) of ids >= 0; returns them as a list."""
    is_scalar = _is_kind(value, int)
    if is_scalar:
        well_formed = accepted != "list"
    else:
        well_formed = (accepted != "id" and isinstance(value, (list, tuple))
                       and all(_is_kind(token, int) for token in value))
    if not well_formed:
        raise TypeError(f"`{name}` must be {_TOKEN_ID_SHAPES[accepted]}, got {value!r}.")
    ids = [value] if is_scalar else list(value)
    if any(token < 0 or token >= _INT32_LIMIT for token in ids):
        raise ValueError(f"`{name}` must hold token ids >= 0 and below 2**31, got {value!r}.")
    return ids


def check_options(config: Any) -> None:
    """Checks the types, ranges and combinations of `config`'s options.

    Raises TypeError (wrong type) or ValueError (bad value or contradiction), naming the attribute.
    """
    for name, (kind, optional, in_range, expected) in _NUMERIC_RULES.items():
        value = getattr(config, name)
        if value is None and optional:
            continue
        if not _is_kind(value, kind):
            raise TypeError(f"`{name}` must be {expected}, got {value!r} ({type(value).__name__}).")
        if not in_range(value):
            raise ValueError(f"`{name}` must be {expected}, got {value!r}.")
        if kind is int and not -_INT32_LIMIT <= value < _INT32_LIMIT:
            raise ValueError(f"`{name}` must be {expected} and below 2**31 (programs hold it as int32), got {value!r}.")
    for name in _BOOL_FLAGS:
        value = getattr(config, name)
        if not (isinstance(value, bool) or (value is None and name in _OPTIONAL_BOOL_FLAGS)):
            raise TypeError(f"`{name}` must be a bool, got {value!r} ({type(value).__name__}).")
    if not (isinstance(config.early_stopping, bool) or config.early_stopping == "never"):
        raise ValueError(f"`early_stopping` must be True, False or 'never', got {config.early_stopping!r}.")
    _check_token_ids(config)
    _check_structured_output(config)
    _check_combinations(config)


def _check_structured_output(config: Any) -> None:
    """Checks the types of `regex` / `json_schema` (what they say is checked when their automaton is built)."""
    regex, schema = getattr(config, "regex", None), getattr(config, "json_schema", None)
    if regex is not None and not (isinstance(regex, str) and regex):
        raise TypeError(f"`regex` must be a non-empty string, got {regex!r} ({type(regex).__name__}).")
    if schema is not None and not isinstance(schema, (dict, str)):
        raise TypeError(f"`json_schema` must be a JSON schema (a dict, or its JSON text), got {type(schema).__name__}.")
    if regex is not None and schema is not None:
        raise ValueError("`regex` and `json_schema` both constrain the output; set one of them.")


def _check_token_ids(config: Any) -> None:
    """Checks the shape and sign of the token-id options (single ids, id lists, `bad_words_ids`)."""
    for accepted, names in (("id", ("pad_token_id", "bos_token_id", "forced_bos_token_id")),
                            ("id or list", ("eos_token_id", "forced_eos_token_id", "decoder_start_token_id")),
                            ("list", ("suppress_tokens", "begin_suppress_tokens"))):
        for name in names:
            if getattr(config, name) is not None:
                _token_id_list(name, getattr(config, name), accepted)
    if config.bad_words_ids is not None:
        if not isinstance(config.bad_words_ids, (list, tuple)):
            raise TypeError(f"`bad_words_ids` must be a list of lists of token ids, got {config.bad_words_ids!r}.")
        if not config.bad_words_ids:
            raise ValueError("`bad_words_ids` must not be empty (use None for no banned words).")
        for index, sequence in enumerate(config.bad_words_ids):
            if not _token_id_list(f"bad_words_ids[{index}]", sequence, "list"):
                raise ValueError(f"`bad_words_ids[{index}]` is empty.")


def _check_combinations(config: Any) -> None:
    """Rejects options that contradict each other (sampling at temperature 0, bad beam-group splits, ...)."""
    if config.do_sample and config.temperature == 0:
        raise ValueError("`temperature` must be > 0 when `do_sample` is True (use do_sample=False for greedy).")
    if config.num_beams > 1 and config.num_beam_groups > 1:
        if config.do_sample:
            raise ValueError("`num_beam_groups` > 1 (group beam search) requires `do_sample` False.")
        if config.num_beams % config.num_beam_groups:
            raise ValueError(f"`num_beams` ({config.num_beams}) must be divisible by `num_beam_groups` "
                             f"({config.num_beam_groups}).")
        if not config.diversity_penalty:
            raise ValueError("`diversity_penalty` must be > 0 with `num_beam_groups` > 1, otherwise all "
                             "groups are identical.")
    if config.num_beams == 1 and not config.do_sample and config.num_return_sequences != 1:
        raise ValueError(f"`num_return_sequences` must be 1 without sampling or beam search "
                         f"(got {config.num_return_sequences}).")
    if config.num_beams > 1 and config.num_return_sequences > config.num_beams:
        raise ValueError(f"`num_return_sequences` ({config.num_return_sequences}) must be <= `num_beams` "
                         f"({config.num_beams}).")


def no_effect_issues(config: Any, sampling_defaults: dict[str, Any]) -> dict[str, str]:
    """{attribute: why it has no effect} for the options set to a non-neutral value that the selected mode
    ignores (e.g. `temperature` without `do_sample`): the attributes HF 4.55 warns about. `sampling_defaults`: the
    sampling warpers' default values (at which they do nothing without sampling)."""
    issues = {}

    def flag_non_neutral(neutral_values: dict[str, Any], reason: str) -> None:
        for name, neutral in neutral_values.items():
            value = getattr(config, name)
            if value is not None and value != neutral:
                issues[name] = f"set to {value!r}, but {reason}."

    if not config.do_sample:
        sampling_only = dict(sampling_defaults)
        if config.penalty_alpha is not None:  # contrastive search uses top_k
            del sampling_only["top_k"]
        flag_non_neutral(sampling_only, "`do_sample` is False and it is only used when sampling")
    if config.num_beams == 1:
        flag_non_neutral(_BEAM_ONLY, "`num_beams` is 1 and it is only used by beam search")
    elif config.num_beam_groups == 1:
        flag_non_neutral({"diversity_penalty": 0.0}, "`num_beam_groups` is 1 and it is only used by group "
                         "beam search")
    if config.prompt_lookup_num_tokens is None:
        flag_non_neutral({"max_matching_ngram_size": None}, "it is only used by prompt lookup decoding "
                         "(`prompt_lookup_num_tokens`)")
    else:
        flag_non_neutral({"num_assistant_tokens": 20}, "prompt lookup drafts `prompt_lookup_num_tokens` tokens")
    if config.use_cache is False:
        flag_non_neutral(dict.fromkeys(("cache_implementation", "cache_config", "return_legacy_cache")),
                         "`use_cache` is False")
    if config.return_dict_in_generate is not True:
        issues.update({flag: "is True, but `return_dict_in_generate` is not, so it is ignored."
                       for flag in OUTPUT_FLAGS if getattr(config, flag) is True})
    return issues
