"""The rotary pre-norm decoder style of keras-hub's Llama, Llama 3, Mistral, Qwen (2), Qwen 3 and Phi-3 backbones:
RMSNorm → attention (RoPE at each row's positions, grouped-query, optional q/k norms and sliding window) → residual,
RMSNorm → gated MLP `down(act(gate(x)) * up(x))` → residual."""

from __future__ import annotations

import tensorflow as tf

from tfgen.keras_hub.styles import DecoderStyle, sublayer
from tfgen.models.attention import grouped_attention

# Attribute names differ between these backbones (Phi-3 has no leading underscores); the first one found is used.
_DECODER_PARTS = {
    "attention": ("_self_attention_layer", "attention"),
    "attention_norm": ("_self_attention_layernorm", "pre_attention_layernorm"),
    "feedforward_norm": ("_feedforward_layernorm", "post_attention_layernorm"),
    "gate": ("_feedforward_gate_dense", "feedforward_gate_dense"),
    "up": ("_feedforward_intermediate_dense", "feedforward_intermediate_dense"),
    "down": ("_feedforward_output_dense", "feedforward_output_dense"),
    "activation": ("activation",),
}
_ATTENTION_PARTS = {
    "query": ("_query_dense", "query_dense"),
    "key": ("_key_dense", "key_dense"),
    "value": ("_value_dense", "value_dense"),
    "output": ("_output_dense", "output_dense"),
    "rope": ("rotary_embedding_layer",),
    "scale": ("_inv_norm_factor",),
}
_QK_NORMS = ("_query_dense_layer_norm", "_key_dense_layer_norm")  # Qwen 3


class RotaryDecoderStyle(DecoderStyle):
    backbone_classes = (
        "LlamaBackbone", "Llama3Backbone", "MistralBackbone", "QwenBackbone", "Qwen3Backbone", "Phi3Backbone",
    )

    def check(self) -> None:
        self.layers = []
        for decoder in self.backbone.transformer_layers:
            parts = {name: sublayer(decoder, names, name.replace("_", " ")) for name, names in _DECODER_PARTS.items()}
            attention = parts.pop("attention")
            parts.update({name: sublayer(attention, names, name) for name, names in _ATTENTION_PARTS.items()})
            parts["qk_norms"] = tuple(getattr(attention, name, None) for name in _QK_NORMS)
            parts["window"] = _sliding_window(decoder, attention)
            self.layers.append(parts)
        # Kernels are `[hidden, heads, head_dim]` ("bqm,muh->bquh").
        query_kernel_shape = tuple(self.layers[0]["query"].kernel.shape)
        self.set_heads(query_kernel_shape[-2], *tuple(self.layers[0]["key"].kernel.shape)[-2:])

    def embed(self, input_ids, position_ids):
        return self.backbone.token_embedding(input_ids)

    def layer(self, index, x, position_ids, allowed, layer_cache, cache_index):
        parts = self.layers[index]
        normed = parts["attention_norm"](x)
        query, key, value = parts["query"](normed), parts["key"](normed), parts["value"](normed)  # [B, T, heads, Dh]
        query_norm, key_norm = parts["qk_norms"]
        if query_norm is not None:
            query, key = query_norm(query), key_norm(key)
        query = parts["rope"](query, positions=position_ids)
        key = parts["rope"](key, positions=position_ids)
        attended, layer_cache = grouped_attention(
            query * tf.cast(parts["scale"], query.dtype), key, value, allowed, layer_cache, cache_index
        )
        x = x + parts["output"](attended)
        normed = parts["feedforward_norm"](x)
        # In float32 as keras-hub's decoders compute it (torch's silu does the same internally).
        gate = tf.cast(parts["activation"](tf.cast(parts["gate"](normed), tf.float32)), x.dtype)
        return x + parts["down"](parts["up"](normed) * gate), layer_cache


def _sliding_window(decoder, attention) -> int | None:
    """The layer's sliding window as keras-hub applies it (Mistral: always, `sliding_window`; Qwen: with
    `use_sliding_window_attention`; Qwen 3: when `sliding_window_size` is set), else None."""
    if hasattr(decoder, "sliding_window"):  # Mistral's decoder masks the window itself
        return decoder.sliding_window
    if hasattr(attention, "use_sliding_window_attention"):
        return attention.sliding_window_size if attention.use_sliding_window_attention else None
    return getattr(attention, "sliding_window_size", None) or None
