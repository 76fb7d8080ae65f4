"""HF's `ConstraintListState` as tensors: each beam's progress through every constraint of a
`tfgen.decoding.constraints.ConstraintTables`, advanced token by token inside the compiled loop.

A beam's progress is three int32/bool values per constraint (`Progress`, shape `[..., C]` each): the trie node it
stands at (the root while pending), whether it is complete, and its place in HF's pending list (a broken
constraint goes to the end). At most one constraint is in progress (not complete, away from its root). HF
rebuilds these states from each sequence every step; adding one token per step gives the same states.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfgen.decoding.constraints import ConstraintTables

# A pending-list place larger than any (places grow by one per broken constraint, at most once per step).
_LAST = 2**30


class Progress(NamedTuple):
    """node: int32 `[..., C]` trie node per constraint; done: bool `[..., C]`; place: int32 `[..., C]` order in
    HF's pending list (meaningful for pending constraints)."""

    node: tf.Tensor
    done: tf.Tensor
    place: tf.Tensor


class AdvanceCandidates(NamedTuple):
    """What each beam offers to move its constraints on (HF's "advance" tokens), `A` slots per beam."""

    tokens: tf.Tensor  # int32 [R, A] (-1 in unused slots)
    valid: tf.Tensor  # bool [R, A]
    banks: tf.Tensor  # int32 [R, A]: HF's bank of each candidate's state
    progress: Progress  # [R, A, C]: each candidate's state (what the beam carries on if it is chosen)


