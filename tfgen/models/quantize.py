"""int8 weights (`from_pretrained(..., quantize="int8")`): symmetric per-output-channel quantization, the kernels that
hold it, and the matmuls that read it.

A quantized kernel is an int8 variable and a float32 scale per output channel (`value = int8 * scale`, the scale the
channel's abs-max over 127), so a model holds about a quarter of its float32 bytes, in memory and in its SavedModel.
Norms, biases and tables that are not matrices of a matmul (T5's relative position buckets) stay float.

Which matmul runs is picked from the static row count of the activations, so one compiled program holds one form
(measured on SmolLM2 shapes, see docs/performance.md, "int8 weights"):

- several rows (a batch, beams, candidates, a prompt of several tokens, or rows unknown when traced, as in an export
  with a free batch): W8A8 — each activation row quantized on the fly by its abs-max per group of
  `ACTIVATION_GROUP` inputs, `s8 x s8 -> s32` dots (`tf.linalg.matmul(..., output_type=tf.int32)`, which XLA
  compiles to integer dots), then both scales;
- one row (a batch-1 decode step): weight-only — the int8 weights cast to the compute dtype, then the dot, then the
  channel scales; exact up to float rounding (an int8 value is exact in float32 and in bfloat16).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

# The int8 range used: symmetric, so that -x quantizes to -q (-128 is never produced).
_LEVELS = 127.0
#: Inputs per activation scale in a W8A8 matmul (None: one scale per row). Groups of 64 keep an outlier channel of
#: the residual stream from flattening its whole row (SmolLM2: max logit error 8% instead of 26% of the float32
#: logits' scale), at 5% (first measurement) to 8% (a later, quieter one) of one scale per row's step time
#: (docs/performance.md, "int8 weights"). One scale per row with SmoothQuant scale migration (alpha 0.5) still loses
#: 1.95% perplexity (docs/performance.md, "int8 accuracy").
ACTIVATION_GROUP = 64


class QuantizedArray(NamedTuple):
    """A checkpoint tensor already quantized (GGUF loads quantize each tensor right after dequantizing it): int8
    `values` in HF's `[out, in]` layout and float32 `scale` `[out]`, one per row."""

    values: np.ndarray
    scale: np.ndarray

    @property
    def shape(self) -> tuple:
        return self.values.shape


