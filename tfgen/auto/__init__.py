"""Loading by source: `AutoModelForCausalLM` / `AutoModelForSeq2SeqLM` pick the model family from a checkpoint's
config, and the checkpoint format (HF safetensors, a GGUF file, a keras-hub preset) from the path.

May import `tfgen.models`, `tfgen.gguf`, `tfgen.keras_hub`, `tfgen.text` and everything below them.
"""
