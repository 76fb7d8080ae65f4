"""The request layer: one generate call, resolved and checked before anything compiles.

    config ⊕ options → GenerationConfig.validate() → input checks → buckets → DecodeSpec (static, hashable:
    the program key) + DecodeInputs (tensors: prompt, budgets, seeds, knobs)

`generate()`, streaming, `tfgen.batch` and `tfgen.export` all go through these functions, so the pad-id rule,
the eos vector, the knob values and the program key exist once. See `docs/design.md`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfgen.config.generation_config import GenerationConfig, GenerationMode
from tfgen.decoding.constraints import check_constraint_vocabulary
from tfgen.request.input_checks import check_prompt, check_seed, pop_input_ids, resolve_lengths
from tfgen.decoding.beam import LENGTH_PENALTY_EXPONENT_LIMIT, length_penalty_fits
from tfgen.decoding.state import DecodeInputs
from tfgen.decoding.loop import DecodeSpec
from tfgen.decoding.speculative import check_assisted
from tfgen.decoding.strategies import strategy_for
from tfgen.request.encoder import (
    ENCODER_DECODER_INPUTS,
    encoder_decoder_prompt,
    is_encoder_decoder,
    padded_encoder_inputs,
    refuse_encoder_decoder_inputs,
    returned_encoder_states,
)
from tfgen.config.knobs import KNOBS
from tfgen.logits.from_config import processor_knobs_from_config, processor_spec_from_config
from tfgen.logits.processors import check_user_processors
from tfgen.decoding.random import derive_seeds
from tfgen.request.size import check_request_fits
from tfgen.stopping.stop_strings import stop_string_tables
from tfgen.structured.automaton import constraint_automaton, structured_option
from tfgen.stopping.criteria import check_user_criteria, split_stopping_criteria
from tfgen.config.unsupported import refuse_unsupported

_BEAM_MODES = (GenerationMode.BEAM_SEARCH, GenerationMode.BEAM_SAMPLE, GenerationMode.GROUP_BEAM_SEARCH,
               GenerationMode.CONSTRAINED_BEAM_SEARCH)
# The strategies whose rows carry a structured-output automaton state.
_GRAMMAR_MODES = (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE, GenerationMode.BEAM_SEARCH,
                  GenerationMode.BEAM_SAMPLE, GenerationMode.CONTRASTIVE_SEARCH)
# What encoder-decoder models do not run (yet): drafting needs a decoder-only assistant, constraints HF's scorer.
_NO_ENCODER_MODES = (GenerationMode.ASSISTED_GENERATION, GenerationMode.CONSTRAINED_BEAM_SEARCH)
# generate() keywords that are not GenerationConfig attributes.
MODEL_INPUT_KWARGS = ("input_ids", "attention_mask", *ENCODER_DECODER_INPUTS)


@dataclasses.dataclass(frozen=True)
class BucketPolicy:
    """How request shapes are rounded up so that ragged traffic reuses a handful of compiled programs.

    Batch sizes round up to a power of two up to `batch_step`, then to a multiple of it; prompt lengths and
    new-token budgets round up to multiples of `length_step` / `new_tokens_step`. The padding is exact: extra
    prompt columns are left padding under the attention mask, extra rows are discarded, and the loop stops at
    the real budget (it is a tensor), not at the bucket.
    """

    batch_step: int = 8
    length_step: int = 16
    new_tokens_step: int = 16

    def batch(self, size: int) -> int:
        if size <= self.batch_step:
            return 1 << (size - 1).bit_length()
        return _round_up(size, self.batch_step)

    def prompt_length(self, length: int) -> int:
        return _round_up(length, self.length_step)

    def new_tokens(self, count: int) -> int:
        return _round_up(count, self.new_tokens_step)


EXACT_SHAPES = BucketPolicy(batch_step=1, length_step=1, new_tokens_step=1)
DEFAULT_BUCKETS = BucketPolicy()


def _round_up(value: int, step: int) -> int:
    return max(step, -(-value // step) * step)


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
    max_time: Optional[float] = None
    #: The `regex` / `json_schema` automaton (`tfgen.structured.automaton.TokenAutomaton`), or None.
    automaton: Any = None
    #: Rows the host made of each prompt before the program (`num_return_sequences` of sampling), else 1.
    host_copies: int = 1
    #: An encoder-decoder request asking for `output_hidden_states`: `encoder_hidden_states` to return (HF's tuple of
    #: float32 `[prompts, S, D]`), or None; `encode_ahead`: they are still to be computed (`tfgen.generation.programs.encode_ahead`
    #: runs the encoder before the program and hands it the output).
    encoder_hidden_states: Optional[tuple] = None
    encode_ahead: bool = False

    def with_budgets(self, budgets) -> "Request":
        """The same request with per-row budgets `budgets` int `[batch_size]` (each at most `max_new_tokens`);
        bucket rows keep a budget of 0. E.g. a batch job gives filler rows nothing to generate."""
        budgets = np.asarray(budgets)
        if budgets.shape != (self.batch_size,) or not np.issubdtype(budgets.dtype, np.integer):
            raise ValueError(f"budgets must be integers of shape [{self.batch_size}], got {budgets.dtype} {budgets.shape}")
        if budgets.min() < 0 or budgets.max() > self.max_new_tokens:
            raise ValueError(f"budgets must be in [0, max_new_tokens={self.max_new_tokens}], got {budgets.tolist()}")
        padded = np.zeros([self.spec.batch_size], np.int32)
        padded[: self.batch_size] = budgets
        return dataclasses.replace(self, inputs=self.inputs._replace(max_new_tokens=tf.constant(padded)))


class ResolvedConfig(NamedTuple):
    """The effective config of a call (a copy) and whether the call set `max_length` explicitly."""

    config: GenerationConfig
    explicit_max_length: bool


def base_config(model, generation_config=None) -> GenerationConfig:
    """A copy of `generation_config`, else of the model's `generation_config`, else one from its config."""
    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise TypeError(
            f"generation_config must be a tfgen.GenerationConfig, got {type(generation_config).__name__}."
        )
    base = generation_config or getattr(model, "generation_config", None)
    if base is None:
        base = GenerationConfig.from_model_config(model.config)
    return base.copy()