def quantize_array(array: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(int8 values of `array`'s shape, float32 scales `[array.shape[axis]]`): each slice along `axis` (one output
    channel) scaled by its abs-max / 127 and rounded to nearest. An all-zero channel gets scale 1 (its values are 0)."""
    array = np.asarray(array, dtype=np.float32)
    reduce = tuple(dim for dim in range(array.ndim) if dim != axis % array.ndim)
    peak = np.max(np.abs(array), axis=reduce, keepdims=True)
    scale = np.where(peak > 0, peak / _LEVELS, 1.0).astype(np.float32)
    values = np.clip(np.rint(array / scale), -_LEVELS, _LEVELS).astype(np.int8)
    return values, scale.reshape(-1)


def quantize_rows(array: np.ndarray) -> QuantizedArray:
    """A checkpoint tensor `[out, in]` quantized per row (its output channels), as `QuantizedArray`."""
    return QuantizedArray(*quantize_array(array, 0))


class QuantizedKernel:
    """A 2-D weight stored as int8 `values` (a `tf.Variable` / Keras variable, the model's layout) and float32
    `scale` `[channels]`, one per output channel: `channel_axis` of `values` (the last axis for an `[in, out]`
    kernel or a `[D, vocab]` embedding, 0 for a `[vocab, D]` one)."""

    def __init__(self, values, scale, channel_axis: int):
        self.values, self.scale, self.channel_axis = values, scale, channel_axis

    @property
    def shape(self):
        return self.values.shape

    def dequantized(self, dtype=tf.float32) -> tf.Tensor:
        """The weight in `dtype`, `values * scale` (the model's layout)."""
        scale = self.scale if self.channel_axis in (-1, len(self.values.shape) - 1) else self.scale[:, tf.newaxis]
        return tf.cast(tf.cast(self.values, tf.float32) * scale, dtype)

    def numpy(self) -> np.ndarray:
        """The dequantized weight as a float32 numpy array (what `save_pretrained` writes)."""
        return self.dequantized().numpy()


def static_rows(x: tf.Tensor) -> int | None:
    """The number of rows of `x` `[..., in]` (the product of its leading dimensions) when the trace knows it."""
    dims = x.shape[:-1]
    if dims.rank is None or any(size is None for size in dims):
        return None
    return int(np.prod(dims, dtype=np.int64))


def quantized_matmul(x: tf.Tensor, kernel: QuantizedKernel, transpose_b: bool = False) -> tf.Tensor:
    """`x @ W` (or `x @ W^T` with `transpose_b`) for `x` `[..., in]` and the int8 weight `W`, in `x`'s dtype
    `[..., out]`; the output channels are `W`'s `channel_axis` (its last axis, or its first with `transpose_b`).
    One row known when traced: weight-only; otherwise W8A8 (see the module docstring)."""
    if static_rows(x) == 1:
        y = tf.matmul(x, tf.cast(kernel.values, x.dtype), transpose_b=transpose_b)
        return y * tf.cast(kernel.scale, x.dtype)
    return _w8a8(x, kernel, transpose_b)


def _w8a8(x: tf.Tensor, kernel: QuantizedKernel, transpose_b: bool) -> tf.Tensor:
    """W8A8: `x`'s rows quantized to int8 by their own abs-max (per group of `ACTIVATION_GROUP` inputs when the
    input width divides into them), int32-accumulating int8 dots, then the activation and the channel scales."""
    shape = tf.shape(x)
    width = x.shape[-1]
    rows = tf.reshape(tf.cast(x, tf.float32), [-1, width])
    group = ACTIVATION_GROUP if ACTIVATION_GROUP and width % ACTIVATION_GROUP == 0 and not transpose_b else None
    if group is None:
        quantized, row_scale = _quantize_rows(rows)
        accumulated = tf.linalg.matmul(quantized, kernel.values, transpose_b=transpose_b, output_type=tf.int32)
        y = tf.cast(accumulated, tf.float32) * row_scale
    else:
        groups = width // group
        quantized, row_scale = _quantize_rows(tf.transpose(tf.reshape(rows, [-1, groups, group]), [1, 0, 2]))
        values = tf.reshape(kernel.values, [groups, group, -1])
        accumulated = tf.linalg.matmul(quantized, values, output_type=tf.int32)  # [groups, rows, out]
        y = tf.reduce_sum(tf.cast(accumulated, tf.float32) * row_scale, axis=0)
    y = y * kernel.scale
    return tf.cast(tf.reshape(y, tf.concat([shape[:-1], tf.shape(y)[-1:]], 0)), x.dtype)


def _quantize_rows(rows: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(int8 `rows`, float32 scales `[..., 1]`): each row of `rows` `[..., width]` over its abs-max / 127."""
    peak = tf.reduce_max(tf.abs(rows), axis=-1, keepdims=True)
    scale = tf.where(peak > 0, peak / _LEVELS, tf.ones_like(peak))
    # |rows / scale| <= 127 by construction: no clip needed before the cast.
    return tf.cast(tf.round(rows / scale), tf.int8), scale


def embedding_rows(table, ids: tf.Tensor) -> tf.Tensor:
    """The rows `ids` (int `[...]`) of a `[vocab, D]` embedding `table` (a variable or a `QuantizedKernel` whose
    channels are its rows), `[..., D]`: a quantized table's int8 rows times their scales, in float32."""
    if not isinstance(table, QuantizedKernel):
        return tf.gather(table, ids)
    return tf.cast(tf.gather(table.values, ids), tf.float32) * tf.gather(table.scale, ids)[..., tf.newaxis]


def embedding_columns(table, ids: tf.Tensor) -> tf.Tensor:
    """The columns `ids` (int `[...]`) of a `[D, vocab]` embedding `table` (a variable or a `QuantizedKernel` whose
    channels are its columns), float32 `[D, ...]`: a quantized table's int8 columns times their scales."""
    if not isinstance(table, QuantizedKernel):
        return tf.gather(table, ids, axis=1)
    return tf.cast(tf.gather(table.values, ids, axis=1), tf.float32) * tf.gather(table.scale, ids)
