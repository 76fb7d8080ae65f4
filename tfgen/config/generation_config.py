"""`GenerationConfig`: the options of `generate()`, compatible with HF transformers 4.55's `GenerationConfig`.

Same attribute names, defaults, generation-mode logic and `generation_config.json` format as
`transformers.GenerationConfig`, so files written by either library load in the other. Unlike HF, an unknown
constructor keyword is an error, and `validate()` rejects out-of-range values up front (HF finds several of
them only when it builds the logits processors), so nothing reaches the compiler with a bad option.
"""

from __future__ import annotations

import copy
import difflib
import enum
import json
import numbers
import os
import warnings
from pathlib import Path
from typing import Any

import huggingface_hub

from tfgen.config.knobs import WARPER_KNOBS
from tfgen.config.rules import OUTPUT_FLAGS, check_options, no_effect_issues
from tfgen.local_files import file_present, read_json_file

__all__ = ["GENERATION_CONFIG_NAME", "SAMPLING_ONLY_NEUTRAL", "GenerationConfig", "GenerationMode"]

GENERATION_CONFIG_NAME = "generation_config.json"

# Bookkeeping keys HF writes or keeps: the first two are kept as attributes (so files round-trip), the
# others are HF-process-local and dropped on load. None of them take part in equality.
_KEPT_METADATA = ("_from_model_config", "transformers_version")
#: Options of tfgen's own, not HF's (structured output); HF keeps them as extra attributes of a config file.
TFGEN_OPTIONS = ("regex", "json_schema")
_DROPPED_METADATA = ("_commit_hash", "_original_object_hash")


class GenerationMode(enum.StrEnum):
    """The decoding strategy a `GenerationConfig` selects (values as in HF's `GenerationMode`)."""

    GREEDY_SEARCH = "greedy_search"
    SAMPLE = "sample"
    CONTRASTIVE_SEARCH = "contrastive_search"
    BEAM_SEARCH = "beam_search"
    BEAM_SAMPLE = "beam_sample"
    GROUP_BEAM_SEARCH = "group_beam_search"
    CONSTRAINED_BEAM_SEARCH = "constrained_beam_search"
    ASSISTED_GENERATION = "assisted_generation"


