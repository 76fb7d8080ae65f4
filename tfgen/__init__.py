"""tfgen: an XLA-compiled generate() for TensorFlow/Keras language models.

The names below load on first use, so `import tfgen.cli` can configure TensorFlow's logging before
TensorFlow itself is imported.
"""

from __future__ import annotations

from tfgen import compile_cache
from tfgen.lazy import lazy_exports

__version__ = "0.1.0"

# TensorFlow reads TF_XLA_FLAGS once, when its runtime starts, so the cache is set up before anything of tfgen's
# can start it.
compile_cache.configure()

_EXPORTS = {
    "AutoModelForCausalLM": "tfgen.models.auto",
    "AutoModelForSeq2SeqLM": "tfgen.models.auto",
    "BucketPolicy": "tfgen.request",
    "DEFAULT_MODEL": "tfgen.defaults",
    "DisjunctiveConstraint": "tfgen.constraints",
    "EXACT_SHAPES": "tfgen.request",
    "EosTokenCriteria": "tfgen.stopping",
    "GenerateBeamDecoderOnlyOutput": "tfgen.outputs",
    "GenerateBeamEncoderDecoderOutput": "tfgen.outputs",
    "GenerateDecoderOnlyOutput": "tfgen.outputs",
    "GenerateEncoderDecoderOutput": "tfgen.outputs",
    "GenerationConfig": "tfgen.config",
    "GenerationMode": "tfgen.config",
    "LogitsProcessor": "tfgen.processors",
    "MaxLengthCriteria": "tfgen.stopping",
    "MaxTimeCriteria": "tfgen.stopping",
    "PhrasalConstraint": "tfgen.constraints",
    "StopStringCriteria": "tfgen.stopping",
    "StoppingCriteria": "tfgen.stopping",
    "StoppingCriteriaList": "tfgen.stopping",
    "T5Config": "tfgen.models.t5_config",
    "T5ForConditionalGeneration": "tfgen.models.t5",
    "TFGenerationMixin": "tfgen.generation",
    "TextIteratorStreamer": "tfgen.streaming",
    "TextStreamer": "tfgen.streaming",
    "TokenCallbackStreamer": "tfgen.streaming",
    "Tokenizer": "tfgen.tokenizer",
    "batch_generate": "tfgen.batch",
    "export_saved_model": "tfgen.export",
    "from_keras_hub": "tfgen.keras_hub",
    "pull": "tfgen.model_pull",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
