"""Rows that stand at their own columns: the one way a token is committed to each of them (written at the row's
column, the mask set, the eos / budget / stop-string / criteria tests, the row finished, its token counted).

Two kinds of loop keep rows apart like this: speculative decoding, whose rows keep different numbers of drafts per
round (`tfgen.decoding.speculative.commit_row_tokens`), and continuous batching, whose slots hold rows that joined at
different times (`tfgen.engine.slot_programs.SlotPrograms`). Loops whose rows all stand at one column commit with
`tfgen.decoding.state.commit_tokens`.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfgen.decoding.state import is_eos
from tfgen.stopping.criteria import stopped_rows
from tfgen.stopping.stop_strings import StopStringTables


class RowTokens(NamedTuple):
    """The token bookkeeping of R rows over an L-column buffer, each row at its own column.

    sequences: int32 `[R, L]` token buffer. mask: int32 `[R, L]` attention mask over it. finished: bool `[R]`, rows
    that take no more tokens. generated: int32 `[R]`, tokens each row took (its finishing token included).
    """

    sequences: tf.Tensor
    mask: tf.Tensor
    finished: tf.Tensor
    generated: tf.Tensor


def commit_per_row(rows: RowTokens, tokens: tf.Tensor, columns: tf.Tensor, active: tf.Tensor, scores: tf.Tensor, *,
                   eos_token_ids: tf.Tensor, budget: tf.Tensor, stop_strings: StopStringTables | None,
                   stopping_criteria: tuple, start, pad_token_id) -> RowTokens:
    """`rows` with `tokens` int32 `[R]` committed to the `active` rows (bool `[R]`; the others are left as they are).

    Each active row gets its token at its own column (`columns` int32 `[R]`) and the mask there; it finishes when the
    token is an eos id (`eos_token_ids` int32 `[E]`), when it spent its `budget` (int32 `[R]`, new tokens it may take,
    this one included), or when a stop string or stopping criterion stops it (they read the row's text from column
    `start`, an int32 scalar, with `pad_token_id` for the columns before, and the criteria get `scores` float32
    `[R, V]`, the processed scores the token was chosen from); and its `generated` count grows by one.
    """
    written = (tf.range(tf.shape(rows.sequences)[1])[tf.newaxis] == columns[:, tf.newaxis]) & active[:, tf.newaxis]
    sequences = tf.where(written, tokens[:, tf.newaxis], rows.sequences)
    ends = is_eos(tokens, eos_token_ids) | (rows.generated + 1 >= budget)
    stopped = stopped_rows(stop_strings, stopping_criteria, sequences, columns, start, pad_token_id, scores)
    if stopped is not None:
        ends |= stopped
    return RowTokens(
        sequences=sequences,
        mask=tf.where(written, 1, rows.mask),
        finished=rows.finished | (active & ends),
        generated=rows.generated + tf.cast(active, tf.int32),
    )

