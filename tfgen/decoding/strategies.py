"""The table that maps a generation mode to its decoding loop, and what the loop needs from the config.

`generate()` looks the mode up here; adding a strategy means adding an entry, not editing generate().
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from tfgen.config import GenerationConfig, GenerationMode
from tfgen.decoding.beam import (
    beam_knobs,
    beam_options,
    decode_beam_search,
    decode_group_beam_search,
    group_beam_knobs,
    group_beam_options,
)
from tfgen.decoding.contrastive import contrastive_knobs, contrastive_options, decode_contrastive_search
from tfgen.decoding.sampling import decode_greedy_or_sample


def _no_options(config: GenerationConfig) -> dict:
    return {}


def _no_knobs(config: GenerationConfig, batch_size: int) -> dict[str, np.ndarray]:
    return {}


@dataclasses.dataclass(frozen=True)
class Strategy:
    """How one generation mode runs.

    decode: `decode(model, inputs: DecodeInputs, *, buffer_new_tokens, processor_spec, user_processors,
        output_scores, output_logits, **static_options) -> dict` of tensors. Required keys: `sequences` int32
        `[B * rows_per_prompt, T + buffer_new_tokens]` (rows grouped by prompt) and `steps` int32 scalar. Optional:
        `scores` / `logits` float32 `[buffer_new_tokens, B * k, V]`, `sequences_scores` float32
        `[B * rows_per_prompt]`, `beam_indices` int32 `[B * rows_per_prompt, buffer_new_tokens]`.
    static_options: config -> dict of hashable values passed to `decode` as keywords (part of the program key).
    runtime_knobs: (config, batch_size) -> dict of per-row numpy arrays `[batch_size, ...]` merged into
        `inputs.knobs` (values that must not recompile, e.g. `length_penalty`).
    host_expands_return_sequences: True when generate() repeats each prompt `num_return_sequences` times before
        decoding (independent samples); False when `decode` itself returns `num_return_sequences` rows per prompt.
    """

    decode: Callable[..., dict]
    static_options: Callable[[GenerationConfig], dict] = _no_options
    runtime_knobs: Callable[[GenerationConfig, int], dict] = _no_knobs
    host_expands_return_sequences: bool = False


STRATEGIES: dict[GenerationMode, Strategy] = {
    GenerationMode.GREEDY_SEARCH: Strategy(
        decode=decode_greedy_or_sample,
        static_options=lambda config: {"do_sample": False},
        host_expands_return_sequences=True,
    ),
    GenerationMode.SAMPLE: Strategy(
        decode=decode_greedy_or_sample,
        static_options=lambda config: {"do_sample": True},
        host_expands_return_sequences=True,
    ),
    GenerationMode.BEAM_SEARCH: Strategy(
        decode=decode_beam_search, static_options=beam_options, runtime_knobs=beam_knobs
    ),
    GenerationMode.BEAM_SAMPLE: Strategy(
        decode=decode_beam_search, static_options=beam_options, runtime_knobs=beam_knobs
    ),
    GenerationMode.GROUP_BEAM_SEARCH: Strategy(
        decode=decode_group_beam_search, static_options=group_beam_options, runtime_knobs=group_beam_knobs
    ),
    GenerationMode.CONTRASTIVE_SEARCH: Strategy(
        decode=decode_contrastive_search, static_options=contrastive_options, runtime_knobs=contrastive_knobs
    ),
}