class GenerationConfig:
    """The options of one `generate()` call, as plain attributes with HF 4.55's names and defaults.

    The class attributes below are the defaults; every instance carries all of them in `vars(self)`, plus
    any unknown keys a loaded JSON file had (kept so they round-trip). For the meaning of each option see
    HF's `GenerationConfig` documentation. Knobs that HF treats as "off" when `None` (temperature, top_k,
    top_p, typical_p, min_p, epsilon/eta cutoffs, penalties, no_repeat_ngram_size) may be `None` here too.
    Options for features tfgen does not implement (universal assisted and DoLa decoding, watermarking,
    cache/compile settings) are carried for compatibility; `get_generation_mode()` rejects the modes.
    """

    # Length of the output.
    max_length: int = 20
    max_new_tokens: int | None = None
    min_length: int = 0
    min_new_tokens: int | None = None
    early_stopping: bool | str = False
    max_time: float | None = None
    stop_strings: str | list[str] | None = None
    # Structured output (tfgen's own options): the generated text must match a regex / a JSON schema.
    regex: str | None = None
    json_schema: dict | str | None = None
    # Decoding strategy.
    do_sample: bool = False
    num_beams: int = 1
    num_beam_groups: int = 1
    penalty_alpha: float | None = None
    dola_layers: str | list[int] | None = None
    # Cache.
    use_cache: bool = True
    cache_implementation: str | None = None
    cache_config: dict | None = None
    return_legacy_cache: bool | None = None
    prefill_chunk_size: int | None = None
    # Logits manipulation.
    temperature: float | None = 1.0
    top_k: int | None = 50
    top_p: float | None = 1.0
    min_p: float | None = None
    typical_p: float | None = 1.0
    epsilon_cutoff: float | None = 0.0
    eta_cutoff: float | None = 0.0
    diversity_penalty: float | None = 0.0
    repetition_penalty: float | None = 1.0
    encoder_repetition_penalty: float | None = 1.0
    length_penalty: float = 1.0
    no_repeat_ngram_size: int | None = 0
    bad_words_ids: list[list[int]] | None = None
    force_words_ids: list | None = None
    renormalize_logits: bool = False
    constraints: list | None = None
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | list[int] | None = None
    remove_invalid_values: bool = False
    exponential_decay_length_penalty: tuple[int, float] | None = None
    suppress_tokens: list[int] | None = None
    begin_suppress_tokens: list[int] | None = None
    sequence_bias: Any = None
    token_healing: bool = False
    guidance_scale: float | None = None
    low_memory: bool | None = None
    watermarking_config: dict | None = None
    # Outputs.
    num_return_sequences: int = 1
    output_attentions: bool = False
    output_hidden_states: bool = False
    output_scores: bool = False
    output_logits: bool | None = None
    return_dict_in_generate: bool = False
    # Special tokens.
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    # Encoder-decoder models.
    encoder_no_repeat_ngram_size: int | None = 0
    decoder_start_token_id: int | list[int] | None = None
    # Assisted generation.
    is_assistant: bool = False
    num_assistant_tokens: int = 20
    num_assistant_tokens_schedule: str = "constant"
    assistant_confidence_threshold: float = 0.4
    prompt_lookup_num_tokens: int | None = None
    max_matching_ngram_size: int | None = None
    assistant_early_exit: int | None = None
    assistant_lookbehind: int = 10
    target_lookbehind: int = 10
    # Compilation (PyTorch-specific in HF).
    compile_config: Any = None
    disable_compile: bool = False
    # Bookkeeping (see _KEPT_METADATA).
    _from_model_config: bool = False
    transformers_version: str | None = None

    def __init__(self, **kwargs: Any) -> None:
        """Builds a config from the defaults overridden by `kwargs`, then `validate()`s it.

        Raises ValueError naming any keyword that is not a generation option.
        """
        unknown = [key for key in kwargs if key not in _DEFAULTS]
        if unknown:
            hints = {key: difflib.get_close_matches(key, _DEFAULTS, n=1) for key in unknown}
            described = ", ".join(f"{key!r}" + (f" (did you mean {hints[key][0]!r}?)" if hints[key] else "")
                                  for key in unknown)
            raise ValueError(f"Unknown GenerationConfig option(s): {described}.")
        vars(self).update(_DEFAULTS)
        vars(self).update(kwargs)
        self.validate()

    # ----------------------------------------------------------------------------------------------------
    # Construction and serialization

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any]) -> GenerationConfig:
        """Builds a config from a `generation_config.json`-style dict (deep-copied).

        HF bookkeeping keys are accepted; keys that are not generation options are kept as extra attributes
        (they appear in `to_dict()`) and reported with a `UserWarning`.
        """
        config_dict = copy.deepcopy(dict(config_dict))
        extras = {key: value for key, value in config_dict.items()
                  if key not in _DEFAULTS and key not in _DROPPED_METADATA}
        shadowing = sorted(key for key in extras if hasattr(cls, key))
        if shadowing:
            raise ValueError(f"Generation config keys {shadowing} clash with GenerationConfig methods.")
        if extras:
            warnings.warn(f"Generation config keys unknown to tfgen are kept but not used: {sorted(extras)}.",
                          UserWarning, stacklevel=2)
        config = cls(**{key: value for key, value in config_dict.items() if key in _DEFAULTS})
        vars(config).update(extras)
        return config

    @classmethod
    def from_pretrained(
        cls,
        path_or_repo_id: str | os.PathLike,
        config_file_name: str = GENERATION_CONFIG_NAME,
        *,
        revision: str | None = None,
        cache_dir: str | os.PathLike | None = None,
        token: str | bool | None = None,
        local_files_only: bool | None = None,
    ) -> GenerationConfig:
        """Loads a config from a JSON file, a directory holding `config_file_name`, or a Hub repo id.

        Hub files are fetched with `huggingface_hub.hf_hub_download` (which honours `HF_HUB_OFFLINE` and
        its cache). Raises OSError naming the path or repo id when the file cannot be found, fetched or
        parsed, and the ValueError / TypeError of an invalid option prefixed with the file's path.
        """
        path = Path(path_or_repo_id)
        if path.is_dir():
            path = path / config_file_name
            if not file_present(path, "the generation config"):
                raise OSError(f"Directory {str(path_or_repo_id)!r} has no {config_file_name!r}.")
        elif not file_present(path, "the generation config"):
            path = _download_from_hub(str(path_or_repo_id), config_file_name, revision=revision,
                                      cache_dir=cache_dir, token=token, local_files_only=bool(local_files_only))
        config_dict = read_json_file(path, "the generation config")
        if not isinstance(config_dict, dict):
            raise OSError(f"{str(path)!r} does not hold a JSON object.")
        try:
            return cls.from_dict(config_dict)
        except (ValueError, TypeError) as err:  # a bad value: say which file holds it
            raise (TypeError if isinstance(err, TypeError) else ValueError)(f"{str(path)!r}: {err}") from None

    @classmethod
    def from_model_config(cls, model_config: Any) -> GenerationConfig:
        """Builds a config from a model config (a dict or an object with attributes, e.g. HF's `PretrainedConfig`).

        As HF does: takes every generation option the model config sets to a non-None value (special token
        ids, and generation keys of old-style configs), marks the result `_from_model_config`, and turns on
        `return_dict_in_generate` when an `output_*` flag is on. (HF additionally consults the decoder
        sub-config of encoder-decoder models; tfgen does not.)
        """
        def lookup(key: str) -> Any:
            return model_config.get(key) if isinstance(model_config, dict) else getattr(model_config, key, None)

        options = {key: lookup(key) for key in _DEFAULTS if key not in _KEPT_METADATA}
        options = {key: value for key, value in options.items() if value is not None}
        if any(options.get(flag) is True for flag in OUTPUT_FLAGS):
            options["return_dict_in_generate"] = True
        return cls(**options, _from_model_config=True)

    def to_dict(self) -> dict[str, Any]:
        """All attributes (options, kept bookkeeping keys and extras) as a deep-copied dict; tfgen's own options
        (`TFGEN_OPTIONS`) only when set, so that a default config's dict is HF's."""
        return copy.deepcopy({key: value for key, value in vars(self).items()
                              if not (key in TFGEN_OPTIONS and value is None)})

    def to_diff_dict(self) -> dict[str, Any]:
        """The attributes whose values differ from a default `GenerationConfig()` (what files store)."""
        return {key: value for key, value in self.to_dict().items()
                if key not in _DEFAULTS or value != _DEFAULTS[key]}

    def to_json_string(self, use_diff: bool = True) -> str:
        """The config as indented, key-sorted JSON (only non-default values when `use_diff`), like HF."""
        config_dict = self.to_diff_dict() if use_diff else self.to_dict()
        return json.dumps(config_dict, indent=2, sort_keys=True, default=_json_scalar) + "\n"

    def to_json_file(self, json_file_path: str | os.PathLike, use_diff: bool = True) -> None:
        """Writes `to_json_string(use_diff)` to `json_file_path`."""
        Path(json_file_path).write_text(self.to_json_string(use_diff=use_diff), encoding="utf-8")

    def save_pretrained(self, save_directory: str | os.PathLike,
                        config_file_name: str = GENERATION_CONFIG_NAME) -> Path:
        """Writes the non-default options to `save_directory/config_file_name` (creating the directory) and
        returns that path; HF's `GenerationConfig.from_pretrained` reads it back to an equal config."""
        os.makedirs(save_directory, exist_ok=True)
        path = Path(save_directory) / config_file_name
        self.to_json_file(path)
        return path

    def copy(self) -> GenerationConfig:
        """A deep copy."""
        return copy.deepcopy(self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GenerationConfig):
            return NotImplemented
        return _without_metadata(self.to_dict()) == _without_metadata(other.to_dict())

    def __repr__(self) -> str:
        diff = json.dumps(_without_metadata(self.to_diff_dict()), sort_keys=True, default=_json_scalar)
        return f"{type(self).__name__}({diff})"

    # ----------------------------------------------------------------------------------------------------
    # Use by generate()

    def update(self, **kwargs: Any) -> dict[str, Any]:
        """Sets the attributes named in `kwargs` that this config has and returns the others, as HF does.

        The result is validated before anything is changed: on a ValueError/TypeError the config is untouched.
        """
        known = {key: value for key, value in kwargs.items() if key in vars(self)}
        candidate = copy.copy(self)
        vars(candidate).update(known)
        candidate.validate()
        vars(self).update(known)
        return {key: value for key, value in kwargs.items() if key not in known}

    def eos_token_ids(self) -> list[int]:
        """`eos_token_id` normalised to a list of ints (empty when unset)."""
        eos = self.eos_token_id
        if eos is None:
            return []
        return [int(eos)] if isinstance(eos, numbers.Integral) else [int(token) for token in eos]

    def get_generation_mode(self, assistant_model=None) -> GenerationMode:
        """The decoding strategy these options select, by HF 4.55's rules.

        `prompt_lookup_num_tokens`, `assistant_early_exit` or an `assistant_model` turn greedy search or sampling
        into assisted generation (speculative decoding); as in HF they are ignored (with a warning) in the other
        modes. `constraints` / `force_words_ids` select constrained beam search whatever the other options (its
        own checks come when a request is built). Raises ValueError when the options select a strategy tfgen does
        not implement (DoLa decoding), naming the option that selected it; DoLa's option is likewise only warned
        about outside greedy search and sampling.
        """
        if self.constraints is not None or self.force_words_ids is not None:
            mode = GenerationMode.CONSTRAINED_BEAM_SEARCH
        elif self.num_beams == 1:
            if self.do_sample:
                mode = GenerationMode.SAMPLE
            elif (self.top_k or 0) > 1 and (self.penalty_alpha or 0) > 0:
                mode = GenerationMode.CONTRASTIVE_SEARCH
            else:
                mode = GenerationMode.GREEDY_SEARCH
        elif self.num_beam_groups > 1:
            mode = GenerationMode.GROUP_BEAM_SEARCH
        else:
            mode = GenerationMode.BEAM_SAMPLE if self.do_sample else GenerationMode.BEAM_SEARCH
        assisting = [option for option in ("prompt_lookup_num_tokens", "assistant_early_exit")
                     if getattr(self, option) is not None]
        if assistant_model is not None:
            assisting.append("assistant_model")
        base_mode = mode
        if assisting:
            if mode in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE):
                mode = GenerationMode.ASSISTED_GENERATION
            else:
                warnings.warn(f"`{assisting[0]}` would select assisted generation, which only extends greedy search "
                              f"and sampling; it is ignored in {mode}.", UserWarning, stacklevel=2)
        if self.dola_layers is not None:
            if base_mode in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE):
                raise ValueError("`dola_layers` selects DoLa decoding, which tfgen does not support.")
            warnings.warn("`dola_layers` would select DoLa decoding, which only extends greedy search and sampling; "
                          f"it is ignored in {mode}.", UserWarning, stacklevel=2)
        return mode

    # ----------------------------------------------------------------------------------------------------
    # Validation

    def validate(self, *, stacklevel: int = 3) -> None:
        """Checks types, ranges and combinations of the options (the rules are in `tfgen.config.rules`).

        Raises TypeError (wrong type) or ValueError (bad value or contradiction), naming the attribute.
        Options that merely have no effect in the selected mode (e.g. `temperature` without `do_sample`)
        produce one `UserWarning` listing them, with the same attributes HF 4.55 reports (`stacklevel` is
        passed to `warnings.warn`; the default points at the caller of `__init__` / `update`).
        """
        check_options(self)
        issues = no_effect_issues(self, SAMPLING_ONLY_NEUTRAL)
        if issues:
            listed = "\n".join(f"- `{name}`: {issue}" for name, issue in issues.items())
            warnings.warn(f"Generation options that have no effect with these settings and are ignored:\n{listed}",
                          UserWarning, stacklevel=stacklevel)


_DEFAULTS: dict[str, Any] = {name: getattr(GenerationConfig, name) for name in GenerationConfig.__annotations__}


def _without_metadata(config_dict: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in config_dict.items() if key not in _KEPT_METADATA}


def _json_scalar(value: Any) -> Any:
    """JSON fallback for numpy scalars (which the numeric checks accept)."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable.")


def _download_from_hub(repo_id: str, filename: str, **kwargs: Any) -> str:
    try:
        return huggingface_hub.hf_hub_download(repo_id, filename, **kwargs)
    # The hub client raises many unrelated types (invalid id, HTTP, offline, missing entry) across versions.
    except Exception as err:
        raise OSError(f"Can't load {filename!r} for {repo_id!r}: it is not a local directory or JSON file, and "
                      f"fetching it from the Hugging Face Hub failed ({type(err).__name__}: {err}).") from err


#: The sampling warpers' defaults, at which HF 4.55 stays silent without `do_sample` (it warns of any other value).
#: Public: `tfgen generate --greedy` resets a sampling config's warpers to these.
SAMPLING_ONLY_NEUTRAL: dict[str, Any] = {name: _DEFAULTS[name] for name in WARPER_KNOBS}
