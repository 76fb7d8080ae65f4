"""A GGUF file's metadata as the HF-style config dict of the matching tfgen model (HF's `config.json` keys)."""

from __future__ import annotations

from typing import Any

from tfgen.gguf.files import GGUFFile
from tfgen.gguf.rope_freqs import llama3_rope_scaling
from tfgen.gguf.tensors import dequantize

# general.architecture -> HF model_type. llama.cpp writes "llama" for Llama, Mistral, SmolLM2, TinyLlama, ...
SUPPORTED_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
# llama.cpp's default when a file gives no rope base.
DEFAULT_ROPE_THETA = 10000.0
# tokenizer.ggml.<name>_token_id keys; the end-of-generation ids that llama.cpp stops at besides eos.
TOKEN_ID_NAMES = ("bos", "eos", "padding", "unknown", "eot", "eom")


def architecture(file: GGUFFile) -> str:
    """`general.architecture`, checked to be one tfgen can build (ValueError naming it and the supported ones)."""
    name = file.string("general.architecture")
    if name not in SUPPORTED_ARCHITECTURES:
        raise file.error(
            f"architecture {name!r} (general.architecture) is not supported; supported: "
            f"{sorted(SUPPORTED_ARCHITECTURES)}"
        )
    return name


def context_length(file: GGUFFile) -> int | None:
    """`<architecture>.context_length`, None when the file gives none (or no architecture): the tokenizer sizes its
    chat template's render bound with it."""
    name = file.string("general.architecture", None)
    length = file.integer(f"{name}.context_length", None) if name is not None else None
    return length if length is not None and length > 0 else None


def vocabulary_size(file: GGUFFile) -> int:
    """`<arch>.vocab_size`, else the length of `tokenizer.ggml.tokens`, else the rows of `token_embd.weight`."""
    arch = architecture(file)
    if file.has(f"{arch}.vocab_size"):
        return file.integer(f"{arch}.vocab_size", minimum=1)
    if file.has("tokenizer.ggml.tokens"):
        return len(file.array("tokenizer.ggml.tokens", str))
    embedding = file.tensors.get("token_embd.weight")
    if embedding is None or len(embedding.shape) != 2:
        raise file.error("no vocabulary size: no <arch>.vocab_size, tokenizer.ggml.tokens or 2-D token_embd.weight")
    return int(embedding.shape[1])


def token_ids(file: GGUFFile) -> dict[str, int]:
    """`{name: id}` of the `tokenizer.ggml.<name>_token_id` keys present (names from `TOKEN_ID_NAMES`), each checked
    to be an id of the vocabulary."""
    size = vocabulary_size(file)
    ids = {}
    for name in TOKEN_ID_NAMES:
        key = f"tokenizer.ggml.{name}_token_id"
        token_id = file.integer(key, None, minimum=0)
        if token_id is not None and token_id >= size:
            raise file.error(f"metadata {key!r} is {token_id}, outside the vocabulary of {size} tokens")
        if token_id is not None:
            ids[name] = token_id
    return ids


