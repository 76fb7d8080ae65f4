"""`quantize="int8"`: int8 weights with a float32 scale per output channel (tfgen.models.quantize), checked against a
numpy reference of the same quantized math on a tiny Llama — weight-only for one-row steps, W8A8 (activations
quantized per row by their abs-max, an int8 dot, both scales) for several rows — through generate, an export and
the loaders' refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from tfgen import AutoModelForCausalLM, AutoModelForSeq2SeqLM
from tfgen.models.llama import LlamaConfig
from tfgen.models.quantize import QuantizedKernel, quantize_array, quantized_matmul

# Widths of 2 and 3 activation groups (tfgen.models.quantize.ACTIVATION_GROUP = 64) and one that is not a multiple
# of them (the attention output, 4 heads of 24: one scale per row).
TINY_LLAMA = dict(vocab_size=101, hidden_size=128, intermediate_size=192, head_dim=24, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.3,
                  tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
PROMPTS = np.array([[1, 5, 17, 33, 9], [1, 60, 7, 81, 44]], np.int32)
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A tiny random Llama checkpoint (tied embedding and head) written by tfgen's save_pretrained."""
    tf.keras.utils.set_random_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**TINY_LLAMA))
    directory = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def int8_llama(llama_dir):
    return AutoModelForCausalLM.from_pretrained(llama_dir, quantize="int8")


# ------------------------------------------------------------------------------------ numpy reference


def _kernel(kernel: QuantizedKernel):
    """(int values as float64 `[in, out]`, scale `[out]`) of a quantized kernel whose channels are its columns."""
    assert kernel.channel_axis == -1
    return kernel.values.numpy().astype(np.float64), kernel.scale.numpy().astype(np.float64)


def _dense(x, kernel, w8a8):
    """x `[T, in]` float64 through the int8 kernel: W8A8 on rows where `w8a8` `[T]` holds (activation scales per
    group of 64 inputs when `in` divides into them, else per row), weight-only elsewhere."""
    values, scale = _kernel(kernel)
    weight_only = (x @ values) * scale
    group = 64 if x.shape[1] % 64 == 0 else x.shape[1]
    both = 0
    for start in range(0, x.shape[1], group):
        part = x[:, start:start + group]
        peak = np.abs(part).max(axis=1, keepdims=True)
        row_scale = np.where(peak > 0, peak / 127.0, 1.0)
        both = both + (np.rint(part / row_scale) @ values[start:start + group]) * row_scale
    return np.where(np.asarray(w8a8)[:, None], both * scale, weight_only)


