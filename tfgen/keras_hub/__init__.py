"""keras-hub models generating through tfgen: `from_keras_hub(causal_lm)` (see docs/keras-hub.md).

The names below load on first use: `tfgen.keras_hub.presets` (preset detection) stays free of TensorFlow.

May import `tfgen.models` (attention, layers), `tfgen.generation` and everything below them.
"""

from __future__ import annotations

from tfgen.lazy import lazy_exports

_EXPORTS = {
    "KerasHubCausalLM": "tfgen.keras_hub.adapter",
    "KerasHubConfig": "tfgen.keras_hub.config",
    "KerasHubTokenizer": "tfgen.keras_hub.tokenizer",
    "from_keras_hub": "tfgen.keras_hub.adapter",
    "supported_backbones": "tfgen.keras_hub.adapter",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
