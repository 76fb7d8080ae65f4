"""keras-hub preset directories (what `causal_lm.save_to_preset(directory)` writes) as tfgen models and tokenizers,
so `--model ./preset` works in `tfgen generate`, `export` and `batch`, and `AutoModelForCausalLM.from_pretrained`
and `Tokenizer.from_pretrained` take the directory."""

from __future__ import annotations

import json
import os
from pathlib import Path


def is_keras_hub_preset(path) -> bool:
    """Whether `path` is a local directory holding a keras-hub preset (its `metadata.json` names a keras-hub
    version). Cheap and TensorFlow-free: checked before anything loads."""
    metadata = Path(os.fspath(path)) / "metadata.json"
    if not metadata.is_file():
        return False
    try:
        return "keras_hub_version" in json.loads(metadata.read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False


def _keras_hub():
    try:
        import keras_hub
    except ImportError as error:
        raise ImportError("loading a keras-hub preset needs keras-hub: pip install 'tfgen[keras-hub]'") from error
    return keras_hub


def load_preset_model(path, dtype=None):
    """`from_keras_hub` of the preset's `CausalLM` (with its preprocessor), in `dtype` (default: the preset's)."""
    from tfgen.keras_hub.adapter import from_keras_hub

    keras_hub = _keras_hub()
    options = {} if dtype is None else {"dtype": dtype}
    try:
        causal_lm = keras_hub.models.CausalLM.from_preset(os.fspath(path), **options)
    except ValueError as error:
        raise ValueError(f"{os.fspath(path)!r}: keras-hub cannot load a CausalLM from this preset: {error}") from None
    return from_keras_hub(causal_lm)


def load_preset_tokenizer(path, padding_side: str = "left"):
    """The `KerasHubTokenizer` of the preset's causal-LM preprocessor."""
    from tfgen.keras_hub.tokenizer import KerasHubTokenizer

    keras_hub = _keras_hub()
    try:
        preprocessor = keras_hub.models.CausalLMPreprocessor.from_preset(os.fspath(path))
    except ValueError as error:
        raise OSError(f"{os.fspath(path)!r}: no causal-LM preprocessor in this keras-hub preset: {error}") from None
    return KerasHubTokenizer(preprocessor, padding_side=padding_side)