def _rms(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight.numpy()


def reference_logits(model, ids, w8a8, head_w8a8=None):
    """float64 logits `[T, vocab]` of one unpadded prompt `ids` `[T]` through the int8 Llama, recomputed from
    scratch in numpy; `w8a8` `[T]`: which positions' matmuls run W8A8 (the others weight-only); `head_w8a8`: the
    same for the LM head (default `w8a8`)."""
    config = model.config
    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    length = len(ids)
    values, scale = _kernel(model.embed_tokens)
    x = (values[:, ids] * scale[ids]).T
    angles = np.arange(length)[:, None] * np.asarray(model.rope.inverse_frequencies, np.float64)
    cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]

    def rotate(t):
        first, second = np.split(t, 2, axis=-1)
        return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)

    causal = np.tril(np.ones((length, length), bool))
    for layer in model.decoder_layers:
        qkv = _dense(_rms(x, layer.input_norm, config.rms_norm_eps), layer.qkv[0], w8a8)
        q, k, v = np.split(qkv, [heads * head_dim, (heads + kv_heads) * head_dim], axis=-1)
        q = rotate(q.reshape(length, heads, head_dim)) / np.sqrt(head_dim)
        k = rotate(k.reshape(length, kv_heads, head_dim))
        v = v.reshape(length, kv_heads, head_dim)
        group = heads // kv_heads
        out = np.empty((length, heads, head_dim))
        for head in range(heads):
            scores = q[:, head] @ k[:, head // group].T
            scores = np.where(causal, scores, -np.inf)
            weights = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[:, head] = (weights / weights.sum(axis=1, keepdims=True)) @ v[:, head // group]
        x = x + _dense(out.reshape(length, -1), layer.o_proj[0], w8a8)
        gate, up = np.split(_dense(_rms(x, layer.post_norm, config.rms_norm_eps), layer.gate_up[0], w8a8), 2, -1)
        x = x + _dense(gate / (1 + np.exp(-gate)) * up, layer.down[0], w8a8)
    head_w8a8 = w8a8 if head_w8a8 is None else head_w8a8
    return _dense(_rms(x, model.norm, config.rms_norm_eps), model.lm_head, head_w8a8)


def reference_greedy(model, prompt, steps, single_row_steps):
    """(tokens `[steps]`, logits `[steps, vocab]`) of greedy decoding in numpy: the prompt's positions W8A8 (a
    prefill of several tokens), the generated ones weight-only when `single_row_steps`, else W8A8; the LM head,
    which runs on each row's last position only, weight-only when `single_row_steps`."""
    ids, logits = list(prompt), []
    for _ in range(steps):
        w8a8 = [True] * len(prompt) + [not single_row_steps] * (len(ids) - len(prompt))
        head = [not single_row_steps] * len(ids)
        logits.append(reference_logits(model, np.array(ids), w8a8, head)[-1])
        ids.append(int(np.argmax(logits[-1])))
    return np.array(ids[len(prompt):]), np.array(logits)


def _close(actual, expected, tolerance=2e-4):
    """Within `tolerance` of the logits' scale (float32 against float64 rounding)."""
    np.testing.assert_allclose(actual, expected, atol=tolerance * np.abs(expected).max(), rtol=0)


# ------------------------------------------------------------------------------------------- tests


def test_int8_model_holds_int8_weights_and_a_quarter_of_the_bytes(llama_dir, int8_llama):
    full = AutoModelForCausalLM.from_pretrained(llama_dir)
    int8_bytes = sum(v.numpy().nbytes for v in int8_llama.variables)
    full_bytes = sum(v.numpy().nbytes for v in full.variables)
    assert int8_bytes < 0.3 * full_bytes
    dtypes = {v.path.split("/")[-1]: v.dtype for v in int8_llama.variables}
    assert dtypes["model_embed_tokens_weight"] == "int8"  # the tied embedding and LM head
    assert dtypes["self_attn_q_proj_k_proj_v_proj_kernel"] == "int8"
    assert dtypes["input_layernorm_weight"] == "float32"
    # Each weight within half a step of its channel's scale of the float one.
    kernel = int8_llama.decoder_layers[0].gate_up[0]
    float_kernel = full.decoder_layers[0].gate_up[0].numpy()
    error = np.abs(kernel.dequantized().numpy() - float_kernel)
    assert np.all(error <= kernel.scale.numpy() / 2 + 1e-6)


@pytest.mark.parametrize("width", [48, 128])  # one activation scale per row; two groups of 64
def test_matmul_forms_by_rows(width):
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((width, 24)).astype(np.float32)
    values, scale = quantize_array(weights, -1)
    kernel = QuantizedKernel(tf.Variable(values), tf.Variable(scale), -1)
    one = rng.standard_normal((1, 1, width)).astype(np.float32)
    several = rng.standard_normal((3, width)).astype(np.float32)
    several[:, 5] *= 30  # an outlier channel, as the residual stream has
    # One row: weight-only, exact up to float rounding.
    _close(quantized_matmul(tf.constant(one), kernel).numpy()[0], (one[0] @ values.astype(np.float64)) * scale, 1e-6)
    # Several rows: W8A8, which differs from weight-only by the activations' rounding.
    w8a8 = _dense(several.astype(np.float64), kernel, [True] * 3)
    weight_only = _dense(several.astype(np.float64), kernel, [False] * 3)
    _close(quantized_matmul(tf.constant(several), kernel).numpy(), w8a8, 1e-6)
    assert np.abs(w8a8 - weight_only).max() > 1e-3 * np.abs(w8a8).max()
    # ... compiled to an s8 x s8 -> s32 dot.
    hlo = tf.function(lambda x: quantized_matmul(x, kernel), jit_compile=True).experimental_get_compiler_ir(
        tf.constant(several))(stage="hlo")
    dot = "dot(s8[3,48]" if width == 48 else "dot(s8[2,3,64]"
    assert any(dot in line and "s32[" in line for line in hlo.splitlines())


def test_forward_logits_match_the_numpy_reference(int8_llama):
    # A plain forward of several tokens: W8A8 at every position.
    logits = int8_llama(PROMPTS[:1]).logits.numpy()[0]
    _close(logits, reference_logits(int8_llama, PROMPTS[0], [True] * PROMPTS.shape[1]))


def test_generate_one_row_steps_run_weight_only(int8_llama):
    out = int8_llama.generate(PROMPTS[:1], max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                              output_logits=True, return_dict_in_generate=True)
    tokens, logits = reference_greedy(int8_llama, PROMPTS[0], NEW_TOKENS, single_row_steps=True)
    _close(np.stack([step.numpy()[0] for step in out.logits]), logits)
    np.testing.assert_array_equal(out.sequences.numpy()[0, PROMPTS.shape[1]:], tokens)


def test_generate_multi_row_steps_run_w8a8(int8_llama):
    out = int8_llama.generate(PROMPTS, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                              output_logits=True, return_dict_in_generate=True)
    for row in range(len(PROMPTS)):
        tokens, logits = reference_greedy(int8_llama, PROMPTS[row], NEW_TOKENS, single_row_steps=False)
        _close(np.stack([step.numpy()[row] for step in out.logits]), logits)
        np.testing.assert_array_equal(out.sequences.numpy()[row, PROMPTS.shape[1]:], tokens)


def test_export_stores_int8_and_gives_the_in_process_tokens(int8_llama, tmp_path):
    from tfgen.export import export_saved_model

    version = export_saved_model(int8_llama, tmp_path / "export", max_new_tokens=NEW_TOKENS,
                                 signatures=["serving_default"], slots=0)
    reader = tf.train.load_checkpoint(f"{version}/variables/variables")
    dtypes = set(reader.get_variable_to_dtype_map().values())
    assert tf.int8 in dtypes
    loaded = tf.saved_model.load(version)
    mask = np.ones_like(PROMPTS)
    exported = loaded.signatures["serving_default"](input_ids=tf.constant(PROMPTS), attention_mask=tf.constant(mask))
    in_process = int8_llama.generate(PROMPTS, max_new_tokens=NEW_TOKENS, do_sample=False).numpy()
    np.testing.assert_array_equal(exported["sequences"].numpy(), in_process)


def test_unknown_quantize_mode_is_refused_before_loading(tmp_path):
    with pytest.raises(ValueError, match="quantize"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "missing", quantize="int4")
    with pytest.raises(ValueError, match="quantize"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "missing", quantize=True)


def test_quantize_refused_for_a_keras_hub_preset(tmp_path):
    preset = tmp_path / "preset"
    preset.mkdir()
    (preset / "metadata.json").write_text(json.dumps({"keras_hub_version": "0.20.0"}))
    with pytest.raises(ValueError, match="quantize='int8'.*keras-hub preset"):
        AutoModelForCausalLM.from_pretrained(preset, quantize="int8")


def test_t5_int8_matches_its_dequantized_float_model(tmp_path):
    from t5_checkpoints import build_hf_model

    build_hf_model("t5", tmp_path / "t5")
    int8 = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "t5", quantize="int8")
    assert int8.shared.values.dtype == "int8" and int8.decoder_blocks[0].cross_kv.values.dtype == "int8"
    dequantized = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "t5")
    dequantized.load_hf_state_dict(int8.hf_state_dict())
    # One token each: weight-only everywhere, the float model holding the dequantized weights.
    single = dict(input_ids=np.array([[5]]), decoder_input_ids=np.array([[0]]))
    _close(int8(**single).logits.numpy(), dequantized(**single).logits.numpy(), 1e-5)
    # Several rows: W8A8, within the activations' rounding.
    several = dict(input_ids=PROMPTS % 90 + 3, decoder_input_ids=PROMPTS[:, :3] % 90)
    _close(int8(**several).logits.numpy(), dequantized(**several).logits.numpy(), 0.05)


