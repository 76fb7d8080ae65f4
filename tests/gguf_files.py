"""Tiny GGUF files written here (nothing is downloaded) for tests/test_gguf_*.py: random HF PyTorch Llama / Qwen2 /
Qwen3 models saved the way llama.cpp's converter saves them (tensor names from gguf-py's own HF -> GGUF map, query
and key rows of `llama` permuted for its rotary layout, 2-D weights quantized by gguf-py), with a tiny byte-level BPE
or SentencePiece vocabulary trained here."""

from __future__ import annotations

import functools
import json

import numpy as np

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_TOKEN = "<tool_call>"
CORPUS = [
    "Hello world! The quick brown fox jumps over the lazy dog 1234567 times.",
    "Café déjà vu, naïve façade; 東京 and Zürich — emojis 🙂🚀 too.",
    "def add(a, b):\n    return a + b  # it's, we'll, they're, I'd\n\n",
    "user\nWhat is the capital of France?\nassistant\nParis is the capital.",
] * 3
TEXTS = [
    "Hello world!",
    "The quick brown fox, 2024 edition: 1234567 apples.",
    "  leading spaces and trailing   ",
    "Café déjà vu — naïve 東京 Zürich",
    "emoji 🙂🚀 mixed with text",
    "line one\nline two\n\n\tindented",
    "it's we'll they're I'd IT'S",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text",
]
# A model small enough to write and compare in a blink; rows are multiples of 32 for the block quantizations.
TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0, initializer_range=0.3)


@functools.cache
def byte_level_vocabulary() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(tokens, merges) of a byte-level BPE trained on CORPUS: SPECIALS are ids 0-2, USER_TOKEN the last id."""
    import tokenizers
    from tokenizers import pre_tokenizers, trainers

    backend = tokenizers.Tokenizer(tokenizers.models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(CORPUS, trainer)
    model = json.loads(backend.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get) + [USER_TOKEN]
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in model["merges"]]
    return tuple(tokens), tuple(merges)


@functools.cache
def sentencepiece_vocabulary() -> tuple[tuple[str, ...], tuple[float, ...], tuple[int, ...]]:
    """(tokens, scores, token types) of a SentencePiece-style BPE: <unk>, <s>, </s>, 256 byte tokens, then pieces
    ("▁" for spaces) scored by merge order (earlier merges score higher; single characters lowest)."""
    import tokenizers
    from tokenizers import pre_tokenizers, trainers

    backend = tokenizers.Tokenizer(tokenizers.models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=300, show_progress=False)
    backend.train_from_iterator([text for text in CORPUS if "🙂" not in text], trainer)
    model = json.loads(backend.to_str())["model"]
    merged = [left + right for left, right in (merge.split(" ") if isinstance(merge, str) else merge
                                               for merge in model["merges"])]
    characters = [token for token in sorted(model["vocab"], key=model["vocab"].get) if len(token) == 1]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{byte:02X}>" for byte in range(256)]
    scores = [0.0] * len(tokens)
    types = [2, 3, 3] + [6] * 256
    for rank, piece in enumerate(dict.fromkeys(characters + merged)):
        tokens.append(piece)
        scores.append(-1000.0 - rank if len(piece) == 1 else -float(rank))
        types.append(1)
    return tuple(tokens), tuple(scores), tuple(types)


def build_hf_model(arch: str, vocab_size: int, seed: int = 0, **overrides):
    """A random HF PyTorch model (eval mode) for GGUF architecture `arch`, norms and biases randomised too."""
    import torch
    import transformers

    classes = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config"}
    options = {**TINY, "vocab_size": vocab_size, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, **overrides}
    if arch == "qwen3":
        options.setdefault("head_dim", 16)
    config = getattr(transformers, classes[arch])(**options, attn_implementation="eager")
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:
                parameter.copy_(1.0 + 0.3 * torch.randn_like(parameter))
    return model


def llama_cpp_permute(array: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's query / key row order: per head, the two halves' rows interleaved."""
    return array.reshape(heads, 2, array.shape[0] // heads // 2, *array.shape[1:]).swapaxes(1, 2).reshape(array.shape)


def llama_cpp_rope_freqs(config) -> np.ndarray:
    """What llama.cpp's converter stores as `rope_freqs.weight` for an HF `llama3` rope_scaling: per rotary frequency,
    the divisor of Llama 3.1's rule (1 for short wavelengths, `factor` for long ones, a blend between)."""
    scaling, head_dim = config.rope_scaling, config.hidden_size // config.num_attention_heads
    context, low, high = (scaling["original_max_position_embeddings"], scaling["low_freq_factor"],
                          scaling["high_freq_factor"])
    divisors = []
    for index in range(0, head_dim, 2):
        wavelength = 2 * np.pi * config.rope_theta ** (index / head_dim)
        if wavelength < context / high:
            divisors.append(1.0)
        elif wavelength > context / low:
            divisors.append(scaling["factor"])
        else:
            smooth = (context / wavelength - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / scaling["factor"] + smooth))
    return np.array(divisors, np.float32)


