"""GPT-2 as a Keras 3 model (TF backend) with a static-buffer KV cache for XLA-compiled generation.

Weights use HF's layout (`Conv1D` kernels are `[in, out]`, the LM head is tied to `wte` unless
`tie_word_embeddings=False`), so HF checkpoints load without transposes. The config, checked field by field and
against the memory available before any layer is built, lives in `tfgen.models.gpt2_config` (re-exported here).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from typing import NamedTuple

import keras
import numpy as np
import safetensors.numpy
import tensorflow as tf

from tfgen.generation import TFGenerationMixin
from tfgen.models.layers import (
    ACTIVATIONS,
    WeightFactory,
    attention_allowed,
    dense,
    dropout,
    layer_norm,
    positions_from_mask,
    write_slots,
)
from tfgen.models.gpt2_config import GPT2Config
from tfgen.models.protocol import CacheStepOutput

__all__ = ["CausalLMOutput", "GPT2Block", "GPT2Config", "GPT2LMHeadModel"]

# Non-persistent causal-mask buffers that old HF checkpoints still carry.
_IGNORED_HF_BUFFER = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")


class CausalLMOutput(NamedTuple):
    """What `GPT2LMHeadModel.call` returns: float32 `logits` `[B, T, vocab]` and the final-norm
    `hidden_states` `[B, T, hidden]`."""

    logits: tf.Tensor
    hidden_states: tf.Tensor


class GPT2Block(keras.layers.Layer):
    """One pre-norm transformer block (attention + MLP, each residual)."""

    def __init__(self, config: GPT2Config, layer_idx: int, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        weights = WeightFactory(self, config, f"h.{layer_idx}.")
        # HF's GPT-2 scheme: residual projections start smaller, by 1/sqrt(2 * n_layer).
        residual_stddev = config.initializer_range / math.sqrt(2 * config.n_layer)
        d, inner = config.n_embd, config.inner_size
        self.ln_1 = weights.layer_norm("ln_1", d)
        self.c_attn = weights.dense("attn.c_attn", d, 3 * d)
        self.attn_c_proj = weights.dense("attn.c_proj", d, d, residual_stddev)
        self.ln_2 = weights.layer_norm("ln_2", d)
        self.c_fc = weights.dense("mlp.c_fc", d, inner)
        self.mlp_c_proj = weights.dense("mlp.c_proj", inner, d, residual_stddev)
        self.hf_variables = weights.by_hf_name
        # Folded into the queries (T x head_dim values) rather than the scores (T x S).
        self.query_scale = (
            (1.0 / math.sqrt(config.head_dim) if config.scale_attn_weights else 1.0)
            / (layer_idx + 1 if config.scale_attn_by_inverse_layer_idx else 1)
        )
        self.activation = ACTIVATIONS[config.activation_function]
        self.built = True

    def forward(self, x, attention_allowed, layer_cache, cache_index, training, seed_generator):
        """x `[B, T, D]`, attention_allowed bool `[B, 1, T, S]`. Without a cache the keys are this call's own
        (S = T); with `layer_cache` = (keys, values) `[B, heads, L, head_dim]` the new keys/values are written
        at slots `[cache_index, cache_index + T)` and attention spans the whole buffer (S = L).
        Returns (x `[B, T, D]`, updated layer_cache or None)."""
        config = self.config
        length = tf.shape(x)[1]
        qkv = dense(layer_norm(x, *self.ln_1, config.layer_norm_epsilon), *self.c_attn)
        qkv = tf.reshape(qkv, [-1, length, 3, config.n_head, config.head_dim])
        query, key, value = tf.unstack(tf.transpose(qkv, [2, 0, 3, 1, 4]))  # each [B, heads, T, head_dim]
        if layer_cache is not None:
            layer_cache = tuple(write_slots(old, new, cache_index) for old, new in zip(layer_cache, (key, value)))
            key, value = layer_cache
        scores = tf.matmul(query * self.query_scale, tf.cast(key, query.dtype), transpose_b=True)
        # A finite floor instead of -inf: a fully masked (padding) row then softmaxes to uniform weights
        # over finite values instead of NaN, which would leak into later tokens through the cache.
        scores = tf.where(attention_allowed, scores, tf.constant(scores.dtype.min, scores.dtype))
        probabilities = tf.cast(tf.nn.softmax(tf.cast(scores, tf.float32)), x.dtype)
        probabilities = dropout(probabilities, config.attn_pdrop, training, seed_generator)
        attended = tf.matmul(probabilities, tf.cast(value, x.dtype))
        attended = tf.reshape(tf.transpose(attended, [0, 2, 1, 3]), [-1, length, config.n_embd])
        x = x + dropout(dense(attended, *self.attn_c_proj), config.resid_pdrop, training, seed_generator)
        mlp = self.activation(dense(layer_norm(x, *self.ln_2, config.layer_norm_epsilon), *self.c_fc))
        x = x + dropout(dense(mlp, *self.mlp_c_proj), config.resid_pdrop, training, seed_generator)
        return x, layer_cache


class GPT2LMHeadModel(TFGenerationMixin, keras.Model):
    """GPT-2 with an LM head. Weights exist right after construction (HF's random init); a config whose weights
    cannot fit in the memory available is refused first (`GPT2Config.check_fits_in_memory`).

    `call` is the plain (training / scoring) forward; `init_cache` / `call_with_cache` implement
    `tfgen.models.protocol.CausalLMProtocol`. The cache is a tuple over layers of (keys, values), each
    `[batch, heads, max_length, head_dim]`.

    Trained with Keras: `compile(optimizer)` without a `loss` uses the causal-LM loss (see `compute_loss`).
    """

    config_class = GPT2Config

    def __init__(self, config: GPT2Config, dtype=None, **kwargs):
        if not isinstance(config, GPT2Config):
            raise TypeError(f"config must be a GPT2Config, got {type(config).__name__}")
        super().__init__(dtype=dtype, **kwargs)
        config.check_fits_in_memory(self.dtype_policy)
        self.config = config
        self.generation_config = None
        weights = WeightFactory(self, config, "")
        self.wte = weights.normal("wte.weight", (config.vocab_size, config.n_embd))
        self.wpe = weights.normal("wpe.weight", (config.n_positions, config.n_embd))
        self.blocks = [
            GPT2Block(config, index, dtype=self.dtype_policy, name=f"h_{index}") for index in range(config.n_layer)
        ]
        self.ln_f = weights.layer_norm("ln_f", config.n_embd)
        self.lm_head = self.wte if config.tie_word_embeddings else weights.normal("lm_head.weight", self.wte.shape)
        self._hf_variables = {**weights.by_hf_name}
        for block in self.blocks:
            self._hf_variables.update(block.hf_variables)
        self.seed_generator = keras.random.SeedGenerator()
        self.built = True

    # ----------------------------------------------------------------------------------------- forward

    def _forward(self, input_ids, position_ids, attention_allowed, cache, cache_index, training):
        """Returns (final-norm hidden states `[B, T, D]` in the compute dtype, updated cache or None)."""
        embeddings = tf.gather(self.wte, input_ids) + tf.gather(self.wpe, position_ids)
        x = dropout(tf.cast(embeddings, self.compute_dtype), self.config.embd_pdrop, training, self.seed_generator)
        layer_caches = [None] * len(self.blocks) if cache is None else cache
        new_caches = []
        for block, layer_cache in zip(self.blocks, layer_caches):
            x, layer_cache = block.forward(
                x, attention_allowed, layer_cache, cache_index, training, self.seed_generator
            )
            new_caches.append(layer_cache)
        hidden = layer_norm(x, *self.ln_f, self.config.layer_norm_epsilon)
        return hidden, None if cache is None else tuple(new_caches)

    def _logits(self, hidden, head_transposed=None):
        # float32 logits whatever the compute dtype: losses and sampling want full precision.
        if head_transposed is not None:  # `[D, vocab]`, see `decoding_view`
            return tf.cast(tf.matmul(hidden, tf.cast(head_transposed, hidden.dtype)), tf.float32)
        return tf.cast(tf.matmul(hidden, tf.cast(self.lm_head, hidden.dtype), transpose_b=True), tf.float32)

    def decoding_view(self, rows):
        """The model as a decode loop should call it for steps of `rows` rows (an int, or None if unknown).

        The tied LM head multiplies by the `[vocab, D]` embedding, which XLA's CPU dot reads at about half the
        bandwidth of a `[D, vocab]` matrix once a step has several rows (beams, candidates, batches; see
        docs/performance.md). For those the view transposes the head once per program run, before the loop,
        and the steps use the copy: nothing is stored, so it can never go stale. One-row steps are already
        fast (a matrix-vector product) and get the model itself.
        """
        if rows == 1:
            return self
        return _TransposedHeadView(self, tf.transpose(self.lm_head))

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
        allowed = attention_allowed(tf.range(tf.shape(input_ids)[1]), attention_mask)
        hidden, _ = self._forward(input_ids, position_ids, allowed, None, None, training)
        return CausalLMOutput(self._logits(hidden), hidden)

    def init_cache(self, batch_size, max_length, dtype=None):
        """Zero cache: a tuple over layers of (keys, values), each `[batch_size, heads, max_length, head_dim]`
        in `dtype` (default: the compute dtype)."""
        for name, value in (("batch_size", batch_size), ("max_length", max_length)):
            if isinstance(value, int) and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        # No check against n_positions: positions come from the mask, so a bucket-padded buffer may hold
        # more slots than the model has positions.
        shape = [batch_size, self.config.n_head, max_length, self.config.head_dim]
        dtype = dtype or self.compute_dtype
        return tuple((tf.zeros(shape, dtype), tf.zeros(shape, dtype)) for _ in self.blocks)

    def call_with_cache(
        self,
        input_ids,
        cache,
        cache_index,
        attention_mask,
        position_ids,
        last_logits_only=False,
        compute_logits=True,
        _head_transposed=None,
    ) -> CacheStepOutput:
        """Runs int `[B, T]` tokens at buffer slots `[cache_index, cache_index + T)` (see
        `tfgen.models.protocol`). attention_mask: `[B, max_length]` over the whole buffer; position_ids
        int `[B, T]`. Returns `CacheStepOutput(logits [B, T or 1, vocab] float32, hidden_states [B, T, D],
        cache)`; with `compute_logits=False` the LM head is skipped and `logits` is None (see
        `logits_from_hidden`)."""
        if len(cache) != len(self.blocks):
            raise ValueError(f"cache has {len(cache)} layers, the model has {len(self.blocks)}")
        cache_index = tf.cast(cache_index, tf.int32)
        input_ids = tf.cast(input_ids, tf.int32)
        allowed = attention_allowed(cache_index + tf.range(tf.shape(input_ids)[1]), attention_mask)
        hidden, cache = self._forward(input_ids, tf.cast(position_ids, tf.int32), allowed, cache, cache_index, False)
        if not compute_logits:
            return CacheStepOutput(None, hidden, cache)
        logits = self._logits(hidden[:, -1:] if last_logits_only else hidden, _head_transposed)
        return CacheStepOutput(logits, hidden, cache)

    def logits_from_hidden(self, hidden_states) -> tf.Tensor:
        """float32 logits `[..., vocab]` of final-norm hidden states `[..., D]` (the `hidden_states` of
        `call_with_cache`): the LM head alone, for rows chosen after a `compute_logits=False` call."""
        return self._logits(hidden_states)

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

    # ------------------------------------------------------------------------------------- HF weights

    def load_hf_state_dict(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Assigns HF GPT-2 weights (names with or without the `transformer.` prefix; `attn.bias` /
        `attn.masked_bias` buffers ignored; `lm_head.weight` optional when tied). Missing, unexpected or
        mis-shaped tensors raise `ValueError` listing them all; nothing is assigned then."""
        provided, unexpected, mismatched = {}, [], {}
        for name, array in tensors.items():
            short_name = name.removeprefix("transformer.")
            if _IGNORED_HF_BUFFER.fullmatch(short_name):
                continue
            # A tied checkpoint may still carry the head (a copy of wte): only its shape matters.
            tied_head = short_name == "lm_head.weight" and self.config.tie_word_embeddings
            variable = self.wte if tied_head else self._hf_variables.get(short_name)
            if variable is None:
                unexpected.append(name)
            elif tuple(array.shape) != tuple(variable.shape):
                mismatched[short_name] = f"{name}: checkpoint {tuple(array.shape)} vs model {tuple(variable.shape)}"
            elif not tied_head:
                provided[short_name] = array
        missing = sorted(set(self._hf_variables) - set(provided) - set(mismatched))
        if missing or unexpected or mismatched:
            raise ValueError(
                "checkpoint does not match GPT2LMHeadModel: "
                f"missing={missing}, unexpected={sorted(unexpected)}, shape_mismatch={list(mismatched.values())}"
            )
        for short_name, array in provided.items():
            variable = self._hf_variables[short_name]
            variable.assign(tf.cast(tf.convert_to_tensor(array), variable.dtype))

    def hf_state_dict(self) -> dict[str, np.ndarray]:
        """The weights under HF `GPT2LMHeadModel` names (a tied `lm_head.weight` omitted, as HF saves it)."""
        return {
            (name if name == "lm_head.weight" else f"transformer.{name}"): keras.ops.convert_to_numpy(variable)
            for name, variable in self._hf_variables.items()
        }

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Writes `config.json` and `model.safetensors` (plus `generation_config.json` when
        `generation_config` is set) that HF's `GPT2LMHeadModel.from_pretrained` loads."""
        os.makedirs(directory, exist_ok=True)
        config_dict = {**self.config.to_dict(), "torch_dtype": keras.backend.standardize_dtype(self.wte.dtype)}
        with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as file:
            json.dump(config_dict, file, indent=2, sort_keys=True)
        safetensors.numpy.save_file(
            self.hf_state_dict(), os.path.join(directory, "model.safetensors"), metadata={"format": "pt"}
        )
        if self.generation_config is not None:
            self.generation_config.save_pretrained(directory)


class _TransposedHeadView:
    """A GPT-2 model whose LM head uses a `[D, vocab]` copy made for one program run (see `decoding_view`)."""

    def __init__(self, model: GPT2LMHeadModel, head_transposed: tf.Tensor):
        self._model, self._head_transposed = model, head_transposed

    def __getattr__(self, name):
        return getattr(self._model, name)

    def decoding_view(self, rows):
        return self

    def call_with_cache(self, *args, **kwargs) -> CacheStepOutput:
        return self._model.call_with_cache(*args, _head_transposed=self._head_transposed, **kwargs)

    def logits_from_hidden(self, hidden_states) -> tf.Tensor:
        return self._model._logits(hidden_states, self._head_transposed)
