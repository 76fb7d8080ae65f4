"""The logits pipeline of a program: which declared processors a config switches on (`resolve_processors`: the
static `ProcessorSpec` and the run-time knob values, validated once), and running them in order
(`apply_processors`): HF's processors, the caller's `logits_processor`s, the structured-output mask, the sampling
warpers, the final renormalisation.

Which processors run follows HF transformers 4.55.4's `GenerationMixin._get_logits_processor`; options HF would reject
when it builds a processor are rejected here (ValueError) before anything is compiled. Reading a config is plain
Python and numpy: the knob arrays are fed to the compiled program, which never sees the config.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tfgen.config.knobs import padded_token_ids
from tfgen.logits.context import NEG_INF, ProcessorContext, read_knob
from tfgen.logits.grammar import GRAMMAR
from tfgen.logits.processors import PROCESSORS, RENORMALIZE
from tfgen.logits.spec import BuildEnv, Processor, ProcessorSpec, option, token_ids
from tfgen.logits.warpers import WARPERS, apply_warpers
from tfgen.value_types import check_callables

#: Every built-in processor, in pipeline order (the caller's processors run between the "processor" and "mask"
#: stages).
PIPELINE: tuple[Processor, ...] = (*PROCESSORS, GRAMMAR, *WARPERS, RENORMALIZE)
_BY_STAGE = {stage: tuple(p for p in PIPELINE if p.stage == stage) for stage in ("processor", "mask", "final")}


class LogitsProcessor:
    """Base class for user processors run inside the compiled loop, after the built-in ones, before the warpers.

    `__call__(input_ids, scores, cur_len)` gets the whole token buffer `input_ids` int32 [B, L], `scores`
    float32 [B, V] and `cur_len`, an int32 scalar tensor: the buffer index of the token being chosen (columns
    from `cur_len` on are unwritten). It returns float32 [B, V] and must use TF ops only (it is traced).
    """

    def __call__(self, input_ids: tf.Tensor, scores: tf.Tensor, cur_len: tf.Tensor) -> tf.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(input_ids, scores, cur_len)")


# ----------------------------------------------------------------------------------------------------------
# Config -> spec and knobs


class ResolvedProcessors(NamedTuple):
    """A config's processors, read and validated once: `spec` (static) and each processor's value (`values`, None
    when off), from which `knobs(batch_size)` fills the run-time inputs."""

    spec: ProcessorSpec
    values: dict[str, Any]
    env: BuildEnv

    def knobs(self, batch_size: int) -> dict[str, np.ndarray]:
        """The run-time values of every processor for `batch_size` rows, as numpy arrays (neutral where an option is
        off; dtypes, neutral values and which knobs are per row from `tfgen.config.knobs`), with the eos ids
        (`eos_token_ids` int32 `[E]`, E a positive multiple of 4, -1 pads)."""
        knobs = {"eos_token_ids": padded_token_ids(self.env.eos_ids)}
        for processor in PIPELINE:
            knobs.update(processor.knobs(self.values[processor.name], batch_size, self.env))
        return knobs


def resolve_processors(config, vocab_size: int, *, num_beams: int = 1) -> ResolvedProcessors:
    """The processor pipeline HF 4.55.4's `_get_logits_processor` builds for `config` (HF attribute names; any
    object with them; `eos_token_id` an int, list or None). Warpers only with `do_sample`; processors of presence
    "always" (and "sampling", when sampling) are in the program with neutral knobs when the config leaves them off.
    Raises ValueError for invalid values, naming the option."""
    do_sample = bool(option(config, "do_sample"))
    env = BuildEnv(vocab_size, token_ids(option(config, "eos_token_id"), "eos_token_id", vocab_size), do_sample,
                   int(num_beams))
    values = {processor.name: processor.read(config, env) for processor in PIPELINE}

    def is_on(processor: Processor) -> bool:
        if processor.presence == "always" or (processor.presence == "sampling" and do_sample):
            return True
        return values[processor.name] is not None and (do_sample or not processor.warper)

    active = tuple(sorted((p.name, p.static(values[p.name], env)) for p in PIPELINE if is_on(p)))
    # Only the warpers read min_tokens_to_keep: it stays 1 (one program key) unless sampling beams.
    return ResolvedProcessors(ProcessorSpec(active, env.min_tokens_to_keep), values, env)


# ----------------------------------------------------------------------------------------------------------
# Running the pipeline


def check_user_processors(user_processors) -> tuple:
    """`user_processors` as a tuple; TypeError unless each entry is a callable instance."""
    return check_callables(
        user_processors, "logits_processor",
        "LogitsProcessor instances or callables (input_ids, scores, cur_len) -> scores",
    )


def _user_processed(index: int, processor, sequences: tf.Tensor, scores: tf.Tensor, cur_len) -> tf.Tensor:
    """`processor(sequences, scores, cur_len)` as float32 scores of `scores`' shape; an exception while tracing it,
    or a result of another shape or a non-float dtype, is an error naming `logits_processor[index]` (a wrong
    shape would otherwise broadcast into garbage)."""
    where = f"logits_processor[{index}] ({getattr(processor, '__name__', type(processor).__name__)})"
    try:
        result = processor(sequences, scores, cur_len)
    except Exception as error:  # noqa: BLE001 (any failure of user code is reported as that code's)
        raise TypeError(f"{where} raised {type(error).__name__} while generate traced it: {error}") from error
    try:
        result = tf.convert_to_tensor(result)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{where} must return scores as a float tensor, got {type(result).__name__}") from error
    if not result.dtype.is_floating:
        raise TypeError(f"{where} must return float scores, got dtype {result.dtype.name}")
    if result.shape.rank != 2 or not result.shape.is_compatible_with(scores.shape):
        raise ValueError(f"{where} must return scores of shape {scores.shape} [batch, vocab] like its input, "
                         f"got {result.shape}")
    return tf.cast(result, tf.float32)


class SamplingCandidates(NamedTuple):
    """The tokens a draw from processed scores can pick, when top-k filtering narrows them down.

    ids: int32 [B, top_k_cap], per row the ids of its `top_k_cap` best scores, in ascending id order (so a
        cumulative sum over them runs in vocabulary order).
    complete: bool scalar, whether `ids` hold every finite score of every row (false when some row keeps more,
        e.g. no top-k for that row or ties at the cut). Only then may a sampler ignore the other columns.
    """

    ids: tf.Tensor
    complete: tf.Tensor


def _run_stage(stage: str, spec: ProcessorSpec, scores: tf.Tensor, ctx: ProcessorContext, knobs) -> tf.Tensor:
    for processor in _BY_STAGE[stage]:
        if spec.is_on(processor.name):
            scores = processor.apply(spec.static(processor.name), scores, ctx, knobs)
    return scores


def apply_processors(
    spec: ProcessorSpec,
    scores: tf.Tensor,
    ctx: ProcessorContext,
    knobs,
    user_processors: Sequence[Callable] = (),
    *,
    return_candidates: bool = False,
):
    """Runs the pipeline `spec` describes on next-token `scores` float32 [B, V] (V static), in HF's order:
    built-in processors, then `user_processors` (called as `(ctx.sequences, scores, ctx.start + ctx.cur_len)`),
    then the structured-output mask, the warpers, then `renormalize_logits`. `knobs` maps knob names to tensors or
    arrays; only the enabled processors' knobs are read. Returns float32 [B, V]; with `return_candidates`,
    `(scores, SamplingCandidates or None)` — None unless top-k ran over part of the vocabulary — so that sampling
    can draw from `top_k_cap` columns instead of all V."""
    user_processors = check_user_processors(user_processors)
    scores = tf.convert_to_tensor(scores, tf.float32)
    if scores.shape[-1] is None:
        raise ValueError("scores must have a static vocabulary dimension")
    scores = _run_stage("processor", spec, scores, ctx, knobs)
    for index, processor in enumerate(user_processors):
        scores = _user_processed(index, processor, ctx.sequences, scores, ctx.start + ctx.cur_len)
    scores = _run_stage("mask", spec, scores, ctx, knobs)
    scores, candidates = apply_warpers(spec, scores, knobs)
    scores = _run_stage("final", spec, scores, ctx, knobs)
    if not return_candidates:
        return scores
    if candidates is None:
        return scores, None
    # Every finite score ranks among the top `cap` exactly when a row has at most `cap` of them.
    finite_counts = tf.reduce_sum(tf.cast(scores > NEG_INF, tf.int32), axis=-1)
    # Without any top-k row the warpers skip the ranking, and the ids are placeholders.
    some_top_k = tf.reduce_any(read_knob(knobs, "top_k", tf.int32) > 0)
    complete = tf.reduce_all(finite_counts <= candidates.shape[-1]) & some_top_k
    return scores, SamplingCandidates(tf.sort(candidates, axis=-1), complete)
