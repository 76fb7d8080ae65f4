"""Checks of a real GGUF file against transformers' reading of the same file, for a test whose fixture provides the
file (e.g. SmolLM2-135M-Instruct's Q4_1 GGUF): `check_gguf_file(path)` asserts, and returns what it measured.

- the HF config dict equals the one transformers reads, on every key both have;
- every tensor equals transformers' dequantized, un-permuted tensor exactly (both dequantize with gguf-py);
- the tokenizer gives transformers' ids (without the bos transformers adds regardless of the file) and decodes them
  back to the text;
- greedy generation on a chat prompt equals HF PyTorch's on the model transformers builds from the file.

`SMOLLM2_IDS` are llama.cpp's ids for SmolLM2's tokenizer (its "smollm" pre-tokenizer splits digits one by one).
"""

from __future__ import annotations

import time

import numpy as np

from gguf_files import TEXTS

SMOLLM2_IDS = {
    "Hello, we can use": [19556, 28, 392, 416, 722],
    "The capital of France is": [504, 3575, 282, 4649, 314],
    "Hello world! 123": [19556, 905, 17, 216, 33, 34, 35],
    "Café déjà vu.": [51, 1939, 2756, 32564, 90, 16739, 386, 101, 30],
    "  multiple   spaces": [216, 2701, 256, 5600],
    "\n": [198],
}


def check_gguf_file(path, *, known_ids=None, max_new_tokens: int = 12) -> dict[str, float]:
    """Asserts the checks above on the GGUF file at `path` (and `known_ids`: {text: ids} without special tokens);
    returns timings in seconds: `open` (parse), `dequantize` (every tensor to float32 HF arrays), `load_model`."""
    import os

    import torch
    import transformers
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from tfgen.gguf.config import hf_config_dict
    from tfgen.gguf.files import GGUFFile
    from tfgen.gguf.tensors import read_hf_tensors
    from tfgen.models.auto import AutoModelForCausalLM
    from tfgen.tokenizer import Tokenizer

    path = os.fspath(path)
    directory, name = os.path.dirname(path) or ".", os.path.basename(path)
    timings = {}
    start = time.perf_counter()
    file = GGUFFile(path, path)  # uncached, to time the parse
    timings["open"] = time.perf_counter() - start
    config = hf_config_dict(file)
    start = time.perf_counter()
    tensors = read_hf_tensors(file, config)
    timings["dequantize"] = time.perf_counter() - start

    hf_config = transformers.AutoConfig.from_pretrained(directory, gguf_file=name)
    for key, value in hf_config.to_dict().items():
        # (tfgen lists the end-of-turn ids with eos; transformers keeps eos alone.)
        if key in config and not isinstance(config[key], list):
            assert config[key] == value, (key, config[key], value)
    hf_config._attn_implementation = "eager"
    hf_model = transformers.AutoModelForCausalLM.from_config(hf_config).eval()
    hf_tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=hf_model)["tensors"]
    assert set(tensors) == set(hf_tensors)
    for tensor_name, array in tensors.items():
        np.testing.assert_array_equal(array, hf_tensors[tensor_name].numpy(), err_msg=tensor_name)
    hf_model.load_state_dict(hf_tensors, strict=False)
    hf_model.tie_weights()
    del tensors, hf_tensors

    tokenizer = Tokenizer.from_pretrained(path)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
    for text in TEXTS + list(known_ids or {}):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == hf_tokenizer(text, add_special_tokens=False)["input_ids"], text
        assert tokenizer.decode(ids) == text, text
    for text, expected in (known_ids or {}).items():
        assert tokenizer.encode(text, add_special_tokens=False) == expected, text

    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path)
    timings["load_model"] = time.perf_counter() - start
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="np",
                                           return_dict=True)
    ours = model.generate(prompt["input_ids"], attention_mask=prompt["attention_mask"],
                          max_new_tokens=max_new_tokens, do_sample=False).numpy()
    with torch.no_grad():
        theirs = hf_model.generate(torch.tensor(prompt["input_ids"], dtype=torch.long),
                                   attention_mask=torch.tensor(prompt["attention_mask"]),
                                   max_new_tokens=max_new_tokens, do_sample=False,
                                   eos_token_id=model.generation_config.eos_token_id,
                                   pad_token_id=model.generation_config.pad_token_id).numpy()
    # HF stops the whole batch at eos; tfgen pads the rest of the buffer with the pad id.
    np.testing.assert_array_equal(ours[:, : theirs.shape[1]], theirs)
    return timings
