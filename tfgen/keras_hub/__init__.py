"""keras-hub models generating through tfgen: `from_keras_hub(causal_lm)` (see docs/keras-hub.md)."""

from tfgen.keras_hub.adapter import KerasHubCausalLM, KerasHubConfig, from_keras_hub, supported_backbones
from tfgen.keras_hub.tokenizer import KerasHubTokenizer

__all__ = ["KerasHubCausalLM", "KerasHubConfig", "KerasHubTokenizer", "from_keras_hub", "supported_backbones"]
