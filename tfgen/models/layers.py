"""Tensor functions a decoder-only model with tfgen's static-buffer KV cache is built from: positions from the
mask, the causal-and-padding attention mask over the cache buffer, in-place cache slot writes, and the basic
layers (norm, dense, dropout) with explicit casts, so that `call` and `call_with_cache` compute identically under
mixed precision policies."""

from __future__ import annotations

import functools
from typing import Any

import keras
import tensorflow as tf

# Private module, but its dynamic_update_slice is the only in-place slice write that runs eagerly, in
# plain graphs and under XLA with a traced offset (TensorStridedSliceUpdate needs a constant offset
# under XLA; tensor_scatter_nd_update works but measured ~3x slower per decode step).
from tensorflow.compiler.tf2xla.python.xla import dynamic_update_slice

from tfgen.models.quantize import QuantizedKernel, quantize_array, quantized_matmul
from tfgen.models.quantize_modes import check_quantize


def silu(x: tf.Tensor) -> tf.Tensor:
    """`x * sigmoid(x)`: tf.nn.silu's forward ops without its custom gradient, which a SavedModel stores as one
    gradient function per call (510 in a 30-layer model's export, each rebuilt in Python when it loads)."""
    return x * tf.sigmoid(x)


# HF activation names (config `activation_function` / `hidden_act`).
ACTIVATIONS = {
    "gelu_new": functools.partial(tf.nn.gelu, approximate=True),
    "gelu_fast": functools.partial(tf.nn.gelu, approximate=True),
    "gelu_pytorch_tanh": functools.partial(tf.nn.gelu, approximate=True),
    "gelu": functools.partial(tf.nn.gelu, approximate=False),
    "quick_gelu": lambda x: x * tf.sigmoid(1.702 * x),
    "relu": tf.nn.relu,
    "silu": silu,
    "swish": silu,
    "tanh": tf.math.tanh,
}


def positions_from_mask(attention_mask: tf.Tensor) -> tf.Tensor:
    """int32 `[B, T]` positions counting only real tokens (`cumsum(mask) - 1`, pads clipped to 0), so a
    left-padded row gets the same positions as the unpadded one."""
    return tf.maximum(tf.cumsum(tf.cast(attention_mask, tf.int32), axis=1) - 1, 0)


def attention_allowed(
    query_index: tf.Tensor, key_mask: tf.Tensor, window: int | None = None, key_index: tf.Tensor | None = None
) -> tf.Tensor:
    """bool `[B, 1, T, S]`: the query at buffer index `query_index[t]` (int32 `[T]`, or `[B, T]` when rows sit at
    different slots) may attend the key at buffer index `key_index[s]` (int32 `[S]` or `[B, S]`, default `range(S)`:
    the whole buffer) iff `key_index[s] <= query_index[t]` and `key_mask[b, s]` (any dtype `[B, S]`, nonzero = real
    token) and, with a sliding `window`, `key_index[s] > query_index[t] - window` (the query and the `window - 1`
    slots before it)."""
    if key_index is None:
        key_index = tf.range(tf.shape(key_mask)[1])
    queries = tf.expand_dims(query_index, -1)  # [T, 1] or [B, T, 1]
    keys = tf.expand_dims(key_index, -2)  # [1, S] or [B, 1, S]
    causal = keys <= queries
    if window is not None:
        # Buffer slots, not position ids, as HF 4.55 counts the window (cache positions, left padding included).
        causal &= keys > queries - window
    if causal.shape.rank == 2:
        causal = causal[tf.newaxis]
    return causal[:, tf.newaxis] & tf.cast(key_mask, tf.bool)[:, tf.newaxis, tf.newaxis, :]


def query_slots(cache_index: tf.Tensor, length) -> tf.Tensor:
    """The buffer slots of a call's `length` tokens written from `cache_index`: int32 `[T]` for a scalar index (every
    row at the same slots), `[B, T]` for a per-row index `[B]` (speculative decoding advances rows unevenly)."""
    if cache_index.shape.rank == 1:
        return cache_index[:, tf.newaxis] + tf.range(length)[tf.newaxis]
    return cache_index + tf.range(length)


