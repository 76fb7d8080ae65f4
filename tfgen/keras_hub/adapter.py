"""`from_keras_hub(causal_lm)`: a keras-hub `CausalLM` as a tfgen model
(`tfgen.decoding.model_protocol.CausalLMProtocol`), sharing its weights, so every tfgen strategy, processor, stopping
criterion, streamer, export signature and batch job runs on it."""

from __future__ import annotations

import os

import tensorflow as tf

from tfgen.config.generation_config import GenerationConfig
from tfgen.decoding.model_protocol import CacheStepOutput
from tfgen.generation.mixin import TFGenerationMixin
from tfgen.keras_hub.config import KerasHubConfig, model_config, sampler_generation_config
from tfgen.keras_hub.gemma import GemmaDecoderStyle
from tfgen.keras_hub.gpt2 import GPT2DecoderStyle
from tfgen.keras_hub.presets import keras_hub_module
from tfgen.keras_hub.rotary import RotaryDecoderStyle
from tfgen.keras_hub.styles import DecoderStyle
from tfgen.keras_hub.tokenizer import KerasHubTokenizer
from tfgen.models.attention import attention_masks
from tfgen.models.layers import query_slots

#: One decoder style per family of backbones, tried in this order.
_STYLES: tuple[type[DecoderStyle], ...] = (RotaryDecoderStyle, GemmaDecoderStyle, GPT2DecoderStyle)


def supported_backbones() -> list[str]:
    """The keras-hub backbone class names `from_keras_hub` runs."""
    return sorted(name for style in _STYLES for name in style.backbone_classes)


class KerasHubCausalLM(TFGenerationMixin):
    """A keras-hub `CausalLM` with tfgen's `generate()`; build it with `from_keras_hub`.

    The cache is a tuple over layers of (keys, values), each `[batch, kv_heads, max_length, head_dim]` in the
    backbone's compute dtype. Attributes: `causal_lm` (the wrapped model, whose weights are used, not copied),
    `config` (`KerasHubConfig`), `generation_config` (the defaults read from the model, see `from_keras_hub`),
    `tokenizer` (a `tfgen.keras_hub.KerasHubTokenizer` over the preprocessor's tokenizer, or None).
    """

    #: `call_with_cache` takes a per-row `cache_index` (see `tfgen.decoding.model_protocol`).
    row_cache_index = True

    def __init__(self, causal_lm, style: DecoderStyle, config: KerasHubConfig, generation_config: GenerationConfig,
                 tokenizer=None):
        self.causal_lm = causal_lm
        self.style = style
        self.config = config
        self.generation_config = generation_config
        self.tokenizer = tokenizer

    def __repr__(self):
        return f"<tfgen KerasHubCausalLM over {type(self.causal_lm).__name__} ({self.config.model_type})>"

    @property
    def variables(self) -> list:
        """The wrapped model's variables (what an export saves)."""
        return self.causal_lm.variables

    @property
    def compute_dtype(self):
        return self.style.compute_dtype

    def init_cache(self, batch_size, max_length, dtype=None):
        """Zero cache: a tuple over layers of (keys, values), each `[batch_size, kv_heads, max_length, head_dim]`."""
        for name, value in (("batch_size", batch_size), ("max_length", max_length)):
            if isinstance(value, int) and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        heads, head_dim = self.style.cache_heads_and_dim()
        shape, dtype = [batch_size, heads, max_length, head_dim], dtype or self.compute_dtype
        return tuple((tf.zeros(shape, dtype), tf.zeros(shape, dtype)) for _ in range(self.style.num_layers()))

    def call_with_cache(self, input_ids, cache, cache_index, attention_mask, position_ids, last_logits_only=False,
                        compute_logits=True, layers=None) -> CacheStepOutput:
        """Runs int `[B, T]` tokens at buffer slots `[cache_index, cache_index + T)` (see
        `tfgen.decoding.model_protocol`); attention_mask `[B, max_length]` over the whole buffer, position_ids int `[B,
        T]`. Returns `CacheStepOutput(logits [B, T or 1, vocab] float32, hidden_states [B, T, D], cache)`; with
        `compute_logits=False` the LM head is skipped and `logits` is None; `layers` runs only the first that many
        decoder layers (early exit; the others' caches pass through). `cache_index` may be int32 `[B]`."""
        style = self.style
        if len(cache) != style.num_layers():
            raise ValueError(f"cache has {len(cache)} layers, the model has {style.num_layers()}")
        input_ids, position_ids = tf.cast(input_ids, tf.int32), tf.cast(position_ids, tf.int32)
        cache_index = tf.cast(cache_index, tf.int32)
        query_index = query_slots(cache_index, tf.shape(input_ids)[1])
        windows = {style.layer_window(index) for index in range(style.num_layers())}
        masks = {window: attention_masks(query_index, attention_mask, window, cache_index) for window in windows}
        x = style.embed(input_ids, position_ids)
        new_cache = list(cache)
        for index, layer_cache in enumerate(cache[:layers]):
            x, new_cache[index] = style.layer(index, x, position_ids, masks[style.layer_window(index)], layer_cache,
                                              cache_index)
        hidden = style.final_norm(x)
        if not compute_logits:
            return CacheStepOutput(None, hidden, tuple(new_cache))
        logits = style.logits(hidden[:, -1:] if last_logits_only else hidden)
        return CacheStepOutput(logits, hidden, tuple(new_cache))

    def logits_from_hidden(self, hidden_states) -> tf.Tensor:
        """float32 logits `[..., vocab]` of final-norm hidden states `[..., D]` (the LM head alone)."""
        return self.style.logits(hidden_states)


