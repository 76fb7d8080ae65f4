"""HF's `BeamHypotheses` (the finished hypotheses of one prompt) as tensors, to the letter: a list of at most
`num_beams` entries in insertion order; a new entry gets in while the list is short or when its score beats the
worst; an overflow drops the worst (the earliest of equal worsts); the results come best first, the latest of equal
scores first (Python's stable sort, popped from the end). Ties are common in constrained beam search (hypotheses
of score -inf), so the order of equal scores is HF's, not an accident of the sort.

Entries are kept as float64 scores (HF's Python floats) plus their place in a pool of candidates (`ids`), so a step
inserts candidates one by one on `[B, K]` tensors and gathers the token buffers once.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf


class HypothesisList(NamedTuple):
    """scores: float64 `[B, K]` in list order; ids: int32 `[B, K]` each entry's pool index; count: int32 `[B]`
    (entries at slots `>= count` are unused)."""

    scores: tf.Tensor
    ids: tf.Tensor
    count: tf.Tensor

    @classmethod
    def from_pool(cls, scores: tf.Tensor, count: tf.Tensor) -> HypothesisList:
        """The list whose entries are pool items `0 .. K-1` (a kept list, first in the pool)."""
        return cls(scores, tf.broadcast_to(tf.range(tf.shape(scores)[1]), tf.shape(scores)), count)

    def worst(self) -> tf.Tensor:
        """float64 `[B]`: HF's `worst_score` (the lowest entry's; +inf when empty)."""
        used = tf.range(tf.shape(self.scores)[1])[None] < self.count[:, None]
        return tf.reduce_min(tf.where(used, self.scores, float("inf")), axis=1)

    def add(self, offered: tf.Tensor, score: tf.Tensor, pool_id) -> HypothesisList:
        """HF's `BeamHypotheses.add` of one candidate per prompt: `offered` bool `[B]`, `score` float64 `[B]`,
        `pool_id` its pool index (int32 scalar or `[B]`)."""
        beams = self.scores.shape[1]
        slots = tf.range(beams + 1)[None]
        full = self.count >= beams
        enter = offered & (~full | (score > self.worst()))
        # Append at `count`, then drop the worst (the first of equal worsts) when that makes K + 1 entries.
        at = slots == self.count[:, None]
        scores = tf.where(at, score[:, None], tf.pad(self.scores, [[0, 0], [0, 1]]))
        new_id = tf.broadcast_to(tf.reshape(pool_id, [-1, 1]), tf.shape(at))
        ids = tf.where(at, new_id, tf.pad(self.ids, [[0, 0], [0, 1]]))
        used = slots <= self.count[:, None]
        lowest = tf.reduce_min(tf.where(used, scores, float("inf")), axis=1, keepdims=True)
        dropped = tf.reduce_min(tf.where(used & (scores == lowest), slots, beams + 1), axis=1, keepdims=True)
        dropped = tf.where(full[:, None], dropped, beams)
        take = slots[:, :beams] + tf.cast(slots[:, :beams] >= dropped, tf.int32)
        added = HypothesisList(tf.gather(scores, take, batch_dims=1), tf.gather(ids, take, batch_dims=1),
                               tf.minimum(self.count + 1, beams))
        return HypothesisList(*(tf.where(enter[:, None] if new.shape.rank == 2 else enter, new, old)
                                for new, old in zip(added, self)))

    def add_all(self, offered: tf.Tensor, scores: tf.Tensor, first_id: int) -> HypothesisList:
        """`add` of candidates `[B, P]` in order, pool indices `first_id + j` (one small loop: a compiled program
        stays the same size whatever P)."""
        def body(index, hypotheses):
            return index + 1, tuple(HypothesisList(*hypotheses).add(
                tf.gather(offered, index, axis=1), tf.gather(scores, index, axis=1), first_id + index))

        count = tf.shape(offered)[1]
        return HypothesisList(*tf.while_loop(lambda index, _: index < count, body, (tf.constant(0), tuple(self)))[1])

    def best_first(self) -> tf.Tensor:
        """int32 `[B, K]`: list slots in HF's output order (score descending, later entry first among equals;
        unused slots last)."""
        beams = self.scores.shape[1]
        slots = tf.range(beams)
        used = slots[None] < self.count[:, None]
        q_used, p_used = used[:, None, :], used[:, :, None]
        q_score, p_score = self.scores[:, None, :], self.scores[:, :, None]
        ahead = (q_used & ~p_used) | ((q_used == p_used) & (
            (q_score > p_score) | ((q_score == p_score) & (slots[None, None, :] > slots[None, :, None]))))
        position = tf.reduce_sum(tf.cast(ahead, tf.int32), axis=2)
        return tf.math.top_k(-tf.cast(position, tf.float32), beams).indices
