"""tfgen.models.t5 without generate(): T5Config's checks and HF defaults, the bucket table against HF's function, the
encoder, the plain forward and cached decoding (prefill + one-token steps in a left-padded buffer, and a step under
XLA) against HF PyTorch for the original T5 (ReLU, tied head) and FLAN-T5 (gated GELU, untied head), checkpoints
(copies of the embedding, mismatches listed) and the round trip through save_pretrained into HF."""

from __future__ import annotations

import json

import numpy as np
import pytest
import safetensors.numpy
import tensorflow as tf
import torch
import transformers
from t5_checkpoints import VARIANTS, build_checkpoints, hf_config, hf_forward, padded_batch

import tfgen
from tfgen.auto.models import AutoModelForCausalLM, AutoModelForSeq2SeqLM
from tfgen.models.t5 import T5ForConditionalGeneration
from tfgen.models.t5_config import T5Config
from tfgen.models.t5_layers import relative_bucket_table

ATOL = 1e-4
LENGTHS = (7, 3, 5)  # encoder rows of different lengths


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """variant -> (directory, HF torch model, our model), built once."""
    return build_checkpoints(tmp_path_factory)


# --- config ----------------------------------------------------------------------------------------------------------


def test_config_hf_defaults_and_round_trip():
    """A config.json with only model_type gets HF's defaults; HF reads our to_dict back to the same architecture."""
    ours, hf_default = T5Config.from_dict({"model_type": "t5"}), transformers.T5Config()
    for name in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads",
                 "relative_attention_num_buckets", "relative_attention_max_distance", "layer_norm_epsilon",
                 "feed_forward_proj", "dense_act_fn", "is_gated_act", "tie_word_embeddings", "pad_token_id",
                 "eos_token_id"):
        assert getattr(ours, name) == getattr(hf_default, name), name
    assert ours.max_position_embeddings is None and ours.is_encoder_decoder and ours.decoder_start_token_id == 0
    for variant in VARIANTS:
        config = T5Config.from_dict(hf_config(variant).to_dict())
        assert (config.num_hidden_layers, config.hidden_size, config.head_dim) == (3, 32, 8)
        assert T5Config.from_dict(transformers.T5Config(**config.to_dict()).to_dict()) == config
    flan = T5Config.from_dict(hf_config("flan").to_dict())
    assert (flan.dense_act_fn, flan.is_gated_act, flan.tie_word_embeddings) == ("gelu_new", True, False)
    assert T5Config(feed_forward_proj="gated-silu").dense_act_fn == "silu"
    assert T5Config(feed_forward_proj="gelu").dense_act_fn == "gelu"


def test_parameter_count_matches_hf(checkpoints):
    for variant in VARIANTS:
        _, hf_model, ours = checkpoints[variant]
        assert ours.config.parameter_count() == sum(p.numel() for p in hf_model.parameters()), variant
        assert ours.count_params() == ours.config.parameter_count(), variant


@pytest.mark.parametrize("changes, error, match", [
    (dict(feed_forward_proj="gated-fancy"), ValueError, r"T5Config.feed_forward_proj='gated-fancy'.*not implemented"),
    (dict(feed_forward_proj="fast-relu"), ValueError, r"T5Config.feed_forward_proj='fast-relu' must be"),
    (dict(feed_forward_proj="gated-gelu-new"), ValueError, r"T5Config.feed_forward_proj"),
    (dict(d_kv=0), ValueError, r"T5Config.d_kv must be a positive int"),
    (dict(num_heads=2.0), TypeError, r"T5Config.num_heads must be an int"),
    (dict(relative_attention_max_distance=4), ValueError, r"relative_attention_max_distance \(4\) must be > "),
    (dict(is_encoder_decoder=False), ValueError, r"is_encoder_decoder=False is not implemented"),
    (dict(decoder_start_token_id=40000), ValueError, r"decoder_start_token_id=40000 is outside the vocabulary"),
    (dict(model_type="bart"), ValueError, r"model_type='bart', expected 't5'"),
])
def test_config_errors_name_the_field(changes, error, match):
    with pytest.raises(error, match=match):
        T5Config.from_dict({"model_type": "t5", **changes})


