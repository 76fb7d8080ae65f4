"""The checkpoints every library loads (HF layout), and the sizes the roofline needs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

RANDOM_124M = "random-124m"
# Relative to the working directory, as it is named in the reports; the benchmark runs from a checkout.
DEFAULT_TRAINED_MODEL = "saved_models/stdlib-gpt2"


def resolve_checkpoint(model: str, cache_dir: str) -> str:
    """A directory in HF layout for `model`: `random-124m` (built once under `cache_dir`) or a path."""
    if model != RANDOM_124M:
        if not (Path(model) / "config.json").is_file():
            raise ValueError(f"--models: {model!r} is neither {RANDOM_124M!r} nor a directory with config.json")
        return model
    directory = Path(cache_dir) / "random-gpt2-124m"
    if not (directory / "model.safetensors").is_file():
        import keras

        from tfgen.models.gpt2 import GPT2Config, GPT2LMHeadModel

        keras.utils.set_random_seed(0)
        # GPT-2 small's shape with HF's initialisation; every library loads this same file.
        GPT2LMHeadModel(GPT2Config()).save_pretrained(directory)
    return str(directory)


def checkpoint_info(checkpoint: str) -> dict:
    """Parameter count and the float32 bytes one batch-1 decode step reads (every weight once, except the
    position and, when the head is untied, token embeddings, of which it reads one row)."""
    from safetensors import safe_open

    config = json.loads((Path(checkpoint) / "config.json").read_text())
    sizes = {}
    for path in sorted(Path(checkpoint).glob("*.safetensors")):
        with safe_open(str(path), "np") as tensors:
            for name in tensors.keys():
                sizes[name.removeprefix("transformer.")] = int(np.prod(tensors.get_slice(name).get_shape()))
    read_once = {"wpe.weight"} | ({"wte.weight"} if "lm_head.weight" in sizes else set())
    return {
        "parameters": sum(sizes.values()),
        "weight_bytes_per_step": 4 * sum(size for name, size in sizes.items() if name not in read_once),
        "vocab_size": int(config["vocab_size"]),
        "n_layer": config.get("n_layer"),
        "n_embd": config.get("n_embd"),
    }