def from_keras_hub(causal_lm, *, generation_config: GenerationConfig | None = None) -> KerasHubCausalLM:
    """Wraps a `keras_hub.models.CausalLM` so that tfgen generates with it, sharing its weights (no copy).

    Supported: the backbones of `supported_backbones()` (GPT-2, Llama, Llama 3, Mistral, Qwen, Qwen 3, Phi-3, Gemma
    and Gemma 3 text-only), in any dtype policy, quantized or not. The model's preprocessor (when it has one) gives
    the tokenizer (`.tokenizer`, text in and out: `tokenizer(["a", "b"])`, `tokenizer.batch_decode(...)`) and the
    special tokens: eos is what keras-hub's `generate(stop_token_ids="auto")` stops at, pad is the tokenizer's pad
    id. `generation_config` (default: one derived from the model) becomes the wrapper's defaults; the derived one
    takes keras-hub's `compile(sampler=...)` choice (greedy, top-k, top-p, random, beam or contrastive, with their
    options) and the preprocessor's `sequence_length` as `max_length`.

    Raises TypeError for anything but a keras-hub CausalLM, ValueError naming what is unsupported (another
    backbone, a vision-enabled Gemma 3, a sublayer this keras-hub release names differently).
    """
    keras_hub = keras_hub_module("from_keras_hub")
    if not isinstance(causal_lm, keras_hub.models.CausalLM):
        raise TypeError(f"causal_lm must be a keras_hub.models.CausalLM, got {type(causal_lm).__name__}")
    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise TypeError(f"generation_config must be a tfgen.GenerationConfig, got {type(generation_config).__name__}")
    backbone_name = type(causal_lm.backbone).__name__
    style_class = next((style for style in _STYLES if backbone_name in style.backbone_classes), None)
    if style_class is None:
        raise ValueError(
            f"causal_lm: {type(causal_lm).__name__} with a {backbone_name} is not supported; supported backbones: "
            f"{', '.join(supported_backbones())}"
        )
    style = style_class(causal_lm)
    style.check()
    preprocessor = getattr(causal_lm, "preprocessor", None)
    tokenizer = None if preprocessor is None else KerasHubTokenizer(preprocessor)
    config = model_config(causal_lm, style, tokenizer)
    if generation_config is None:
        generation_config = sampler_generation_config(causal_lm, config)
    return KerasHubCausalLM(causal_lm, style, config, generation_config.copy(), tokenizer)


def from_preset(path, dtype=None) -> KerasHubCausalLM:
    """`from_keras_hub` of a keras-hub preset directory's `CausalLM` (with its preprocessor), in `dtype` (default: the
    preset's)."""
    keras_hub = keras_hub_module()
    options = {} if dtype is None else {"dtype": dtype}
    try:
        causal_lm = keras_hub.models.CausalLM.from_preset(os.fspath(path), **options)
    except ValueError as error:
        raise ValueError(f"{os.fspath(path)!r}: keras-hub cannot load a CausalLM from this preset: {error}") from None
    return from_keras_hub(causal_lm)