def test_cli_refuses_an_unknown_quantize_mode(capsys):
    from tfgen.cli import main

    assert main(["generate", "hello", "--quantize", "int4"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "--quantize" in error[0] and "int4" in error[0]


def test_gpt2_int8_matches_its_dequantized_float_model(tiny_checkpoint):
    directory = tiny_checkpoint[0]
    int8 = AutoModelForCausalLM.from_pretrained(directory, quantize="int8")
    assert int8.wte.values.dtype == "int8" and int8.blocks[0].c_attn[0].values.dtype == "int8"
    dequantized = AutoModelForCausalLM.from_pretrained(directory)
    dequantized.load_hf_state_dict(int8.hf_state_dict())
    prompt = PROMPTS[:1] % 97
    # One row (one token): weight-only, the float model holding the dequantized weights up to float rounding.
    _close(int8(prompt[:, :1]).logits.numpy(), dequantized(prompt[:, :1]).logits.numpy(), 1e-5)
    # Several rows: W8A8, within the activations' rounding of it.
    several, reference = int8(prompt).logits.numpy(), dequantized(prompt).logits.numpy()
    _close(several, reference, 0.05)
    assert np.abs(several - reference).max() > 1e-4 * np.abs(reference).max()


@pytest.mark.parametrize("command", ["generate", "chat", "batch", "export", "serve"])
def test_every_model_command_takes_quantize_from_one_place(command):
    from tfgen.cli import build_parser
    from tfgen.commands import model_options

    extra = {"generate": ["hi"], "chat": [], "batch": ["--input", "in.jsonl", "--output", "out.jsonl"],
             "export": ["out"], "serve": []}
    args = build_parser().parse_args([command, *extra[command], "--quantize", "int8"])
    assert model_options(args) == {"quantize": "int8"}


def test_serve_refuses_quantize_for_an_export_folder(tmp_path, capsys):
    from tfgen.cli import main

    assert main(["serve", str(tmp_path), "--quantize", "int8"]) == 2
    assert "--quantize shapes the export of --model" in capsys.readouterr().err


def test_gguf_int8_load_quantizes_each_tensor_as_the_float_load_would(tmp_path):
    from gguf_files import build_hf_model, byte_level_vocabulary, write_gguf

    path = write_gguf(tmp_path / "m.gguf", build_hf_model("llama", len(byte_level_vocabulary()[0])), arch="llama",
                      qtype="Q4_0")
    int8 = AutoModelForCausalLM.from_pretrained(path, quantize="int8")
    full = AutoModelForCausalLM.from_pretrained(path)
    for quantized, weight in ((int8.embed_tokens, full.embed_tokens), (int8.decoder_layers[1].qkv[0],
                                                                      full.decoder_layers[1].qkv[0])):
        values, scale = quantize_array(weight.numpy(), -1)  # the q rows un-permuted before, as the float load does
        np.testing.assert_array_equal(quantized.values.numpy(), values)
        np.testing.assert_allclose(quantized.scale.numpy(), scale, rtol=1e-6)


def test_int8_export_served_with_continuous_batching_gives_the_in_process_tokens(int8_llama, tmp_path):
    """`quantize="int8"` through export → `tfgen serve`'s loading (continuous-batching slots) → a greedy request:
    the in-process tokens."""
    from tfgen.export import export_saved_model
    from tfgen.serving import load_export

    export_saved_model(int8_llama, tmp_path / "served", max_new_tokens=NEW_TOKENS, signatures=["greedy"], slots=2,
                       slot_length=16)
    served = load_export(tmp_path / "served", warmup=False, batching={"steps_per_call": 4})
    try:
        assert served.engine is not None
        outputs = served.predict("greedy", {"input_ids": PROMPTS, "attention_mask": np.ones_like(PROMPTS),
                                            "max_new_tokens": np.full([len(PROMPTS)], NEW_TOKENS, np.int32)})
    finally:
        served.close()
    in_process = int8_llama.generate(PROMPTS, max_new_tokens=NEW_TOKENS, do_sample=False).numpy()
    np.testing.assert_array_equal(outputs["sequences"], in_process)