def test_bucket_table_matches_hf():
    """Our host table equals HF's torch bucket function everywhere, boundaries (16, 32, 64 of the usual 32/128
    buckets) and far distances included."""
    relative = np.arange(-400, 401)
    for buckets, distance in ((32, 128), (8, 20), (32, 64), (16, 100)):
        for bidirectional in (True, False):
            expected = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
                torch.tensor(relative), bidirectional, buckets, distance).numpy()
            table = relative_bucket_table(buckets, distance, bidirectional)
            np.testing.assert_array_equal(table[np.clip(relative, -distance, distance) + distance], expected)


# --- numerics against HF -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("side", ["right", "left"])
def test_encode_matches_hf(checkpoints, variant, side):
    _, hf_model, ours = checkpoints[variant]
    ids, mask = padded_batch(LENGTHS, 8, side)
    decoder_ids = np.zeros((len(LENGTHS), 1), np.int32)
    _, expected = hf_forward(hf_model, ids, mask, decoder_ids)
    real = mask.astype(bool)
    np.testing.assert_allclose(ours.encode(ids, mask).numpy()[real], expected[real], atol=ATOL)


@pytest.mark.parametrize("variant", VARIANTS)
def test_forward_logits_match_hf(checkpoints, variant):
    _, hf_model, ours = checkpoints[variant]
    ids, mask = padded_batch(LENGTHS, 8, "left", seed=1)
    decoder_ids = np.random.default_rng(2).integers(2, 99, (len(LENGTHS), 6)).astype(np.int32)
    decoder_ids[:, 0] = 0
    expected_logits, expected_encoded = hf_forward(hf_model, ids, mask, decoder_ids)
    out = ours(ids, attention_mask=mask, decoder_input_ids=decoder_ids)
    np.testing.assert_allclose(out.logits.numpy(), expected_logits, atol=ATOL)
    real = mask.astype(bool)
    np.testing.assert_allclose(out.encoder_last_hidden_state.numpy()[real], expected_encoded[real], atol=ATOL)
    np.testing.assert_allclose(ours.logits_from_hidden(out.hidden_states).numpy(), expected_logits, atol=ATOL)


def cached_logits(model, ids, mask, decoder_ids, prompt_length, left_pad, max_length, step=None):
    """Logits `[B, T_dec, V]` of `decoder_ids` decoded through the cache: the first `prompt_length` tokens prefilled at
    cache_index 0 behind `left_pad` padding columns (mask 0), then one token per `step` call (default: eager
    `call_with_cache`) in a `max_length`-slot buffer whose mask is 1 from the first real slot to its end."""
    step = step or model.call_with_cache
    rows, total = decoder_ids.shape
    cache = model.init_cache(rows, max_length, encoder_hidden_states=model.encode(ids, mask),
                             encoder_attention_mask=mask)
    buffer_mask = np.zeros((rows, max_length), np.int32)
    buffer_mask[:, left_pad:] = 1
    prompt = np.concatenate([np.zeros((rows, left_pad), np.int32), decoder_ids[:, :prompt_length]], axis=1)
    out = model.call_with_cache(prompt, cache, 0, buffer_mask, np.zeros_like(prompt))
    logits = [out.logits.numpy()[:, left_pad:]]
    for index in range(prompt_length, total):
        slot = left_pad + index
        out = step(decoder_ids[:, index:index + 1], out.cache, tf.constant(slot, tf.int32), buffer_mask,
                   tf.fill([rows, 1], index))
        logits.append(out.logits.numpy())
    return np.concatenate(logits, axis=1), out


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("prompt_length, left_pad", [(1, 3), (3, 2)])
def test_cached_decoding_matches_hf(checkpoints, variant, prompt_length, left_pad):
    """Prefill + one-token steps (teacher-forced) give HF's full-forward logits at every decoder position, with left
    padding in the decoder buffer, future slots unmasked (causality is the model's) and a buffer longer than needed."""
    _, hf_model, ours = checkpoints[variant]
    ids, mask = padded_batch(LENGTHS, 8, "left", seed=3)
    decoder_ids = np.random.default_rng(4).integers(2, 99, (len(LENGTHS), 7)).astype(np.int32)
    decoder_ids[:, 0] = 0
    expected, _ = hf_forward(hf_model, ids, mask, decoder_ids)
    logits, out = cached_logits(ours, ids, mask, decoder_ids, prompt_length, left_pad, max_length=16)
    np.testing.assert_allclose(logits, expected, atol=ATOL)
    assert out.hidden_states.shape == (len(LENGTHS), 1, 32)


