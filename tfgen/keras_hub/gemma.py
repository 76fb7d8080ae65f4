"""The decoder style of keras-hub's Gemma backbones: `GemmaBackbone` (Gemma 1 and Gemma 2) and `Gemma3Backbone`
(text only). Embeddings × sqrt(hidden_dim) → per layer: RMSNorm → attention (optional q/k RMSNorms, RoPE at each row's
positions, grouped-query, optional score soft cap and sliding window) → optional RMSNorm → residual, RMSNorm → GeGLU
`linear(gelu_tanh(gating(x)) * gating_2(x))` → optional RMSNorm → residual; final RMSNorm; logits through the tied
(optionally soft-capped) embedding.

Everything follows what keras-hub's own `call_with_cache` computes, read off the layers that run it:
- the query scale is the *attention layer's* `query_head_dim_normalize` (1/sqrt(head_dim), else
  1/sqrt(hidden_dim // heads)); keras-hub's decoder blocks build their attention with True whatever the backbone's
  `query_head_dim_normalize` says, so that flag changes nothing in keras-hub and nothing here;
- a layer's sliding window is its attention's `sliding_window_size` when its `use_sliding_window_attention` is set
  (Gemma 2: even layers; Gemma 3: five local layers in six), counted in cache slots: keras-hub lets the query at slot
  `i` see the keys at slots `(i - window, i]`, as `tfgen.models.layers.attention_allowed` does;
- each layer's own rotary layer (Gemma 3: 10k wavelength and the local scaling factor on local layers, 1M and the
  global factor on global ones) rotates at per-row positions; Gemma 1/2's `_apply_rope` also interleaves the rotated
  halves (a permutation of both queries and keys, so of the cache too), and it is run as is.
"""

from __future__ import annotations

import inspect

import keras
import tensorflow as tf

from tfgen.keras_hub.styles import DecoderStyle, sublayer
from tfgen.models.attention import grouped_attention

# part: (attribute, what an error calls it).
_DECODER_PARTS = {
    "attention": ("attention", "attention layer"),
    "attention_norm": ("pre_attention_norm", "pre-attention norm"),
    "feedforward_norm": ("pre_ffw_norm", "pre-feed-forward norm"),
    "gate": ("gating_ffw", "feed-forward gate projection"),  # gelu(gate(x)) * up(x)
    "up": ("gating_ffw_2", "feed-forward up projection"),
    "down": ("ffw_linear", "feed-forward down projection"),
}
_ATTENTION_PARTS = {
    "query": ("query_dense", "query projection"),
    "key": ("key_dense", "key projection"),
    "value": ("value_dense", "value projection"),
    "output": ("output_dense", "output projection"),
    "rope": ("rope_layer", "rotary embedding"),
}
_FLOAT16_MAX = 65504.0