class ConstraintGraph:
    """The tables of `tables` as constants, and HF's state operations over them."""

    def __init__(self, tables: ConstraintTables):
        self.tables = tables
        self.roots = tf.constant(tables.roots, tf.int32)
        self.leaf = tf.constant(tables.node_leaf, tf.int32) > 0
        self.node_bank = tf.constant(tables.node_bank, tf.int32)
        self.child_token = tf.constant(tables.child_token, tf.int32)
        self.child_node = tf.constant(tables.child_node, tf.int32)
        self.advance_banks = tf.constant(tables.advance_banks, tf.int32)
        # [C, W]: the tokens that start each constraint, in HF's order.
        self.root_tokens = tf.gather(self.child_token, self.roots)[:, : tables.root_width]

    def initial(self, rows) -> Progress:
        """`rows` beams with every constraint pending, in the given order."""
        count = self.tables.num_constraints
        node = tf.tile(self.roots[None], tf.stack([rows, 1]))
        return Progress(node, tf.zeros_like(node, tf.bool), tf.tile(tf.range(count)[None], tf.stack([rows, 1])))

    def in_progress(self, progress: Progress) -> tf.Tensor:
        """bool `[..., C]`: the constraint being fulfilled (at most one per beam)."""
        return ~progress.done & (progress.node != self.roots)

    @staticmethod
    def completed(progress: Progress) -> tf.Tensor:
        """bool `[...]`: every constraint fulfilled."""
        return tf.reduce_all(progress.done, axis=-1)

    def bank(self, progress: Progress) -> tf.Tensor:
        """int32 `[...]`: HF's `get_bank()` (completed constraints x max_seqlen, plus the progress of the one in
        progress)."""
        done = tf.reduce_sum(tf.cast(progress.done, tf.int32), axis=-1)
        partial = tf.where(self.in_progress(progress), tf.gather(self.node_bank, progress.node), 0)
        return done * self.tables.max_seqlen + tf.reduce_sum(partial, axis=-1)

    def add(self, progress: Progress, tokens: tf.Tensor) -> Progress:
        """HF's `ConstraintListState.add(token)` for every beam: `tokens` int32 `[...]`, progress `[..., C]`."""
        children = tf.gather(self.child_token, progress.node)  # [..., C, D]
        match = (children == tokens[..., None, None]) & (children >= 0)
        has_child = tf.reduce_any(match, axis=-1)
        child = tf.reduce_sum(tf.where(match, tf.gather(self.child_node, progress.node), 0), axis=-1)
        in_progress = self.in_progress(progress)
        busy = tf.reduce_any(in_progress, axis=-1, keepdims=True)
        # No constraint in progress: the first pending one (in HF's list order) that the token starts.
        starts = ~progress.done & ~in_progress & has_child & ~busy
        first = tf.reduce_min(tf.where(starts, progress.place, _LAST), axis=-1, keepdims=True)
        started = starts & (progress.place == first)
        open_ = ~tf.reduce_all(progress.done, axis=-1, keepdims=True)
        stepped = ((in_progress & has_child) | started) & open_
        # A token that breaks the constraint in progress sends it, reset, to the end of the pending list.
        broken = in_progress & ~has_child & open_
        last = tf.reduce_max(progress.place, axis=-1, keepdims=True) + 1
        return Progress(
            node=tf.where(stepped, child, tf.where(broken, self.roots, progress.node)),
            done=progress.done | (stepped & tf.gather(self.leaf, child)),
            place=tf.where(broken, last, progress.place),
        )

    def walk(self, progress: Progress, sequences: tf.Tensor, begin, end) -> Progress:
        """`progress` after adding the tokens of `sequences` int32 `[R, L]` at columns `[begin, end)`."""
        def body(column, progress):
            return column + 1, self.add(progress, tf.gather(sequences, column, axis=1))

        return tf.while_loop(lambda column, _: column < end, body, (tf.convert_to_tensor(begin, tf.int32), progress))[1]

    def advance_candidates(self, progress: Progress) -> AdvanceCandidates:
        """HF's advance tokens of every beam (`ConstraintListState.advance()`: the children of the node in progress,
        else the first tokens of the pending constraints in list order), their states and banks. `progress` `[R, C]`."""
        slots, width = self.tables.advance_slots, self.tables.root_width
        in_progress = self.in_progress(progress)
        busy = tf.reduce_any(in_progress, axis=-1)
        done_count = tf.reduce_sum(tf.cast(progress.done, tf.int32), axis=-1)
        # A constraint in progress offers its node's children (banks as HF computes them, see `advance_banks`).
        node = tf.reduce_sum(tf.where(in_progress, progress.node, 0), axis=-1)
        busy_tokens = _pad_to(tf.gather(self.child_token, node), slots, -1)
        busy_banks = (done_count[:, None] * self.tables.max_seqlen
                      + _pad_to(tf.gather(self.advance_banks, node), slots, 0))
        # Otherwise every pending constraint offers its first tokens, in pending-list order.
        pending = ~progress.done & ~in_progress
        key = tf.cast(tf.where(pending, progress.place, _LAST), tf.float32)
        order = tf.math.top_k(-key, self.tables.num_constraints).indices  # [R, C]
        free_tokens = tf.where(tf.gather(pending, order, batch_dims=1)[:, :, None],
                               tf.gather(self.root_tokens, order), -1)
        free_tokens = _pad_to(tf.reshape(free_tokens, [-1, self.tables.num_constraints * width]), slots, -1)
        tokens = tf.where(busy[:, None], busy_tokens, free_tokens)
        valid = (tokens >= 0) & ~self.completed(progress)[:, None]
        expanded = Progress(*(tf.repeat(part[:, None], slots, axis=1) for part in progress))
        advanced = self.add(expanded, tokens)
        banks = tf.where(busy[:, None], busy_banks, self.bank(advanced))
        return AdvanceCandidates(tokens, valid, banks, advanced)


def _pad_to(values: tf.Tensor, width: int, fill: int) -> tf.Tensor:
    """`values` `[R, w]` (w <= width, static) padded with `fill` to `[R, width]`."""
    extra = width - values.shape[-1]
    return values if extra == 0 else tf.pad(values, [[0, 0], [0, extra]], constant_values=fill)


def gather_progress(progress: Progress, rows: tf.Tensor) -> Progress:
    """The progress of beams `rows` (int32, any shape)."""
    return Progress(*(tf.gather(part, rows) for part in progress))


def select_progress(condition: tf.Tensor, if_true: Progress, if_false: Progress) -> Progress:
    """Per beam: `if_true`'s progress where `condition` (bool, the progress' shape less C), else `if_false`'s."""
    return Progress(*(tf.where(condition[..., None], a, b) for a, b in zip(if_true, if_false)))
