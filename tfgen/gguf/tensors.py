"""A GGUF file's tensors under HF names, dequantized to float32 in HF's `[out, in]` layout.

GGUF lists a tensor's dimensions innermost first (`[in, out]` for a linear weight), so reversing them gives the
row-major numpy shape, which is HF's. llama.cpp's converter reorders the query and key rows of `llama` models for
its rotary embedding; `unpermute_rotary_rows` puts them back. The tensor table is checked against the config
(names, shapes, quantization types) before anything is dequantized.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from tfgen.gguf.files import GGUFFile
from tfgen.memory import check_fits
from tfgen.models.quantize import quantize_rows
from tfgen.models.quantize_modes import check_quantize

# GGUF tensor name -> HF name, for the tensors outside the blocks.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# blk.N.<gguf> -> model.layers.N.<hf>, then .weight / .bias.
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# Types whose dequantization (gguf-py's) is checked by tfgen's tests; the K-quants are what llama.cpp's usual
# "Q4_K_M"-style files mix.
SUPPORTED_TYPE_NAMES = ("F32", "F16", "BF16", "Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1",
                        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def hf_name(gguf_name: str) -> str | None:
    """The HF name of a GGUF tensor name (`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`), or
    None for a name tfgen does not know."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK_TENSOR.fullmatch(gguf_name)
    if match is None or match.group(2) not in _BLOCK_NAMES:
        return None
    layer, part, kind = match.groups()
    return f"model.layers.{int(layer)}.{_BLOCK_NAMES[part]}.{kind}"


def expected_hf_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HF name -> shape of every tensor that a model of the HF config dict `config` (from `hf_config_dict`) has."""
    vocab, hidden, inner = config["vocab_size"], config["hidden_size"], config["intermediate_size"]
    head_dim = config["head_dim"]
    queries, keys = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    model_type = config["model_type"]
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, hidden)
    for layer in range(config["num_hidden_layers"]):
        projections = {"self_attn.q_proj": (queries, hidden), "self_attn.k_proj": (keys, hidden),
                       "self_attn.v_proj": (keys, hidden), "self_attn.o_proj": (hidden, queries),
                       "mlp.gate_proj": (inner, hidden), "mlp.up_proj": (inner, hidden),
                       "mlp.down_proj": (hidden, inner)}
        # Qwen2 always has query, key and value biases; Llama and Qwen3 say so in their config.
        biased = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"} if model_type == "qwen2" else set()
        if config.get("attention_bias"):
            biased |= {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"}
        if config.get("mlp_bias"):
            biased |= {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}
        prefix = f"model.layers.{layer}."
        for name, shape in projections.items():
            shapes[f"{prefix}{name}.weight"] = shape
            if name in biased:
                shapes[f"{prefix}{name}.bias"] = shape[:1]
        shapes[f"{prefix}input_layernorm.weight"] = (hidden,)
        shapes[f"{prefix}post_attention_layernorm.weight"] = (hidden,)
        if model_type == "qwen3":
            shapes[f"{prefix}self_attn.q_norm.weight"] = (head_dim,)
            shapes[f"{prefix}self_attn.k_norm.weight"] = (head_dim,)
    return shapes


def check_tensor_table(file: GGUFFile, config: dict[str, Any]) -> dict[str, str]:
    """HF name -> GGUF name of the file's tensors, after checking that they are exactly the tensors of `config`'s
    model, with its shapes, in supported types. ValueError naming the file and listing every missing, unknown or
    mis-shaped tensor, or naming the first unsupported quantization type."""
    import gguf

    expected = expected_hf_shapes(config)
    # A llama file's rope scaling divisors, read into the config's rope_scaling (see tfgen.gguf.rope_freqs).
    rope_freqs = config["model_type"] in ("llama", "mistral")
    names, unknown, mismatched = {}, [], []
    for gguf_name, tensor in file.tensors.items():
        if gguf_name == "rope_freqs.weight" and rope_freqs:
            continue
        name = hf_name(gguf_name)
        if name is None or name not in expected:
            unknown.append(gguf_name)
            continue
        names[name] = gguf_name
        shape = tuple(int(size) for size in reversed(tensor.shape))
        if shape != expected[name]:
            mismatched.append(f"{gguf_name}: file {shape} (HF order) vs {expected[name]} from the metadata")
    missing = sorted(set(expected) - set(names), key=_natural_order)
    if missing or unknown or mismatched:
        raise file.error(
            f"tensors do not match a {config['model_type']} model of its metadata: missing={_listed(missing)}, "
            f"unknown={_listed(sorted(unknown, key=_natural_order))}, shape_mismatch={_listed(mismatched)}"
        )
    for gguf_name in names.values():
        type_name = gguf.GGMLQuantizationType(file.tensors[gguf_name].tensor_type).name
        if type_name not in SUPPORTED_TYPE_NAMES:
            raise file.error(
                f"tensor {gguf_name!r} has quantization type {type_name}, which tfgen does not dequantize; "
                f"supported: {', '.join(SUPPORTED_TYPE_NAMES)}"
            )
    return names


def read_hf_tensors(file: GGUFFile, config: dict[str, Any], quantize: str | None = None) -> dict[str, np.ndarray]:
    """Every tensor of the file as a float32 numpy array under its HF name and in HF's shape (`[out, in]` for
    linear weights), with the query / key rows of `llama` files put back in HF's order. Checks the table first
    (`check_tensor_table`) and that the copies fit in memory.

    With `quantize="int8"` each matrix is quantized per row (`tfgen.models.quantize.quantize_rows`) right after it
    is dequantized, so at most one float32 matrix exists at a time. GGUF's own blocks (32 weights with one scale, Q4
    and Q8 alike) cannot be kept: one scale per output row is coarser than a scale per block, so each block's values
    are requantized to the row's scale (a Q8_0 tensor loses up to half a row step per weight)."""
    quantize = check_quantize(quantize)
    names = check_tensor_table(file, config)
    elements = [int(file.tensors[gguf_name].n_elements) for gguf_name in names.values()]
    needed = 4 * sum(elements) if quantize is None else sum(elements) + 4 * max(elements)
    what = "to float32" if quantize is None else "to int8"
    check_fits(needed, f"dequantizing {file.path!r} {what}", "use a machine with more memory")
    # llama.cpp permutes the rows only in its converter for the llama architecture (Qwen's are left as HF has them).
    permuted = {"self_attn.q_proj": config["num_attention_heads"], "self_attn.k_proj": config["num_key_value_heads"]}
    permutes = config["model_type"] in ("llama", "mistral")
    tensors = {}
    for name, gguf_name in names.items():
        array = dequantize(file, gguf_name)
        part = name.split(".")[-2] if name.startswith("model.layers.") else ""
        heads = permuted.get(f"self_attn.{part}") if permutes else None
        array = array if heads is None else unpermute_rotary_rows(array, heads)
        tensors[name] = quantize_rows(array) if quantize is not None and array.ndim == 2 else array
    return tensors