class GemmaDecoderStyle(DecoderStyle):
    backbone_classes = ("GemmaBackbone", "Gemma3Backbone")

    def check(self) -> None:
        backbone = self.backbone
        if getattr(backbone, "vision_encoder", None) is not None or getattr(backbone, "text_only_model", True) is False:
            raise ValueError(
                "causal_lm: this Gemma 3 has a vision encoder; from_keras_hub runs text-only Gemma 3 models "
                "(build the backbone with vision_encoder=None, or load a text-only preset)"
            )
        if getattr(backbone, "use_bidirectional_attention", False):
            raise ValueError(
                "causal_lm: use_bidirectional_attention=True (an embedding model such as EmbeddingGemma) does not "
                "generate; from_keras_hub runs causal Gemma models only"
            )
        self._embedding = sublayer(backbone, "token_embedding", "token embedding")
        self._final_norm = sublayer(backbone, "layer_norm", "final norm")
        self._hidden_dim = int(_option(backbone, "hidden_dim"))
        self.layers = []
        for decoder in backbone.transformer_layers:
            parts = {part: sublayer(decoder, name, what) for part, (name, what) in _DECODER_PARTS.items()}
            attention = parts.pop("attention")
            parts.update({part: sublayer(attention, name, what) for part, (name, what) in _ATTENTION_PARTS.items()})
            for name, flag, what in (("post_attention_norm", "use_post_attention_norm", "post-attention norm"),
                                     ("post_ffw_norm", "use_post_ffw_norm", "post-feed-forward norm")):
                parts[name] = sublayer(decoder, name, what) if _option(decoder, flag) else None
            if getattr(attention, "use_query_key_norm", False):  # Gemma 3
                parts["qk_norms"] = (sublayer(attention, "query_norm", "query norm"),
                                     sublayer(attention, "key_norm", "key norm"))
            else:
                parts["qk_norms"] = None
            if getattr(attention, "use_bidirectional_attention", False):
                raise ValueError("causal_lm: a decoder layer has use_bidirectional_attention=True; from_keras_hub "
                                 "runs causal Gemma models only")
            # keras-hub Gemma 1/2 rotate through `_apply_rope(x, start_index, positions=None)`, which also
            # interleaves the rotated halves; Gemma 3's `_apply_rope(x, start_index)` is the rotary layer alone.
            apply_rope = getattr(attention, "_apply_rope", None)
            if apply_rope is not None and "positions" in inspect.signature(apply_rope).parameters:
                parts["apply_rope"] = apply_rope
            elif type(attention).__name__ == "CachedGemma3Attention":
                parts["apply_rope"] = None
            else:
                raise ValueError(
                    f"causal_lm: {type(attention).__name__}._apply_rope takes no positions; this keras-hub release "
                    "rotates Gemma's queries and keys differently from the one tfgen's adapter was written for"
                )
            heads, head_dim = int(_option(attention, "num_query_heads")), int(_option(attention, "head_dim"))
            if _option(attention, "query_head_dim_normalize"):
                parts["scale"] = 1.0 / float(head_dim) ** 0.5
            else:
                parts["scale"] = 1.0 / float(int(_option(attention, "hidden_dim")) // heads) ** 0.5
            soft_cap = _option(attention, "logit_soft_cap")
            parts["soft_cap"] = None if soft_cap is None else float(soft_cap)
            window = None
            if _option(attention, "use_sliding_window_attention"):
                window = int(_option(attention, "sliding_window_size"))
                if window < 1:
                    raise ValueError(f"causal_lm: sliding_window_size={window} is not a window")
            parts["window"] = window
            parts["clips_float16"] = type(decoder).__name__ == "Gemma3DecoderBlock"
            self.layers.append(parts)
        if not self.layers:
            raise ValueError("causal_lm: the backbone has no decoder layers")
        # Kernels: query `[heads, hidden, head_dim]` ("btd,ndh->btnh"), key `[kv_heads, hidden, head_dim]`.
        key_kernel_shape = tuple(self.layers[0]["key"].kernel.shape)
        self.set_heads(self.layers[0]["query"].kernel.shape[0], key_kernel_shape[0], key_kernel_shape[2])

    def embed(self, input_ids, position_ids):
        x = self._embedding(input_ids)
        # As keras-hub's call_with_cache scales them: sqrt in float32, cast to the compute dtype.
        return x * tf.cast(keras.ops.sqrt(self._hidden_dim), x.dtype)

    def _rotate(self, parts, x, position_ids):
        if parts["apply_rope"] is not None:
            return parts["apply_rope"](x, 0, positions=position_ids)
        return parts["rope"](x, positions=position_ids)

    def layer(self, index, x, position_ids, allowed, layer_cache, cache_index):
        parts = self.layers[index]
        # Gemma 3's decoder block keeps float16 activations finite this way; Gemma 1/2's does not.
        float16 = x.dtype == tf.float16 and parts["clips_float16"]
        if float16:
            x = tf.clip_by_value(x, -_FLOAT16_MAX, _FLOAT16_MAX)
        normed = parts["attention_norm"](x)
        query, key, value = parts["query"](normed), parts["key"](normed), parts["value"](normed)  # [B, T, heads, Dh]
        if parts["qk_norms"] is not None:
            query, key = parts["qk_norms"][0](query), parts["qk_norms"][1](key)
        query, key = self._rotate(parts, query, position_ids), self._rotate(parts, key, position_ids)
        attended, layer_cache = grouped_attention(
            query * tf.cast(parts["scale"], query.dtype), key, value, allowed, layer_cache, cache_index,
            score_soft_cap=parts["soft_cap"],
        )
        attention = parts["output"](attended)
        if parts["post_attention_norm"] is not None:
            attention = parts["post_attention_norm"](attention)
        x = _residual(x, attention, float16)
        normed = parts["feedforward_norm"](x)
        hidden = keras.activations.gelu(parts["gate"](normed), approximate=True) * parts["up"](normed)
        out = parts["down"](hidden)
        if parts["post_ffw_norm"] is not None:
            out = parts["post_ffw_norm"](out)
        return _residual(out, x, float16), layer_cache

    def final_norm(self, x):
        return self._final_norm(x)


def _residual(a, b, float16: bool):
    """`a + b`; in float32 and clipped back into float16's range where Gemma 3's decoder block does so."""
    if not float16:
        return a + b
    total = tf.cast(a, tf.float32) + tf.cast(b, tf.float32)
    return tf.cast(tf.clip_by_value(total, -_FLOAT16_MAX, _FLOAT16_MAX), tf.float16)


def _option(owner, name: str):
    """`owner.name`, a ValueError naming it when this keras-hub release has no such attribute."""
    if not hasattr(owner, name):
        raise ValueError(
            f"causal_lm: {type(owner).__name__} has no {name}; this keras-hub release lays the model out differently "
            "from the one tfgen's adapter was written for"
        )
    return getattr(owner, name)
