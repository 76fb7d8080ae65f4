"""What each decoding strategy is and can do, declared once (`DecodingStrategy`, one entry per generation mode in
`STRATEGIES`): its loop class, its static options and run-time knobs, how many cache rows it keeps per prompt, and its
abilities — structured output, encoder-decoder models, stop strings, stopping criteria, streaming, export, continuous
batching — with its own checks. The request layer, the size check, streaming, the export and the server read these
declarations; none of them keeps lists of modes. Adding a strategy is its loop class and an entry here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from tfgen.config.generation_config import GenerationConfig, GenerationMode
from tfgen.decoding.beam import (
    LENGTH_PENALTY_EXPONENT_LIMIT,
    BeamSearchLoop,
    beam_knobs,
    beam_options,
    length_penalty_fits,
)
from tfgen.decoding.constrained_beam import ConstrainedBeamSearchLoop, constrained_options
from tfgen.decoding.constraints import check_constraint_vocabulary
from tfgen.decoding.contrastive import ContrastiveSearchLoop, contrastive_knobs, contrastive_options
from tfgen.decoding.group_beam import GroupBeamSearchLoop, group_beam_knobs, group_beam_options
from tfgen.decoding.loop import DecodeSpec, DecodingLoop
from tfgen.decoding.sampling import GreedyOrSampleLoop
from tfgen.decoding.speculative import SpeculativeLoop, assisted_options, check_assisted


class StrategyRequest(NamedTuple):
    """What a strategy's own checks see of a request: its config, the strategy's static options, the vocabulary
    size, and the new tokens asked for (None where unknown: an export checks them per request in its graph)."""

    config: GenerationConfig
    options: dict
    vocab_size: int
    max_new_tokens: int | None = None


def _no_knobs(config: GenerationConfig, batch_size: int) -> dict[str, np.ndarray]:
    return {}


def _no_check(request: StrategyRequest) -> None:
    return None


def _one_row(config: GenerationConfig) -> int:
    return 1


@dataclasses.dataclass(frozen=True)
class DecodingStrategy:
    """How one generation mode runs, and what it can do.

    loop: the `DecodingLoop` subclass, built as `loop(model, spec)` inside the program.
    static_options: config -> dict of hashable values (part of the program key, `DecodeSpec.options`); raises
        ValueError for options the strategy refuses.
    runtime_knobs: (config, batch_size) -> dict of numpy knob values (declared in `tfgen.config.knobs`) merged into
        `DecodeInputs.knobs`: values that must not recompile, e.g. `length_penalty`.
    host_expands_return_sequences: True when the request layer repeats each prompt `num_return_sequences` times
        before decoding (independent samples); False when the loop itself returns that many rows per prompt.
    cache_rows_per_prompt: config -> how many cache rows the loop keeps per prompt, for the up-front memory check;
        `rows_named` says what they are ("beams (num_beams)").
    check: its own checks of a request (`StrategyRequest`), before compiling; ValueError naming the option.
    check_model: (model, assistant_model, config, user_processors) -> None, checks of the models themselves.
    grammar: rows carry a structured-output automaton state (`regex` / `json_schema`).
    encoder_decoder: runs encoder-decoder models (T5).
    stop_strings / stopping_criteria: honours them; `limits` says why not where it does not.
    streamable: produces one token per row per step, so `generate(..., streamer=...)` runs it in chunks.
    exportable: config -> whether `tfgen export` writes a signature decoding this way with that config (None: never).
    slot_sampling: the `do_sample` of its rows in the continuous-batching engine (`tfgen.engine`), or None when the
        engine does not run it (its requests run as whole calls).
    """

    loop: type[DecodingLoop]
    static_options: Callable[[GenerationConfig], dict]
    runtime_knobs: Callable[[GenerationConfig, int], dict] = _no_knobs
    host_expands_return_sequences: bool = False
    cache_rows_per_prompt: Callable[[GenerationConfig], int] = _one_row
    rows_named: str = "rows"
    check: Callable[[StrategyRequest], None] = _no_check
    check_model: Callable | None = None
    grammar: bool = False
    encoder_decoder: bool = True
    stop_strings: bool = True
    stopping_criteria: bool = True
    limits: str = ""
    streamable: bool = False
    exportable: Callable[[GenerationConfig], bool] | None = None
    slot_sampling: bool | None = None

    def make_loop(self, model, spec: DecodeSpec) -> DecodingLoop:
        return self.loop(model, spec)


def _beams(config: GenerationConfig) -> int:
    return int(config.num_beams)


def _length_penalty_fits(request: StrategyRequest) -> None:
    """Beam strategies: `length ** length_penalty` must stay within float32 for every length up to the budget."""
    if request.max_new_tokens is not None and not bool(
            length_penalty_fits(request.config.length_penalty, request.max_new_tokens)):
        raise ValueError(
            f"length_penalty: {request.config.length_penalty!r} is too large in magnitude for {request.max_new_tokens} "
            "new tokens: length ** length_penalty would leave float32 and every beam would score alike "
            f"(|length_penalty| × ln(max_new_tokens) must stay <= {LENGTH_PENALTY_EXPONENT_LIMIT:g})."
        )


def _candidates_fit(request: StrategyRequest) -> None:
    top_k = request.options["top_k"]
    if top_k > request.vocab_size:
        raise ValueError(f"top_k: contrastive search ranks top_k={top_k} candidates, more than the vocabulary's "
                         f"{request.vocab_size} tokens.")


def _constraints_fit(request: StrategyRequest) -> None:
    _length_penalty_fits(request)
    check_constraint_vocabulary(request.options["constraints"], request.vocab_size)


def _always(config: GenerationConfig) -> bool:
    return True


_BEAM = dict(cache_rows_per_prompt=_beams, rows_named="beams (num_beams)", check=_length_penalty_fits)

STRATEGIES: dict[GenerationMode, DecodingStrategy] = {
    GenerationMode.GREEDY_SEARCH: DecodingStrategy(
        GreedyOrSampleLoop, lambda config: {"do_sample": False}, host_expands_return_sequences=True, grammar=True,
        streamable=True, exportable=_always, slot_sampling=False,
    ),
    GenerationMode.SAMPLE: DecodingStrategy(
        GreedyOrSampleLoop, lambda config: {"do_sample": True}, host_expands_return_sequences=True, grammar=True,
        streamable=True, exportable=_always, slot_sampling=True,
    ),
    GenerationMode.BEAM_SEARCH: DecodingStrategy(BeamSearchLoop, beam_options, beam_knobs, grammar=True,
                                                 exportable=_always, **_BEAM),
    GenerationMode.BEAM_SAMPLE: DecodingStrategy(BeamSearchLoop, beam_options, beam_knobs, grammar=True, **_BEAM),
    GenerationMode.GROUP_BEAM_SEARCH: DecodingStrategy(
        GroupBeamSearchLoop, group_beam_options, group_beam_knobs, stop_strings=False, stopping_criteria=False,
        limits="not yet (beam search, sampling, greedy and contrastive search do)", **_BEAM,
    ),
    GenerationMode.CONSTRAINED_BEAM_SEARCH: DecodingStrategy(
        ConstrainedBeamSearchLoop, constrained_options, beam_knobs,
        **{**_BEAM, "check": _constraints_fit}, encoder_decoder=False, stop_strings=False, stopping_criteria=False,
        limits="HF applies them to the running beams as a whole, not per hypothesis",
    ),
    GenerationMode.CONTRASTIVE_SEARCH: DecodingStrategy(
        ContrastiveSearchLoop, contrastive_options, contrastive_knobs,
        cache_rows_per_prompt=lambda config: int(config.top_k), rows_named="candidates (top_k)",
        check=_candidates_fit, grammar=True, streamable=True, exportable=_always,
    ),
    # Drafting needs a decoder-only assistant; an export drafts by prompt lookup only.
    GenerationMode.ASSISTED_GENERATION: DecodingStrategy(
        SpeculativeLoop, assisted_options, host_expands_return_sequences=True, check_model=check_assisted,
        encoder_decoder=False, streamable=True,
        exportable=lambda config: config.prompt_lookup_num_tokens is not None,
    ),
}


def described(modes) -> str:
    """The modes' names as words, e.g. "greedy search, sampling and beam search"."""
    named = {"sample": "sampling", "beam_sample": "beam sampling"}
    words = [named.get(mode.value, mode.value.replace("_", " ")) for mode in modes]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def modes_that(ability: Callable[[DecodingStrategy], bool]) -> list[GenerationMode]:
    """The modes whose strategy has `ability`, in declaration order."""
    return [mode for mode, strategy in STRATEGIES.items() if ability(strategy)]


def strategy_for(mode: GenerationMode) -> DecodingStrategy:
    """The declaration of `mode`; ValueError naming the available modes when there is none."""
    strategy = STRATEGIES.get(mode)
    if strategy is None:
        raise ValueError(
            f"generation mode {mode.value!r} is not available; these are: {', '.join(m.value for m in STRATEGIES)}."
        )
    return strategy


def make_loop(model, spec: DecodeSpec) -> DecodingLoop:
    """The decoding loop of `spec.mode` for `model`."""
    return strategy_for(spec.mode).make_loop(model, spec)
