"""The program key of a request: `decode_spec` (the static, hashable `DecodeSpec` that selects one compiled program)
and the run-time knob values beside it (`knob_values`), each option and ability checked against what the mode's
strategy declares (`tfgen.decoding.strategies`). `generate()` (through `tfgen.request.prepare`) and the export build
their programs' keys here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tfgen.config.generation_config import GenerationConfig, GenerationMode
from tfgen.config.knobs import KNOBS
from tfgen.config.unsupported import refuse_unsupported
from tfgen.decoding.loop import DecodeSpec
from tfgen.decoding.strategies import DecodingStrategy, StrategyRequest, described, modes_that, strategy_for
from tfgen.logits.pipeline import ResolvedProcessors, check_user_processors
from tfgen.stopping.criteria import check_user_criteria
from tfgen.stopping.stop_strings import stop_string_tables
from tfgen.structured.automaton import structured_option


def knob_values(config: GenerationConfig, mode: GenerationMode, batch_size: int, processors: ResolvedProcessors,
                automaton=None) -> dict:
    """Every run-time knob of `config`'s decoding in `mode` for `batch_size` rows (numpy arrays): the processors'
    (`processors`, `resolve_processors` of the config), the strategy's, and `automaton`'s tables
    (`constraint_automaton`: the config's `regex` / `json_schema`)."""
    knobs = {**processors.knobs(batch_size), **strategy_for(mode).runtime_knobs(config, batch_size)}
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
    processors: ResolvedProcessors,
    *,
    buffer_new_tokens: int,
    knobs: dict,
    batch_size: int | None = None,
    prompt_width: int | None = None,
    max_new_tokens: int | None = None,
    user_processors: Sequence = (),
    processor_overrides: dict | None = None,
    tokenizer=None,
    stopping_criteria: Sequence = (),
    assistant_model=None,
    encoder_decoder: bool = False,
    encoder_width: int | None = None,
    encoder_states_given: bool = False,
) -> DecodeSpec:
    """The program key of `config`'s decoding in `mode` (`config.get_generation_mode()`, computed once by the
    caller: it may warn) with `processors` (`resolve_processors` of the config). Refuses, naming the option, what the
    mode's strategy declares it cannot do (`tfgen.decoding.strategies`) and what its own checks refuse
    (`max_new_tokens`: the budget asked for, None in an export). `processor_overrides`: processors forced to static
    values (`ProcessorSpec.forced`: an export forces the processors whose knobs it takes per request); batch and
    prompt width None: any (exports). `tokenizer` is needed for `config.stop_strings`; `stopping_criteria` are user
    criteria traced into the loop; `assistant_model` drafts for assisted generation (checked by the caller, the
    strategy's `check_model`). `encoder_decoder`: the model has an encoder, whose input is `encoder_width` columns
    wide (None: any), and whose output comes with the inputs when `encoder_states_given`."""
    vocab_size = processors.env.vocab_size
    strategy = strategy_for(mode)
    refuse_unsupported(config, encoder_decoder=encoder_decoder)
    _refuse_what_the_strategy_cannot(strategy, mode, config, encoder_decoder=encoder_decoder,
                                     stop_strings=config.stop_strings is not None,
                                     stopping_criteria=bool(stopping_criteria))
    stop_strings = _stop_string_tables(config, tokenizer, vocab_size)
    stopping_criteria = check_user_criteria(stopping_criteria)
    static_options = strategy.static_options(config)
    strategy.check(StrategyRequest(config, static_options, vocab_size, max_new_tokens))
    processor_spec = processors.spec.forced(processor_overrides) if processor_overrides else processors.spec
    user_processors = check_user_processors(user_processors)
    assisted = mode == GenerationMode.ASSISTED_GENERATION
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
        assistant=assistant_model if assisted else None,
        assistant_id=id(assistant_model) if assisted else None,
        encoder_width=encoder_width,
        encoder_states_given=encoder_states_given,
    )


def _refuse_what_the_strategy_cannot(strategy: DecodingStrategy, mode: GenerationMode, config: GenerationConfig, *,
                                     encoder_decoder: bool, stop_strings: bool, stopping_criteria: bool) -> None:
    """ValueError, naming the option, for what `mode`'s strategy declares it cannot do."""
    if encoder_decoder and not strategy.encoder_decoder:
        raise ValueError(f"{mode.value}: tfgen does not run it for encoder-decoder models yet "
                         f"({described(modes_that(lambda s: s.encoder_decoder))} it does).")
    refused = [name for name, given, able in (("stop_strings", stop_strings, strategy.stop_strings),
                                              ("stopping_criteria", stopping_criteria, strategy.stopping_criteria))
               if given and not able]
    if refused:
        raise ValueError(f"{' / '.join(refused)}: {described([mode])} does not support them: {strategy.limits}.")
    option = structured_option(config)
    if option is not None and not strategy.grammar:
        raise ValueError(f"{option}: structured output works with {described(modes_that(lambda s: s.grammar))}, not "
                         f"with {described([mode])}.")


def _stop_string_tables(config: GenerationConfig, tokenizer, vocab_size: int):
    """The matcher tables of `config.stop_strings` (None when unset); ValueError without a tokenizer."""
    if config.stop_strings is None:
        return None
    if tokenizer is None:
        raise ValueError("stop_strings: matching stop strings needs the model's tokenizer; pass tokenizer=.")
    return stop_string_tables(tokenizer, config.stop_strings, vocab_size)
