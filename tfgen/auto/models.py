"""`AutoModelForCausalLM` and `AutoModelForSeq2SeqLM`: build the tfgen model matching an HF-style checkpoint or
config."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import keras

from tfgen.auto.sources import resolve_source
from tfgen.gguf import is_gguf_path, refuse_hub_options
from tfgen.gguf.load_cache import gguf_checkpoint
from tfgen.keras_hub.adapter import from_preset as keras_hub_preset
from tfgen.keras_hub.presets import is_keras_hub_preset
from tfgen.local_files import file_present
from tfgen.models.gpt2 import GPT2LMHeadModel
from tfgen.models.llama import LlamaForCausalLM
from tfgen.models.loading import read_config_dict, read_safetensors_weights, resolve_model_directory
from tfgen.models.pretrained import (
    build_pretrained,
    check_quantizable,
    default_generation_config,
    generation_source,
    naming_the_file,
)
from tfgen.models.quantize_modes import check_quantize
from tfgen.models.t5 import T5ForConditionalGeneration

# config.json `model_type` -> model class (each with a `config_class` offering `from_dict`).
MODEL_FOR_CAUSAL_LM_MAPPING: dict[str, type] = {
    model_type: model_class for model_class in (GPT2LMHeadModel, LlamaForCausalLM)
    for model_type in model_class.model_types
}
# config.json `model_type` -> encoder-decoder model class.
MODEL_FOR_SEQ2SEQ_LM_MAPPING: dict[str, type] = {
    model_type: model_class for model_class in (T5ForConditionalGeneration,) for model_type in model_class.model_types
}

# Each mapping with the Auto class that loads it, to point a caller at the other one.
_AUTO_CLASSES = (("AutoModelForCausalLM", MODEL_FOR_CAUSAL_LM_MAPPING),
                 ("AutoModelForSeq2SeqLM", MODEL_FOR_SEQ2SEQ_LM_MAPPING))


def _model_class(model_type: Any, mapping: Mapping[str, type] = MODEL_FOR_CAUSAL_LM_MAPPING) -> type:
    model_class = mapping.get(model_type) if isinstance(model_type, str) else None
    if model_class is None:
        for auto_name, other in _AUTO_CLASSES:
            if other is not mapping and isinstance(model_type, str) and model_type in other:
                raise ValueError(f"model_type {model_type!r} is a {other[model_type].__name__}: load it with "
                                 f"tfgen.{auto_name} (supported here: {sorted(mapping)})")
        raise ValueError(f"model_type {model_type!r} is not supported; supported: {sorted(mapping)}")
    return model_class


class _AutoModel:
    """What the Auto classes share: `from_pretrained` of an HF directory or Hub id, `from_config`, both dispatching on
    `model_type` through the class's `mapping` (a model of the other kind is a ValueError naming its Auto class), and
    the single-file formats a subclass reads (`_from_single_file`)."""

    mapping: Mapping[str, type]

    def __init__(self):
        raise TypeError(f"{type(self).__name__} is not instantiable; use from_pretrained() or from_config()")

    @classmethod
    def from_pretrained(
        cls,
        path_or_repo_id: str | os.PathLike,
        *,
        dtype=None,
        revision: str | None = None,
        cache_dir: str | os.PathLike | None = None,
        token: str | bool | None = None,
        local_files_only: bool | None = None,
        quantize: str | None = None,
    ):
        """Loads a model from a local directory or Hub id holding `config.json` and safetensors weights, or a
        registered model name (`"smollm2-135m-instruct"`: pulled unless cached, as `tfgen --model NAME` does, see
        `tfgen.auto.sources`) (and, through
        `AutoModelForCausalLM`, from a GGUF file — llama.cpp's format, a path ending in `.gguf`, see `tfgen.gguf` —
        or a keras-hub preset directory, `causal_lm.save_to_preset`, which comes back wrapped by
        `tfgen.from_keras_hub`), in `dtype` (a Keras dtype or policy name; default the Keras float type), with
        `generation_config` set (the checkpoint's `generation_config.json`, else derived from the config). Raises
        `OSError` for unresolvable ids and missing or malformed files, `ValueError` / `TypeError` naming
        `config.json` (or the GGUF file) for unsupported architectures (a model of the other Auto class among them),
        invalid config values or weights that cannot fit in the memory available (checked before anything is built
        or read), `ValueError` for mismatched weights.

        `quantize="int8"`: int8 weights with a float32 scale per output channel (`tfgen.models.quantize`; GPT-2,
        the Llama family and T5); another value, or a family without an int8 form, is a ValueError naming `quantize`."""
        # Resolved first: a bad `dtype` or `quantize` is the caller's mistake, not the file's.
        policy = None if dtype is None else keras.dtype_policies.get(dtype)
        quantize = check_quantize(quantize)
        hub_options = dict(revision=revision, cache_dir=cache_dir, token=token)
        path_or_repo_id = resolve_source(path_or_repo_id, local_files_only=local_files_only, **hub_options)
        model = cls._from_single_file(path_or_repo_id, dtype, policy, hub_options, quantize)
        if model is not None:
            return model
        directory = resolve_model_directory(path_or_repo_id, **hub_options, local_files_only=local_files_only)
        config_dict = read_config_dict(directory)
        config_path = directory / "config.json"
        with naming_the_file(config_path):
            model_class = _model_class(config_dict.get("model_type"), cls.mapping)
        check_quantizable(model_class, quantize)
        return build_pretrained(model_class, config_dict, dtype, policy, config_path, directory,
                                lambda: read_safetensors_weights(directory), quantize)

    @classmethod
    def _from_single_file(cls, path_or_repo_id, dtype, policy, hub_options: dict, quantize: str | None = None):
        """The model of a GGUF file or keras-hub preset, or None when `path_or_repo_id` is neither (an HF
        directory or Hub id). Both hold decoder-only models: here a ValueError pointing to `AutoModelForCausalLM`."""
        if is_gguf_path(path_or_repo_id) or is_keras_hub_preset(path_or_repo_id):
            raise ValueError(f"{str(path_or_repo_id)!r} is a GGUF file or keras-hub preset, which hold decoder-only "
                             "models: load it with tfgen.AutoModelForCausalLM")
        return None

    @classmethod
    def from_config(cls, config, *, dtype=None):
        """A randomly initialised model from an HF config dict (dispatching on its `model_type`) or a config
        object of a registered model (e.g. `GPT2Config`, `T5Config`)."""
        if isinstance(config, Mapping):
            model_class = _model_class(config.get("model_type"), cls.mapping)
            config_dict, config = config, model_class.config_class.from_dict(config)
        else:
            model_class = next((model for model in cls.mapping.values() if isinstance(config, model.config_class)),
                               None)
            if model_class is None:
                if any(isinstance(config, model.config_class)
                       for _, mapping in _AUTO_CLASSES for model in mapping.values()):
                    _model_class(config.model_type, cls.mapping)  # raises, naming the other Auto class
                raise TypeError(f"config must be a dict or a registered config object, got {type(config).__name__}")
            config_dict = config.to_dict()
        model = model_class(config, dtype=dtype)
        model.generation_config = default_generation_config(None, generation_source(model_class, config_dict, config))
        return model


class AutoModelForCausalLM(_AutoModel):
    """Dispatches on `model_type` through `MODEL_FOR_CAUSAL_LM_MAPPING`; use the class methods."""

    mapping = MODEL_FOR_CAUSAL_LM_MAPPING

    @classmethod
    def _from_single_file(cls, path_or_repo_id, dtype, policy, hub_options: dict, quantize: str | None = None):
        if is_gguf_path(path_or_repo_id):
            # One file holds the config (as metadata) and the weights (dequantized to float32 once checked).
            # A file is local: Hub options could do nothing for it.
            refuse_hub_options(path_or_repo_id, **hub_options)
            # The GGUF load cache (tfgen.gguf.load_cache) may hold both, from an earlier load of the same file.
            config_dict, shown_path, read_weights = gguf_checkpoint(path_or_repo_id, quantize)
            config_path = Path(shown_path)
            with naming_the_file(config_path):
                model_class = _model_class(config_dict.get("model_type"), cls.mapping)
            return build_pretrained(model_class, config_dict, dtype, policy, config_path, None, read_weights,
                                    quantize)
        if is_keras_hub_preset(path_or_repo_id):
            refuse_hub_options(path_or_repo_id, "keras-hub preset", **hub_options)
            if quantize is not None:
                raise ValueError(
                    f"quantize={quantize!r}: {str(path_or_repo_id)!r} is a keras-hub preset, whose layers are "
                    "keras-hub's own; quantize it with keras-hub (`causal_lm.quantize(\"int8\")` before "
                    "`tfgen.from_keras_hub`, which runs it as it is) rather than through tfgen")
            return keras_hub_preset(path_or_repo_id, dtype=dtype)
        return None


class AutoModelForSeq2SeqLM(_AutoModel):
    """Dispatches on `model_type` through `MODEL_FOR_SEQ2SEQ_LM_MAPPING` (encoder-decoder models: `t5`); use the class
    methods."""

    mapping = MODEL_FOR_SEQ2SEQ_LM_MAPPING


def load_generation_model(path_or_repo_id: str | os.PathLike, **options):
    """The model at `path_or_repo_id` (a directory, Hub id, GGUF file or keras-hub preset) through
    `AutoModelForSeq2SeqLM` when its `config.json` names an encoder-decoder `model_type`, else through
    `AutoModelForCausalLM` (what the command line loads `--model` with); `options` go to `from_pretrained`."""
    if not (is_gguf_path(path_or_repo_id) or is_keras_hub_preset(path_or_repo_id)):
        config_file = Path(path_or_repo_id) / "config.json"
        model_type = read_config_dict(config_file.parent).get("model_type") if file_present(config_file) else None
        if model_type in MODEL_FOR_SEQ2SEQ_LM_MAPPING:
            return AutoModelForSeq2SeqLM.from_pretrained(path_or_repo_id, **options)
    return AutoModelForCausalLM.from_pretrained(path_or_repo_id, **options)