def dequantize(file: GGUFFile, gguf_name: str) -> np.ndarray:
    """The tensor `gguf_name` of the file as a new float32 array in numpy (HF) order, dequantized by gguf-py."""
    import gguf

    tensor = file.tensors[gguf_name]
    shape = tuple(int(size) for size in reversed(tensor.shape))
    try:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except (ValueError, NotImplementedError) as error:
        raise file.error(f"cannot dequantize tensor {gguf_name!r}: {error}") from None
    # A copy: F32 tensors come back as views of the memory-mapped file.
    return np.array(values, dtype=np.float32).reshape(shape)


def unpermute_rotary_rows(array: np.ndarray, heads: int) -> np.ndarray:
    """Undoes llama.cpp's query / key row order: `array` is `[heads * head_dim, ...]` (a weight or a bias) whose rows
    within each head hold the rotary pairs interleaved (pair p's first element at row 2p, its second at 2p + 1), as
    the original Llama checkpoints and llama.cpp lay them out; HF keeps all first elements, then all second ones
    (row j < head_dim / 2 is pair j's first element, row head_dim / 2 + j its second). Returns a new array in HF's
    row order, same shape."""
    head_dim, remainder = divmod(array.shape[0], heads)
    if remainder or head_dim % 2:
        raise ValueError(f"{array.shape[0]} rows do not split into {heads} heads of an even size")
    half = head_dim // 2
    within_head = np.arange(head_dim)
    # HF row j of a head reads the interleaved row 2 * (j mod half) + (j div half).
    source = 2 * (within_head % half) + within_head // half
    order = (np.arange(heads)[:, None] * head_dim + source[None, :]).reshape(-1)
    return array[order]


def _listed(items: list[str], limit: int = 8) -> str:
    """The first `limit` items as a list, with a count of the others (a 70-layer model misses hundreds at once)."""
    return f"{items[:limit]}{f' and {len(items) - limit} more' if len(items) > limit else ''}"


def _natural_order(name: str) -> tuple:
    """Sort key putting blk.2 before blk.10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))
