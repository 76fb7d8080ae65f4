"""End to end from a GGUF file: `AutoModelForCausalLM.from_pretrained("x.gguf")` greedy generation equals HF PyTorch's
on the model HF loads from the same file, token for token (F32 and quantized files), and `tfgen generate --model
x.gguf` prints it."""

from __future__ import annotations

import numpy as np
import pytest
from gguf_files import build_hf_model, byte_level_vocabulary, hf_gguf_checkpoint, llama_cpp_rope_freqs, write_gguf

from tfgen.auto.models import AutoModelForCausalLM
from tfgen.auto.tokenizer import AutoTokenizer
from tfgen.cli import main

VOCAB = len(byte_level_vocabulary()[0])
PROMPTS = ["The quick brown fox", "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"]


def _hf_model_from_gguf(path, arch, **overrides):
    """The PyTorch model HF builds from the file: its GGUF config and its dequantized, un-permuted tensors."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    missing, unexpected = model.load_state_dict(hf_gguf_checkpoint(path, arch, VOCAB, **overrides)["tensors"],
                                                strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    if config.tie_word_embeddings:
        model.tie_weights()
    return model


@pytest.mark.parametrize("arch, qtype, overrides", [
    ("llama", "F32", {}),
    ("qwen2", "Q8_0", {"tie_word_embeddings": True}),
])
def test_greedy_generate_equals_transformers_on_the_same_file(tmp_path, arch, qtype, overrides):
    path = write_gguf(tmp_path / "m.gguf", build_hf_model(arch, VOCAB, **overrides), arch=arch, qtype=qtype,
                      pre="gpt-2" if arch == "llama" else "qwen2")
    _assert_same_greedy_tokens(path, _hf_model_from_gguf(path, arch, **overrides))


def test_llama3_rope_scaling_file_generates_as_the_original_model(tmp_path):
    """transformers' GGUF loader ignores rope_freqs.weight, so the reference is the model the file was written from."""
    scaling = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
    hf_model = build_hf_model("llama", VOCAB, rope_scaling=scaling)
    path = write_gguf(tmp_path / "m.gguf", hf_model, arch="llama", qtype="F16",
                      extra_tensors={"rope_freqs.weight": llama_cpp_rope_freqs(hf_model.config)})
    import torch

    with torch.no_grad():
        for parameter in hf_model.parameters():  # the weights as the file holds them
            parameter.copy_(parameter.half().float())
    _assert_same_greedy_tokens(path, hf_model)


def _assert_same_greedy_tokens(path, hf_model):
    import torch

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.generation_config.eos_token_id == 2 and model.generation_config.pad_token_id == 0
    batch = tokenizer(PROMPTS)
    ours = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=8,
                          do_sample=False, eos_token_id=None).numpy()
    with torch.no_grad():
        theirs = hf_model.generate(torch.tensor(batch["input_ids"], dtype=torch.long),
                                   attention_mask=torch.tensor(batch["attention_mask"]), max_new_tokens=8,
                                   do_sample=False, eos_token_id=None, pad_token_id=0).numpy()
    np.testing.assert_array_equal(ours, theirs)


def test_cli_generate_from_a_gguf_file(tmp_path, capsys):
    path = write_gguf(tmp_path / "m.gguf", build_hf_model("llama", VOCAB), arch="llama", qtype="Q4_0")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype="float32")
    prompt = tokenizer("Hello world")
    expected = model.generate(prompt["input_ids"], max_new_tokens=4, do_sample=False, eos_token_id=None,
                              jit_compile=False).numpy()[0, prompt["input_ids"].shape[1]:]
    # --raw: the file has a chat template, which `tfgen generate` would apply by default.
    assert main(["generate", "--model", str(path), "Hello world", "--raw", "--max-new-tokens", "4", "--greedy",
                 "--no-stream", "--no-jit"]) == 0
    printed = capsys.readouterr().out
    # The command stops at eos (2), as the model's generation config says.
    stop = list(expected).index(2) if 2 in expected else len(expected)
    assert printed == "Hello world" + tokenizer.decode(expected[:stop], skip_special_tokens=True) + "\n"


def test_gguf_errors_name_the_file(tmp_path):
    with pytest.raises(OSError, match="absent.gguf"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "absent.gguf")
    with pytest.raises(ValueError, match="revision is a Hub option"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "absent.gguf", revision="v2")
    path = write_gguf(tmp_path / "m.gguf", build_hf_model("llama", VOCAB), arch="llama",
                      skip={"blk.0.ffn_up.weight"})
    with pytest.raises(ValueError, match=r"m.gguf.*missing=\['model.layers.0.mlp.up_proj.weight'\]"):
        AutoModelForCausalLM.from_pretrained(path)
    assert main(["generate", "--model", str(path), "Hello"]) == 2


def test_cli_export_of_a_gguf_file_answers_like_generate(tmp_path):
    import tensorflow as tf

    path = write_gguf(tmp_path / "m.gguf", build_hf_model("qwen2", VOCAB), arch="qwen2", qtype="Q8_0", pre="qwen2")
    out = tmp_path / "export"
    assert main(["export", "--model", str(path), str(out), "--signatures", "greedy", "--max-new-tokens", "6"]) == 0
    batch = AutoTokenizer.from_pretrained(path)(PROMPTS)
    served = tf.saved_model.load(str(out / "1")).signatures["greedy"](
        input_ids=tf.constant(batch["input_ids"]), attention_mask=tf.constant(batch["attention_mask"]),
        max_new_tokens=tf.constant([6, 6]),
    )["sequences"].numpy()
    model = AutoModelForCausalLM.from_pretrained(path)
    expected = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=6,
                              do_sample=False).numpy()
    np.testing.assert_array_equal(served, expected)