def resolve_config(
    model, generation_config=None, options: Optional[dict] = None, *, stacklevel: int = 2
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


def pad_token_id_of(config: GenerationConfig, vocab_size: Optional[int] = None) -> int:
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


def knob_values(config: GenerationConfig, mode: GenerationMode, batch_size: int, vocab_size: int,
                automaton=None) -> dict:
    """Every run-time knob of `config`'s decoding in `mode` for `batch_size` rows (numpy arrays): the processors',
    the strategy's, and `automaton`'s tables (`constraint_automaton`: the config's `regex` / `json_schema`)."""
    strategy = strategy_for(mode)
    knobs = {**processor_knobs_from_config(config, batch_size, vocab_size), **strategy.runtime_knobs(config, batch_size)}
    if automaton is not None:
        knobs.update(automaton.knobs())
    return knobs


def knob_layout(knobs: dict) -> tuple:
    """`(name, shape, dtype)` per knob, the batch axis of per-row knobs left out (part of the program key)."""
    return tuple(
        (name, tuple(np.shape(value)[1:] if KNOBS[name].per_row else np.shape(value)), str(np.asarray(value).dtype))
        for name, value in sorted(knobs.items())
    )


def decode_spec(
    config: GenerationConfig,
    mode: GenerationMode,
    vocab_size: int,
    *,
    buffer_new_tokens: int,
    knobs: dict,
    batch_size: Optional[int] = None,
    prompt_width: Optional[int] = None,
    user_processors: Sequence = (),
    processor_overrides: Optional[dict] = None,
    tokenizer=None,
    stopping_criteria: Sequence = (),
    assistant_model=None,
    encoder_decoder: bool = False,
    encoder_width: Optional[int] = None,
    encoder_states_given: bool = False,
) -> DecodeSpec:
    """The program key of `config`'s decoding in `mode` (`config.get_generation_mode()`, computed once by the
    caller: it may warn). `processor_overrides`: `ProcessorSpec` fields forced (an export
    forces the processors whose knobs it takes per request); batch and prompt width None: any (exports).
    `tokenizer` is needed for `config.stop_strings`; `stopping_criteria` are user criteria traced into the loop;
    `assistant_model` drafts for assisted generation (checked by the caller, `check_assisted`). `encoder_decoder`:
    the model has an encoder, whose input is `encoder_width` columns wide (None: any), and whose output comes with the
    inputs when `encoder_states_given`."""
    refuse_unsupported(config, encoder_decoder=encoder_decoder)
    if encoder_decoder and mode in _NO_ENCODER_MODES:
        raise ValueError(f"{mode.value}: tfgen does not run it for encoder-decoder models yet (greedy search, "
                         "sampling, beam search, beam sampling, group beam search and contrastive search it does).")
    stop_strings = _stop_string_tables(config, tokenizer, vocab_size)
    stopping_criteria = check_user_criteria(stopping_criteria)
    processor_spec = processor_spec_from_config(config, vocab_size, num_beams=int(config.num_beams))
    if processor_spec.grammar and mode not in _GRAMMAR_MODES:
        raise ValueError(f"{structured_option(config)}: structured output works with greedy search, sampling, beam "
                         f"search, beam sampling and contrastive search, not with {mode.value.replace('_', ' ')}.")
    if stopping_criteria and mode == GenerationMode.CONSTRAINED_BEAM_SEARCH:
        raise ValueError("stopping_criteria: constrained beam search does not support them (HF applies them to the "
                         "running beams as a whole, not per hypothesis).")
    if (stop_strings is not None or stopping_criteria) and mode == GenerationMode.GROUP_BEAM_SEARCH:
        raise ValueError(
            "stop_strings / stopping_criteria: group beam search does not support them yet (beam search, sampling, "
            "greedy and contrastive search do)."
        )
    strategy = strategy_for(mode)
    static_options = strategy.static_options(config)
    if mode == GenerationMode.CONTRASTIVE_SEARCH and static_options["top_k"] > vocab_size:
        raise ValueError(f"top_k: contrastive search ranks top_k={static_options['top_k']} candidates, more than "
                         f"the vocabulary's {vocab_size} tokens.")
    if mode == GenerationMode.CONSTRAINED_BEAM_SEARCH:
        check_constraint_vocabulary(static_options["constraints"], vocab_size)
    if processor_overrides:
        processor_spec = dataclasses.replace(processor_spec, **processor_overrides)
    user_processors = check_user_processors(user_processors)
    return DecodeSpec(
        mode=mode,
        options=tuple(sorted(static_options.items())),
        buffer_new_tokens=buffer_new_tokens,
        processor_spec=processor_spec,
        knob_layout=knob_layout(knobs),
        batch_size=batch_size,
        prompt_width=prompt_width,
        output_scores=bool(config.output_scores) and bool(config.return_dict_in_generate),
        output_logits=bool(config.output_logits) and bool(config.return_dict_in_generate),
        user_processors=user_processors,
        user_processor_ids=tuple(id(processor) for processor in user_processors),
        stop_strings=stop_strings,
        stopping_criteria=stopping_criteria,
        stopping_criteria_ids=tuple(id(criterion) for criterion in stopping_criteria),
        assistant=assistant_model if mode == GenerationMode.ASSISTED_GENERATION else None,
        assistant_id=id(assistant_model) if mode == GenerationMode.ASSISTED_GENERATION else None,
        encoder_width=encoder_width,
        encoder_states_given=encoder_states_given,
    )


def _stop_string_tables(config: GenerationConfig, tokenizer, vocab_size: int):
    """The matcher tables of `config.stop_strings` (None when unset); ValueError without a tokenizer."""
    if config.stop_strings is None:
        return None
    if tokenizer is None:
        raise ValueError("stop_strings: matching stop strings needs the model's tokenizer; pass tokenizer=.")
    return stop_string_tables(tokenizer, config.stop_strings, vocab_size)


def prepare_request(
    model,
    inputs=None,
    *,
    generation_config: Optional[GenerationConfig] = None,
    logits_processor: Optional[Sequence] = None,
    seed=None,
    tokenizer=None,
    stopping_criteria: Optional[Sequence] = None,
    stacklevel: int = 2,
    **options,
) -> Request:
    """Resolves the config, checks every input and builds the program inputs and key — all before compiling.

    inputs / `input_ids=`: int ids `[batch, prompt_len]`, left padded (may be empty when the model has a
    `bos_token_id`). `attention_mask=`: `[batch, prompt_len]` 0/1, inferred from pad ids like HF when absent.
    seed: None, `[2]` or `[batch, 2]`. tokenizer: the model's `tfgen.Tokenizer`, needed for `stop_strings`.
    stopping_criteria: `tfgen.stopping.criteria` criteria or callables (see there). Other `options` are `GenerationConfig`
    attributes. Bad input raises ValueError / TypeError naming the argument. stacklevel: where warnings point
    (`warnings.warn`'s, counted from this function).
    """
    model_config = model.config
    vocab_size = int(model_config.vocab_size)
    input_ids = pop_input_ids(inputs, options)
    attention_mask = options.pop("attention_mask", None)
    encoder_decoder = is_encoder_decoder(model)
    encoder_decoder_inputs = {name: options.pop(name) for name in ENCODER_DECODER_INPUTS if name in options}
    if not encoder_decoder:
        refuse_encoder_decoder_inputs(encoder_decoder_inputs)
    assistant_model = options.pop("assistant_model", None)
    user_criteria, criteria_options, tokenizer = split_stopping_criteria(
        stopping_criteria, base_config(model, generation_config), options, tokenizer
    )
    options.update(criteria_options)
    config, explicit_max_length = resolve_config(model, generation_config, options, stacklevel=stacklevel + 1)
    mode = config.get_generation_mode(assistant_model)
    if mode == GenerationMode.ASSISTED_GENERATION:
        check_assisted(model, assistant_model, config, logits_processor)
    strategy = strategy_for(mode)
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
    max_new_tokens = resolve_lengths(config, prompt_len, model_config, explicit_max_length)
    longest_row = int(attention_mask.sum(axis=1).max())
    max_positions = getattr(model_config, "max_position_embeddings", None)
    if max_positions is not None and longest_row + max_new_tokens > max_positions:
        raise ValueError(
            f"max_new_tokens: the longest prompt has {longest_row} tokens and {max_new_tokens} new tokens were asked "
            f"for, but the model has only {max_positions} positions."
        )

    if mode in _BEAM_MODES and not bool(length_penalty_fits(config.length_penalty, max_new_tokens)):
        raise ValueError(
            f"length_penalty: {config.length_penalty!r} is too large in magnitude for {max_new_tokens} new tokens: "
            f"length ** length_penalty would leave float32 and every beam would score alike (|length_penalty| × "
            f"ln(max_new_tokens) must stay <= {LENGTH_PENALTY_EXPONENT_LIMIT:g})."
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
    knobs = knob_values(config, mode, padded_batch, vocab_size, automaton)

    hidden_states_out, encode_ahead = returned_encoder_states(encoder, config, stacklevel=stacklevel + 1)
    spec = decode_spec(
        config, mode, vocab_size, buffer_new_tokens=buckets.new_tokens(max_new_tokens), knobs=knobs,
        batch_size=padded_batch, prompt_width=padded_len, user_processors=logits_processor or (),
        tokenizer=tokenizer, stopping_criteria=user_criteria, assistant_model=assistant_model,
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
