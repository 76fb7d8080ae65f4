"""Loading by source: `AutoModelForCausalLM` / `AutoModelForSeq2SeqLM` pick the model family from a checkpoint's
config, and the checkpoint format (HF safetensors, a GGUF file, a keras-hub preset) from the path; a registered model
name stands for its cached or pulled files (`sources`).

May import `tfgen.hub` (registered names), `tfgen.models`, `tfgen.gguf`, `tfgen.keras_hub`, `tfgen.text` and everything
below them.
"""
