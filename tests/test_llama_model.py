"""tfgen.models.llama without generate(): LlamaConfig's checks and HF defaults per family, the plain forward against
HF PyTorch (every family, every implemented RoPE type), the cache protocol, checkpoints (bfloat16 exact, sharded,
mismatches listed) and the round trip through save_pretrained into HF."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from conftest import left_padded_batch
from llama_checkpoints import FAMILIES, build_checkpoints, build_hf_model, hf_config, hf_logits

from tfgen.auto.models import AutoModelForCausalLM
from tfgen.models.llama import LlamaConfig, LlamaForCausalLM
from tfgen.models.loading import read_safetensors_weights

PROMPTS = [[5, 17, 33, 8, 61, 12, 9, 40, 3, 77], [44, 3, 90], [7, 7, 21, 64, 15]]


@pytest.fixture(scope="module")
def batch():
    return left_padded_batch(PROMPTS)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """family -> (directory, HF torch model, our model), built once."""
    return build_checkpoints(tmp_path_factory)


def assert_logits_match(ours, hf_model, ids, mask):
    expected = hf_logits(hf_model, ids, mask)
    real = mask.astype(bool)
    np.testing.assert_allclose(ours(ids, attention_mask=mask).logits.numpy()[real], expected[real], atol=1e-4)


# --- config ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_defaults_per_family(family):
    """A config.json with only model_type gets the HF class's defaults; the HF class reads our to_dict back alike."""
    class_name = FAMILIES[family][0]
    hf_default = getattr(transformers, class_name)()
    ours = LlamaConfig.from_dict({"model_type": family})
    for name in ("vocab_size", "intermediate_size", "num_key_value_heads", "max_position_embeddings", "rope_theta",
                 "tie_word_embeddings", "bos_token_id", "eos_token_id", "rms_norm_eps"):
        assert getattr(ours, name) == getattr(hf_default, name), name
    assert ours.head_dim == (getattr(hf_default, "head_dim", None) or 4096 // 32)
    assert ours.sliding_window == hf_default.sliding_window if family != "llama" else ours.sliding_window is None
    config = LlamaConfig.from_dict(hf_config(family).to_dict())
    again = getattr(transformers, class_name)(**config.to_dict())
    assert LlamaConfig.from_dict(again.to_dict()) == config
    assert config.layer_windows == {"llama": (None, None), "mistral": (4, 4), "qwen2": (None, None),
                                    "qwen3": (None, 5)}[family]


BAD_CONFIGS = [
    # (model_type, override, error, words the message must hold)
    ("llama", {"num_key_value_heads": 4}, ValueError, ["num_key_value_heads", "divide"]),
    ("llama", {"head_dim": 7}, ValueError, ["head_dim", "even"]),
    ("llama", {"hidden_size": 48.0}, TypeError, ["hidden_size"]),
    ("llama", {"num_hidden_layers": 0}, ValueError, ["num_hidden_layers"]),
    ("llama", {"rms_norm_eps": 0}, ValueError, ["rms_norm_eps"]),
    ("llama", {"rope_theta": "1e4"}, TypeError, ["rope_theta"]),
    ("llama", {"hidden_act": "swiglu"}, ValueError, ["hidden_act"]),
    ("llama", {"attention_dropout": 1.0}, ValueError, ["attention_dropout"]),
    ("llama", {"attention_bias": "yes"}, TypeError, ["attention_bias"]),
    ("llama", {"eos_token_id": [2, 500]}, ValueError, ["eos_token_id", "vocabulary"]),
    ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, ValueError, ["dynamic", "other rows"]),
    ("llama", {"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}}, ValueError,
     ["longrope"]),
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, ValueError, ["low_freq_factor", "missing"]),
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0, "scale": 1}}, ValueError, ["unknown", "scale"]),
    ("llama", {"rope_scaling": {"rope_type": "linear", "type": "yarn", "factor": 2.0}}, ValueError, ["rope_type"]),
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": -2.0}}, ValueError, ["factor"]),
    ("llama", {"rope_scaling": {"factor": 2.0}}, ValueError, ["rope_scaling", "needs a 'rope_type'"]),
    ("llama", {"rope_scaling": "linear"}, TypeError, ["rope_scaling"]),
    ("llama", {"partial_rotary_factor": 0.5}, ValueError, ["partial_rotary_factor"]),
    ("llama", {"quantization_config": {"quant_method": "gptq"}}, ValueError, ["quantization_config"]),
    ("llama", {"rope_parameters": {"rope_theta": 500000.0}}, ValueError, ["rope_parameters"]),
    ("mistral", {"sliding_window": 0}, ValueError, ["sliding_window"]),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "layer_types": ["full_attention"]}, ValueError,
     ["layer_types"]),
    ("qwen2", {"layer_types": ["sliding_attention", "full_attention"]}, ValueError, ["layer_types", "sliding_window"]),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 4, "layer_types": ["chunked_attention"] * 2},
     ValueError, ["layer_types"]),
    ("qwen3", {"head_dim": None}, ValueError, ["head_dim"]),
    ("gpt2", {}, ValueError, ["model_type"]),
]


