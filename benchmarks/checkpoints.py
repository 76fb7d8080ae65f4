"""The checkpoints every library loads (HF layout or GGUF), and the sizes the roofline needs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks.peers import is_gguf

RANDOM_124M = "random-124m"
# Relative to the working directory, as it is named in the reports; the benchmark runs from a checkout.
DEFAULT_TRAINED_MODEL = "saved_models/stdlib-gpt2"


def resolve_checkpoint(model: str, cache_dir: str) -> str:
    """The checkpoint every library loads for `model`: `random-124m` (an HF-layout directory built once under
    `cache_dir`), a directory with config.json, a `.gguf` file, or a model name of `tfgen pull` (its GGUF file,
    fetched and verified on first use)."""
    if is_gguf(model) and Path(model).is_file():
        return model
    if model != RANDOM_124M:
        from tfgen.hub.pull import pull
        from tfgen.hub.registry import MODELS

        if model in MODELS:
            return str(pull(model))
        if not (Path(model) / "config.json").is_file():
            raise ValueError(
                f"--models: {model!r} is neither {RANDOM_124M!r}, a model name of `tfgen pull` ({', '.join(MODELS)}), "
                "a .gguf file nor a directory with config.json"
            )
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
    if is_gguf(checkpoint):
        return _gguf_info(checkpoint)
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


def _gguf_info(checkpoint: str) -> dict:
    """`checkpoint_info` of a GGUF file: the float32 bytes (what tfgen and hf-torch compute with) and the bytes
    as stored (what llama.cpp reads per step), each counting the token embedding once only when the head is tied."""
    import gguf

    reader = gguf.GGUFReader(checkpoint)
    sizes = {tensor.name: (int(tensor.n_elements), int(tensor.n_bytes)) for tensor in reader.tensors}
    read_once = set() if "output.weight" not in sizes else {"token_embd.weight"}
    architecture = reader.fields["general.architecture"].contents()
    return {
        "parameters": sum(count for count, _ in sizes.values()),
        "weight_bytes_per_step": 4 * sum(count for name, (count, _) in sizes.items() if name not in read_once),
        "stored_bytes_per_step": sum(size for name, (_, size) in sizes.items() if name not in read_once),
        "file_type": gguf.LlamaFileType(reader.fields["general.file_type"].contents()).name,
        "vocab_size": len(reader.fields["tokenizer.ggml.tokens"].data),
        "n_layer": reader.fields[f"{architecture}.block_count"].contents(),
        "n_embd": reader.fields[f"{architecture}.embedding_length"].contents(),
    }
