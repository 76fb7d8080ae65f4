"""Model families that follow `tfgen.decoding.model_protocol`: GPT-2 (`gpt2`), the Llama family (`llama`: Llama,
Mistral, Qwen 2/3), T5 (`t5`), with their configs checked field by field (`*_config`, `config_checks`), shared layers
(`layers`, `attention`, `rope`), HF checkpoints <-> variables (`hf_weights`, `loading`) and building a family's model
from a checkpoint (`pretrained`). Each family mixes in `tfgen.generation.mixin.TFGenerationMixin`.

May import `tfgen.generation` and everything below it. Picking a family by `model_type` is `tfgen.auto`'s.
"""
