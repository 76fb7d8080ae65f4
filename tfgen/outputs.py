"""Output structures of `generate`, with HF's field names (attribute and item access both work)."""

from __future__ import annotations

import dataclasses
from typing import Optional

import tensorflow as tf


class _Output:
    """Dataclass mixin: `out["sequences"]` and `out.keys()` like HF's ModelOutput; unset (None) fields hidden."""

    def keys(self):
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None]

    def __getitem__(self, key):
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key):
        return key in self.keys()


@dataclasses.dataclass
class GenerateDecoderOnlyOutput(_Output):
    """Result of greedy search / sampling with `return_dict_in_generate=True`.

    sequences: int32 `[batch * num_return_sequences, prompt_len + max_new_tokens]`.
    scores: processed scores, one float32 `[batch * num_return_sequences, vocab]` per generated step.
    logits: raw logits, same layout as `scores`.
    """

    sequences: tf.Tensor
    scores: Optional[tuple] = None
    logits: Optional[tuple] = None


@dataclasses.dataclass
class GenerateBeamDecoderOnlyOutput(_Output):
    """Result of beam search / beam sampling / group beam search with `return_dict_in_generate=True`.

    sequences: int32 `[batch * num_return_sequences, prompt_len + max_new_tokens]`.
    sequences_scores: float32 `[batch * num_return_sequences]`, the length-penalised log-probability.
    scores / logits: one float32 `[batch * num_beams, vocab]` per step.
    beam_indices: int32 `[batch * num_return_sequences, generated_steps]`, the beam each token came from.
    """

    sequences: tf.Tensor
    sequences_scores: Optional[tf.Tensor] = None
    scores: Optional[tuple] = None
    logits: Optional[tuple] = None
    beam_indices: Optional[tf.Tensor] = None
