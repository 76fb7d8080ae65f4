"""The request layer: one generate call, resolved and checked before anything compiles.

    config ⊕ options → GenerationConfig.validate() → input checks → buckets → DecodeSpec (static, hashable:
    the program key) + DecodeInputs (tensors: prompt, budgets, seeds, knobs)

`generate()`, streaming, `tfgen.batch` and `tfgen.export` all go through these functions, so the pad-id rule,
the eos vector, the knob values and the program key exist once. See `docs/design.md`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tfgen.config.generation_config import GenerationConfig, GenerationMode
from tfgen.decoding.loop import DecodeSpec
from tfgen.decoding.model_protocol import capabilities
from tfgen.decoding.random import derive_seeds
from tfgen.decoding.state import DecodeInputs
from tfgen.decoding.strategies import DecodingStrategy, strategy_for
from tfgen.logits.pipeline import ResolvedProcessors, check_user_processors, resolve_processors
from tfgen.request.buckets import DEFAULT_BUCKETS
from tfgen.request.encoder import (
    ENCODER_DECODER_INPUTS,
    encoder_decoder_prompt,
    padded_encoder_inputs,
    refuse_encoder_decoder_inputs,
    returned_encoder_states,
)
from tfgen.request.input_checks import check_prompt, check_prompt_fits, check_seed, pop_input_ids, resolve_lengths
from tfgen.request.size import check_request_fits
from tfgen.request.spec import decode_spec, knob_values
from tfgen.stopping.criteria import split_stopping_criteria
from tfgen.structured.automaton import constraint_automaton

# generate() keywords that are not GenerationConfig attributes.
MODEL_INPUT_KWARGS = ("input_ids", "attention_mask", *ENCODER_DECODER_INPUTS)


@dataclasses.dataclass(frozen=True)
class Request:
    """A validated generate call: the program key, the tensors to feed it, and how to cut its outputs.

    spec: the static `DecodeSpec` (selects the compiled program). inputs: the `DecodeInputs` of
    `spec.batch_size` rows. batch_size: the caller's rows (after repeating prompts for `num_return_sequences`);
    start: bucket columns before the caller's prompt; prompt_len: the caller's prompt width; max_new_tokens:
    the budget asked for; return_dict: whether the caller gets an output object rather than a tensor;
    max_time: seconds the call may take (checked between compiled chunks), or None.
    """

    spec: DecodeSpec
    inputs: DecodeInputs
    batch_size: int
    start: int
    prompt_len: int
    max_new_tokens: int
    return_dict: bool = False
    max_time: float | None = None
    #: The `regex` / `json_schema` automaton (`tfgen.structured.automaton.TokenAutomaton`), or None.
    automaton: Any = None
    #: Rows the host made of each prompt before the program (`num_return_sequences` of sampling), else 1.
    host_copies: int = 1
    #: An encoder-decoder request asking for `output_hidden_states`: `encoder_hidden_states` to return (HF's tuple of
    #: float32 `[prompts, S, D]`), or None; `encode_ahead`: they are still to be computed
    #: (`tfgen.generation.programs.encode_ahead` runs the encoder before the program and hands it the output).
    encoder_hidden_states: tuple | None = None
    encode_ahead: bool = False

    def with_budgets(self, budgets) -> Request:
        """The same request with per-row budgets `budgets` int `[batch_size]` (each at most `max_new_tokens`);
        bucket rows keep a budget of 0. E.g. a batch job gives filler rows nothing to generate."""
        budgets = np.asarray(budgets)
        if budgets.shape != (self.batch_size,) or not np.issubdtype(budgets.dtype, np.integer):
            raise ValueError(f"budgets must be integers of shape [{self.batch_size}], got {budgets.dtype} "
                             f"{budgets.shape}")
        if budgets.min() < 0 or budgets.max() > self.max_new_tokens:
            raise ValueError(f"budgets must be in [0, max_new_tokens={self.max_new_tokens}], got {budgets.tolist()}")
        padded = np.zeros([self.spec.batch_size], np.int32)
        padded[: self.batch_size] = budgets
        return dataclasses.replace(self, inputs=self.inputs._replace(max_new_tokens=tf.constant(padded)))


class ResolvedConfig(NamedTuple):
    """The effective config of a call (a copy) and whether the call set `max_length` explicitly."""

    config: GenerationConfig
    explicit_max_length: bool


def source_config(model, generation_config=None) -> GenerationConfig:
    """`generation_config`, else the model's `generation_config`, else one from its config (not a copy: read it,
    never change it)."""
    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise TypeError(
            f"generation_config must be a tfgen.GenerationConfig, got {type(generation_config).__name__}."
        )
    base = generation_config or getattr(model, "generation_config", None)
    return GenerationConfig.from_model_config(model.config) if base is None else base


def base_config(model, generation_config=None) -> GenerationConfig:
    """A copy of `source_config(model, generation_config)`."""
    return source_config(model, generation_config).copy()


def resolve_config(
    model, generation_config=None, options: dict | None = None, *, stacklevel: int = 2
) -> ResolvedConfig:
    """`generation_config` (default: the model's, else one from its config), copied and updated with `options`.

    An option that is not a `GenerationConfig` attribute is a ValueError naming it; the result is validated
    once (one warning for options without effect; `stacklevel` as `warnings.warn`'s, from this function).
    """
    options = dict(options or {})
    config = base_config(model, generation_config)
    unused = sorted(set(options) - set(vars(config)))
    if unused:
        raise ValueError(
            f"unknown generation option(s): {', '.join(unused)}. They are neither GenerationConfig "
            f"attributes nor generate() arguments ({', '.join(MODEL_INPUT_KWARGS)}, seed, logits_processor, "
            "stopping_criteria, tokenizer, jit_compile, streamer)."
        )
    # `config` is a copy, so it can be changed first and validated once (not `update`, which validates too).
    vars(config).update(options)
    config.validate(stacklevel=stacklevel + 1)
    return ResolvedConfig(config, "max_length" in options)


def refuse_whole_call_options(config: GenerationConfig, why: dict[str, str]) -> None:
    """ValueError for the options only `generate()` honours, for an entry point that runs each request as whole
    compiled calls and returns one row per prompt (a batch job, an export): `max_time` (the host checks a clock
    between compiled chunks) and `num_return_sequences` above 1. `why`: each option's reason, in the entry point's
    words."""
    if config.max_time is not None:
        raise ValueError(f"max_time: {why['max_time']}")
    if int(config.num_return_sequences or 1) != 1:
        raise ValueError(f"num_return_sequences: {why['num_return_sequences']}")


class ResolvedCall(NamedTuple):
    """What a generate call decides before looking at its inputs, resolved and validated once (`resolve_call`): the
    effective config (a copy), whether it set `max_length`, the generation mode and its strategy's declaration, the
    processors (spec and values), the user's processors and criteria, the tokenizer and the assistant model."""

    config: GenerationConfig
    explicit_max_length: bool
    mode: GenerationMode
    strategy: DecodingStrategy
    processors: ResolvedProcessors
    user_processors: tuple
    user_criteria: tuple
    tokenizer: Any
    assistant_model: Any


def resolve_call(model, generation_config: GenerationConfig | None = None, options: dict | None = None, *,
                 logits_processor: Sequence | None = None, stopping_criteria: Sequence | None = None,
                 tokenizer=None, assistant_model=None, stacklevel: int = 2) -> ResolvedCall:
    """The config of a call (`generation_config` or the model's, updated with `options`: `GenerationConfig`
    attributes) validated once, its mode, the strategy's model checks and its processors — everything of a call
    that does not depend on its inputs, so that a caller running many calls alike (a batch job) resolves it once.
    Raises ValueError / TypeError naming the option; `stacklevel` as `warnings.warn`'s, from this function."""
    options = dict(options or {})
    user_processors = check_user_processors(logits_processor)
    user_criteria, criteria_options, tokenizer = split_stopping_criteria(
        stopping_criteria, source_config(model, generation_config), options, tokenizer
    )
    options.update(criteria_options)
    config, explicit_max_length = resolve_config(model, generation_config, options, stacklevel=stacklevel + 1)
    mode = config.get_generation_mode(assistant_model)
    _warn_of_a_draft_length_without_drafter(config, mode, stacklevel + 1)
    strategy = strategy_for(mode)
    if strategy.check_model is not None:
        strategy.check_model(model, assistant_model, config, user_processors)
    processors = resolve_processors(config, int(model.config.vocab_size), num_beams=int(config.num_beams))
    return ResolvedCall(config, explicit_max_length, mode, strategy, processors, user_processors, user_criteria,
                        tokenizer, assistant_model)


def pad_token_id_of(config: GenerationConfig, vocab_size: int | None = None) -> int:
    """The id written after a row finished: `pad_token_id`, else HF's convention for models without a pad token,
    the (first) eos id, else 0. With `vocab_size`, a pad id outside the vocabulary is a ValueError (the model
    embeds pad columns, and a lookup out of range fails eagerly and reads garbage under XLA)."""
    if config.pad_token_id is not None:
        pad_token_id = int(config.pad_token_id)
    else:
        eos_ids = config.eos_token_ids()
        pad_token_id = eos_ids[0] if eos_ids else 0
    if vocab_size is not None and not 0 <= pad_token_id < vocab_size:
        raise ValueError(f"pad_token_id: {pad_token_id} is outside the model's vocabulary [0, {vocab_size}).")
    return pad_token_id


def _warn_of_a_draft_length_without_drafter(config: GenerationConfig, mode: GenerationMode, stacklevel: int) -> None:
    """`num_assistant_tokens` sets how many tokens a model drafter drafts; without one (no `assistant_model`, no
    `assistant_early_exit`) it has no effect: warned as HF warns of options of another mode (`stacklevel` as
    `warnings.warn`'s, from the caller). Prompt lookup's own case is `GenerationConfig.validate`'s."""
    default = GenerationConfig.num_assistant_tokens
    if mode != GenerationMode.ASSISTED_GENERATION and config.num_assistant_tokens != default:
        warnings.warn(
            "Generation options that have no effect with these settings and are ignored:\n- `num_assistant_tokens`: "
            f"set to {config.num_assistant_tokens!r}, but no drafter is given (assistant_model= or "
            "assistant_early_exit) and it is only used by assisted generation.",
            UserWarning, stacklevel=stacklevel + 1,
        )


def prepare_request(
    model,
    inputs=None,
    *,
    generation_config: GenerationConfig | None = None,
    logits_processor: Sequence | None = None,
    seed=None,
    tokenizer=None,
    stopping_criteria: Sequence | None = None,
    call: ResolvedCall | None = None,
    stacklevel: int = 2,
    **options,
) -> Request:
    """Resolves the config, checks every input and builds the program inputs and key — all before compiling.
    `call`: the call already resolved (`resolve_call`); `generation_config`, `logits_processor`, `tokenizer`,
    `stopping_criteria` and generation options must then be left out.

    inputs / `input_ids=`: int ids `[batch, prompt_len]`, left padded (may be empty when the model has a
    `bos_token_id`). `attention_mask=`: `[batch, prompt_len]` 0/1, inferred from pad ids like HF when absent.
    seed: None, `[2]` or `[batch, 2]`. tokenizer: the model's `tfgen.Tokenizer`, needed for `stop_strings`.
    stopping_criteria: `tfgen.stopping.criteria` criteria or callables (see there). Other `options` are
    `GenerationConfig` attributes. Bad input raises ValueError / TypeError naming the argument. stacklevel: where
    warnings point (`warnings.warn`'s, counted from this function).
    """
    model_config = model.config
    vocab_size = int(model_config.vocab_size)
    input_ids = pop_input_ids(inputs, options)
    attention_mask = options.pop("attention_mask", None)
    encoder_decoder = capabilities(model).encoder_decoder
    encoder_decoder_inputs = {name: options.pop(name) for name in ENCODER_DECODER_INPUTS if name in options}
    if not encoder_decoder:
        refuse_encoder_decoder_inputs(encoder_decoder_inputs)
    if call is None:
        call = resolve_call(model, generation_config, options, logits_processor=logits_processor,
                            stopping_criteria=stopping_criteria, tokenizer=tokenizer,
                            assistant_model=options.pop("assistant_model", None), stacklevel=stacklevel + 1)
    elif options or any(value is not None for value in (generation_config, logits_processor, tokenizer,
                                                          stopping_criteria)):
        raise TypeError("prepare_request: with `call`, the call's config, processors, criteria and tokenizer are "
                        "already resolved; pass only inputs and seed")
    config, mode, strategy, processors = call.config, call.mode, call.strategy, call.processors
    tokenizer = call.tokenizer
    eos_ids = config.eos_token_ids()
    pad_token_id = pad_token_id_of(config, vocab_size)

    encoder = None  # the EncoderDecoderPrompt of an encoder-decoder model
    if encoder_decoder:
        encoder = encoder_decoder_prompt(input_ids, attention_mask, encoder_decoder_inputs, config, model_config,
                                         pad_token_id, eos_ids)
        input_ids, attention_mask = encoder.decoder_input_ids, encoder.decoder_attention_mask
    else:
        input_ids, attention_mask = check_prompt(input_ids, attention_mask, config, vocab_size, pad_token_id, eos_ids,
                                                 stacklevel=stacklevel + 1)
    batch_size, prompt_len = input_ids.shape
    longest_row = int(attention_mask.sum(axis=1).max())
    max_positions = getattr(model_config, "max_position_embeddings", None)
    check_prompt_fits(longest_row, max_positions)
    max_new_tokens = resolve_lengths(config, prompt_len, model_config, call.explicit_max_length)
    if max_positions is not None and longest_row + max_new_tokens > max_positions:
        raise ValueError(
            f"max_new_tokens: the longest prompt has {longest_row} tokens and {max_new_tokens} new tokens were asked "
            f"for, but the model has only {max_positions} positions: at most {max_positions - longest_row} new "
            "tokens fit (or shorten the prompt)."
        )

    row_seeds = check_seed(seed, batch_size, bool(config.do_sample), stacklevel=stacklevel + 1)
    num_return = int(config.num_return_sequences or 1)
    buckets = getattr(model, "generation_buckets", DEFAULT_BUCKETS)
    expanded_batch = batch_size * num_return if strategy.host_expands_return_sequences else batch_size
    encoder_width = None if encoder is None else buckets.prompt_length(encoder.input_ids.shape[1])
    check_request_fits(model, config, mode, buckets.batch(expanded_batch),
                       buckets.prompt_length(prompt_len) + buckets.new_tokens(max_new_tokens), encoder_width)
    host_copies = num_return if strategy.host_expands_return_sequences else 1
    if host_copies > 1:
        input_ids = np.repeat(input_ids, num_return, axis=0)
        attention_mask = np.repeat(attention_mask, num_return, axis=0)
        if encoder is not None:
            encoder = encoder.repeated(num_return)
        copies = np.tile(np.arange(num_return), batch_size)
        row_seeds = derive_seeds(np.repeat(row_seeds, num_return, axis=0), copies).numpy()
        batch_size *= num_return

    padded_batch = buckets.batch(batch_size)
    padded_len = buckets.prompt_length(prompt_len)
    start = padded_len - prompt_len

    ids = np.full((padded_batch, padded_len), pad_token_id, np.int32)
    ids[:batch_size, start:] = input_ids
    mask = np.zeros((padded_batch, padded_len), np.int32)
    mask[:batch_size, start:] = attention_mask
    budgets = np.zeros([padded_batch], np.int32)
    budgets[:batch_size] = max_new_tokens
    seeds = np.zeros([padded_batch, 2], np.int32)
    seeds[:batch_size] = row_seeds
    automaton = constraint_automaton(config, tokenizer, vocab_size)
    knobs = knob_values(config, mode, padded_batch, processors, automaton)

    hidden_states_out, encode_ahead = returned_encoder_states(encoder, config, stacklevel=stacklevel + 1)
    spec = decode_spec(
        config, mode, processors, buffer_new_tokens=buckets.new_tokens(max_new_tokens), knobs=knobs,
        batch_size=padded_batch, prompt_width=padded_len, max_new_tokens=max_new_tokens,
        user_processors=call.user_processors,
        tokenizer=tokenizer, stopping_criteria=call.user_criteria, assistant_model=call.assistant_model,
        encoder_decoder=encoder_decoder, encoder_width=encoder_width,
        encoder_states_given=encode_ahead or getattr(encoder, "states", None) is not None,
    )
    decode_inputs = DecodeInputs(
        input_ids=tf.constant(ids),
        attention_mask=tf.constant(mask),
        start=tf.constant(start, tf.int32),
        prompt_len=tf.constant(prompt_len, tf.int32),
        max_new_tokens=tf.constant(budgets),
        row_seeds=tf.constant(seeds),
        pad_token_id=tf.constant(pad_token_id, tf.int32),
        knobs={name: tf.constant(value) for name, value in knobs.items()},
        encoder=() if encoder is None else padded_encoder_inputs(encoder, padded_batch, encoder_width, pad_token_id),
    )
    return Request(
        spec=spec,
        inputs=decode_inputs,
        batch_size=batch_size,
        start=start,
        prompt_len=prompt_len,
        max_new_tokens=max_new_tokens,
        return_dict=bool(config.return_dict_in_generate),
        max_time=config.max_time,
        automaton=automaton,
        host_copies=host_copies,
        encoder_hidden_states=hidden_states_out,
        encode_ahead=encode_ahead,
    )
