"""The pieces of `tfgen.models.t5`: T5's relative position buckets and bias, its attention (no `1/sqrt(d)` scaling, a
learned bias per head and bucket, masked keys at the dtype's minimum), and one block
of either stack (self-attention, the decoder's cross-attention, the feed-forward), each sub-layer pre-norm with a
residual, as HF 4.55's `modeling_t5.py` computes them.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import keras
import numpy as np
import tensorflow as tf

from tfgen.models.hf_weights import HFWeights
from tfgen.models.layers import ACTIVATIONS, dense, rms_norm, write_slots
from tfgen.models.t5_config import T5Config


def relative_bucket_table(num_buckets: int, max_distance: int, bidirectional: bool) -> np.ndarray:
    """int32 `[2 * max_distance + 1]`: entry `max_distance + r` is HF's bucket of the relative position
    `r = key_position - query_position`, for r in `[-max_distance, max_distance]`; a farther r has the bucket of
    the nearest end (the buckets saturate at `max_distance`).

    Computed on the host, in float32 numpy as HF's torch code does (`log(r / max_exact) / log(max_distance /
    max_exact)`, truncated): some positions (16, 32, 64 with the usual 32 buckets and distance 128) land exactly on a
    bucket boundary, where a log computed by another library (TF's Eigen, XLA) could round to the bucket below.
    """
    relative = np.arange(-max_distance, max_distance + 1, dtype=np.int64)
    buckets = np.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative > 0) * num_buckets  # keys after the query get the upper half
        distance = np.abs(relative)
    else:
        distance = -np.minimum(relative, 0)  # a key after the query is masked anyway: bucket 0
    max_exact = num_buckets // 2  # below it, one bucket per distance; above, logarithmically wider ones
    with np.errstate(divide="ignore"):
        scaled = (np.log(distance.astype(np.float32) / np.float32(max_exact))
                  / np.float32(math.log(max_distance / max_exact)) * np.float32(num_buckets - max_exact))
    # log(0) = -inf only where distance < max_exact, whose exact bucket np.where picks.
    large = np.minimum(max_exact + np.nan_to_num(scaled, neginf=0.0).astype(np.int64), num_buckets - 1)
    return (buckets + np.where(distance < max_exact, distance, large)).astype(np.int32)


def position_bias(bias_weight, table: np.ndarray, query_slots: tf.Tensor, key_slots: tf.Tensor, dtype) -> tf.Tensor:
    """`[1, heads, T, S]` in `dtype`: the learned bias (`bias_weight` `[num_buckets, heads]`, HF's
    `relative_attention_bias.weight`) of each query at int32 `query_slots` `[T]` against each key at `key_slots`
    `[S]`, through the bucket `table` (`relative_bucket_table`). Only slot differences count, so shifting every
    query and key by the same padding leaves the bias unchanged."""
    max_distance = (table.shape[0] - 1) // 2
    relative = key_slots[tf.newaxis, :] - query_slots[:, tf.newaxis]  # [T, S]
    buckets = tf.gather(tf.constant(table), tf.clip_by_value(relative, -max_distance, max_distance) + max_distance)
    values = tf.gather(tf.cast(bias_weight, dtype), buckets)  # [T, S, heads]
    return tf.transpose(values, [2, 0, 1])[tf.newaxis]


class AttentionBlock(NamedTuple):
    """Keys the queries attend: `keys` / `values` `[B, heads, S, d_kv]`, an optional additive `bias` broadcastable to
    `[B, heads, T, S]` (None: none, as in cross-attention) and the bool `allowed` broadcastable to `[B, 1, T, S]`."""

    keys: tf.Tensor
    values: tf.Tensor
    bias: Any
    allowed: tf.Tensor


def attend(query: tf.Tensor, blocks: list[AttentionBlock]) -> tf.Tensor:
    """T5 attention of `query` `[B, heads, T, d_kv]` over the keys of `blocks`, with one softmax across them: scores
    are `q . k` (unscaled: T5 folds the scale into its init) plus the bias, and a key that is not allowed scores the
    dtype's minimum. HF adds that minimum to the score instead; for an allowed key both give `q . k + bias`, and a
    masked key's weight is 0 either way (a row with no allowed key gets uniform weights either way). The softmax runs
    in float32, as HF's. Returns the attended values `[B, T, heads * d_kv]`."""
    scores, sizes = [], []
    for block in blocks:
        block_scores = tf.matmul(query, tf.cast(block.keys, query.dtype), transpose_b=True)  # [B, heads, T, S_i]
        if block.bias is not None:
            block_scores += tf.cast(block.bias, block_scores.dtype)
        sizes.append(tf.shape(block_scores)[-1])
        floor = tf.constant(block_scores.dtype.min, block_scores.dtype)
        scores.append(tf.where(block.allowed, block_scores, floor))
    scores = scores[0] if len(scores) == 1 else tf.concat(scores, axis=-1)
    probabilities = tf.cast(tf.nn.softmax(tf.cast(scores, tf.float32)), query.dtype)
    parts = [probabilities] if len(blocks) == 1 else tf.split(probabilities, tf.stack(sizes), axis=-1)
    attended = tf.add_n([tf.matmul(part, tf.cast(block.values, query.dtype)) for part, block in zip(parts, blocks)])
    heads, head_dim = query.shape[1], query.shape[3]
    return tf.reshape(tf.transpose(attended, [0, 2, 1, 3]), [-1, tf.shape(query)[2], heads * head_dim])


def split_heads(x: tf.Tensor, heads: int) -> tf.Tensor:
    """`[B, T, heads * d_kv]` -> `[B, heads, T, d_kv]`."""
    # The head size from the static width: with batch and length unknown (an export's signatures), -1 would leave
    # it unknown too.
    head_dim = -1 if x.shape[-1] is None else x.shape[-1] // heads
    return tf.transpose(tf.reshape(x, [tf.shape(x)[0], tf.shape(x)[1], heads, head_dim]), [0, 2, 1, 3])


class T5Block(keras.layers.Layer):
    """One block of the encoder (`decoder=False`: self-attention, feed-forward) or the decoder (self-attention,
    cross-attention over the encoder output, feed-forward); each sub-layer is `x + f(T5LayerNorm(x))`. q/k/v are one
    kernel, as are the cross-attention's k/v (projected once per prompt, see `cross_keys_values`) and a gated
    feed-forward's `wi_0`/`wi_1`."""

    def __init__(self, config: T5Config, index: int, decoder: bool, quantize: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.config, self.decoder = config, decoder
        # HF's T5 initialisation (`_init_weights`, times `initializer_factor`).
        weights = HFWeights(self, f"{'decoder' if decoder else 'encoder'}.block.{index}.",
                            stddev_scale=config.initializer_factor, quantize=quantize)
        d, inner, d_ff = config.d_model, config.inner_dim, config.d_ff

        def linear(module, projections, n_in, width, stddevs):  # T5's layers have no biases
            return weights.linear(module, projections, n_in, (width,) * len(projections), stddevs=stddevs)[0]

        # HF's Mesh-TensorFlow deviations: q is scaled down by sqrt(d_kv) in place of scaling the scores.
        qkv_stddevs = ((d * config.d_kv) ** -0.5, d ** -0.5, d ** -0.5)
        self.self_norm = weights.norm("layer.0.layer_norm.weight", d)
        self.qkv = linear("layer.0.SelfAttention", ("q", "k", "v"), d, inner, qkv_stddevs)
        self.self_out = linear("layer.0.SelfAttention", ("o",), inner, d, (inner ** -0.5,))
        if decoder:
            self.cross_norm = weights.norm("layer.1.layer_norm.weight", d)
            self.cross_query = linear("layer.1.EncDecAttention", ("q",), d, inner, qkv_stddevs[:1])
            self.cross_kv = linear("layer.1.EncDecAttention", ("k", "v"), d, inner, qkv_stddevs[1:])
            self.cross_out = linear("layer.1.EncDecAttention", ("o",), inner, d, (inner ** -0.5,))
        ff = f"layer.{2 if decoder else 1}"
        self.ff_norm = weights.norm(f"{ff}.layer_norm.weight", d)
        wi = ("wi_0", "wi_1") if config.is_gated_act else ("wi",)
        self.wi = linear(f"{ff}.DenseReluDense", wi, d, d_ff, (d ** -0.5,))
        self.wo = linear(f"{ff}.DenseReluDense", ("wo",), d_ff, d, (d_ff ** -0.5,))
        self.activation = ACTIVATIONS[config.dense_act_fn]
        self.hf_parts = weights.parts
        self.built = True

    def _norm(self, x, weight):
        return rms_norm(x, weight, self.config.layer_norm_epsilon)

    def self_attention(self, x, blocks, layer_cache=None, cache_index=None):
        """`x + SelfAttention(norm(x))` for x `[B, T, D]`. Without a cache, `blocks` is [(bias, allowed)] over the
        call's own keys. With `layer_cache` = (keys, values) `[B, heads, L, d_kv]`, `blocks` is ((bias, allowed) over
        the cache's earlier slots, or None for a prefill at slot 0; (bias, allowed) over the new tokens): the earlier
        slots are read from the cache as it came in and the new tokens from their fresh keys (see docs/design.md,
        "Attending the cache as it came in"), and the cache is written at `[cache_index, cache_index + T)` for the
        next call only. Returns (x, the updated layer cache or None)."""
        heads = self.config.num_heads
        query, key, value = (split_heads(part, heads)
                             for part in tf.split(dense(self._norm(x, self.self_norm), self.qkv), 3, axis=-1))
        if layer_cache is None:
            ((bias, allowed),) = blocks
            attended = attend(query, [AttentionBlock(key, value, bias, allowed)])
        else:
            earlier, (new_bias, new_allowed) = blocks
            attention_blocks = [AttentionBlock(key, value, new_bias, new_allowed)]
            if earlier is not None:
                attention_blocks.insert(0, AttentionBlock(*layer_cache, *earlier))
            attended = attend(query, attention_blocks)
            layer_cache = (write_slots(layer_cache[0], key, cache_index),
                           write_slots(layer_cache[1], value, cache_index))
        return x + dense(attended, self.self_out), layer_cache

    def cross_keys_values(self, encoder_hidden_states, dtype) -> tuple[tf.Tensor, tf.Tensor]:
        """This block's cross-attention keys and values `[B, heads, S, d_kv]` in `dtype` of the encoder output
        `[B, S, D]`: projected once per prompt, then read by every decode step."""
        keys, values = tf.split(dense(encoder_hidden_states, self.cross_kv), 2, axis=-1)
        heads = self.config.num_heads
        return tf.cast(split_heads(keys, heads), dtype), tf.cast(split_heads(values, heads), dtype)

    def cross_attention(self, x, keys, values, allowed):
        """`x + EncDecAttention(norm(x))` over the encoder's `keys` / `values` `[B, heads, S, d_kv]`; `allowed` bool
        `[B, 1, 1, S]` (the encoder mask). No position bias: HF's cross-attention has none."""
        query = split_heads(dense(self._norm(x, self.cross_norm), self.cross_query), self.config.num_heads)
        return x + dense(attend(query, [AttentionBlock(keys, values, None, allowed)]), self.cross_out)

    def feed_forward(self, x):
        """`x + wo(act(wi(norm(x))))`, or with a gated projection `x + wo(act(wi_0(h)) * wi_1(h))`."""
        hidden = dense(self._norm(x, self.ff_norm), self.wi)
        if self.config.is_gated_act:
            gate, linear = tf.split(hidden, 2, axis=-1)
            hidden = self.activation(gate) * linear
        else:
            hidden = self.activation(hidden)
        return x + dense(hidden, self.wo)