def test_cached_step_compiles_under_xla(checkpoints):
    """The one-token step traced once with jit_compile=True serves every slot and matches HF's logits."""
    _, hf_model, ours = checkpoints["flan"]
    ids, mask = padded_batch(LENGTHS, 8, "right", seed=5)
    decoder_ids = np.random.default_rng(6).integers(2, 99, (len(LENGTHS), 5)).astype(np.int32)
    decoder_ids[:, 0] = 0
    expected, _ = hf_forward(hf_model, ids, mask, decoder_ids)
    traces = []

    @tf.function(jit_compile=True)
    def step(input_ids, cache, cache_index, attention_mask, position_ids):
        traces.append(1)
        return ours.call_with_cache(input_ids, cache, cache_index, attention_mask, position_ids, last_logits_only=True)

    logits, out = cached_logits(ours, ids, mask, decoder_ids, 1, 2, max_length=16, step=step)
    np.testing.assert_allclose(logits, expected, atol=ATOL)
    assert len(traces) == 1

    @tf.function(jit_compile=True)
    def start(ids, mask, prompt, buffer_mask):
        """What a generate program does first: encode, project the cross-attention cache, prefill the decoder."""
        cache = ours.init_cache(3, 16, encoder_hidden_states=ours.encode(ids, mask), encoder_attention_mask=mask)
        return ours.call_with_cache(prompt, cache, 0, buffer_mask, tf.zeros_like(prompt), last_logits_only=True)

    buffer_mask = np.ones((3, 16), np.int32)
    prefill = start(ids, mask, decoder_ids[:, :3], buffer_mask)
    np.testing.assert_allclose(prefill.logits.numpy()[:, 0], expected[:, 2], atol=ATOL)


def test_cache_layout(checkpoints):
    _, _, ours = checkpoints["t5"]
    ids, mask = padded_batch(LENGTHS, 8, "right")
    cache = ours.init_cache(3, 16, encoder_hidden_states=ours.encode(ids, mask), encoder_attention_mask=mask)
    assert len(cache["decoder"]) == 3 and cache["decoder"][0][0].shape == (3, 4, 16, 8)
    assert len(cache["encoder"]["keys"]) == 3 and cache["encoder"]["values"][2].shape == (3, 4, 8, 8)
    assert cache["encoder"]["mask"].dtype == tf.int32
    assert all(leaf.shape[0] == 3 for leaf in tf.nest.flatten(cache))
    out = ours.call_with_cache(np.zeros((3, 1), np.int32), cache, 0, np.ones((3, 16)), np.zeros((3, 1)),
                               compute_logits=False)
    assert out.logits is None and out.cache["encoder"] is cache["encoder"]
    estimate = ours.init_cache(2, 16, tf.float16, encoder_length=5)
    assert estimate["encoder"]["keys"][0].shape == (2, 4, 5, 8) and estimate["decoder"][0][1].dtype == tf.float16
    with pytest.raises(ValueError, match="encoder_hidden_states .* or encoder_length"):
        ours.init_cache(2, 16)
    with pytest.raises(ValueError, match="scalar cache_index"):
        ours.call_with_cache(np.zeros((3, 1), np.int32), cache, tf.constant([0, 1, 2]), np.ones((3, 16)),
                             np.zeros((3, 1)))
    assert ours.row_cache_index is False and ours.is_encoder_decoder


