"""The `GenerationConfig` options tfgen refuses, and why: every option is honoured, refused here with a
ValueError naming it, or (where HF also does) warned about as having no effect in the chosen mode.

`GenerationConfig` itself keeps every HF attribute, so `generation_config.json` files round-trip; the refusal
happens when a config is used to generate or export (`tfgen.request.prepare.decode_spec`). TF-free.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class Refusal(NamedTuple):
    """is_set: whether the value asks for the feature (its HF default does not). why: the error's explanation."""

    is_set: Callable[[Any], bool]
    why: str


def _not_none(value) -> bool:
    return value is not None


def _true(value) -> bool:
    return value is True


def _differs(default) -> Callable[[Any], bool]:
    return lambda value: value is not None and value != default


_ASSISTED = ("it belongs to universal assisted generation (an assistant with another tokenizer), which tfgen does not "
             "support: the assistant must share the model's vocabulary")
_FIXED_DRAFTS = ("tfgen drafts a fixed number of tokens per round (`num_assistant_tokens`), so that one compiled "
                 "program serves every round")

#: Options tfgen refuses when they ask for something (`dola_layers`, which selects a mode, is refused by
#: `get_generation_mode`).
REFUSED: dict[str, Refusal] = {
    "output_attentions": Refusal(_true, "the compiled loop does not return attention weights"),
    "use_cache": Refusal(lambda value: value is False, "the compiled loop always decodes over its static KV cache"),
    "cache_implementation": Refusal(_differs("static"), "tfgen has one cache: a static, padded KV buffer ('static')"),
    "cache_config": Refusal(_not_none, "tfgen's static KV cache takes no configuration"),
    "return_legacy_cache": Refusal(_true, "generate does not return the KV cache"),
    "prefill_chunk_size": Refusal(_not_none, "the prompt is prefilled in one pass"),
    "low_memory": Refusal(_true, "contrastive search always scores its top_k candidates in one batch"),
    "token_healing": Refusal(_true, "token healing is not supported"),
    "guidance_scale": Refusal(_differs(1), "classifier-free guidance is not supported"),
    "watermarking_config": Refusal(_not_none, "watermarking is not supported"),
    "is_assistant": Refusal(_true, "it marks a config as an assistant's own; pass the model as assistant_model="),
    "num_assistant_tokens_schedule": Refusal(_differs("constant"), _FIXED_DRAFTS),
    "assistant_confidence_threshold": Refusal(_differs(0.4), _FIXED_DRAFTS),
    "assistant_lookbehind": Refusal(_differs(10), _ASSISTED),
    "target_lookbehind": Refusal(_differs(10), _ASSISTED),
    "compile_config": Refusal(_not_none,
                              "it configures torch.compile; tfgen compiles with XLA (generate's jit_compile=)"),
    "disable_compile": Refusal(_true, "it configures torch.compile; pass jit_compile=False to generate instead"),
}


#: Options a decoder-only model refuses: it has no encoder (whose hidden states an encoder-decoder model returns, and
#: whose input its n-gram ban reads), nor a decoder start.
DECODER_ONLY_REFUSED: dict[str, Refusal] = {
    "output_hidden_states": Refusal(_true, "the compiled loop does not return a decoder-only model's hidden states "
                                           "(an encoder-decoder model returns its encoder's)"),
    "encoder_no_repeat_ngram_size": Refusal(
        lambda value: value is not None and value > 0,
        "it bans n-grams of an encoder-decoder model's encoder input, and this model is decoder-only",
    ),
    "decoder_start_token_id": Refusal(_not_none, "it starts an encoder-decoder model's decoder, and this model is "
                                                 "decoder-only"),
}


def refuse_unsupported(config, *, encoder_decoder: bool = False) -> None:
    """Raises ValueError naming the first option of `config` that asks for something tfgen does not do (for a
    decoder-only model unless `encoder_decoder`, `DECODER_ONLY_REFUSED` too)."""
    refused = REFUSED if encoder_decoder else {**REFUSED, **DECODER_ONLY_REFUSED}
    for name, refusal in refused.items():
        value = getattr(config, name, None)
        if refusal.is_set(value):
            raise ValueError(f"{name}={value!r} is not supported: {refusal.why}.")