@pytest.mark.parametrize("model_type, override, error, words", BAD_CONFIGS, ids=lambda case: str(case)[:50])
def test_bad_config_is_refused_naming_the_field(model_type, override, error, words):
    small = dict(hidden_size=48, num_attention_heads=6, num_key_value_heads=2, num_hidden_layers=2, vocab_size=101)
    with pytest.raises(error) as raised:
        LlamaForCausalLM(LlamaConfig.from_dict({"model_type": model_type, **small, **override}))
    assert type(raised.value) is error
    for word in words:
        assert word in str(raised.value)


def test_options_of_another_family_are_refused_when_built_directly():
    with pytest.raises(ValueError, match="mlp_bias.*'qwen2' has no such option"):
        LlamaConfig(model_type="qwen2", mlp_bias=True)
    with pytest.raises(ValueError, match="sliding_window.*'llama' has no such option"):
        LlamaConfig(model_type="llama", sliding_window=8)


def test_bad_config_json_names_the_file_before_reading_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mistral", "rope_scaling": {"type": "dynamic",
                                                                                             "factor": 2.0}}))
    with pytest.raises(ValueError) as raised:
        AutoModelForCausalLM.from_pretrained(tmp_path)
    assert str(tmp_path / "config.json") in str(raised.value) and "rope_scaling" in str(raised.value)


def test_memory_check_counts_the_weights(monkeypatch):
    config = LlamaConfig.from_dict({"model_type": "qwen3"})  # ~8B weights
    monkeypatch.setenv("TFGEN_MEMORY_LIMIT_BYTES", str(2**30))
    with pytest.raises(ValueError, match=r"qwen3 model of [\d,]+ float32 weights \(vocab_size=151936"):
        LlamaForCausalLM(config)


@pytest.mark.parametrize("family", FAMILIES)
def test_parameter_count_matches_the_built_model_and_hf(family, checkpoints):
    _, hf_model, ours = checkpoints[family]
    assert ours.config.parameter_count() == ours.count_params() == sum(p.numel() for p in hf_model.parameters())


# --- forward ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_forward_matches_hf_with_left_padding(family, checkpoints, batch):
    _, hf_model, ours = checkpoints[family]
    assert_logits_match(ours, hf_model, *batch)


@pytest.mark.parametrize("rope_scaling", [
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    {"rope_type": "yarn", "factor": 3.0, "beta_fast": 16.0, "mscale": 1.2, "mscale_all_dim": 0.8, "truncate": False},
    {"type": "linear", "factor": 3.0},
    {"rope_type": "default"},
], ids=["yarn", "yarn_options", "linear", "default"])
def test_rope_types_match_hf(rope_scaling, batch):
    hf_model = build_hf_model("llama", rope_scaling=rope_scaling, rope_theta=500.0)
    ours = LlamaForCausalLM(LlamaConfig.from_dict(hf_model.config.to_dict()))
    ours.load_hf_state_dict({name: tensor.numpy() for name, tensor in hf_model.state_dict().items()})
    assert_logits_match(ours, hf_model, *batch)


