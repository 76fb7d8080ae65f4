"""The continuous-batching decode state (`SlotState`) and its flat form: the named tensors the export's slot
signatures take and return (`tokens`, ..., `knob_<name>`, `logprobs_<name>`, `cache_<i>`), which a driver outside
tfgen feeds back as they came. The programs (`tfgen.engine.slot_programs`) and the scheduler
(`tfgen.engine.scheduler`) hold the typed state; only the signature boundary converts (`SlotState.to_flat` /
`SlotState.from_flat`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import tensorflow as tf

#: The flat form's prefixes of the per-row knobs, the log-probabilities and the cache leaves.
KNOB_PREFIX, LOGPROBS_PREFIX, CACHE_PREFIX = "knob_", "logprobs_", "cache_"
#: The entries of `SlotState.logprobs` (when the programs record them), in the flat form's order.
LOGPROBS_ENTRIES = ("chosen", "top_ids", "top")
#: The knobs a row joining the engine may set for itself (`SlotPrograms.insert`; the export's `sample` signature
#: takes the same per row), besides the row, its budget, seed and `do_sample`.
REQUEST_KNOBS = ("temperature", "top_k", "top_p")


_NESTS = ("knobs", "logprobs", "cache")  # the fields that are no single tensor


class SlotState(NamedTuple):
    """The decode state of S slots over L buffer columns (a slot's layout: `tfgen.engine.slot_programs`).

    tokens: int32 `[S, L]`, each slot's token buffer: its row as sent at columns `[0, width)`, then its new tokens,
        then pad.
    mask: int32 `[S, L]`, the attention mask over `tokens` (0 at the row's own padding and past `length`).
    width: int32 `[S]`, the row's columns as sent (HF's prompt length).
    length: int32 `[S]`, columns written: the next token goes to column `length`.
    position: int32 `[S]`, the position id of the last written token (the one the next step runs).
    generated: int32 `[S]`, new tokens the row chose (its finishing token included).
    budget: int32 `[S]`, new tokens the row may take.
    finished: bool `[S]`, slots that take no more tokens (an empty slot is finished).
    seed: int32 `[S, 2]`, each row's sampling key.
    do_sample: bool `[S]`, rows that sample (the others decode greedily).
    knobs: {name: `[S, ...]`}, the per-row knobs of the export's decoding (`tfgen.config.knobs`), neutral warpers
        in greedy rows.
    cache: the model's cache nest, every leaf `[S, ...]` (the cache slot of column `c` holds the token at `c`); or,
        in a driver that never looks inside it (`from_flat` without a structure), the tuple of its leaves.
    logprobs: {} when the programs record no log-probabilities (exports made before them, or with them off);
        else, per slot and buffer column `c` of a new token (`width <= c < length`), the raw log-probabilities
        (log-softmax of the model's logits for that column, before any processor or warper: vLLM's default):
        "chosen" float32 `[S, L]`, the token at `c`'s; "top_ids" int32 `[S, L, K]` and "top" float32 `[S, L, K]`,
        the K most likely tokens' ids and log-probabilities, most likely first (K static, the programs').
    """

    tokens: tf.Tensor
    mask: tf.Tensor
    width: tf.Tensor
    length: tf.Tensor
    position: tf.Tensor
    generated: tf.Tensor
    budget: tf.Tensor
    finished: tf.Tensor
    seed: tf.Tensor
    do_sample: tf.Tensor
    knobs: dict
    cache: Any
    logprobs: dict = {}  # noqa: RUF012 (never mutated: the programs build new dicts)

    def to_flat(self) -> dict:
        """{name: tensor}, the signatures' form: each tensor field under its own name, then the knobs as
        `knob_<name>`, the log-probabilities as `logprobs_<name>`, then the cache leaves as `cache_<i>`
        (`tf.nest.flatten` order)."""
        flat = {name: getattr(self, name) for name in self._fields if name not in _NESTS}
        flat.update({KNOB_PREFIX + name: value for name, value in self.knobs.items()})
        flat.update({LOGPROBS_PREFIX + name: self.logprobs[name] for name in LOGPROBS_ENTRIES if name in self.logprobs})
        flat.update({f"{CACHE_PREFIX}{index}": leaf for index, leaf in enumerate(tf.nest.flatten(self.cache))})
        return flat

    @classmethod
    def from_flat(cls, flat: Mapping, cache_structure: Any | None = None) -> SlotState:
        """The state of `flat` (`to_flat`'s form). The cache leaves are packed as `cache_structure` (a nest with as
        many leaves: the model's) or, when it is None, kept as a tuple in leaf order — which `to_flat` turns back
        into the same names."""
        fields = {name: flat[name] for name in cls._fields if name not in _NESTS}
        knobs = {name[len(KNOB_PREFIX):]: value for name, value in flat.items() if name.startswith(KNOB_PREFIX)}
        # Absent from the state of an export made before them: then {} (the programs record none).
        logprobs = {name: flat[LOGPROBS_PREFIX + name] for name in LOGPROBS_ENTRIES if LOGPROBS_PREFIX + name in flat}
        # By index, not by name order: cache_10 comes after cache_9.
        leaves = tuple(flat[f"{CACHE_PREFIX}{index}"]
                       for index in range(sum(name.startswith(CACHE_PREFIX) for name in flat)))
        cache = leaves if cache_structure is None else tf.nest.pack_sequence_as(cache_structure, leaves)
        return cls(**fields, knobs=knobs, logprobs=logprobs, cache=cache)


__all__ = ["SlotState"]
