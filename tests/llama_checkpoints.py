"""Tiny random HF PyTorch checkpoints of the Llama family (llama, mistral, qwen2, qwen3), built here (nothing is
downloaded) for tests/test_llama_model.py and tests/test_llama_parity.py."""

from __future__ import annotations

import copy

import numpy as np

COMMON = dict(
    vocab_size=101,
    hidden_size=48,
    intermediate_size=80,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=64,
    # A wide init spreads the logits, so greedy choices are not near-ties that float noise could flip.
    initializer_range=0.3,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8}
# Each family with what sets it apart; windows smaller than prompt + new tokens, so they cut real context.
FAMILIES = {
    # Grouped-query (6 heads over 2), Llama 3.1 RoPE scaling, every bias Llama has.
    "llama": ("LlamaConfig", dict(rope_scaling=LLAMA3_ROPE, attention_bias=True, mlp_bias=True)),
    # A sliding window on every layer, 3 key/value heads.
    "mistral": ("MistralConfig", dict(sliding_window=4, num_key_value_heads=3)),
    # q/k/v biases (no o bias), plain multi-head attention, tied head, linear RoPE scaling.
    "qwen2": ("Qwen2Config", dict(num_key_value_heads=6, tie_word_embeddings=True,
                                  rope_scaling={"type": "linear", "factor": 2.0})),
    # Per-head q/k RMSNorm, a head_dim other than hidden / heads, a window on layer 1 only, tied head.
    "qwen3": ("Qwen3Config", dict(head_dim=16, attention_bias=True, use_sliding_window=True, sliding_window=5,
                                  max_window_layers=1, tie_word_embeddings=True)),
}

# Seeds whose greedy runs reach some token mid-way at different steps in different rows (a usable eos).
SEEDS = {"qwen3": 1}


def hf_config(family: str, **overrides):
    import transformers

    class_name, extra = FAMILIES[family]
    # A deep copy: HF configs write into the rope_scaling dict they are given.
    options = copy.deepcopy({**COMMON, **extra, **overrides})
    return getattr(transformers, class_name)(**options, attn_implementation="eager")


def build_hf_model(family: str, directory=None, seed: int | None = None, dtype=None, **overrides):
    """A random HF PyTorch model of `family` (eval mode), saved with safetensors to `directory` when given. Norm
    weights and biases (HF starts them at ones and zeros) get noise too, so that each of them matters."""
    import torch
    import transformers

    torch.manual_seed(SEEDS.get(family, 0) if seed is None else seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(family, **overrides)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:
                parameter.add_(0.2 * torch.randn_like(parameter))
    if dtype is not None:
        model = model.to(dtype)
    if directory is not None:
        model.save_pretrained(directory, safe_serialization=True)
    return model


def build_checkpoints(tmp_path_factory) -> dict:
    """family -> (checkpoint directory, HF torch model, our model loaded from the checkpoint), for every family."""
    from tfgen.auto.models import AutoModelForCausalLM

    built = {}
    for family in FAMILIES:
        directory = tmp_path_factory.mktemp(family)
        hf_model = build_hf_model(family, directory)
        built[family] = (str(directory), hf_model, AutoModelForCausalLM.from_pretrained(directory))
    return built


def hf_logits(hf_model, ids, mask) -> np.ndarray:
    """float32 `[B, T, V]` logits of HF's plain forward."""
    import torch

    with torch.no_grad():
        out = hf_model(input_ids=torch.tensor(ids, dtype=torch.long),
                       attention_mask=torch.tensor(mask, dtype=torch.long))
    return out.logits.float().numpy()


def first_eos_candidate(free_run: np.ndarray) -> int | None:
    """A token of the generated columns `free_run` `[rows, N]` that at least two rows first reach at different steps,
    none at the first or last step: as an eos it ends rows mid-way, at different steps."""
    steps_total = free_run.shape[1]
    for candidate in np.unique(free_run):
        hits = [np.flatnonzero(row == candidate) for row in free_run]
        steps = [row_hits[0] for row_hits in hits if row_hits.size]
        if len(steps) >= 2 and len(set(steps)) == len(steps) and min(steps) >= 1 and max(steps) < steps_total - 1:
            return int(candidate)
    return None