def test_sliding_window_cuts_context_as_hf_does(checkpoints, batch):
    """The window matters (a window-less copy differs on the long row) and left padding does not change a row."""
    _, hf_model, ours = checkpoints["mistral"]
    ids, mask = batch
    unwindowed = LlamaForCausalLM(LlamaConfig.from_dict({**ours.config.to_dict(), "sliding_window": None}))
    unwindowed.set_weights(ours.get_weights())
    assert not np.allclose(unwindowed(ids, attention_mask=mask).logits[0], ours(ids, attention_mask=mask).logits[0],
                           atol=1e-3)
    alone = ours(np.array(PROMPTS[1:2]), attention_mask=np.ones((1, 3), np.int32)).logits.numpy()[0]
    np.testing.assert_allclose(ours(ids, attention_mask=mask).logits.numpy()[1, -3:], alone, atol=1e-5)


@pytest.mark.parametrize("family", ["mistral", "qwen3"])
def test_cached_steps_equal_the_full_forward(family, checkpoints, batch):
    """A prefill of part of the prompt then one-token steps over the static buffer give the plain forward's logits."""
    import tensorflow as tf

    _, _, ours = checkpoints[family]
    ids, mask = batch
    width = ids.shape[1]
    buffer_mask = np.concatenate([mask, np.zeros((3, 4), np.int32)], axis=1)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    cache = ours.init_cache(3, width + 4)
    assert cache[0][0].shape == (3, ours.config.num_key_value_heads, width + 4, ours.config.head_dim)
    out = ours.call_with_cache(ids[:, :6], cache, tf.constant(0), buffer_mask, positions[:, :6])
    logits = [out.logits.numpy()]
    for index in range(6, width):
        out = ours.call_with_cache(ids[:, index:index + 1], out.cache, tf.constant(index), buffer_mask,
                                   positions[:, index:index + 1], last_logits_only=True)
        logits.append(out.logits.numpy())
    np.testing.assert_allclose(np.concatenate(logits, axis=1)[mask.astype(bool)],
                               ours(ids, attention_mask=mask).logits.numpy()[mask.astype(bool)], atol=1e-5)
    hidden_only = ours.call_with_cache(ids[:, -1:], out.cache, tf.constant(width - 1), buffer_mask,
                                       positions[:, -1:], compute_logits=False)
    assert hidden_only.logits is None
    np.testing.assert_allclose(ours.logits_from_hidden(hidden_only.hidden_states).numpy(), logits[-1], atol=1e-5)
    with pytest.raises(ValueError, match="cache has 1 layers, the model has 2"):
        ours.call_with_cache(ids[:, -1:], out.cache[:1], tf.constant(width - 1), buffer_mask, positions[:, -1:])
    with pytest.raises(ValueError, match="max_length must be positive"):
        ours.init_cache(1, 0)


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # an untied head and one tied to the embedding
def test_decoding_view_computes_the_same_logits(family, checkpoints, batch):
    """The multi-row view multiplies by a `[vocab, D]` copy of the `[D, vocab]` head: same logits (by
    `call_with_cache` and `logits_from_hidden`), same cache, no new weights; one-row steps get the model itself."""
    import tensorflow as tf

    _, _, ours = checkpoints[family]
    ids, mask = batch
    assert ours.decoding_view(1) is ours
    view = ours.decoding_view(3)
    assert view.config is ours.config and len(view.variables) == len(ours.variables)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    plain = ours.call_with_cache(ids, ours.init_cache(3, ids.shape[1]), tf.constant(0), mask, positions)
    viewed = view.call_with_cache(ids, ours.init_cache(3, ids.shape[1]), tf.constant(0), mask, positions)
    np.testing.assert_allclose(viewed.logits.numpy(), plain.logits.numpy(), atol=1e-5)
    for theirs, mine in zip(tf.nest.flatten(plain.cache), tf.nest.flatten(viewed.cache)):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    np.testing.assert_allclose(view.logits_from_hidden(plain.hidden_states).numpy(), plain.logits.numpy(), atol=1e-5)


