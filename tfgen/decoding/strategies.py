"""The table that maps a generation mode to its decoding loop, and what the loop needs from the config.

The request layer looks the mode up here; adding a strategy means adding a `DecodingLoop` subclass and an entry,
not editing `generate()`, streaming, batch or export.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from tfgen.config.generation_config import GenerationConfig, GenerationMode
from tfgen.decoding.beam import BeamSearchLoop, beam_knobs, beam_options
from tfgen.decoding.constrained_beam import ConstrainedBeamSearchLoop, constrained_options
from tfgen.decoding.contrastive import ContrastiveSearchLoop, contrastive_knobs, contrastive_options
from tfgen.decoding.group_beam import GroupBeamSearchLoop, group_beam_knobs, group_beam_options
from tfgen.decoding.loop import DecodeSpec, DecodingLoop
from tfgen.decoding.sampling import GreedyOrSampleLoop
from tfgen.decoding.speculative import SpeculativeLoop, assisted_options


def _beams(config: GenerationConfig) -> int:
    return int(config.num_beams)


def _no_knobs(config: GenerationConfig, batch_size: int) -> dict[str, np.ndarray]:
    return {}


@dataclasses.dataclass(frozen=True)
class Strategy:
    """How one generation mode runs.

    loop: the `DecodingLoop` subclass, built as `loop(model, spec)` inside the program.
    static_options: config -> dict of hashable values (part of the program key, `DecodeSpec.options`).
    runtime_knobs: (config, batch_size) -> dict of numpy knob values (declared in `tfgen.config.knobs`) merged into
        `DecodeInputs.knobs`: values that must not recompile, e.g. `length_penalty`.
    host_expands_return_sequences: True when the request layer repeats each prompt `num_return_sequences` times
        before decoding (independent samples); False when the loop itself returns that many rows per prompt.
    cache_rows_per_prompt: config -> how many cache rows the loop keeps per prompt (beams, contrastive
        candidates), for the up-front memory estimate.
    """

    loop: type[DecodingLoop]
    static_options: Callable[[GenerationConfig], dict]
    runtime_knobs: Callable[[GenerationConfig, int], dict] = _no_knobs
    host_expands_return_sequences: bool = False
    cache_rows_per_prompt: Callable[[GenerationConfig], int] = lambda config: 1

    def make_loop(self, model, spec: DecodeSpec) -> DecodingLoop:
        return self.loop(model, spec)


STRATEGIES: dict[GenerationMode, Strategy] = {
    GenerationMode.GREEDY_SEARCH: Strategy(
        GreedyOrSampleLoop, lambda config: {"do_sample": False}, host_expands_return_sequences=True
    ),
    GenerationMode.SAMPLE: Strategy(
        GreedyOrSampleLoop, lambda config: {"do_sample": True}, host_expands_return_sequences=True
    ),
    GenerationMode.BEAM_SEARCH: Strategy(BeamSearchLoop, beam_options, beam_knobs, cache_rows_per_prompt=_beams),
    GenerationMode.BEAM_SAMPLE: Strategy(BeamSearchLoop, beam_options, beam_knobs, cache_rows_per_prompt=_beams),
    GenerationMode.GROUP_BEAM_SEARCH: Strategy(
        GroupBeamSearchLoop, group_beam_options, group_beam_knobs, cache_rows_per_prompt=_beams
    ),
    GenerationMode.CONSTRAINED_BEAM_SEARCH: Strategy(
        ConstrainedBeamSearchLoop, constrained_options, beam_knobs, cache_rows_per_prompt=_beams
    ),
    GenerationMode.CONTRASTIVE_SEARCH: Strategy(
        ContrastiveSearchLoop, contrastive_options, contrastive_knobs,
        cache_rows_per_prompt=lambda config: int(config.top_k),
    ),
    GenerationMode.ASSISTED_GENERATION: Strategy(
        SpeculativeLoop, assisted_options, host_expands_return_sequences=True
    ),
}


def strategy_for(mode: GenerationMode) -> Strategy:
    """The table's entry for `mode`; ValueError naming the available modes when there is none."""
    strategy = STRATEGIES.get(mode)
    if strategy is None:
        raise ValueError(
            f"generation mode {mode.value!r} is not available; these are: {', '.join(m.value for m in STRATEGIES)}."
        )
    return strategy


def make_loop(model, spec: DecodeSpec) -> DecodingLoop:
    """The decoding loop of `spec.mode` for `model`."""
    return strategy_for(spec.mode).make_loop(model, spec)
