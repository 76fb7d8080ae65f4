"""GPT-2 as a Keras 3 model (TF backend) with a static-buffer KV cache for XLA-compiled generation.

Weights use HF's layout (`Conv1D` kernels are `[in, out]`, the LM head is tied to `wte` unless
`tie_word_embeddings=False`), so HF checkpoints load without transposes. The config, checked field by field and
against the memory available before any layer is built, lives in `tfgen.models.gpt2_config` (re-exported here).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import keras
import numpy as np
import tensorflow as tf

from tfgen.models.causal_lm import CausalLMOutput, KerasCausalLM
from tfgen.models.gpt2_config import GPT2Config
from tfgen.models.hf_weights import select_hf_tensors
from tfgen.models.layers import (
    ACTIVATIONS,
    WeightFactory,
    assign_weight,
    attention_allowed,
    dense,
    dropout,
    layer_norm,
    query_slots,
    weight_array,
    write_slots,
)
from tfgen.models.quantize import embedding_rows

__all__ = ["CausalLMOutput", "GPT2Block", "GPT2Config", "GPT2LMHeadModel"]

# Non-persistent causal-mask buffers that old HF checkpoints still carry.
_IGNORED_HF_BUFFER = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")


class GPT2Block(keras.layers.Layer):
    """One pre-norm transformer block (attention + MLP, each residual)."""

    def __init__(self, config: GPT2Config, layer_idx: int, quantize: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        weights = WeightFactory(self, config, f"h.{layer_idx}.", quantize)
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


class GPT2LMHeadModel(KerasCausalLM):
    """GPT-2 with an LM head. Weights exist right after construction (HF's random init); a config whose weights
    cannot fit in the memory available is refused first (`GPT2Config.check_fits_in_memory`).

    `call` is the plain (training / scoring) forward; `init_cache` / `call_with_cache` implement
    `tfgen.decoding.model_protocol.CausalLMProtocol`. The cache is a tuple over layers of (keys, values), each
    `[batch, heads, max_length, head_dim]`.

    Trained with Keras: `compile(optimizer)` without a `loss` uses the causal-LM loss (see `compute_loss`).
    """

    config_class = GPT2Config
    model_types = ("gpt2",)
    lm_head_vocab_major = True  # HF's `[vocab, D]`: the head may be the tied `wte`
    quantizable = True  # `quantize="int8"` (tfgen.models.quantize): kernels, wte and the head; wpe stays float

    def __init__(self, config: GPT2Config, dtype=None, quantize: str | None = None, **kwargs):
        super().__init__(config, dtype=dtype, quantize=quantize, **kwargs)
        weights = WeightFactory(self, config, "", quantize)
        self.wte = weights.normal("wte.weight", (config.vocab_size, config.n_embd), quantizable=True)
        self.wpe = weights.normal("wpe.weight", (config.n_positions, config.n_embd))
        self.blocks = [
            GPT2Block(config, index, quantize, dtype=self.dtype_policy, name=f"h_{index}")
            for index in range(config.n_layer)
        ]
        self.ln_f = weights.layer_norm("ln_f", config.n_embd)
        self.lm_head = self.wte if config.tie_word_embeddings else weights.normal("lm_head.weight", self.wte.shape,
                                                                                  quantizable=True)
        self._hf_variables = {**weights.by_hf_name}
        for block in self.blocks:
            self._hf_variables.update(block.hf_variables)
        self.seed_generator = keras.random.SeedGenerator()
        self.built = True

    # ----------------------------------------------------------------------------------------- forward

    def _forward(self, input_ids, position_ids, attention_allowed, cache, cache_index, training, layers=None):
        """Returns (final-norm hidden states `[B, T, D]` in the compute dtype, updated cache or None); `layers`: run
        only the first that many blocks (early exit; the other blocks' caches pass through)."""
        # The cast: an int8 wte's rows come back in float32 (a no-op for a float model's equal dtypes).
        embeddings = tf.cast(embedding_rows(self.wte, input_ids), self.wpe.dtype) + tf.gather(self.wpe, position_ids)
        x = dropout(tf.cast(embeddings, self.compute_dtype), self.config.embd_pdrop, training, self.seed_generator)
        layer_caches = [None] * len(self.blocks) if cache is None else cache
        new_caches = list(layer_caches)
        for index, block in enumerate(self.blocks[:layers]):
            x, new_caches[index] = block.forward(
                x, attention_allowed, layer_caches[index], cache_index, training, self.seed_generator
            )
        hidden = layer_norm(x, *self.ln_f, self.config.layer_norm_epsilon)
        return hidden, None if cache is None else tuple(new_caches)

    def _hidden_states(self, input_ids, attention_mask, position_ids, training):
        """Final-norm hidden states `[B, T, D]` of the plain forward (see `KerasCausalLM.call`)."""
        allowed = attention_allowed(tf.range(tf.shape(input_ids)[1]), attention_mask)
        hidden, _ = self._forward(input_ids, position_ids, allowed, None, None, training)
        return hidden

    def _cached_forward(self, input_ids, cache, cache_index, attention_mask, position_ids, layers=None):
        """(hidden states `[B, T, D]`, updated cache) of `call_with_cache` (see `KerasCausalLM`)."""
        allowed = attention_allowed(query_slots(cache_index, tf.shape(input_ids)[1]), attention_mask)
        return self._forward(input_ids, position_ids, allowed, cache, cache_index, False, layers)

    # ------------------------------------------------------------------------------------- HF weights

    def load_hf_state_dict(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Assigns HF GPT-2 weights (names with or without the `transformer.` prefix; `attn.bias` /
        `attn.masked_bias` buffers ignored; `lm_head.weight` optional when tied). Missing, unexpected or
        mis-shaped tensors raise `ValueError` listing them all; nothing is assigned then."""
        expected = {name: tuple(variable.shape) for name, variable in self._hf_variables.items()}
        # A tied checkpoint may still carry the head (a copy of wte): only its shape matters.
        tied_head = {"lm_head.weight": tuple(self.wte.shape)} if self.config.tie_word_embeddings else {}
        provided = select_hf_tensors(
            tensors, expected, "GPT2LMHeadModel", optional=tied_head,
            rename=lambda name: name.removeprefix("transformer."), ignored=_IGNORED_HF_BUFFER.fullmatch,
        )
        for short_name, array in provided.items():
            assign_weight(self._hf_variables[short_name], array)

    def hf_state_dict(self) -> dict[str, np.ndarray]:
        """The weights under HF `GPT2LMHeadModel` names (a tied `lm_head.weight` omitted, as HF saves it)."""
        return {
            (name if name == "lm_head.weight" else f"transformer.{name}"): weight_array(variable)
            for name, variable in self._hf_variables.items()
        }

