"""What a keras-hub `CausalLM` says about generation, in tfgen's terms: the model config (vocabulary, special tokens)
and the default `GenerationConfig` from the sampler chosen with `causal_lm.compile(sampler=...)`."""

from __future__ import annotations

import dataclasses
import warnings

from tfgen.config.generation_config import GenerationConfig
from tfgen.keras_hub.presets import keras_hub_module


@dataclasses.dataclass
class KerasHubConfig:
    """What tfgen reads of a model config, taken from the keras-hub backbone and its preprocessor's tokenizer."""

    model_type: str
    vocab_size: int
    num_hidden_layers: int
    max_position_embeddings: int | None
    bos_token_id: int | None
    eos_token_id: list[int] | None
    pad_token_id: int | None


def model_config(causal_lm, style, tokenizer):
    """The `KerasHubConfig` of `causal_lm`; special tokens come from `tokenizer` (a `KerasHubTokenizer` or None)."""
    backbone = causal_lm.backbone
    model_type = type(backbone).__name__.removesuffix("Backbone").lower()
    return KerasHubConfig(
        model_type=model_type,
        vocab_size=int(backbone.vocabulary_size),
        num_hidden_layers=style.num_layers(),
        # Learned position tables end; rotary positions do not.
        max_position_embeddings=getattr(backbone, "max_sequence_length", None),
        bos_token_id=None if tokenizer is None else tokenizer.bos_token_id,
        eos_token_id=None if tokenizer is None else tokenizer.stop_token_ids or None,
        pad_token_id=None if tokenizer is None else tokenizer.pad_token_id,
    )


def sampler_generation_config(causal_lm, config) -> GenerationConfig:
    """The defaults keras-hub's `causal_lm.generate()` would use: its sampler's strategy and options, the
    preprocessor's `sequence_length` as `max_length`, and the special tokens of `config`. A sampler subclass tfgen
    cannot express (its own `get_next_token`) is warned about and replaced by greedy search."""
    samplers = keras_hub_module().samplers
    options = {
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
    }
    preprocessor = getattr(causal_lm, "preprocessor", None)
    if preprocessor is not None and getattr(preprocessor, "sequence_length", None):
        options["max_length"] = int(preprocessor.sequence_length)
    sampler = getattr(causal_lm, "sampler", None)
    temperature = float(getattr(sampler, "temperature", 1.0) or 1.0)
    # Exact types: a subclass may pick tokens its own way, which no option here describes.
    kind = type(sampler)
    if sampler is None or kind is samplers.GreedySampler:
        options["do_sample"] = False
    elif kind is samplers.TopKSampler:
        options.update(do_sample=True, top_k=int(sampler.k), temperature=temperature)
    elif kind is samplers.TopPSampler:
        options.update(do_sample=True, top_p=float(sampler.p), top_k=int(sampler.k or 0), temperature=temperature)
    elif kind is samplers.RandomSampler:
        options.update(do_sample=True, top_k=0, temperature=temperature)
    elif kind is samplers.BeamSampler:
        # keras-hub's beam search has no length penalty and keeps going to max_length.
        options.update(do_sample=False, num_beams=int(sampler.num_beams), length_penalty=0.0)
        if sampler.return_all_beams:
            warnings.warn("the sampler's return_all_beams is not carried over: pass num_return_sequences to "
                          "generate() for several beams", UserWarning, stacklevel=3)
    elif kind is samplers.ContrastiveSampler:
        options.update(do_sample=False, top_k=int(sampler.k), penalty_alpha=float(sampler.alpha))
    else:
        warnings.warn(f"causal_lm's sampler {kind.__name__} has no tfgen equivalent; the wrapper's defaults use "
                      "greedy search (pass generation_config= or generate() options to choose)", UserWarning,
                      stacklevel=3)
        options["do_sample"] = False
    if temperature != 1.0 and not options.get("do_sample"):
        warnings.warn(f"the sampler's temperature={temperature} is not carried over: tfgen applies a temperature "
                      f"when sampling only, not to {kind.__name__}'s choice", UserWarning, stacklevel=3)
    if getattr(sampler, "seed", None) is not None and options.get("do_sample"):
        # A seed is a per-call input in tfgen (per row, stateless), not a model default.
        warnings.warn(f"the sampler's seed={sampler.seed} is not carried over: pass seed= to generate() for "
                      "reproducible sampling", UserWarning, stacklevel=3)
    return GenerationConfig(**{key: value for key, value in options.items() if value is not None})
