"""Decoder styles: how one family of keras-hub backbones runs a cached forward with tfgen's attention masks and per-row
positions, reusing the backbone's own sublayers (so its weights, dtype policy and `quantize()` apply unchanged).

keras-hub's own `call_with_cache(token_ids, cache, cache_update_index)` has no key mask and one position start for
every row (it right-pads); tfgen left-pads, so a style runs the decoder layers itself. A style knows its backbone's
sublayer names, which are keras-hub internals: `check()` looks them all up once, so a keras-hub release that renames
one fails at `from_keras_hub` with the name, not inside a traced program.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


class DecoderStyle:
    """One decoder style. Subclasses list the keras-hub backbone class names they run (`backbone_classes`) and
    implement the methods below; tensors are in the backbone's compute dtype unless said otherwise."""

    backbone_classes: tuple[str, ...] = ()

    def __init__(self, causal_lm):
        self.causal_lm = causal_lm
        self.backbone = causal_lm.backbone
        # Per layer, the sublayers and options `check()` looked up (a dict each).
        self.layers: list[dict] = []

    @property
    def compute_dtype(self):
        return self.backbone.compute_dtype

    def check(self) -> None:
        """Raises ValueError naming what this style cannot run in this backbone (an option, a missing sublayer)."""

    def num_layers(self) -> int:
        return len(self.backbone.transformer_layers)

    def set_heads(self, heads: int, kv_heads: int, head_dim: int) -> None:
        """Records the attention shape `check()` read off the projection kernels (the same in every layer); query heads
        must group evenly over key/value heads."""
        if heads % kv_heads:
            raise ValueError(f"causal_lm: {heads} query heads do not group over {kv_heads} key/value heads")
        self._kv_heads, self._head_dim = int(kv_heads), int(head_dim)

    def cache_heads_and_dim(self) -> tuple[int, int]:
        """(key/value heads, head dim) of every layer's cache, as `set_heads` recorded them."""
        return self._kv_heads, self._head_dim

    def layer_window(self, index: int) -> int | None:
        """The sliding attention window of layer `index` in buffer slots (None: full attention): the "window" entry
        of the layer's parts in `self.layers`, where `check()` put one."""
        return self.layers[index].get("window")

    def embed(self, input_ids: tf.Tensor, position_ids: tf.Tensor) -> tf.Tensor:
        """Input embeddings `[B, T, D]` of int32 `input_ids` `[B, T]` at `position_ids` `[B, T]`."""
        raise NotImplementedError

    def layer(self, index: int, x: tf.Tensor, position_ids: tf.Tensor, allowed: Any, layer_cache: Any,
              cache_index: tf.Tensor) -> tuple[tf.Tensor, Any]:
        """Decoder layer `index` on `x` `[B, T, D]`; `allowed` / `layer_cache` / `cache_index` as
        `tfgen.models.attention.grouped_attention` takes them. Returns (x, updated layer cache)."""
        raise NotImplementedError

    def final_norm(self, x: tf.Tensor) -> tf.Tensor:
        """The final-norm hidden states `[B, T, D]` (what contrastive search compares)."""
        return self.backbone.layer_norm(x)

    def logits(self, hidden: tf.Tensor) -> tf.Tensor:
        """float32 logits `[..., vocab]` of final-norm hidden states, through the backbone's (reversible, possibly
        quantized, possibly soft-capped) embedding as keras-hub's own `call_with_cache` computes them."""
        return tf.cast(self.backbone.token_embedding(hidden, reverse=True), tf.float32)


def sublayer(owner, names: tuple[str, ...] | str, what: str):
    """`owner`'s attribute under the first of `names` it has; a ValueError naming `what` and the names otherwise."""
    names = (names,) if isinstance(names, str) else names
    for name in names:
        found = getattr(owner, name, None)
        if found is not None:
            return found
    raise ValueError(
        f"causal_lm: {type(owner).__name__} has no {what} (looked for {', '.join(names)}); this keras-hub release "
        "lays the model out differently from the one tfgen's adapter was written for"
    )