# --- checkpoints -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_save_pretrained_round_trip_into_hf(checkpoints, variant, tmp_path):
    directory, hf_model, ours = checkpoints[variant]
    ours.save_pretrained(tmp_path)
    written = safetensors.numpy.load_file(tmp_path / "model.safetensors")
    assert ("lm_head.weight" in written) == (variant == "flan") and "shared.weight" in written
    reloaded = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    for name, value in hf_model.state_dict().items():
        np.testing.assert_array_equal(reloaded.state_dict()[name].numpy(), value.numpy(), err_msg=name)
    assert json.loads((tmp_path / "generation_config.json").read_text())["decoder_start_token_id"] == 0
    again = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert isinstance(again, tfgen.T5ForConditionalGeneration) and again.config == ours.config
    for name, value in ours.hf_state_dict().items():
        np.testing.assert_array_equal(again.hf_state_dict()[name], value, err_msg=name)
    assert isinstance(T5ForConditionalGeneration.from_pretrained(directory, dtype="float16"),
                      T5ForConditionalGeneration)


def test_generation_config_from_model_config(checkpoints):
    """Without generation_config.json the generation config comes from the model config, HF's T5 defaults filled."""
    _, _, ours = checkpoints["t5"]
    generation_config = ours.generation_config
    assert (generation_config.decoder_start_token_id, generation_config.pad_token_id,
            generation_config.eos_token_id) == (0, 0, 1)
    built = AutoModelForSeq2SeqLM.from_config({"model_type": "t5", "vocab_size": 50, "d_model": 8, "d_kv": 2,
                                               "d_ff": 8, "num_layers": 1, "num_heads": 2})
    assert built.generation_config.decoder_start_token_id == 0 and built.config.num_decoder_layers == 1


def test_checkpoint_mismatches_are_listed(checkpoints):
    directory, _, _ = checkpoints["flan"]
    tensors = safetensors.numpy.load_file(f"{directory}/model.safetensors")
    model = T5ForConditionalGeneration(T5Config.from_dict(hf_config("flan").to_dict()))
    missing = {name: value for name, value in tensors.items()
               if name != "decoder.block.2.layer.1.EncDecAttention.k.weight"}
    with pytest.raises(ValueError, match=r"missing=\['decoder.block.2.layer.1.EncDecAttention.k.weight'\]"):
        model.load_hf_state_dict(missing)
    with pytest.raises(ValueError, match=r"unexpected=\['encoder.block.9.layer.0.SelfAttention.q.weight'\]"):
        model.load_hf_state_dict({**tensors, "encoder.block.9.layer.0.SelfAttention.q.weight": np.zeros((32, 32))})
    shared = tensors["shared.weight"]
    with pytest.raises(ValueError, match=r"\['encoder.embed_tokens.weight'\] differ from shared.weight"):
        model.load_hf_state_dict({**tensors, "encoder.embed_tokens.weight": shared + 1})
    # Equal copies are accepted, and the embedding may come under a copy's name only.
    renamed = {("encoder.embed_tokens.weight" if name == "shared.weight" else name): value
               for name, value in tensors.items()}
    model.load_hf_state_dict({**renamed, "decoder.embed_tokens.weight": shared,
                              "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight":
                                  np.zeros((8, 4), np.float32)})
    np.testing.assert_array_equal(model.hf_state_dict()["shared.weight"], shared)


def test_wrong_auto_class_points_to_the_right_one(checkpoints, tmp_path):
    directory, _, ours = checkpoints["t5"]
    with pytest.raises(ValueError, match=r"config.json.*'t5' is a T5ForConditionalGeneration: load it with "
                                         r"tfgen.AutoModelForSeq2SeqLM"):
        AutoModelForCausalLM.from_pretrained(directory)
    with pytest.raises(ValueError, match="AutoModelForSeq2SeqLM"):
        AutoModelForCausalLM.from_config(ours.config)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="'llama' is a LlamaForCausalLM: load it with tfgen.AutoModelForCausalLM"):
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    with pytest.raises(TypeError, match="must be a T5Config"):
        T5ForConditionalGeneration({"model_type": "t5"})
