"""Llama-family decoders — HF `llama`, `mistral`, `qwen2`, `qwen3` — as one Keras 3 model (TF backend) with tfgen's
static-buffer KV cache for XLA-compiled generation.

Layout for CPU decoding: every kernel is stored `[in, out]`, q/k/v are one kernel and gate/up another (fused when an
HF checkpoint is loaded, split again by `hf_state_dict`), and the token embedding is stored `[hidden, vocab]`, so the
(tied or untied) LM head is an `x @ W` that XLA's CPU dot reads at full bandwidth for one row. A decode step at batch
1 is then a handful of matrix-vector products per layer; steps of several rows use a `[vocab, D]` copy of the head
made once per run (`decoding_view`), which XLA's CPU dot multiplies faster for them.

Attention is grouped-query without repeating keys/values (`tfgen.models.attention`).
The config, checked field by field before any layer is built, lives in `tfgen.models.llama_config` (re-exported).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import keras
import numpy as np
import tensorflow as tf

from tfgen.models.attention import attention_masks, grouped_attention
from tfgen.models.causal_lm import CausalLMOutput, KerasCausalLM
from tfgen.models.hf_weights import HFWeights, assign_hf_parts, hf_part_arrays, select_hf_tensors
from tfgen.models.layers import ACTIVATIONS, apply_rotary, dense, query_slots, rms_norm, rotary_cos_sin
from tfgen.models.llama_config import LlamaConfig
from tfgen.models.quantize import embedding_columns

__all__ = ["CausalLMOutput", "LlamaConfig", "LlamaDecoderLayer", "LlamaForCausalLM"]

# RoPE frequency buffers that old checkpoints still carry (HF recomputes them from the config).
_IGNORED_HF_BUFFER = re.compile(r"model\.(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq")


class LlamaDecoderLayer(keras.layers.Layer):
    """One pre-norm decoder layer: RMSNorm → attention (RoPE, grouped-query, optional sliding window) → residual,
    RMSNorm → gated MLP `down(act(gate(x)) * up(x))` → residual."""

    def __init__(self, config: LlamaConfig, layer_idx: int, quantize: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.window = config.layer_windows[layer_idx]
        weights = HFWeights(self, f"model.layers.{layer_idx}.", stddev_scale=config.initializer_range,
                            quantize=quantize)
        d, hd, inner = config.hidden_size, config.head_dim, config.intermediate_size
        q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
        self.input_norm = weights.norm("input_layernorm.weight", d)
        self.qkv = weights.linear("self_attn", ("q_proj", "k_proj", "v_proj"), d, (q, kv, kv), bias=config.qkv_bias)
        self.q_norm = weights.norm("self_attn.q_norm.weight", hd) if config.qk_norm else None
        self.k_norm = weights.norm("self_attn.k_norm.weight", hd) if config.qk_norm else None
        self.o_proj = weights.linear("self_attn", ("o_proj",), q, (d,), bias=config.output_bias)
        self.post_norm = weights.norm("post_attention_layernorm.weight", d)
        self.gate_up = weights.linear("mlp", ("gate_proj", "up_proj"), d, (inner, inner), bias=config.mlp_bias)
        self.down = weights.linear("mlp", ("down_proj",), inner, (d,), bias=config.mlp_bias)
        self.hf_parts = weights.parts
        # Folded into the queries (T x head_dim values) rather than the scores (T x S).
        self.query_scale = 1.0 / math.sqrt(hd)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.built = True

    def forward(self, x, cos, sin, allowed, layer_cache, cache_index, training, seed_generator):
        """x `[B, T, D]`; cos/sin `[B, T, head_dim // 2]`; `allowed` and `layer_cache` (keys, values
        `[B, kv_heads, L, head_dim]`, or None without a cache) as `tfgen.models.attention.grouped_attention` takes
        them. Returns (x `[B, T, D]`, updated layer_cache or None)."""
        config = self.config
        heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        length = tf.shape(x)[1]
        qkv = dense(rms_norm(x, self.input_norm, config.rms_norm_eps), *self.qkv)
        query, key, value = tf.split(qkv, [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], axis=-1)
        query = tf.reshape(query, [-1, length, heads, head_dim])
        key = tf.reshape(key, [-1, length, kv_heads, head_dim])
        value = tf.reshape(value, [-1, length, kv_heads, head_dim])
        if self.q_norm is not None:  # Qwen3: per-head RMSNorm before RoPE
            query = rms_norm(query, self.q_norm, config.rms_norm_eps)
            key = rms_norm(key, self.k_norm, config.rms_norm_eps)
        query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
        attended, layer_cache = grouped_attention(
            query * tf.cast(self.query_scale, query.dtype), key, value, allowed, layer_cache, cache_index,
            dropout_rate=config.attention_dropout, training=training, seed_generator=seed_generator,
        )
        x = x + dense(tf.reshape(attended, [-1, length, heads * head_dim]), *self.o_proj)
        gate, up = tf.split(dense(rms_norm(x, self.post_norm, config.rms_norm_eps), *self.gate_up), 2, axis=-1)
        return x + dense(self.activation(gate) * up, *self.down), layer_cache


class LlamaForCausalLM(KerasCausalLM):
    """A Llama-family decoder with an LM head (`config.model_type` picks the family). Weights exist right after
    construction (HF's random init); a config whose weights cannot fit in the memory available is refused first
    (`LlamaConfig.check_fits_in_memory`).

    `call` is the plain (training / scoring) forward; `init_cache` / `call_with_cache` implement
    `tfgen.decoding.model_protocol.CausalLMProtocol`. The cache is a tuple over layers of (keys, values), each
    `[batch, num_key_value_heads, max_length, head_dim]`.

    Trained with Keras: `compile(optimizer)` without a `loss` uses the causal-LM loss (see `compute_loss`).
    """

    config_class = LlamaConfig
    model_types = ("llama", "mistral", "qwen2", "qwen3")
    lm_head_vocab_major = False  # `[D, vocab]`, like the embedding it may be tied to
    quantizable = True  # `quantize="int8"` (tfgen.models.quantize)

    def __init__(self, config: LlamaConfig, dtype=None, quantize: str | None = None, **kwargs):
        super().__init__(config, dtype=dtype, quantize=quantize, **kwargs)
        self.rope = config.rope()
        weights = HFWeights(self, stddev_scale=config.initializer_range, quantize=quantize)
        embedding_shape = (config.vocab_size, config.hidden_size)
        self.embed_tokens = weights.matrix("model.embed_tokens.weight", embedding_shape, transposed=True,
                                           quantizable=True)
        self.decoder_layers = [
            LlamaDecoderLayer(config, index, quantize, dtype=self.dtype_policy, name=f"layers_{index}")
            for index in range(config.num_hidden_layers)
        ]
        self.norm = weights.norm("model.norm.weight", config.hidden_size)
        self.lm_head = (
            self.embed_tokens if config.tie_word_embeddings
            else weights.matrix("lm_head.weight", embedding_shape, transposed=True, quantizable=True)
        )
        self._hf_parts = dict(weights.parts)
        for layer in self.decoder_layers:
            self._hf_parts.update(layer.hf_parts)
        self.seed_generator = keras.random.SeedGenerator()
        self.built = True

    # ----------------------------------------------------------------------------------------- forward

    def _forward(self, input_ids, position_ids, query_index, key_mask, cache, cache_index, training, layers=None):
        """input_ids / position_ids int32 `[B, T]`; query_index int32 `[T]` or `[B, T]` (the tokens' buffer slots);
        key_mask `[B, S]`; `layers`: run only the first that many decoder layers (early exit; the other layers'
        caches pass through). Returns (final-norm hidden states `[B, T, D]` in the compute dtype, updated cache or
        None)."""
        # The embedding is stored [D, vocab]: gather columns, then put the hidden axis last.
        x = tf.transpose(embedding_columns(self.embed_tokens, input_ids), [1, 2, 0])
        x = tf.cast(x, self.compute_dtype)
        cos, sin = rotary_cos_sin(position_ids, self.rope.inverse_frequencies, self.rope.attention_scaling, x.dtype)
        masks = {window: attention_masks(query_index, key_mask, window, cache_index)
                 for window in set(self.config.layer_windows)}
        layer_caches = [None] * len(self.decoder_layers) if cache is None else cache
        new_caches = list(layer_caches)
        for index, layer in enumerate(self.decoder_layers[:layers]):
            x, new_caches[index] = layer.forward(
                x, cos, sin, masks[layer.window], layer_caches[index], cache_index, training, self.seed_generator
            )
        hidden = rms_norm(x, self.norm, self.config.rms_norm_eps)
        return hidden, None if cache is None else tuple(new_caches)

    def _hidden_states(self, input_ids, attention_mask, position_ids, training):
        """Final-norm hidden states `[B, T, D]` of the plain forward (see `KerasCausalLM.call`)."""
        query_index = tf.range(tf.shape(input_ids)[1])
        hidden, _ = self._forward(input_ids, position_ids, query_index, attention_mask, None, None, training)
        return hidden

    def _cached_forward(self, input_ids, cache, cache_index, attention_mask, position_ids, layers=None):
        """(hidden states `[B, T, D]`, updated cache) of `call_with_cache` (see `KerasCausalLM`); the cache is a tuple
        over layers of (keys, values), each `[B, num_key_value_heads, max_length, head_dim]`."""
        query_index = query_slots(cache_index, tf.shape(input_ids)[1])
        return self._forward(input_ids, position_ids, query_index, attention_mask, cache, cache_index, False, layers)

    # ------------------------------------------------------------------------------------- HF weights

    def load_hf_state_dict(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Assigns HF weights (`model.embed_tokens.weight`, `model.layers.N.self_attn.q_proj.weight`, ...,
        `lm_head.weight`, optional when tied; `rotary_emb.inv_freq` buffers ignored), transposing and fusing them
        into our layout. Missing, unexpected or mis-shaped tensors raise `ValueError` listing them all; nothing is
        assigned then. Values are cast to the variables' dtype (bfloat16 → float32 is exact)."""
        expected = {name: part.hf_shape for name, part in self._hf_parts.items()}
        tied_head = {"lm_head.weight": (self.config.vocab_size, self.config.hidden_size)}
        provided = select_hf_tensors(
            tensors, expected, f"LlamaForCausalLM ({self.config.model_type})",
            optional=tied_head if self.config.tie_word_embeddings else None, ignored=_IGNORED_HF_BUFFER.fullmatch,
        )
        assign_hf_parts(self._hf_parts, provided)

    def hf_state_dict(self) -> dict[str, np.ndarray]:
        """The weights under HF names and layouts (`[out, in]` kernels, q/k/v and gate/up split again; a tied
        `lm_head.weight` omitted, as HF saves it)."""
        return hf_part_arrays(self._hf_parts)
