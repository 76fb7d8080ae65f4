"""The GPT-2 decoder style of keras-hub's `GPT2Backbone`: token embedding + learned position embedding (at each
row's positions) → pre-LN `keras_hub.layers.TransformerDecoder`s (LayerNorm → multi-head attention → residual,
LayerNorm → `output(gelu(intermediate(x)))` → residual) → final LayerNorm, the LM head tied to the token embedding."""

from __future__ import annotations

import tensorflow as tf

from tfgen.keras_hub.styles import DecoderStyle, sublayer
from tfgen.models.attention import grouped_attention

_DECODER_PARTS = {
    "attention": "_self_attention_layer",
    "attention_norm": "_self_attention_layer_norm",
    "feedforward_norm": "_feedforward_layer_norm",
    "intermediate": "_feedforward_intermediate_dense",  # carries the activation (gelu) itself
    "output_dense": "_feedforward_output_dense",
}
_ATTENTION_PARTS = {
    "query": "_query_dense",
    "key": "_key_dense",
    "value": "_value_dense",
    "output": "_output_dense",
}
_BACKBONE_PARTS = ("token_embedding", "position_embedding", "embeddings_add", "layer_norm")


class GPT2DecoderStyle(DecoderStyle):
    backbone_classes = ("GPT2Backbone",)

    def check(self) -> None:
        import keras
        import keras_hub

        backbone = self.backbone
        for name in _BACKBONE_PARTS:
            sublayer(backbone, name, name.replace("_", " "))
        self._position_table = sublayer(backbone.position_embedding, "position_embeddings", "position table")
        self.layers = []
        for index, decoder in enumerate(backbone.transformer_layers):
            where = f"causal_lm: GPT2Backbone transformer layer {index}"
            if not isinstance(decoder, keras_hub.layers.TransformerDecoder):
                raise ValueError(f"{where} is a {type(decoder).__name__}, not the keras_hub.layers.TransformerDecoder "
                                 "tfgen runs")
            if not getattr(decoder, "normalize_first", False):
                raise ValueError(f"{where} has normalize_first=False (post-LN); tfgen runs GPT-2's pre-LN decoder only")
            if getattr(decoder, "_cross_attention_layer", None) is not None:
                raise ValueError(f"{where} has cross-attention (an encoder sequence); tfgen runs decoder-only models")
            parts = {name: sublayer(decoder, attribute, name.replace("_", " "))
                     for name, attribute in _DECODER_PARTS.items()}
            attention = parts.pop("attention")
            if not isinstance(attention, keras.layers.MultiHeadAttention):
                raise ValueError(f"{where}'s self-attention is a {type(attention).__name__}, not a Keras "
                                 "MultiHeadAttention")
            parts.update({name: sublayer(attention, attribute, f"attention {name} projection")
                          for name, attribute in _ATTENTION_PARTS.items()})
            parts["scale"] = sublayer(attention, "_inverse_sqrt_key_dim", "attention scale")
            self._check_attention(where, attention)
            self.layers.append(parts)
        # Projection kernels are `[hidden, heads, head_dim]` ("abc,cde->abde").
        heads, head_dim = tuple(self.layers[0]["query"].kernel.shape)[-2:]
        self.set_heads(heads, heads, head_dim)  # multi-head attention: a key/value head per query head

    @staticmethod
    def _check_attention(where, attention) -> None:
        """Refuses the Keras MultiHeadAttention options that `grouped_attention` does not compute (keras-hub's GPT-2
        sets none of them). Keras keeps them in private attributes, read by name."""
        options = {name: getattr(attention, f"_{name}", None) for name in
                   ("key_dim", "value_dim", "attention_axes", "output_shape", "use_gate", "sliding_window")}
        refused = {
            "value_dim": options["value_dim"] not in (None, options["key_dim"]),
            "attention_axes": tuple(options["attention_axes"] or (1,)) != (1,),
            "output_shape": bool(options["output_shape"]),
            "use_gate": bool(options["use_gate"]),
            "sliding_window": options["sliding_window"] is not None,
        }
        for name, bad in refused.items():
            if bad:
                raise ValueError(f"{where}'s self-attention has {name}={options[name]}, which tfgen's GPT-2 style "
                                 "does not run")

    def embed(self, input_ids, position_ids):
        tokens = self.backbone.token_embedding(input_ids)
        # keras-hub's PositionEmbedding slices the table from one start index for every row; tfgen gathers each
        # row's own positions (left padding gives rows different starts).
        positions = tf.cast(tf.gather(self._position_table, position_ids), tokens.dtype)
        # The embedding dropout is skipped: generation is inference.
        return self.backbone.embeddings_add((tokens, positions))

    def layer(self, index, x, position_ids, allowed, layer_cache, cache_index):
        parts = self.layers[index]
        normed = parts["attention_norm"](x)
        query, key, value = parts["query"](normed), parts["key"](normed), parts["value"](normed)  # [B, T, heads, Dh]
        attended, layer_cache = grouped_attention(
            query * tf.cast(parts["scale"], query.dtype), key, value, allowed, layer_cache, cache_index
        )
        x = x + parts["output"](attended)
        normed = parts["feedforward_norm"](x)
        return x + parts["output_dense"](parts["intermediate"](normed)), layer_cache
