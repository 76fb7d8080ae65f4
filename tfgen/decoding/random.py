"""Counter-based random numbers that are bit-identical eagerly, under XLA and in an exported SavedModel.

Why our own generator: TF's `stateless_uniform` with `alg="philox"` gives *different* numbers eagerly and under
`jit_compile=True` (XLA lowers it to its own bit generator), which would break "same seed, same tokens" across
eager, compiled and served runs. Philox-4x32-10 written in plain integer ops gives the same bits everywhere.

Sampling needs one uniform per row per step (inverse-CDF sampling), so the generator runs on `[batch]`
counters and costs nothing next to a decode step.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

_MASK32 = 0xFFFFFFFF
_PHILOX_M0 = 0xD2511F53
_PHILOX_M1 = 0xCD9E8D57
_PHILOX_W0 = 0x9E3779B9
_PHILOX_W1 = 0xBB67AE85
_PHILOX_ROUNDS = 10


def _u64(value) -> tf.Tensor:
    return tf.constant(value, tf.uint64)


def philox4x32(counter: tf.Tensor, key: tf.Tensor) -> tf.Tensor:
    """Philox-4x32-10 block function (Salmon et al., 2011).

    counter: uint32-valued `[..., 4]`; key: uint32-valued `[..., 2]` (any integer dtype; only the low 32 bits
    are used). Returns uint32 `[..., 4]`. Arithmetic runs in uint64 so the 32x32->64 products are exact.
    """
    counter = tf.bitwise.bitwise_and(tf.cast(counter, tf.uint64), _u64(_MASK32))
    key = tf.bitwise.bitwise_and(tf.cast(key, tf.uint64), _u64(_MASK32))
    c0, c1, c2, c3 = tf.unstack(counter, num=4, axis=-1)
    k0, k1 = tf.unstack(key, num=2, axis=-1)
    mask, shift = _u64(_MASK32), _u64(32)
    for round_index in range(_PHILOX_ROUNDS):
        if round_index:
            k0 = tf.bitwise.bitwise_and(k0 + _u64(_PHILOX_W0), mask)
            k1 = tf.bitwise.bitwise_and(k1 + _u64(_PHILOX_W1), mask)
        product0 = _u64(_PHILOX_M0) * c0
        product1 = _u64(_PHILOX_M1) * c2
        hi0, lo0 = tf.bitwise.right_shift(product0, shift), tf.bitwise.bitwise_and(product0, mask)
        hi1, lo1 = tf.bitwise.right_shift(product1, shift), tf.bitwise.bitwise_and(product1, mask)
        c0, c1, c2, c3 = (
            tf.bitwise.bitwise_xor(tf.bitwise.bitwise_xor(hi1, c1), k0),
            lo1,
            tf.bitwise.bitwise_xor(tf.bitwise.bitwise_xor(hi0, c3), k1),
            lo0,
        )
    return tf.cast(tf.stack([c0, c1, c2, c3], axis=-1), tf.uint32)


def uniform_per_row(row_seeds: tf.Tensor, step: tf.Tensor, stream: int = 0) -> tf.Tensor:
    """One uniform float32 in (0, 1) per row, keyed by the row's seed and folded with the step.

    row_seeds: int32 `[batch, 2]` (the Philox key); step: int32 scalar or `[batch]` (the counter: a row's number of
    tokens chosen so far), so each decode step of a row draws a fresh number that depends on that row's seed and
    the step only — not on the batch.
    stream: a static integer separating independent uses within one step. Returns float32 `[batch]`.
    """
    batch = tf.shape(row_seeds)[0]
    step_column = tf.broadcast_to(tf.cast(step, tf.int64), [batch])
    stream_column = tf.fill([batch], tf.constant(stream, tf.int64))
    zeros = tf.zeros([batch], tf.int64)
    counter = tf.stack([step_column, stream_column, zeros, zeros], axis=-1)
    bits = philox4x32(counter, tf.cast(row_seeds, tf.int64))[:, 0]
    # 24 high bits -> a float32 mantissa; the half-step offset keeps the value strictly inside (0, 1).
    top24 = tf.cast(tf.bitwise.right_shift(bits, tf.constant(8, tf.uint32)), tf.float32)
    return (top24 + 0.5) * (1.0 / (1 << 24))


def derive_seeds(seeds, indices) -> tf.Tensor:
    """Derives independent keys: int32 `[n, 2]` from parent keys `seeds` `[n, 2]` and ints `indices` `[n]`.

    Used for row `i` of a batch given one seed (so a row gets the same key whatever the batch size) and for
    the `j`-th return sequence of a row.
    """
    seeds = tf.cast(seeds, tf.int64)
    indices = tf.cast(indices, tf.int64)
    zeros = tf.zeros_like(indices)
    # A counter word no decode step uses (steps sit in word 0 with word 1 = 0) keeps derived keys apart from
    # the per-step draws of the parent key.
    counter = tf.stack([indices, tf.fill(tf.shape(indices), tf.constant(0x5EED, tf.int64)), zeros, zeros], axis=-1)
    return tf.bitcast(philox4x32(counter, seeds)[:, :2], tf.int32)


def random_seeds(batch_size: int) -> np.ndarray:
    """Fresh entropy for callers that pass no seed: int32 `[batch_size, 2]`."""
    return np.random.default_rng().integers(-(2**31), 2**31 - 1, size=(batch_size, 2), dtype=np.int32)


def uniform_per_element(row_seeds: tf.Tensor, step: tf.Tensor, size: int, stream: int = 0) -> tf.Tensor:
    """`size` uniform float32 in (0, 1) per row, keyed by the row's seed and folded with the step.

    row_seeds: int32 `[batch, 2]`; step: int32 scalar; size, stream: static ints. Returns float32 `[batch, size]`.
    Like `uniform_per_row`, a row's numbers depend on its seed, the step and the element index only. Each Philox
    block yields four numbers; the counter's last word is 1, a value no other draw here uses, so these numbers
    never repeat those of `uniform_per_row` or `derive_seeds`.
    """
    batch = tf.shape(row_seeds)[0]
    blocks = -(-size // 4)
    block_index = tf.broadcast_to(tf.range(blocks, dtype=tf.int64)[None, :], tf.stack([batch, blocks]))
    counter = tf.stack(
        [
            tf.fill(tf.shape(block_index), tf.cast(step, tf.int64)),
            tf.fill(tf.shape(block_index), tf.constant(stream, tf.int64)),
            block_index,
            tf.ones_like(block_index),
        ],
        axis=-1,
    )
    bits = philox4x32(counter, tf.cast(row_seeds, tf.int64)[:, None, :])
    bits = tf.reshape(bits, tf.stack([batch, blocks * 4]))[:, :size]
    top24 = tf.cast(tf.bitwise.right_shift(bits, tf.constant(8, tf.uint32)), tf.float32)
    return (top24 + 0.5) * (1.0 / (1 << 24))
