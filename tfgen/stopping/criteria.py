"""Stopping criteria, with HF transformers' names, and how each runs inside (or around) the compiled loop.

- `stop_strings` (or `StopStringCriteria`): tables precomputed from the vocabulary (`tfgen.stopping.stop_strings`),
tested
  on each row's last tokens inside the loop after every step.
- `max_time` (or `MaxTimeCriteria`): wall time of the call, checked by the host between compiled chunks (a
  program cannot read a clock under XLA); rows still running are then given one last step, as HF's criterion
  stops them after the step it fires on.
- `max_length` / `eos_token_id` (`MaxLengthCriteria`, `EosTokenCriteria`): the loop's budgets and eos ids.
- any other callable `criterion(input_ids, scores) -> bool [rows]`: traced into the loop like a user logits
  processor, called after every step with `input_ids` int32 `[rows, L]` — each row's tokens right-aligned, the
  newest last, `pad_token_id` before the row's text (so `input_ids[:, -k:]` are the last k tokens, as in HF) — and
  `scores` float32 `[rows, V]`, the step's processed scores (None in beam search, which tests candidates).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tfgen.stopping.stop_strings import StopStringTables, stop_string_hits, stop_string_tables, tail_window
from tfgen.value_types import check_callables


class StoppingCriteria:
    """Base class of user stopping criteria run inside the compiled loop (TF ops only; see the module doc)."""

    def __call__(self, input_ids: tf.Tensor, scores: tf.Tensor | None, **kwargs) -> tf.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(input_ids, scores) -> bool [rows]")


class StoppingCriteriaList(list):
    """A list of criteria; calling it ORs theirs (a row stops when any criterion says so)."""

    def __call__(self, input_ids, scores, **kwargs) -> tf.Tensor:
        done = tf.zeros([tf.shape(input_ids)[0]], tf.bool)
        for criterion in self:
            done = done | tf.cast(criterion(input_ids, scores, **kwargs), tf.bool)
        return done


class MaxLengthCriteria(StoppingCriteria):
    """Stops once a row holds `max_length` tokens (prompt included). In `generate` it is the `max_length` option."""

    def __init__(self, max_length: int, max_position_embeddings: int | None = None):
        self.max_length = max_length
        self.max_position_embeddings = max_position_embeddings

    def __call__(self, input_ids, scores, **kwargs) -> tf.Tensor:
        return tf.fill([tf.shape(input_ids)[0]], tf.shape(input_ids)[1] >= self.max_length)


class MaxTimeCriteria(StoppingCriteria):
    """Stops once `max_time` seconds passed since `initial_timestamp` (default: now). In `generate` it is the
    `max_time` option, checked by the host between compiled chunks."""

    def __init__(self, max_time: float, initial_timestamp: float | None = None):
        self.max_time = max_time
        self.initial_timestamp = time.time() if initial_timestamp is None else initial_timestamp

    def __call__(self, input_ids, scores, **kwargs) -> tf.Tensor:
        return tf.fill([tf.shape(input_ids)[0]], time.time() - self.initial_timestamp > self.max_time)


class EosTokenCriteria(StoppingCriteria):
    """Stops a row whose newest token is one of `eos_token_id`. In `generate` its ids join the eos ids."""

    def __init__(self, eos_token_id):
        ids = np.atleast_1d(np.asarray(eos_token_id.numpy() if isinstance(eos_token_id, tf.Tensor) else eos_token_id))
        self.eos_token_id = [int(token) for token in ids]

    def __call__(self, input_ids, scores, **kwargs) -> tf.Tensor:
        return tf.reduce_any(input_ids[:, -1:] == tf.constant(self.eos_token_id, input_ids.dtype), axis=-1)


class StopStringCriteria(StoppingCriteria):
    """Stops a row whose decoded text ends with one of `stop_strings` (HF's rules: the string may span several
    tokens, start inside the first of them or end inside the last). In `generate` it is the `stop_strings` option
    with `tokenizer=`."""

    def __init__(self, tokenizer, stop_strings: str | Sequence[str]):
        self.tokenizer = tokenizer
        self.stop_strings = stop_strings
        self.tables = stop_string_tables(tokenizer, stop_strings)

    def __call__(self, input_ids, scores, **kwargs) -> tf.Tensor:
        return stop_string_hits(self.tables, input_ids)


def check_user_criteria(criteria) -> tuple:
    """`criteria` as a tuple of callables; TypeError naming `stopping_criteria` otherwise."""
    return check_callables(
        criteria, "stopping_criteria", "StoppingCriteria instances or callables (input_ids, scores) -> bool [rows]"
    )


def stopped_rows(
    stop_strings: StopStringTables | None,
    user_criteria: tuple,
    sequences: tf.Tensor,
    end_index,
    first_valid,
    pad_token_id,
    scores: tf.Tensor | None,
) -> tf.Tensor | None:
    """bool `[R]`: rows of `sequences` (int32 `[R, L]`, newest token at column `end_index`, the row's text from
    column `first_valid`) that a stop string or a user criterion stops; None when there is nothing to test."""
    stopped = None
    if stop_strings is not None:
        tail = tail_window(sequences, end_index, first_valid, stop_strings.max_token_len)
        stopped = stop_string_hits(stop_strings, tail)
    if user_criteria:
        width = sequences.shape[1]
        window = tail_window(sequences, end_index, first_valid, width)
        input_ids = tf.where(window < 0, tf.cast(pad_token_id, tf.int32), window)
        for criterion in user_criteria:
            hit = tf.convert_to_tensor(criterion(input_ids, scores))
            if hit.shape.rank != 1 or (hit.shape[0] is not None and sequences.shape[0] is not None
                                        and hit.shape[0] != sequences.shape[0]):
                raise ValueError(
                    f"stopping_criteria: {criterion!r} returned shape {hit.shape}; it must return one bool per row "
                    f"[{sequences.shape[0]}]"
                )
            hit = tf.cast(hit, tf.bool)
            stopped = hit if stopped is None else stopped | hit
    return stopped


def split_stopping_criteria(stopping_criteria, config, options: dict, tokenizer) -> tuple[tuple, dict, object]:
    """Sorts `generate(stopping_criteria=...)`: tfgen's built-in criteria become the options they stand for
    (`MaxTimeCriteria` -> max_time, `StopStringCriteria` -> stop_strings + its tokenizer, `EosTokenCriteria` ->
    eos ids); the others are user criteria traced into the loop. `config` and `options` are the call's config and
    keyword options before they are merged. Returns (user criteria, options to add, tokenizer).

    As in HF, a criterion that the call already creates is an error (set the option instead): a
    `MaxLengthCriteria` always (generate always has a length), the others when their option is set.
    """

    def current(option):
        return options[option] if option in options else getattr(config, option)

    user, added = [], {}
    for criterion in check_user_criteria(_flattened(stopping_criteria)):
        if isinstance(criterion, MaxLengthCriteria):
            raise ValueError("stopping_criteria: a MaxLengthCriteria duplicates generate's own length limit; set "
                             "max_length or max_new_tokens instead.")
        if isinstance(criterion, MaxTimeCriteria):
            # The criterion's clock started when it was made; an expired one still allows the first chunk.
            option, value = "max_time", max(criterion.max_time - (time.time() - criterion.initial_timestamp), 1e-6)
        elif isinstance(criterion, StopStringCriteria):
            option, value = "stop_strings", criterion.stop_strings
            tokenizer = tokenizer or criterion.tokenizer
        elif isinstance(criterion, EosTokenCriteria):
            eos = current("eos_token_id")
            eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
            added["eos_token_id"] = eos + criterion.eos_token_id
            continue
        else:
            user.append(criterion)
            continue
        if current(option) is not None:
            raise ValueError(f"stopping_criteria: a {type(criterion).__name__} duplicates the {option} option "
                             f"({current(option)!r}); give one of them.")
        added[option] = value
    return tuple(user), added, tokenizer


def _flattened(criteria) -> list:
    """`criteria` with nested `StoppingCriteriaList`s opened, so a built-in criterion inside one still stands for
    its option (a `MaxTimeCriteria` traced into the loop would read the clock once, at trace time)."""
    flat = []
    for criterion in criteria or ():
        flat.extend(_flattened(criterion) if isinstance(criterion, StoppingCriteriaList) else [criterion])
    return flat
