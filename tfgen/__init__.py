"""tfgen: an XLA-compiled generate() for TensorFlow/Keras language models.

The names below load on first use, so `import tfgen.cli` can configure TensorFlow's logging before
TensorFlow itself is imported.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "AutoModelForCausalLM": "tfgen.models.auto",
    "BucketPolicy": "tfgen.generation",
    "DEFAULT_MODEL": "tfgen.defaults",
    "EXACT_SHAPES": "tfgen.generation",
    "GenerateBeamDecoderOnlyOutput": "tfgen.outputs",
    "GenerateDecoderOnlyOutput": "tfgen.outputs",
    "GenerationConfig": "tfgen.config",
    "GenerationMode": "tfgen.config",
    "LogitsProcessor": "tfgen.processors",
    "TFGenerationMixin": "tfgen.generation",
    "TextIteratorStreamer": "tfgen.streaming",
    "TextStreamer": "tfgen.streaming",
    "TokenCallbackStreamer": "tfgen.streaming",
    "Tokenizer": "tfgen.tokenizer",
    "batch_generate": "tfgen.batch",
    "export_saved_model": "tfgen.export",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tfgen' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
