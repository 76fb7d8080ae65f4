"""GPT-2: parity with HF torch, KV-cache consistency (eager and XLA), checkpoint I/O and Keras training."""

import dataclasses
import json
import shutil

import keras
import numpy as np
import pytest
import safetensors.numpy
import tensorflow as tf
import torch
import transformers

from tfgen.auto.models import AutoModelForCausalLM
from tfgen.config.generation_config import GenerationConfig
from tfgen.models.gpt2 import GPT2Config, GPT2LMHeadModel

VOCAB = 99
TINY = dict(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=97, eos_token_id=98)
# The second variant exercises every option that changes the math: layer-scaled attention, another
# activation, a custom MLP width and an untied LM head.
VARIANTS = {
    "default": {},
    "options": dict(
        scale_attn_by_inverse_layer_idx=True, activation_function="relu", n_inner=48, tie_word_embeddings=False
    ),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def hf_checkpoint(request, tmp_path_factory):
    """(HF torch model, directory it saved to). All weights, biases and norm gains random so that any
    mis-mapped tensor changes the logits."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(**TINY, **VARIANTS[request.param], attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    directory = tmp_path_factory.mktemp(f"hf_{request.param}")
    model.save_pretrained(directory)
    return model, directory


@pytest.fixture(scope="module")
def tf_model(hf_checkpoint):
    return AutoModelForCausalLM.from_pretrained(hf_checkpoint[1])


def left_padded_batch(seed=0, batch=3, length=10, pads=(0, 3, 9)):
    rng = np.random.default_rng(seed)
    input_ids = rng.integers(0, VOCAB, (batch, length)).astype(np.int32)
    attention_mask = np.ones((batch, length), np.int32)
    for row, pad in enumerate(pads):
        attention_mask[row, :pad] = 0
        input_ids[row, :pad] = 0
    return input_ids, attention_mask


def assert_same_logits(model, other):
    input_ids, attention_mask = left_padded_batch()
    np.testing.assert_array_equal(
        model(input_ids, attention_mask=attention_mask).logits, other(input_ids, attention_mask=attention_mask).logits
    )


def hf_forward(hf_model, input_ids, attention_mask):
    """HF logits and last hidden states with positions as HF's generate() builds them."""
    mask = torch.tensor(attention_mask, dtype=torch.long)
    position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    with torch.no_grad():
        out = hf_model(
            torch.tensor(input_ids, dtype=torch.long),
            attention_mask=mask,
            position_ids=position_ids,
            output_hidden_states=True,
        )
    return out.logits.numpy(), out.hidden_states[-1].numpy()


def test_logits_match_hf_on_left_padded_batch(hf_checkpoint, tf_model):
    input_ids, attention_mask = left_padded_batch()
    hf_logits, hf_hidden = hf_forward(hf_checkpoint[0], input_ids, attention_mask)
    out = tf_model(input_ids, attention_mask=attention_mask)
    real = attention_mask.astype(bool)
    assert out.logits.dtype == tf.float32
    assert np.abs(hf_logits).max() > 1.0  # the comparison below is not vacuous
    np.testing.assert_allclose(out.logits.numpy()[real], hf_logits[real], atol=1e-4, rtol=0)
    np.testing.assert_allclose(out.hidden_states.numpy()[real], hf_hidden[real], atol=1e-4, rtol=0)


def teacher_forced_decode(model, input_ids, attention_mask, prompt_length, static_step_length):
    """Prefill `input_ids[:, :prompt_length]` then feed the remaining tokens one at a time through
    `call_with_cache` (a tf.while_loop, so a traced cache_index). The step tokens are taken with a static
    length of 1, or by Python slicing at the traced index, which leaves their length unknown when traced
    (under XLA: a bounded dynamic size). Returns (prefill logits [B, 1, V], step logits [B, steps, V], step
    hidden states [B, steps, D])."""
    batch, total = input_ids.shape
    position_ids = tf.maximum(tf.cumsum(attention_mask, axis=1) - 1, 0)
    prefill = model.call_with_cache(
        input_ids[:, :prompt_length],
        model.init_cache(batch, total),
        tf.constant(0),
        attention_mask,
        position_ids[:, :prompt_length],
        last_logits_only=True,
    )

    def column(tensor, index):
        return tf.slice(tensor, [0, index], [-1, 1]) if static_step_length else tensor[:, index : index + 1]

    def step(index, cache, logits, hidden):
        out = model.call_with_cache(
            column(input_ids, index), cache, index, attention_mask, column(position_ids, index)
        )
        return index + 1, out.cache, logits.write(index - prompt_length, out.logits[:, 0]), hidden.write(
            index - prompt_length, out.hidden_states[:, 0]
        )

    steps = total - prompt_length
    _, _, logits, hidden = tf.while_loop(
        lambda index, *_: index < total,
        step,
        (tf.constant(prompt_length), prefill.cache, *(tf.TensorArray(tf.float32, steps) for _ in range(2))),
    )
    return prefill.logits, tf.transpose(logits.stack(), [1, 0, 2]), tf.transpose(hidden.stack(), [1, 0, 2])


@pytest.mark.parametrize(
    "jit_compile, static_step_length", [(False, True), (True, True), (True, False)], ids=["eager", "xla", "xla-traced"]
)
def test_cached_decoding_matches_full_forward(tf_model, jit_compile, static_step_length):
    prompt_length = 6
    input_ids, attention_mask = left_padded_batch(seed=1, length=prompt_length + 4, pads=(0, 2, 5))
    input_ids, attention_mask = tf.constant(input_ids), tf.constant(attention_mask)
    full = tf_model(input_ids, attention_mask=attention_mask)
    decode = tf.function(teacher_forced_decode, jit_compile=True) if jit_compile else teacher_forced_decode
    prefill_logits, step_logits, step_hidden = decode(
        tf_model, input_ids, attention_mask, prompt_length, static_step_length
    )
    assert prefill_logits.shape == (3, 1, VOCAB)
    # allclose treats NaN as equal: padding must not poison either path (masked scores are finite).
    assert np.isfinite(full.logits).all() and np.isfinite(step_logits).all()
    np.testing.assert_allclose(prefill_logits[:, 0], full.logits[:, prompt_length - 1], atol=1e-4, rtol=0)
    np.testing.assert_allclose(step_logits, full.logits[:, prompt_length:], atol=1e-4, rtol=0)
    np.testing.assert_allclose(step_hidden, full.hidden_states[:, prompt_length:], atol=1e-4, rtol=0)


@pytest.mark.parametrize("dtype", ["bfloat16", "mixed_bfloat16"])
def test_half_precision_paths_agree(hf_checkpoint, tf_model, dtype):
    model = AutoModelForCausalLM.from_pretrained(hf_checkpoint[1], dtype=dtype)
    input_ids, attention_mask = left_padded_batch()
    full = model(input_ids, attention_mask=attention_mask)
    cache = model.init_cache(3, 10)
    assert all(leaf.dtype == tf.bfloat16 for leaf in tf.nest.flatten(cache))
    cached = model.call_with_cache(input_ids, cache, 0, attention_mask, tf.maximum(tf.cumsum(attention_mask, 1) - 1, 0))
    assert cached.logits.dtype == full.logits.dtype == tf.float32
    np.testing.assert_array_equal(cached.logits, full.logits)
    reference = tf_model(input_ids, attention_mask=attention_mask).logits.numpy()
    real = attention_mask.astype(bool)
    assert np.abs(full.logits.numpy()[real] - reference[real]).max() < 0.05 * np.abs(reference).max()


def test_decoding_view_computes_the_same_logits(tf_model):
    """The multi-row view multiplies by a transposed copy of the LM head: same logits, same cache, no new weights;
    one-row steps get the model itself."""
    assert tf_model.decoding_view(1) is tf_model
    view = tf_model.decoding_view(3)
    assert view.config is tf_model.config and len(view.variables) == len(tf_model.variables)
    input_ids, attention_mask = left_padded_batch()
    positions = tf.maximum(tf.cumsum(attention_mask, 1) - 1, 0)
    plain = tf_model.call_with_cache(input_ids, tf_model.init_cache(3, 10), 0, attention_mask, positions)
    viewed = view.call_with_cache(input_ids, tf_model.init_cache(3, 10), 0, attention_mask, positions)
    np.testing.assert_allclose(viewed.logits.numpy(), plain.logits.numpy(), atol=1e-5)
    for ours, theirs in zip(tf.nest.flatten(viewed.cache), tf.nest.flatten(plain.cache)):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    np.testing.assert_allclose(view.logits_from_hidden(plain.hidden_states).numpy(), plain.logits.numpy(), atol=1e-5)


def test_decode_step_compiles_once_for_every_cache_index(tf_model):
    cache = tf_model.init_cache(1, 8)
    mask = tf.ones([1, 8], tf.int32)
    step = tf.function(
        lambda ids, cache, index: tf_model.call_with_cache(ids, cache, index, mask, tf.reshape(index, [1, 1])),
        jit_compile=True,
    )
    for index in range(3):
        cache = step(tf.constant([[index + 1]]), cache, tf.constant(index)).cache
    assert step.experimental_get_tracing_count() == 1
    written_slots = tf.reduce_any(cache[0][0] != 0, axis=[0, 1, 3]).numpy()
    assert written_slots.tolist() == [True] * 3 + [False] * 5


def test_init_cache_layout_and_limits(tf_model):
    cache = tf_model.init_cache(2, 16)
    assert len(cache) == 2
    assert all(leaf.shape == (2, 4, 16, 8) for leaf in tf.nest.flatten(cache))
    # A bucket-padded buffer may hold more slots than the model has positions (positions come from the mask).
    assert tf_model.init_cache(1, 80)[0][0].shape == (1, 4, 80, 8)
    with pytest.raises(ValueError, match="max_length"):
        tf_model.init_cache(1, 0)


def test_sharded_checkpoint_loads_like_single_file(hf_checkpoint, tf_model, tmp_path):
    source = hf_checkpoint[1]
    tensors = safetensors.numpy.load_file(str(source / "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard_name, shard_names in shards.items():
        safetensors.numpy.save_file({name: tensors[name] for name in shard_names}, str(tmp_path / shard_name))
    weight_map = {name: shard_name for shard_name, shard_names in shards.items() for name in shard_names}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    shutil.copy(source / "config.json", tmp_path / "config.json")
    sharded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert_same_logits(sharded, tf_model)


def test_save_pretrained_round_trips_through_hf(hf_checkpoint, tf_model, tmp_path):
    tf_model.save_pretrained(tmp_path)
    saved = safetensors.numpy.load_file(str(tmp_path / "model.safetensors"))
    hf_saved = safetensors.numpy.load_file(str(hf_checkpoint[1] / "model.safetensors"))
    assert sorted(saved) == sorted(hf_saved)
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    input_ids, attention_mask = left_padded_batch()
    hf_logits, _ = hf_forward(reloaded, input_ids, attention_mask)
    real = attention_mask.astype(bool)
    ours = tf_model(input_ids, attention_mask=attention_mask).logits.numpy()
    np.testing.assert_allclose(ours[real], hf_logits[real], atol=1e-4, rtol=0)
    assert GenerationConfig.from_pretrained(tmp_path) == tf_model.generation_config


def test_state_dict_names_with_or_without_prefix_and_buffers(tf_model):
    state = tf_model.hf_state_dict()
    fresh = GPT2LMHeadModel(tf_model.config)
    unprefixed = {name.removeprefix("transformer."): array for name, array in state.items()}
    unprefixed["h.0.attn.bias"] = np.ones((1, 1, 64, 64), bool)
    unprefixed["h.1.attn.masked_bias"] = np.array(-1e4, np.float32)
    fresh.load_hf_state_dict(unprefixed)
    assert_same_logits(fresh, tf_model)


def test_mismatched_state_dict_is_rejected_with_every_offending_name(tf_model):
    state = tf_model.hf_state_dict()
    del state["transformer.h.1.mlp.c_fc.bias"]
    state["transformer.h.2.ln_1.weight"] = np.ones(32, np.float32)
    state["transformer.wpe.weight"] = np.zeros((63, 32), np.float32)
    fresh = GPT2LMHeadModel(tf_model.config)
    before = fresh.hf_state_dict()
    with pytest.raises(ValueError) as error:
        fresh.load_hf_state_dict(state)
    for fragment in ("h.1.mlp.c_fc.bias", "transformer.h.2.ln_1.weight", "transformer.wpe.weight: checkpoint (63, 32)"):
        assert fragment in str(error.value)
    name = "transformer.h.0.ln_1.bias"  # nothing was assigned
    np.testing.assert_array_equal(fresh.hf_state_dict()[name], before[name])


def test_generation_config_comes_from_file_or_model_config(hf_checkpoint, tmp_path):
    with_file = AutoModelForCausalLM.from_pretrained(hf_checkpoint[1])
    assert with_file.generation_config == GenerationConfig.from_pretrained(hf_checkpoint[1])
    for name in ("config.json", "model.safetensors"):
        shutil.copy(hf_checkpoint[1] / name, tmp_path / name)
    config_dict = json.loads((tmp_path / "config.json").read_text())
    config_dict["eos_token_id"] = 42
    (tmp_path / "config.json").write_text(json.dumps(config_dict))
    without_file = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert without_file.generation_config.eos_token_id == 42
    assert without_file.generation_config.bos_token_id == 97


def test_pickle_only_checkpoint_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", **TINY}))
    torch.save({"transformer.wte.weight": torch.zeros(2, 2)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(OSError, match="pytorch_model.bin.*does not load pickled"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_unknown_model_type_lists_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "falcon"}))
    with pytest.raises(ValueError, match=r"'falcon' is not supported; supported: \[.*'gpt2'.*'llama'.*\]"):
        AutoModelForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="supported"):
        AutoModelForCausalLM.from_config({"model_type": "bert"})


def test_unresolvable_hub_id_offline_names_the_id(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="no-such-org/no-such-model"):
        AutoModelForCausalLM.from_pretrained("no-such-org/no-such-model", cache_dir=tmp_path)


@pytest.mark.parametrize(
    "option",
    [
        {"reorder_and_upcast_attn": True},
        {"activation_function": "mish"},
        {"add_cross_attention": True},
        {"n_embd": 30},
    ],
    ids=lambda option: next(iter(option)),
)
def test_unimplemented_config_options_raise(option):
    with pytest.raises(ValueError, match=next(iter(option))):
        GPT2Config.from_dict({**TINY, **option})


def test_config_round_trips_with_hf():
    hf_config = transformers.GPT2Config(**TINY, **VARIANTS["options"])
    ours = GPT2Config.from_dict(hf_config.to_dict())  # full HF dict: bookkeeping keys are ignored
    assert (ours.n_inner, ours.tie_word_embeddings, ours.eos_token_id) == (48, False, 98)
    assert (ours.max_position_embeddings, ours.hidden_size, ours.num_hidden_layers, ours.num_attention_heads) == (
        64, 32, 2, 4,
    )
    back = transformers.GPT2Config(**ours.to_dict())
    for field in dataclasses.fields(GPT2Config):
        assert getattr(back, field.name) == getattr(hf_config, field.name), field.name
    assert (back.model_type, back.architectures) == ("gpt2", ["GPT2LMHeadModel"])


def test_keras_fit_lowers_the_causal_lm_loss():
    keras.utils.set_random_seed(0)
    model = AutoModelForCausalLM.from_config(GPT2Config(**TINY))
    input_ids, attention_mask = left_padded_batch(seed=2, batch=4, length=12, pads=(0, 1, 2, 3))
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = model.fit(
        {"input_ids": input_ids, "attention_mask": attention_mask}, epochs=8, batch_size=4, verbose=0
    ).history["loss"]
    assert history[-1] < 0.8 * history[0]
    first = model(input_ids, training=True).logits
    assert not np.allclose(first, model(input_ids, training=True).logits)  # dropout is active in training
    np.testing.assert_array_equal(model(input_ids).logits, model(input_ids).logits)
