"""tfgen: an XLA-compiled generate() for TensorFlow/Keras language models.

The names below load on first use, so `import tfgen` imports no TensorFlow; the first import of TensorFlow made by
tfgen keeps TensorFlow's C++ start-up lines quiet (`tfgen.generation.tf_startup`; `TF_CPP_MIN_LOG_LEVEL=0` shows
them).
"""

from __future__ import annotations

from tfgen.generation import compile_cache, tf_startup
from tfgen.lazy import lazy_exports

__version__ = "0.1.0"

# TensorFlow reads TF_XLA_FLAGS once, when its runtime starts (the first op, long before the first generate call),
# so the compile cache's flag is set now. That creates nothing: the cache's folders, thread and exit hook start
# with the first compiled program (compile_cache.start()).
compile_cache.configure()
# TensorFlow's C++ start-up lines (CUDA probes, absl's notice, cuInit errors) stay quiet when a tfgen module is the
# first to import it; TF_CPP_MIN_LOG_LEVEL=0 shows them. This installs an import hook and imports nothing.
tf_startup.quiet_first_import()

_EXPORTS = {
    "AutoModelForCausalLM": "tfgen.auto.models",
    "AutoModelForSeq2SeqLM": "tfgen.auto.models",
    "AutoTokenizer": "tfgen.auto.tokenizer",
    "BucketPolicy": "tfgen.request.buckets",
    "DEFAULT_MODEL": "tfgen.hub.default_model",
    "DisjunctiveConstraint": "tfgen.decoding.constraints",
    "EXACT_SHAPES": "tfgen.request.buckets",
    "EosTokenCriteria": "tfgen.stopping.criteria",
    "GenerateBeamDecoderOnlyOutput": "tfgen.generation.outputs",
    "GenerateBeamEncoderDecoderOutput": "tfgen.generation.outputs",
    "GenerateDecoderOnlyOutput": "tfgen.generation.outputs",
    "GenerateEncoderDecoderOutput": "tfgen.generation.outputs",
    "GenerationConfig": "tfgen.config.generation_config",
    "GenerationMode": "tfgen.config.generation_config",
    "LogitsProcessor": "tfgen.logits.pipeline",
    "MaxLengthCriteria": "tfgen.stopping.criteria",
    "MaxTimeCriteria": "tfgen.stopping.criteria",
    "PhrasalConstraint": "tfgen.decoding.constraints",
    "StopStringCriteria": "tfgen.stopping.criteria",
    "StoppingCriteria": "tfgen.stopping.criteria",
    "StoppingCriteriaList": "tfgen.stopping.criteria",
    "T5Config": "tfgen.models.t5_config",
    "T5ForConditionalGeneration": "tfgen.models.t5",
    "TFGenerationMixin": "tfgen.generation.mixin",
    "TextGenerationPipeline": "tfgen.pipelines.text_generation",
    "TextIteratorStreamer": "tfgen.generation.streaming",
    "TextStreamer": "tfgen.generation.streaming",
    "TokenCallbackStreamer": "tfgen.generation.streaming",
    "Tokenizer": "tfgen.text.tokenizer",
    "batch_generate": "tfgen.batch",
    "export_saved_model": "tfgen.export",
    "from_keras_hub": "tfgen.keras_hub",
    "pipeline": "tfgen.pipelines.text_generation",
    "pull": "tfgen.hub.pull",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