def write_slots(buffer: tf.Tensor, update: tf.Tensor, start: tf.Tensor) -> tf.Tensor:
    """`buffer` `[B, H, L, Dh]` with `update` `[B, H, T, Dh]` written at slots `[start, start + T)`; `start` is an
    int32 scalar, or `[B]` for a slot per row. The caller keeps every write inside the buffer."""
    update = tf.cast(update, buffer.dtype)
    if start.shape.rank == 1:
        return _write_row_slots(buffer, update, start)
    if update.shape[2] is not None:
        return dynamic_update_slice(buffer, update, tf.stack([0, 0, start, 0]))
    # T unknown when traced: under XLA it may be a bounded dynamic size (tokens sliced at a traced
    # offset), padded to its bound, which dynamic_update_slice would write whole; select slots instead.
    length = tf.shape(update)[2]
    offsets = tf.range(tf.shape(buffer)[2]) - start
    written = (offsets >= 0) & (offsets < length)
    gathered = tf.gather(update, tf.clip_by_value(offsets, 0, length - 1), axis=2)
    return tf.where(written[:, tf.newaxis], gathered, buffer)


def _write_row_slots(buffer: tf.Tensor, update: tf.Tensor, starts: tf.Tensor) -> tf.Tensor:
    """`write_slots` with one start slot per row, `starts` int32 `[B]`."""
    rows, length = buffer.shape[0], update.shape[2]
    if rows is not None and length is not None and rows <= 32:
        # One in-place slice write per row: each touches T slots, where a select rewrites the whole buffer.
        for row in range(rows):
            buffer = dynamic_update_slice(buffer, update[row:row + 1], tf.stack([row, 0, starts[row], 0]))
        return buffer
    length = tf.shape(update)[2]
    offsets = tf.range(tf.shape(buffer)[2])[tf.newaxis] - starts[:, tf.newaxis]  # [B, L]
    written = (offsets >= 0) & (offsets < length)
    gathered = tf.gather(update, tf.clip_by_value(offsets, 0, length - 1), axis=2, batch_dims=1)  # [B, H, L, Dh]
    return tf.where(written[:, tf.newaxis, :, tf.newaxis], gathered, buffer)


def layer_norm(x: tf.Tensor, gamma, beta, epsilon: float) -> tf.Tensor:
    """Layer normalisation over the last axis, in `x`'s dtype."""
    # Statistics in float32 so half-precision models stay stable; a no-op cast for float32 models.
    x32 = tf.cast(x, tf.float32)
    mean, variance = tf.nn.moments(x32, axes=[-1], keepdims=True)
    normed = (x32 - mean) * tf.math.rsqrt(variance + epsilon)
    return tf.cast(normed * tf.cast(gamma, tf.float32) + tf.cast(beta, tf.float32), x.dtype)


def rms_norm(x: tf.Tensor, weight, epsilon: float) -> tf.Tensor:
    """RMS normalisation over the last axis (HF's `LlamaRMSNorm`): statistics in float32, the result cast back to
    `x`'s dtype before the weight multiplies it, so half-precision models round where HF's do."""
    x32 = tf.cast(x, tf.float32)
    normed = x32 * tf.math.rsqrt(tf.reduce_mean(tf.square(x32), axis=-1, keepdims=True) + epsilon)
    return tf.cast(normed, x.dtype) * tf.cast(weight, x.dtype)


def rotary_cos_sin(position_ids: tf.Tensor, inverse_frequencies, scaling: float, dtype) -> tuple[tf.Tensor, tf.Tensor]:
    """cos and sin `[B, T, head_dim // 2]` in `dtype` of the RoPE angles `position * inverse_frequency`, computed in
    float32 from int `[B, T]` positions (exact up to 2**24) and scaled by `scaling` before the cast, as HF does."""
    angles = tf.cast(position_ids, tf.float32)[..., tf.newaxis] * tf.constant(inverse_frequencies, tf.float32)
    cos, sin = tf.cos(angles), tf.sin(angles)
    if scaling != 1.0:
        cos, sin = cos * scaling, sin * scaling
    return tf.cast(cos, dtype), tf.cast(sin, dtype)


def apply_rotary(x: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor) -> tf.Tensor:
    """RoPE in HF's "rotate half" layout: `x` `[B, T, heads, head_dim]` whose two halves `(a, b)` become
    `(a cos - b sin, b cos + a sin)`; cos and sin `[B, T, head_dim // 2]`."""
    first, second = tf.split(x, 2, axis=-1)
    cos, sin = cos[:, :, tf.newaxis, :], sin[:, :, tf.newaxis, :]
    return tf.concat([first * cos - second * sin, second * cos + first * sin], axis=-1)