def write_gguf(path, model, *, arch: str, qtype: str = "F32", tokenizer: str = "gpt2", pre: str | None = "gpt-2",
               add_bos: bool | None = False, metadata=None, skip=(), extra_tensors=None):
    """Writes `model` (from `build_hf_model`) to `path` as llama.cpp would: architecture metadata, the tokenizer
    (`tokenizer` "gpt2": byte-level BPE with pre-tokenizer `pre`; "llama": SentencePiece), weights in `qtype` (norms
    stay F32, as llama.cpp keeps them). `metadata` ({key: (value, gguf.GGUFValueType)}) adds or replaces keys; GGUF
    tensors named in `skip` are left out; `extra_tensors` ({gguf name: float32 array, or (raw uint8 blocks, type name)})
    are added as they are."""
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny test model")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim != config.hidden_size // config.num_attention_heads:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(config.vocab_size)
    _add_tokenizer(writer, tokenizer, pre, add_bos)
    for key, (value, value_type) in (metadata or {}).items():
        writer.kv_data[0].pop(key, None)  # replaces a key written above (the writer refuses duplicates)
        writer.add_key_value(key, value, value_type)
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), config.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        base, kind = hf_name.rsplit(".", 1)
        gguf_name = f"{names.get_name(base)}.{kind}"
        array = tensor.detach().float().numpy()
        if arch == "llama" and ".self_attn.q_proj" in hf_name:
            array = llama_cpp_permute(array, config.num_attention_heads)
        elif arch == "llama" and ".self_attn.k_proj" in hf_name:
            array = llama_cpp_permute(array, config.num_key_value_heads)
        if gguf_name not in skip:
            _add_tensor(writer, gguf_name, array, qtype if array.ndim == 2 else "F32")
    for gguf_name, tensor in (extra_tensors or {}).items():
        if isinstance(tensor, tuple):  # (raw uint8 blocks, type name)
            writer.add_tensor(gguf_name, tensor[0], raw_dtype=gguf.GGMLQuantizationType[tensor[1]])
        else:
            writer.add_tensor(gguf_name, tensor)
    finish(writer)
    return path


def finish(writer) -> None:
    """Writes out and closes a `gguf.GGUFWriter` whose metadata and tensors are all added."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _add_tensor(writer, name: str, array: np.ndarray, qtype: str) -> None:
    import gguf

    if qtype == "F32":
        writer.add_tensor(name, array.astype(np.float32))
    elif qtype == "F16":
        writer.add_tensor(name, array.astype(np.float16))
    else:
        quant_type = gguf.GGMLQuantizationType[qtype]
        writer.add_tensor(name, gguf.quants.quantize(array, quant_type), raw_dtype=quant_type)


def _add_tokenizer(writer, tokenizer: str, pre: str | None, add_bos: bool | None) -> None:
    if tokenizer == "llama":
        tokens, scores, types = sentencepiece_vocabulary()
        writer.add_tokenizer_model("llama")
        writer.add_token_list(list(tokens))
        writer.add_token_scores(list(scores))
        writer.add_token_types(list(types))
        writer.add_unk_token_id(0)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
    else:
        tokens, merges = byte_level_vocabulary()
        writer.add_tokenizer_model(tokenizer)
        if pre is not None:
            writer.add_tokenizer_pre(pre)
        writer.add_token_list(list(tokens))
        # CONTROL for the specials, USER_DEFINED for the tool-call token, NORMAL otherwise.
        writer.add_token_types([3 if token in SPECIALS else 4 if token == USER_TOKEN else 1 for token in tokens])
        writer.add_token_merges(list(merges))
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_pad_token_id(0)
        writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                                 "{% endfor %}")
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)


def hf_gguf_checkpoint(path, arch: str, vocab_size: int, **overrides):
    """What HF reads from the GGUF file (`transformers`' own GGUF loader, the one `from_pretrained(gguf_file=...)`
    runs): `{"config": ..., "tensors": {HF name: torch tensor}}`."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    return load_gguf_checkpoint(str(path), return_tensors=True,
                                model_to_load=build_hf_model(arch, vocab_size, **overrides))
