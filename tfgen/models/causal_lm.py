"""What tfgen's Keras causal LMs share: the plain forward's inputs, the causal-LM loss, the LM head alone for
contrastive search, and `save_pretrained` (`tfgen.models.hf_weights`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import keras
import tensorflow as tf

from tfgen.decoding.model_protocol import CacheStepOutput
from tfgen.generation.mixin import TFGenerationMixin
from tfgen.models.layers import positions_from_mask
from tfgen.models.pretrained import PretrainedModel
from tfgen.models.quantize import QuantizedKernel, quantized_matmul
from tfgen.models.quantize_modes import check_quantize


class CausalLMOutput(NamedTuple):
    """What a model's `call` returns: float32 `logits` `[B, T, vocab]` and the final-norm `hidden_states`
    `[B, T, hidden]`."""

    logits: tf.Tensor
    hidden_states: tf.Tensor


class KerasCausalLM(PretrainedModel, TFGenerationMixin, keras.Model):
    """Base of the Keras 3 models. A subclass sets `config_class` and provides `_hidden_states(input_ids,
    attention_mask, position_ids, training)` (the final-norm hidden states of a plain forward), `_cached_forward(
    input_ids, cache, cache_index, attention_mask, position_ids)` (hidden states and the updated cache of
    `call_with_cache`), the `lm_head` variable with its layout `lm_head_vocab_major`, and `hf_state_dict()`. The cache
    is a tuple over layers of (keys, values) (`init_cache`)."""

    config_class: type
    #: The config.json `model_type` values this class loads (`tfgen.auto` maps each to it).
    model_types: tuple[str, ...]
    #: `call_with_cache` takes a per-row `cache_index` (see `tfgen.decoding.model_protocol`).
    row_cache_index = True
    # Whether `lm_head` is stored `[vocab, D]` (True) or `[D, vocab]` (False); a decoding view uses the other layout.
    lm_head_vocab_major: bool

    def __init__(self, config, dtype=None, quantize: str | None = None, **kwargs):
        """Checks `config` (a `config_class`), `quantize` (None or "int8": int8 kernels, embeddings and head, see
        `tfgen.models.quantize`) and that its weights fit in memory in `dtype`, before any weight is made; sets
        `config`, `quantization` (the `quantize` mode) and `generation_config` (None until a loader sets it)."""
        if not isinstance(config, self.config_class):
            raise TypeError(f"config must be a {self.config_class.__name__}, got {type(config).__name__}")
        quantize = check_quantize(quantize)
        super().__init__(dtype=dtype, **kwargs)
        # Not `self.quantize`: that is Keras's own `Model.quantize()` method.
        self.quantization = quantize
        config.check_fits_in_memory(self.dtype_policy)
        self.config = config
        self.generation_config = None

    def call(self, input_ids, attention_mask=None, position_ids=None, training=False) -> CausalLMOutput:
        """Full causal forward.

        input_ids: int `[B, T]`, or a dict with `input_ids` and optionally `attention_mask` /
            `position_ids` (how Keras `fit` passes a dict `x`). attention_mask: `[B, T]` (1 = real token),
            default all ones. position_ids: int `[B, T]`, default `positions_from_mask(attention_mask)`.
        Returns `CausalLMOutput(logits [B, T, vocab] float32, hidden_states [B, T, D])`.
        """
        if isinstance(input_ids, Mapping):
            inputs = dict(input_ids)
            unknown = set(inputs) - {"input_ids", "attention_mask", "position_ids"}
            if "input_ids" not in inputs or unknown or attention_mask is not None or position_ids is not None:
                raise ValueError(
                    "a dict input_ids must hold 'input_ids' and only optionally 'attention_mask'/'position_ids' "
                    f"(and then no separate mask/positions); got keys {sorted(inputs)}"
                )
            return self.call(**inputs, training=training)
        input_ids = tf.cast(input_ids, tf.int32)
        attention_mask = tf.ones_like(input_ids) if attention_mask is None else tf.cast(attention_mask, tf.int32)
        position_ids = positions_from_mask(attention_mask) if position_ids is None else tf.cast(position_ids, tf.int32)
        hidden = self._hidden_states(input_ids, attention_mask, position_ids, training)
        return CausalLMOutput(self._logits(hidden), hidden)

    def init_cache(self, batch_size, max_length, dtype=None):
        """Zero cache: a tuple over layers of (keys, values), each `[batch_size, kv_heads, max_length, head_dim]` in
        `dtype` (default: the compute dtype); `kv_heads` is the config's `num_key_value_heads` where it has one,
        else `num_attention_heads`."""
        for name, value in (("batch_size", batch_size), ("max_length", max_length)):
            if isinstance(value, int) and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        # No check against max_position_embeddings: positions come from the mask, so a bucket-padded buffer may
        # hold more slots than the model has positions.
        config = self.config
        heads = getattr(config, "num_key_value_heads", config.num_attention_heads)
        shape, dtype = [batch_size, heads, max_length, config.head_dim], dtype or self.compute_dtype
        return tuple((tf.zeros(shape, dtype), tf.zeros(shape, dtype)) for _ in range(config.num_hidden_layers))

    def call_with_cache(
        self,
        input_ids,
        cache,
        cache_index,
        attention_mask,
        position_ids,
        last_logits_only=False,
        compute_logits=True,
        head_transposed=None,
        layers=None,
    ) -> CacheStepOutput:
        """Runs int `[B, T]` tokens at buffer slots `[cache_index, cache_index + T)` (see
        `tfgen.decoding.model_protocol`). attention_mask: `[B, max_length]` over the whole buffer; position_ids int `[B,
        T]`. Returns `CacheStepOutput(logits [B, T or 1, vocab] float32, hidden_states [B, T, D], cache)`; with
        `compute_logits=False` the LM head is skipped and `logits` is None (see `logits_from_hidden`).
        head_transposed: the transposed head copy of a decoding view (see `decoding_view`), None for the stored one.
        layers: run only the first `layers` decoder layers, then the final norm and the head (early exit: the
        other layers' caches pass through unchanged); None runs them all. `cache_index` may be int32 `[B]`."""
        if len(cache) != self.config.num_hidden_layers:
            raise ValueError(f"cache has {len(cache)} layers, the model has {self.config.num_hidden_layers}")
        hidden, cache = self._cached_forward(
            tf.cast(input_ids, tf.int32), cache, tf.cast(cache_index, tf.int32), attention_mask,
            tf.cast(position_ids, tf.int32), layers,
        )
        if not compute_logits:
            return CacheStepOutput(None, hidden, cache)
        logits = self._logits(hidden[:, -1:] if last_logits_only else hidden, head_transposed)
        return CacheStepOutput(logits, hidden, cache)

    def logits_from_hidden(self, hidden_states) -> tf.Tensor:
        """float32 logits `[..., vocab]` of final-norm hidden states `[..., D]` (the `hidden_states` of
        `call_with_cache`): the LM head alone, for rows chosen after a `compute_logits=False` call."""
        return self._logits(hidden_states)

    def _logits(self, hidden, head_transposed=None) -> tf.Tensor:
        """float32 logits (whatever the compute dtype: losses and sampling want full precision) of `hidden` `[..., D]`
        through `lm_head`, or through `head_transposed`, its transposed copy made by a decoding view."""
        head, vocab_major = self.lm_head, self.lm_head_vocab_major
        if head_transposed is not None:
            head, vocab_major = head_transposed, not vocab_major
        if isinstance(head, QuantizedKernel):
            return tf.cast(quantized_matmul(hidden, head, transpose_b=vocab_major), tf.float32)
        return tf.cast(tf.matmul(hidden, tf.cast(head, hidden.dtype), transpose_b=vocab_major), tf.float32)

    def decoding_view(self, rows):
        """The model as a decode loop should call it for steps of `rows` rows (an int, or None if unknown).

        XLA's CPU dot reads the two layouts of the LM head at different speeds: one row (a matrix-vector product) is
        fastest through `[D, vocab]` and several rows (beams, candidates, batches) through `[vocab, D]` on the Llama
        head, and the other way round through GPT-2's tied `[vocab, D]` embedding (see docs/performance.md). A model
        stores the layout its one-row steps want; for several rows the view transposes the head once per program
        run, before the loop, and the steps use the copy: nothing is stored, so it can never go stale. One-row steps
        get the model itself. An int8 model's steps get the model itself too: its matmuls pick their form from the
        rows they see (`tfgen.models.quantize`).
        """
        if rows == 1 or self.quantization is not None:
            return self
        return TransposedHeadView(self, tf.transpose(self.lm_head))

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """Keras hook. With a `loss` given to `compile()`, Keras's default. Otherwise the causal-LM loss:
        mean cross-entropy of `logits[:, :-1]` against `labels[:, 1:]`, where labels are `y` (int `[B, T]`)
        or else the input ids; labels < 0 (HF's -100) and padding (mask 0 in a dict `x`) are ignored."""
        if self.loss is not None:
            return super().compute_loss(x, y, y_pred, sample_weight, training)
        if sample_weight is not None:
            raise ValueError("sample_weight is not supported by the built-in causal-LM loss; mask labels with -100")
        inputs = x if isinstance(x, Mapping) else {"input_ids": x}
        labels = tf.cast(inputs["input_ids"] if y is None else y, tf.int32)[:, 1:]
        keep = labels >= 0
        if "attention_mask" in inputs:
            keep &= tf.cast(inputs["attention_mask"], tf.bool)[:, 1:]
        token_losses = keras.losses.sparse_categorical_crossentropy(
            tf.maximum(labels, 0), y_pred.logits[:, :-1], from_logits=True
        )
        weights = tf.cast(keep, token_losses.dtype)
        return tf.reduce_sum(token_losses * weights) / tf.maximum(tf.reduce_sum(weights), 1.0)



class TransposedHeadView:
    """A model whose LM head uses `head_transposed`, a transposed copy of its stored head made for one program run
    (see `KerasCausalLM.decoding_view`): every step's `_logits` gets it as `head_transposed`."""

    def __init__(self, model: KerasCausalLM, head_transposed: tf.Tensor):
        self._model, self._head_transposed = model, head_transposed

    def __getattr__(self, name):
        return getattr(self._model, name)

    def decoding_view(self, rows):
        return self

    def call_with_cache(self, *args, **kwargs) -> CacheStepOutput:
        return self._model.call_with_cache(*args, head_transposed=self._head_transposed, **kwargs)

    def logits_from_hidden(self, hidden_states) -> tf.Tensor:
        return self._model._logits(hidden_states, self._head_transposed)