def hf_config_dict(file: GGUFFile) -> dict[str, Any]:
    """The HF config dict (`model_type` llama, mistral, qwen2 or qwen3) described by the file's metadata and tensor
    table. ValueError naming the file and key for an unsupported architecture (mixture-of-experts included), a missing
    or mistyped key, a head size llama.cpp and HF would disagree on, or an unsupported rope scaling."""
    arch = architecture(file)

    def key(name: str) -> str:
        return f"{arch}.{name}"

    # llama.cpp writes Mixtral-style models as "llama" with experts; their tensors would only be "unknown" below.
    experts = file.integer(key("expert_count"), 0, minimum=0)
    if experts:
        raise file.error(f"{key('expert_count')} is {experts}: mixture-of-experts models are not supported")
    hidden_size = file.integer(key("embedding_length"), minimum=1)
    heads = file.integer(key("attention.head_count"), minimum=1)
    if not file.has(key("attention.key_length")) and hidden_size % heads:
        raise file.error(f"{key('embedding_length')} ({hidden_size}) is not divisible by the {heads} heads and "
                         f"{key('attention.key_length')} is missing")
    head_dim = file.integer(key("attention.key_length"), hidden_size // heads, minimum=1)
    # HF's attention has one head size for queries, keys and values, rotated in full.
    for other in ("attention.value_length", "rope.dimension_count"):
        if file.integer(key(other), head_dim) != head_dim:
            raise file.error(f"{key(other)} ({file.integer(key(other))}) differs from the head size {head_dim}; "
                             f"{arch} models rotate and attend with one head size")
    ids = token_ids(file)
    # llama.cpp ends generation at eos and at the end-of-turn / end-of-message ids; HF takes a list for that.
    eos_ids = list(dict.fromkeys(ids[name] for name in ("eos", "eot", "eom") if name in ids))
    config = {
        "model_type": SUPPORTED_ARCHITECTURES[arch],
        "vocab_size": vocabulary_size(file),
        "hidden_size": hidden_size,
        "intermediate_size": file.integer(key("feed_forward_length"), minimum=1),
        "num_hidden_layers": file.integer(key("block_count"), minimum=1),
        "num_attention_heads": heads,
        "num_key_value_heads": file.integer(key("attention.head_count_kv"), heads, minimum=1),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": file.integer(key("context_length"), minimum=1),
        "rms_norm_eps": file.number(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": file.number(key("rope.freq_base"), DEFAULT_ROPE_THETA),
        "rope_scaling": _rope_scaling(file, arch, head_dim),
        "tie_word_embeddings": "output.weight" not in file.tensors,
        "bos_token_id": ids.get("bos"),
        "eos_token_id": (eos_ids[0] if len(eos_ids) == 1 else eos_ids) if eos_ids else None,
        "pad_token_id": ids.get("padding"),
    }
    if arch in ("llama", "qwen3"):
        config["attention_bias"] = "blk.0.attn_q.bias" in file.tensors
    if arch == "llama":
        config["mlp_bias"] = "blk.0.ffn_up.bias" in file.tensors
    window = file.integer(key("attention.sliding_window"), None, minimum=1)
    if window is not None:
        if arch == "llama":
            # HF's name for a Llama with a sliding attention window.
            config["model_type"] = "mistral"
        else:
            # One window for every layer (HF's Qwen2 windows the layers from max_window_layers on).
            config.update(use_sliding_window=True, max_window_layers=0)
        config["sliding_window"] = window
    return config


def _rope_scaling(file: GGUFFile, arch: str, head_dim: int) -> dict[str, Any] | None:
    """HF's `rope_scaling` for the file's `rope.scaling.*` keys (None without scaling), or for its `rope_freqs.weight`
    (Llama 3.1-style scaling). llama.cpp reads a factor without a type as linear scaling, and the older
    `rope.scale_linear` key as a linear factor."""

    def key(name: str) -> str:
        return f"{arch}.{name}"

    if "rope_freqs.weight" in file.tensors and arch == "llama":
        if file.has(key("rope.scaling.type")) or file.has(key("rope.scaling.factor")):
            raise file.error("both rope.scaling metadata and a rope_freqs.weight tensor: which scaling applies?")
        theta = file.number(key("rope.freq_base"), DEFAULT_ROPE_THETA)
        try:
            return llama3_rope_scaling(dequantize(file, "rope_freqs.weight"), theta, head_dim,
                                       file.integer(key("context_length"), minimum=1))
        except ValueError as error:
            raise file.error(str(error)) from None
    scaling_type = file.string(key("rope.scaling.type"), None)
    factor = file.number(key("rope.scaling.factor"), None)
    if factor is None:
        factor = file.number(key("rope.scale_linear"), None)
    if scaling_type == "none":
        return None
    if scaling_type in (None, "linear"):
        if scaling_type == "linear" and factor is None:
            raise file.error(f"{key('rope.scaling.type')} is 'linear' but there is no scaling factor")
        # A factor of 0 or 1 scales nothing (llama.cpp treats 0 as unset).
        return None if factor in (None, 0.0, 1.0) else {"rope_type": "linear", "factor": factor}
    if scaling_type == "yarn":
        scaling = {
            "rope_type": "yarn",
            "factor": file.number(key("rope.scaling.factor")),
            "original_max_position_embeddings": file.integer(key("rope.scaling.original_context_length"), minimum=1),
        }
        for gguf_name, hf_name in (("attn_factor", "attention_factor"), ("yarn_beta_fast", "beta_fast"),
                                   ("yarn_beta_slow", "beta_slow")):
            value = file.number(key(f"rope.scaling.{gguf_name}"), None)
            if value is not None:
                scaling[hf_name] = value
        return scaling
    raise file.error(
        f"rope scaling {scaling_type!r} ({key('rope.scaling.type')}) is not supported; supported: linear, yarn"
    )