# --- checkpoints -----------------------------------------------------------------------------------------------------

def test_bfloat16_checkpoint_loads_exactly(tmp_path):
    hf_model = build_hf_model("qwen3", tmp_path, dtype=torch.bfloat16)
    tensors = read_safetensors_weights(tmp_path)
    assert tensors["model.norm.weight"].dtype == ml_dtypes.bfloat16
    expected = {name: tensor.float().numpy() for name, tensor in hf_model.state_dict().items()
                if name != "lm_head.weight"}
    for dtype in ("bfloat16", "float32"):
        ours = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=dtype)
        state = ours.hf_state_dict()
        assert set(state) == set(expected)
        for name, array in state.items():
            assert str(array.dtype) == dtype, name
            np.testing.assert_array_equal(array.astype(np.float32), expected[name], err_msg=f"{dtype} {name}")


def test_sharded_checkpoint_loads(tmp_path, checkpoints, batch):
    _, hf_model, _ = checkpoints["llama"]
    hf_model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="40KB")
    assert len(json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]) > 2
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 2
    assert_logits_match(AutoModelForCausalLM.from_pretrained(tmp_path), hf_model, *batch)


def test_mismatched_checkpoints_are_listed_and_nothing_is_assigned(checkpoints):
    _, _, ours = checkpoints["llama"]
    before = [weight.copy() for weight in ours.get_weights()]
    other = build_hf_model("llama", intermediate_size=64, attention_bias=False)
    tensors = {name: tensor.numpy() for name, tensor in other.state_dict().items()}
    tensors["model.layers.0.self_attn.extra.weight"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError) as raised:
        ours.load_hf_state_dict(tensors)
    message = str(raised.value)
    assert "model.layers.1.mlp.gate_proj.weight: checkpoint (64, 48) vs model (80, 48)" in message
    assert "'model.layers.0.self_attn.q_proj.bias'" in message.split("unexpected=")[0]  # missing
    assert "model.layers.0.self_attn.extra.weight" in message.split("unexpected=")[1]
    for old, new in zip(before, ours.get_weights()):
        np.testing.assert_array_equal(old, new)


def test_auto_model_from_config(batch):
    ids, mask = batch
    for family in FAMILIES:
        model = AutoModelForCausalLM.from_config(hf_config(family).to_dict())
        assert isinstance(model, LlamaForCausalLM) and model.config.model_type == family
        assert model(ids, attention_mask=mask).logits.shape == (3, ids.shape[1], 101)
        assert model.generation_config.eos_token_id == 2
    model = AutoModelForCausalLM.from_config(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=24,
                                                         num_hidden_layers=1, num_attention_heads=2))
    assert model.config.num_key_value_heads == 2 and model.count_params() == model.config.parameter_count()


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_save_pretrained_loads_in_hf_with_the_same_logits(family, checkpoints, tmp_path, batch):
    _, hf_model, ours = checkpoints[family]
    ours.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(reloaded) is type(hf_model)
    for name, tensor in hf_model.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[name], tensor, rtol=0, atol=0, msg=name)
    assert_logits_match(ours, reloaded, *batch)


def test_keras_fit_lowers_the_causal_lm_loss_with_attention_dropout(batch):
    import keras

    keras.utils.set_random_seed(0)
    config = hf_config("qwen3", attention_dropout=0.3, initializer_range=0.02)
    model = AutoModelForCausalLM.from_config(config.to_dict())
    ids, mask = batch
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = model.fit({"input_ids": ids, "attention_mask": mask}, epochs=8, batch_size=3, verbose=0).history["loss"]
    assert history[-1] < 0.8 * history[0]
    assert not np.allclose(model(ids, training=True).logits, model(ids, training=True).logits)
    np.testing.assert_array_equal(model(ids).logits, model(ids).logits)