def dense(x: tf.Tensor, kernel, bias=None) -> tf.Tensor:
    """`x @ kernel + bias` in `x`'s dtype (kernel `[in, out]`, or a `QuantizedKernel`: see
    `tfgen.models.quantize.quantized_matmul`; no bias when None)."""
    if isinstance(kernel, QuantizedKernel):
        y = quantized_matmul(x, kernel)
    else:
        y = tf.matmul(x, tf.cast(kernel, x.dtype))
    return y if bias is None else y + tf.cast(bias, x.dtype)


def dropout(x: tf.Tensor, rate: float, training: bool, seed_generator) -> tf.Tensor:
    """Keras dropout when training with a positive rate, else `x`."""
    return keras.random.dropout(x, rate, seed=seed_generator) if training and rate > 0 else x


class WeightFactory:
    """Creates a layer's weights with HF's initialisation (`config.initializer_range`) and records them under
    their HF names (`hf_prefix` + name) in `by_hf_name`, so checkpoints map onto them by name. With
    `quantize="int8"`, dense kernels and the matrices made with `quantizable=True` (token embeddings, LM heads) are
    `QuantizedKernel`s (see `assign_weight`)."""

    def __init__(self, layer: keras.layers.Layer, config, hf_prefix: str, quantize: str | None = None):
        self.layer, self.config, self.hf_prefix = layer, config, hf_prefix
        self.quantize = check_quantize(quantize)
        self.by_hf_name: dict[str, Any] = {}

    def _add(self, hf_name: str, shape, initializer):
        # No Keras autocast: the code casts explicitly, so `call` (under Keras's autocast scope) and
        # `call_with_cache` (called directly) compute identically under mixed policies.
        variable = self.layer.add_weight(
            shape=shape, initializer=initializer, name=hf_name.replace(".", "_"), autocast=False
        )
        self.by_hf_name[self.hf_prefix + hf_name] = variable
        return variable

    def _add_quantized(self, hf_name: str, shape, channel_axis: int) -> QuantizedKernel:
        """An int8 weight (zeros until a checkpoint is assigned) with a float32 scale per slice along
        `channel_axis`."""
        name = hf_name.replace(".", "_")
        values = self.layer.add_weight(shape=shape, initializer="zeros",
                                       name=name, dtype="int8", trainable=False, autocast=False)
        scale = self.layer.add_weight(shape=(shape[channel_axis],), initializer=keras.initializers.Constant(0.01),
                                      name=f"{name}_scale", trainable=False, autocast=False)
        kernel = QuantizedKernel(values, scale, channel_axis)
        self.by_hf_name[self.hf_prefix + hf_name] = kernel
        return kernel

    def normal(self, hf_name: str, shape, stddev: float | None = None, quantizable: bool = False):
        """A normal-initialised weight; int8 with a scale per row (a token's embedding, a head's output channel)
        when the factory quantizes and it is `quantizable`."""
        if self.quantize and quantizable:
            return self._add_quantized(hf_name, shape, 0)
        stddev = self.config.initializer_range if stddev is None else stddev
        return self._add(hf_name, shape, keras.initializers.RandomNormal(stddev=stddev))

    def dense(self, hf_name: str, n_in: int, n_out: int, stddev: float | None = None):
        """(kernel `[n_in, n_out]`, bias `[n_out]`) as HF's Conv1D; an int8 kernel with a scale per output column
        when the factory quantizes."""
        if self.quantize:
            kernel = self._add_quantized(f"{hf_name}.weight", (n_in, n_out), -1)
        else:
            kernel = self.normal(f"{hf_name}.weight", (n_in, n_out), stddev)
        return kernel, self._add(f"{hf_name}.bias", (n_out,), "zeros")

    def layer_norm(self, hf_name: str, dim: int):
        return self._add(f"{hf_name}.weight", (dim,), "ones"), self._add(f"{hf_name}.bias", (dim,), "zeros")


def assign_weight(variable, array) -> None:
    """Assigns a checkpoint array (HF's layout = the variable's) to a `WeightFactory` weight: a `QuantizedKernel`
    gets it quantized along its channel axis, a variable gets it cast to its dtype."""
    if isinstance(variable, QuantizedKernel):
        values, scale = quantize_array(array, variable.channel_axis)
        variable.values.assign(values)
        variable.scale.assign(scale)
    else:
        variable.assign(tf.cast(tf.convert_to_tensor(array), variable.dtype))


def weight_array(variable):
    """A `WeightFactory` weight as a float numpy array (a `QuantizedKernel` dequantized)."""
    return variable.numpy() if isinstance(variable, QuantizedKernel) else keras.ops.convert_to_numpy(variable)
