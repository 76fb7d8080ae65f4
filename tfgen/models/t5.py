"""T5 (original T5, T5 v1.1, FLAN-T5: HF `t5`) as one Keras 3 encoder-decoder model (TF backend), with tfgen's
static-buffer KV cache for the decoder and the cross-attention keys/values projected once per prompt.

Numerics as HF 4.55's `modeling_t5.py`: T5LayerNorm (RMS, no mean, no bias), unscaled attention with a learned
relative position bias computed in the first block of each stack and shared by all its blocks (bidirectional buckets
in the encoder, causal ones in the decoder; none in cross-attention), a ReLU or gated feed-forward, and with a tied
head the decoder output scaled by `d_model ** -0.5` before the shared embedding maps it to logits.

Layout for CPU decoding, as in `tfgen.models.llama`: kernels `[in, out]`, q/k/v fused, the cross-attention's k/v fused,
`wi_0`/`wi_1` fused, and the shared embedding (and an untied head) stored `[d_model, vocab]`.

The cache (`init_cache`) is a dict: `"decoder"`, a tuple over decoder layers of self-attention (keys, values)
`[B, heads, max_length, d_kv]`, and `"encoder"`: the cross-attention `"keys"` / `"values"` (tuples over decoder layers
of `[B, heads, S, d_kv]`) and the encoder `"mask"` int32 `[B, S]`, all with the batch leading. A decode step reads
`"encoder"` and passes it through unchanged; it is the same for every row (beam, candidate) of one prompt, so a
beam reorder within a prompt only needs to reorder `"decoder"` (gathering the whole nest is also correct).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

from tfgen.decoding.model_protocol import CacheStepOutput
from tfgen.generation.mixin import TFGenerationMixin
from tfgen.models.attention import attention_masks
from tfgen.models.hf_weights import HFWeights, assign_hf_parts, hf_part_arrays, select_hf_tensors
from tfgen.models.layers import attention_allowed, query_slots, rms_norm
from tfgen.models.pretrained import PretrainedModel
from tfgen.models.quantize import QuantizedKernel, embedding_columns, quantized_matmul
from tfgen.models.quantize_modes import check_quantize
from tfgen.models.t5_config import T5Config
from tfgen.models.t5_layers import T5Block, position_bias, relative_bucket_table

__all__ = ["Seq2SeqLMOutput", "T5Config", "T5ForConditionalGeneration"]

# Copies of `shared.weight` HF checkpoints may carry (the stacks' embeddings are the shared module).
_EMBEDDING_COPIES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
# A tensor HF's T5 ignores when loading (old checkpoints have it; no cross-attention has a position bias).
_IGNORED_HF_TENSORS = ("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",)


class Seq2SeqLMOutput(NamedTuple):
    """What `call` returns: float32 `logits` `[B, T_dec, vocab]`, the decoder's final-norm `hidden_states`
    `[B, T_dec, D]` (before the tied head's scaling) and the encoder's `encoder_last_hidden_state` `[B, S, D]`."""

    logits: tf.Tensor
    hidden_states: tf.Tensor
    encoder_last_hidden_state: tf.Tensor


class T5ForConditionalGeneration(PretrainedModel, TFGenerationMixin, keras.Model):
    """T5 with its LM head. Weights exist right after construction (HF's random init); a config whose weights cannot
    fit in the memory available is refused first (`T5Config.check_fits_in_memory`).

    `call` is the plain forward (encoder, then decoder over `decoder_input_ids`); generation runs `encode` once, builds
    the cache with `init_cache(..., encoder_hidden_states=, encoder_attention_mask=)` and then steps the decoder with
    `call_with_cache` (buffer coordinates as in `tfgen.decoding.model_protocol`; see the module docstring for the
    cache).
    """

    config_class = T5Config
    model_types = ("t5",)
    quantizable = True  # `quantize="int8"` (tfgen.models.quantize)
    is_encoder_decoder = True
    #: `call_with_cache` takes a scalar `cache_index` only (see `tfgen.decoding.model_protocol`).
    row_cache_index = False

    def __init__(self, config: T5Config, dtype=None, quantize: str | None = None, **kwargs):
        """Checks `config` (a `T5Config`), `quantize` (None or "int8": int8 kernels, embedding and head, see
        `tfgen.models.quantize`; the relative position bias tables stay float) and that its weights fit in memory in
        `dtype`, before any weight is made; sets `config`, `quantization` and `generation_config` (None until a
        loader sets it)."""
        if not isinstance(config, T5Config):
            raise TypeError(f"config must be a T5Config, got {type(config).__name__}")
        quantize = check_quantize(quantize)
        super().__init__(dtype=dtype, **kwargs)
        # Not `self.quantize`: that is Keras's own `Model.quantize()` method.
        self.quantization = quantize
        config.check_fits_in_memory(self.dtype_policy)
        self.config = config
        self.generation_config = None
        weights = HFWeights(self, stddev_scale=config.initializer_factor, quantize=quantize)
        vocab, d, buckets = config.vocab_size, config.d_model, config.relative_attention_num_buckets
        self.shared = weights.matrix("shared.weight", (vocab, d), transposed=True, quantizable=True)
        self.encoder_blocks = [T5Block(config, index, False, quantize, dtype=self.dtype_policy,
                                       name=f"encoder_block_{index}") for index in range(config.num_layers)]
        self.decoder_blocks = [T5Block(config, index, True, quantize, dtype=self.dtype_policy,
                                       name=f"decoder_block_{index}") for index in range(config.num_decoder_layers)]
        # HF keeps each stack's bias table in its first block's self-attention; every block of the stack uses it.
        self.encoder_bias, self.decoder_bias = (
            weights.matrix(f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                           (buckets, config.num_heads), transposed=False, stddev=d ** -0.5)
            for stack in ("encoder", "decoder"))
        self.encoder_norm = weights.norm("encoder.final_layer_norm.weight", d)
        self.decoder_norm = weights.norm("decoder.final_layer_norm.weight", d)
        self.lm_head = self.shared if config.tie_word_embeddings else weights.matrix(
            "lm_head.weight", (vocab, d), transposed=True, quantizable=True)
        self.hf_parts = dict(weights.parts)
        for block in (*self.encoder_blocks, *self.decoder_blocks):
            self.hf_parts.update(block.hf_parts)
        max_distance = config.relative_attention_max_distance
        self.encoder_buckets = relative_bucket_table(buckets, max_distance, bidirectional=True)
        self.decoder_buckets = relative_bucket_table(buckets, max_distance, bidirectional=False)
        self.built = True

    # ----------------------------------------------------------------------------------------- encoder

    def _embed(self, input_ids) -> tf.Tensor:
        """`[B, T, D]` embeddings (unscaled, as T5's) in the compute dtype; the table is stored `[D, vocab]`."""
        x = tf.transpose(embedding_columns(self.shared, tf.cast(input_ids, tf.int32)), [1, 2, 0])
        return tf.cast(x, self.compute_dtype)

    def encode(self, input_ids, attention_mask=None, output_hidden_states: bool = False):
        """The encoder stack's output after its final norm, `[B, S, D]` in the compute dtype, of int `input_ids`
        `[B, S]` under `attention_mask` `[B, S]` (1 = real token; default all ones). Padding may sit on either side:
        masked keys are never attended, and the relative bias sees only differences of positions, which padding on
        one side shifts alike. Padding positions get finite values of no meaning.

        With `output_hidden_states`, returns `(output, hidden_states)`: HF's `hidden_states`, a tuple of
        `num_layers + 1` `[B, S, D]` — each block's input (the embeddings first), then `output`."""
        input_ids = tf.cast(input_ids, tf.int32)
        mask = tf.ones_like(input_ids) if attention_mask is None else attention_mask
        x = self._embed(input_ids)
        slots = tf.range(tf.shape(input_ids)[1])
        blocks = [(position_bias(self.encoder_bias, self.encoder_buckets, slots, slots, x.dtype),
                   tf.cast(mask, tf.bool)[:, tf.newaxis, tf.newaxis, :])]
        block_inputs = []
        for block in self.encoder_blocks:
            block_inputs.append(x)
            x, _ = block.self_attention(x, blocks)
            x = block.feed_forward(x)
        output = rms_norm(x, self.encoder_norm, self.config.layer_norm_epsilon)
        return (output, (*block_inputs, output)) if output_hidden_states else output

    # ----------------------------------------------------------------------------------------- decoder

    def init_cache(self, batch_size, max_length, dtype=None, *, encoder_hidden_states=None,
                   encoder_attention_mask=None, encoder_length=None):
        """The cache for `batch_size` rows, `max_length` decoder slots, in `dtype` (default: the compute dtype):
        `{"decoder": ((keys, values), ...) zeros [B, heads, max_length, d_kv] per decoder layer, "encoder": {"keys":
        (...), "values": (...) [B, heads, S, d_kv] per decoder layer, "mask": int32 [B, S]}}`.

        The cross-attention keys/values are projected here, once, from `encoder_hidden_states` `[B, S, D]` (what
        `encode` returns) under `encoder_attention_mask` `[B, S]` (default all ones). Without them (a memory estimate
        tracing the cache's shapes) the `"encoder"` entry is zeros of `encoder_length` positions with an all-ones
        mask; one of the two must be given."""
        for name, value in (("batch_size", batch_size), ("max_length", max_length), ("encoder_length", encoder_length)):
            if isinstance(value, int) and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        config, dtype = self.config, dtype or self.compute_dtype
        shape = [batch_size, config.num_heads, max_length, config.d_kv]
        decoder = tuple((tf.zeros(shape, dtype), tf.zeros(shape, dtype)) for _ in self.decoder_blocks)
        if encoder_hidden_states is None:
            if encoder_length is None:
                raise ValueError("init_cache needs encoder_hidden_states (the encode() output) or encoder_length")
            shape = [batch_size, config.num_heads, encoder_length, config.d_kv]
            keys = values = tuple(tf.zeros(shape, dtype) for _ in self.decoder_blocks)
            mask = tf.ones([batch_size, encoder_length], tf.int32)
        else:
            states = tf.cast(encoder_hidden_states, self.compute_dtype)
            for name, expected, actual in (("batch", batch_size, states.shape[0]),
                                           ("length", encoder_length, states.shape[1])):
                if isinstance(expected, int) and actual is not None and actual != expected:
                    raise ValueError(f"encoder_hidden_states has {name} {actual}, init_cache was asked for {expected}")
            pairs = [block.cross_keys_values(states, dtype) for block in self.decoder_blocks]
            keys, values = tuple(key for key, _ in pairs), tuple(value for _, value in pairs)
            mask = (tf.ones(tf.shape(states)[:2], tf.int32) if encoder_attention_mask is None
                    else tf.cast(encoder_attention_mask, tf.int32))
        return {"decoder": decoder, "encoder": {"keys": keys, "values": values, "mask": mask}}

    def _decode(self, input_ids, self_blocks, cross_keys, cross_values, cross_allowed, cache=None, cache_index=None):
        """Decoder stack over int32 `input_ids` `[B, T]`: `self_blocks` as `T5Block.self_attention` takes them,
        per-layer cross-attention keys/values `[B, heads, S, d_kv]` and `cross_allowed` bool `[B, 1, 1, S]`.
        Returns (final-norm hidden states `[B, T, D]`, the updated decoder cache or None)."""
        x = self._embed(input_ids)
        layer_caches = cache if cache is not None else (None,) * len(self.decoder_blocks)
        new_caches = []
        for block, layer_cache, keys, values in zip(self.decoder_blocks, layer_caches, cross_keys, cross_values):
            x, layer_cache = block.self_attention(x, self_blocks, layer_cache, cache_index)
            x = block.feed_forward(block.cross_attention(x, keys, values, cross_allowed))
            new_caches.append(layer_cache)
        hidden = rms_norm(x, self.decoder_norm, self.config.layer_norm_epsilon)
        return hidden, None if cache is None else tuple(new_caches)

    def call_with_cache(self, input_ids, cache, cache_index, attention_mask, position_ids, last_logits_only=False,
                        compute_logits=True) -> CacheStepOutput:
        """Runs decoder tokens int `[B, T]` at buffer slots `[cache_index, cache_index + T)` (`cache_index` an int32
        scalar; a constant 0 for a prefill of several decoder-prompt tokens). attention_mask `[B, max_length]` over the
        decoder buffer: a query at slot q attends slot k iff k <= q and the mask is 1 there. `position_ids` is
        accepted and ignored: the relative bias uses `k - q` in slots, unchanged by uniform left padding.
        Returns `CacheStepOutput(logits [B, T or 1, vocab] float32 (None with compute_logits=False), hidden_states
        [B, T, D] (final norm, before the tied head's scaling), cache)`, the cache's `"encoder"` passed through."""
        del position_ids
        decoder_cache, encoder = cache["decoder"], cache["encoder"]
        for name, layers in (("decoder", decoder_cache), ("encoder keys of", encoder["keys"])):
            if len(layers) != len(self.decoder_blocks):
                raise ValueError(f"cache has {name} {len(layers)} layers, the decoder has {len(self.decoder_blocks)}")
        cache_index = tf.cast(cache_index, tf.int32)
        if cache_index.shape.rank != 0:
            raise ValueError("T5ForConditionalGeneration takes a scalar cache_index (row_cache_index is False), got "
                             f"shape {cache_index.shape}")
        input_ids = tf.cast(input_ids, tf.int32)
        dtype = self.compute_dtype
        query_index = query_slots(cache_index, tf.shape(input_ids)[1])
        earlier_allowed, new_allowed = attention_masks(query_index, attention_mask, None, cache_index)
        new = (position_bias(self.decoder_bias, self.decoder_buckets, query_index, query_index, dtype), new_allowed)
        earlier = None
        if earlier_allowed is not None:
            key_slots = tf.range(tf.shape(attention_mask)[1])
            earlier = (position_bias(self.decoder_bias, self.decoder_buckets, query_index, key_slots, dtype),
                       earlier_allowed)
        cross_allowed = tf.cast(encoder["mask"], tf.bool)[:, tf.newaxis, tf.newaxis, :]
        hidden, decoder_cache = self._decode(input_ids, (earlier, new), encoder["keys"], encoder["values"],
                                             cross_allowed, decoder_cache, cache_index)
        cache = {"decoder": decoder_cache, "encoder": encoder}
        if not compute_logits:
            return CacheStepOutput(None, hidden, cache)
        return CacheStepOutput(self.logits_from_hidden(hidden[:, -1:] if last_logits_only else hidden), hidden, cache)

    def logits_from_hidden(self, hidden_states) -> tf.Tensor:
        """float32 logits `[..., vocab]` of decoder final-norm hidden states `[..., D]` (the `hidden_states` of
        `call_with_cache`): with a tied head scaled by `d_model ** -0.5` first, as HF does, then the head."""
        if self.config.tie_word_embeddings:
            hidden_states = hidden_states * tf.cast(self.config.d_model ** -0.5, hidden_states.dtype)
        if isinstance(self.lm_head, QuantizedKernel):
            return tf.cast(quantized_matmul(hidden_states, self.lm_head), tf.float32)
        return tf.cast(tf.matmul(hidden_states, tf.cast(self.lm_head, hidden_states.dtype)), tf.float32)

    def call(self, input_ids, attention_mask=None, decoder_input_ids=None, decoder_attention_mask=None
             ) -> Seq2SeqLMOutput:
        """Plain forward: `encode(input_ids, attention_mask)`, then the decoder over `decoder_input_ids` int
        `[B, T_dec]` (causal, under `decoder_attention_mask` `[B, T_dec]`, default all ones) attending the encoder
        output under `attention_mask`. Returns `Seq2SeqLMOutput`."""
        if decoder_input_ids is None:
            raise ValueError("T5ForConditionalGeneration.call needs decoder_input_ids, e.g. [[decoder_start_token_id]]")
        input_ids = tf.cast(input_ids, tf.int32)
        attention_mask = tf.ones_like(input_ids) if attention_mask is None else tf.cast(attention_mask, tf.int32)
        encoded = self.encode(input_ids, attention_mask)
        decoder_input_ids = tf.cast(decoder_input_ids, tf.int32)
        decoder_mask = (tf.ones_like(decoder_input_ids) if decoder_attention_mask is None
                        else decoder_attention_mask)
        slots = tf.range(tf.shape(decoder_input_ids)[1])
        self_blocks = [(position_bias(self.decoder_bias, self.decoder_buckets, slots, slots, encoded.dtype),
                        attention_allowed(slots, decoder_mask))]
        pairs = [block.cross_keys_values(encoded, encoded.dtype) for block in self.decoder_blocks]
        hidden, _ = self._decode(decoder_input_ids, self_blocks, [key for key, _ in pairs],
                                 [value for _, value in pairs], tf.cast(attention_mask, tf.bool)[:, None, None, :])
        return Seq2SeqLMOutput(self.logits_from_hidden(hidden), hidden, encoded)

    # ------------------------------------------------------------------------------------- HF weights

    def load_hf_state_dict(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Assigns HF weights (`shared.weight`, `encoder.block.N.layer.0.SelfAttention.q.weight`, ...,
        `lm_head.weight` when untied), transposing and fusing them into our layout. Copies of the shared embedding
        (`encoder.embed_tokens.weight`, `decoder.embed_tokens.weight`, a tied `lm_head.weight`) are accepted when
        equal to it; the cross-attention bias table old checkpoints carry is ignored, as HF ignores it. Missing,
        unexpected or mis-shaped tensors raise `ValueError` listing them all; nothing is assigned then. Values are cast
        to the variables' dtype."""
        config = self.config
        tensors = dict(tensors)
        copies = _EMBEDDING_COPIES + (("lm_head.weight",) if config.tie_word_embeddings else ())
        if "shared.weight" not in tensors:  # a checkpoint may keep the embedding under one of its copies' names only
            present = [name for name in _EMBEDDING_COPIES if name in tensors]
            if present:
                tensors["shared.weight"] = tensors[present[0]]
        shape = (config.vocab_size, config.d_model)
        expected = {name: part.hf_shape for name, part in self.hf_parts.items()}
        provided = select_hf_tensors(tensors, expected, "T5ForConditionalGeneration",
                                     optional={name: shape for name in copies},
                                     ignored=lambda name: name in _IGNORED_HF_TENSORS)
        different = [name for name in copies if name in tensors
                     and not np.array_equal(np.asarray(tensors[name]), np.asarray(provided["shared.weight"]))]
        if different:
            raise ValueError(f"checkpoint does not match T5ForConditionalGeneration: {different} differ from "
                             "shared.weight, but this model's embeddings (and tied head) are one matrix")
        assign_hf_parts(self.hf_parts, provided)

    def hf_state_dict(self) -> dict[str, np.ndarray]:
        """The weights under HF names and layouts (`[out, in]` kernels, fused projections split again; the shared
        embedding once, as `shared.weight`, and `lm_head.weight` only when untied, as HF saves them)."""
        return hf_part_arrays(self.hf_parts)

