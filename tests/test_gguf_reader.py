"""GGUF metadata -> HF config dict, tensors -> HF-named float32 arrays (tfgen/gguf/{files,config,tensors}.py), checked
against the HF model each tiny file was written from and against what transformers' own GGUF loader reads."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf_files import (
    build_hf_model,
    byte_level_vocabulary,
    finish,
    hf_gguf_checkpoint,
    llama_cpp_permute,
    llama_cpp_rope_freqs,
    write_gguf,
)

from tfgen.gguf import is_gguf_path
from tfgen.gguf.config import hf_config_dict
from tfgen.gguf.files import open_gguf
from tfgen.gguf.tensors import read_hf_tensors, unpermute_rotary_rows

VOCAB = len(byte_level_vocabulary()[0])
# The HF config keys a GGUF file describes, compared with the model it was written from.
ARCHITECTURE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "max_position_embeddings", "rope_theta",
                     "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id")
U32, F32, STR = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.STRING


def _read(path):
    file = open_gguf(path)
    config = hf_config_dict(file)
    return config, read_hf_tensors(file, config)


def _state_dict(model):
    return {name: tensor.numpy() for name, tensor in model.state_dict().items()
            if not (name == "lm_head.weight" and model.config.tie_word_embeddings)}


@pytest.mark.parametrize("arch, overrides", [
    ("llama", {}),
    ("llama", {"tie_word_embeddings": True, "attention_bias": True, "num_key_value_heads": 4}),
    ("qwen2", {"tie_word_embeddings": True}),
    ("qwen3", {"attention_bias": False}),
])
def test_f32_file_gives_back_the_hf_model_exactly(tmp_path, arch, overrides):
    """F32 weights round-trip bit for bit, so the llama rows permuted by the writer are exactly restored."""
    model = build_hf_model(arch, VOCAB, **overrides)
    config, tensors = _read(write_gguf(tmp_path / "m.gguf", model, arch=arch))
    expected = _state_dict(model)
    assert sorted(tensors) == sorted(expected)
    for name, array in tensors.items():
        assert array.dtype == np.float32 and np.array_equal(array, expected[name]), name
    assert config["model_type"] == arch
    hf_config = {"head_dim": model.config.hidden_size // model.config.num_attention_heads, **model.config.to_dict()}
    for key in ARCHITECTURE_KEYS:
        assert config[key] == pytest.approx(hf_config[key]), key
    assert config["rms_norm_eps"] == pytest.approx(hf_config["rms_norm_eps"])
    if arch != "qwen2":
        assert config["attention_bias"] == hf_config["attention_bias"]


@pytest.mark.parametrize("arch, qtype", [
    ("llama", "F32"), ("llama", "Q8_0"), ("llama", "Q4_0"), ("llama", "Q5_1"), ("llama", "BF16"),
    ("qwen2", "F16"), ("qwen2", "Q4_1"), ("qwen2", "Q5_0"),
])
def test_config_and_tensors_equal_transformers_gguf_loader(tmp_path, arch, qtype):
    model = build_hf_model(arch, VOCAB, tie_word_embeddings=arch == "qwen2")
    path = write_gguf(tmp_path / "m.gguf", model, arch=arch, qtype=qtype)
    config, tensors = _read(path)
    hf = hf_gguf_checkpoint(path, arch, VOCAB, tie_word_embeddings=arch == "qwen2")
    for key, value in hf["config"].items():
        if key not in ("_model_name_or_path", "unk_token_id"):
            assert config[key] == value, key
    assert sorted(tensors) == sorted(name for name in hf["tensors"] if name in tensors)
    original = _state_dict(model)
    for name, array in tensors.items():
        np.testing.assert_array_equal(array, hf["tensors"][name].numpy(), err_msg=name)
        # Within the quantization's error of the original weights.
        scale = np.abs(original[name]).max()
        assert np.abs(array - original[name]).max() <= 0.15 * scale, name


def test_unpermute_rotary_rows_inverts_llama_cpp_permutation():
    rng = np.random.default_rng(0)
    for heads, head_dim, columns in ((4, 16, (8,)), (3, 8, ()), (1, 2, (5,))):
        original = rng.normal(size=(heads * head_dim, *columns)).astype(np.float32)
        permuted = llama_cpp_permute(original, heads)
        assert not np.array_equal(permuted, original) or head_dim == 2
        np.testing.assert_array_equal(unpermute_rotary_rows(permuted, heads), original)
    with pytest.raises(ValueError, match="even size"):
        unpermute_rotary_rows(np.zeros((12, 4)), 4)


def test_metadata_variants(tmp_path):
    model = build_hf_model("llama", VOCAB)
    metadata = {
        "llama.attention.sliding_window": (8, U32),
        "llama.rope.scaling.type": ("linear", STR),
        "llama.rope.scaling.factor": (2.0, F32),
        "tokenizer.ggml.eot_token_id": (1, U32),
    }
    config = hf_config_dict(open_gguf(write_gguf(tmp_path / "m.gguf", model, arch="llama", metadata=metadata)))
    assert config["model_type"] == "mistral" and config["sliding_window"] == 8
    assert config["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    assert config["eos_token_id"] == [2, 1]
    yarn = {"qwen2.rope.scaling.type": ("yarn", STR), "qwen2.rope.scaling.factor": (4.0, F32),
            "qwen2.rope.scaling.original_context_length": (32, U32), "qwen2.attention.sliding_window": (16, U32)}
    qwen = build_hf_model("qwen2", VOCAB)
    config = hf_config_dict(open_gguf(write_gguf(tmp_path / "q.gguf", qwen, arch="qwen2", metadata=yarn)))
    assert config["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    assert (config["use_sliding_window"], config["sliding_window"], config["max_window_layers"]) == (True, 16, 0)


@pytest.mark.parametrize("context", [64, 8, 2])
def test_llama3_rope_scaling_from_rope_freqs(tmp_path, context):
    """llama.cpp keeps Llama 3.1's rope scaling as per-frequency divisors; the recovered scaling gives HF's
    frequencies (with 8, one frequency is blended; with 2, none is and any thresholds in the gap do)."""
    from tfgen.models.rope import rope_parameters

    scaling = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": context}
    model = build_hf_model("llama", VOCAB, rope_scaling=scaling)
    path = write_gguf(tmp_path / "m.gguf", model, arch="llama",
                      extra_tensors={"rope_freqs.weight": llama_cpp_rope_freqs(model.config)})
    config, tensors = _read(path)
    assert config["rope_scaling"]["rope_type"] == "llama3" and "rope_freqs.weight" not in tensors
    ours = rope_parameters(config["rope_scaling"], config["rope_theta"], 16, 64).inverse_frequencies
    np.testing.assert_allclose(ours, model.model.rotary_emb.inv_freq.numpy(), rtol=1e-5)
    path = write_gguf(tmp_path / "ones.gguf", model, arch="llama",
                      extra_tensors={"rope_freqs.weight": np.ones(8, np.float32)})
    assert _read(path)[0]["rope_scaling"] is None


def test_is_gguf_path(tmp_path):
    path = write_gguf(tmp_path / "model.bin", build_hf_model("llama", VOCAB), arch="llama")
    assert is_gguf_path(path) and is_gguf_path(str(tmp_path / "absent.GGUF"))
    assert not is_gguf_path(tmp_path) and not is_gguf_path("org/model") and not is_gguf_path(3)
    (tmp_path / "other.bin").write_bytes(b"PK\x03\x04")
    assert not is_gguf_path(tmp_path / "other.bin")


def test_unreadable_files_are_oserrors_naming_them(tmp_path):
    good = write_gguf(tmp_path / "good.gguf", build_hf_model("llama", VOCAB), arch="llama").read_bytes()
    cases = {"absent.gguf": None, "text.gguf": b"not a gguf file at all " * 8, "empty.gguf": b"",
             "header.gguf": good[:200], "tensors.gguf": good[: len(good) - 100]}
    for name, content in cases.items():
        if content is not None:
            (tmp_path / name).write_bytes(content)
        with pytest.raises(OSError, match=name):
            open_gguf(tmp_path / name)


def _error(tmp_path, match, arch="llama", **options):
    model = build_hf_model(arch, VOCAB)
    path = write_gguf(tmp_path / "bad.gguf", model, arch=arch, **options)
    with pytest.raises(ValueError, match=match) as raised:
        _read(path)
    assert "bad.gguf" in str(raised.value)


def test_unsupported_architecture(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "gpt2")
    finish(writer)
    with pytest.raises(ValueError, match=r"bad.gguf.*'gpt2'.*supported: \['llama', 'qwen2', 'qwen3'\]"):
        hf_config_dict(open_gguf(tmp_path / "bad.gguf"))


def test_unsupported_quantization_type(tmp_path):
    # IQ4_NL (18-byte blocks of 32 values) is not one tfgen dequantizes; gguf-py cannot quantize it: raw bytes do.
    raw = np.zeros((VOCAB, 2 * 18), np.uint8)
    _error(tmp_path, r"'token_embd.weight'.*IQ4_NL.*supported: F32", skip={"token_embd.weight"},
           extra_tensors={"token_embd.weight": (raw, "IQ4_NL")})


def test_tensors_not_matching_the_metadata(tmp_path):
    _error(tmp_path, r"shape_mismatch=\[.*'blk.0.ffn_down.weight: file \(64, 96\) \(HF order\) vs \(64, 128\)",
           metadata={"llama.feed_forward_length": (128, U32)})
    _error(tmp_path, r"missing=\['model.layers.1.self_attn.k_proj.weight'\]", skip={"blk.1.attn_k.weight"})
    _error(tmp_path, "rope_freqs.weight does not follow Llama 3.1's RoPE scaling",
           extra_tensors={"rope_freqs.weight": np.array([1, 3, 1.5, 2, 4, 4, 4, 4], np.float32)})
    _error(tmp_path, "rope_freqs.weight must hold 8 positive divisors",
           extra_tensors={"rope_freqs.weight": np.ones(6, np.float32)})
    _error(tmp_path, r"unknown=\['rope_freqs.weight'\]", arch="qwen2",
           extra_tensors={"rope_freqs.weight": np.ones(8, np.float32)})
    _error(tmp_path, "rope.dimension_count.*differs from the head size 16",
           metadata={"llama.rope.dimension_count": (8, U32)})
    _error(tmp_path, "'llama.attention.head_count' must be at least 1",
           metadata={"llama.attention.head_count": (0, U32)})
    _error(tmp_path, "'llama.block_count' must be an integer", metadata={"llama.block_count": ("2", STR)})
    _error(tmp_path, "rope scaling 'longrope'.*supported: linear, yarn",
           metadata={"llama.rope.scaling.type": ("longrope", STR)})
    _error(tmp_path, "'tokenizer.ggml.eos_token_id' is 9999, outside the vocabulary",
           metadata={"tokenizer.ggml.eos_token_id": (9999, U32)})
    _error(tmp_path, "llama.expert_count is 8: mixture-of-experts models are not supported",
           metadata={"llama.expert_count": (8, U32)})
