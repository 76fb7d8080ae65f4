"""Shared fixtures: tiny random GPT-2 checkpoints built here (nothing is downloaded), loaded once per session."""

from __future__ import annotations

import json
import os
import shutil

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tests never write the user's persistent compile cache (tests/test_compile_cache.py points it at temp folders).
os.environ.setdefault("TFGEN_COMPILE_CACHE", "0")
# Nor the GGUF load cache (tests/test_fast_start.py turns it on in temp folders).
os.environ.setdefault("TFGEN_GGUF_CACHE", "0")

import numpy as np
import pytest

TINY_GPT2 = dict(
    vocab_size=97,
    n_positions=64,
    n_embd=32,
    n_layer=2,
    n_head=4,
    # A wide init spreads the logits, so greedy choices are not near-ties that float noise could flip.
    initializer_range=0.3,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def build_hf_gpt2(directory, seed: int = 0, **overrides):
    """Saves a random HF PyTorch GPT-2 (safetensors) to `directory` and returns the torch model (eval mode)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.GPT2Config(**{**TINY_GPT2, **overrides}, attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(directory, safe_serialization=True)
    return model


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """(directory, HF torch model) of the shared tiny GPT-2."""
    directory = tmp_path_factory.mktemp("tiny_gpt2")
    return str(directory), build_hf_gpt2(directory)


@pytest.fixture(scope="session")
def tiny_model(tiny_checkpoint):
    """Our Keras GPT-2 loaded from the shared checkpoint (its compiled programs are shared by the tests)."""
    from tfgen import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_checkpoint[0])


#: The tiny model's chat template, word-level (its vocabulary is "w3" ... "w96"): roles become words, the turns
#: end with eos.
CHAT_TEMPLATE = ("{% for m in messages %}{{ bos_token }}{% if m.role == 'system' %}w10{% else %}w11{% endif %} "
                 "{{ m.content }} {{ eos_token }}{% endfor %}{% if add_generation_prompt %} w12{% endif %}")


def copy_with_chat_template(model_dir, directory, template: str) -> str:
    """Copies the model folder `model_dir` into `directory` with `template` as its chat_template.jinja."""
    shutil.copytree(model_dir, directory, dirs_exist_ok=True)
    (directory / "chat_template.jinja").write_text(template, encoding="utf-8")
    return str(directory)


@pytest.fixture(scope="session")
def chat_model_dir(model_dir, tmp_path_factory):
    """`model_dir` plus `CHAT_TEMPLATE` as its chat_template.jinja (read-only)."""
    return copy_with_chat_template(model_dir, tmp_path_factory.mktemp("chat_model"), CHAT_TEMPLATE)


@pytest.fixture(scope="session")
def model_dir(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint plus the word-level tokenizer ("w3" ... "w96"), as `--model` expects (read-only)."""
    directory = tmp_path_factory.mktemp("word_level_model")
    shutil.copytree(tiny_checkpoint[0], directory, dirs_exist_ok=True)
    word_level_tokenizer().save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="session")
def hf_model(tiny_checkpoint):
    return tiny_checkpoint[1]


def left_padded_batch(rows, pad_token_id: int = 0):
    """Left-pads lists of ids: returns (input_ids, attention_mask) int32 numpy arrays."""
    width = max(len(row) for row in rows)
    ids = np.full((len(rows), width), pad_token_id, np.int32)
    mask = np.zeros((len(rows), width), np.int32)
    for index, row in enumerate(rows):
        ids[index, width - len(row) :] = row
        mask[index, width - len(row) :] = 1
    return ids, mask


def word_level_tokenizer():
    """A word-level `tfgen.Tokenizer` over the tiny model's 97 ids: <pad>=0, <s>=1, </s>=2, "w3" ... "w96"."""
    import tokenizers

    from tfgen import Tokenizer

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, TINY_GPT2["vocab_size"])}}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w3"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return Tokenizer(backend, eos_token="</s>", pad_token="<pad>", bos_token="<s>")


def write_jsonl(path, rows) -> str:
    """Writes `rows` (dicts as JSON, or str lines as they are) to `path` (a pathlib.Path), one per line; its str."""
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows),
                    encoding="utf-8")
    return str(path)


def read_jsonl(path) -> list:
    """The JSON values of a JSONL file, line by line."""
    with open(path, encoding="utf-8") as file:
        return [json.loads(line) for line in file]


def batch_reference(model, tokenizer, rows: list, folder, sampled: bool, new_tokens: int) -> tuple:
    """What `tfgen batch` writes for `rows` on `model` (job seed 3 4; top-k 20 sampling when `sampled`): (the rows'
    JSONL file under `folder`, a pathlib.Path, the output file, the same job's `python -m tfgen.beam` flags)."""
    from tfgen.batch import run_batch_job

    source = write_jsonl(folder / "rows.jsonl", rows)
    expected = folder / "batch.jsonl"
    run_batch_job(model, source, expected, tokenizer=tokenizer, max_new_tokens=new_tokens, progress=False,
                  seed=[3, 4], **({"do_sample": True, "top_k": 20} if sampled else {}))
    flags = ["--seed", "3", "4", "--max-new-tokens", str(new_tokens)]
    return source, expected, flags + (["--do-sample", "--top-k", "20"] if sampled else [])


def with_row_options(row: dict, index: int, rng, sampled: bool, budget: int, seed_every: int, knob_every: int
                     ) -> dict:
    """`row` (a `tfgen batch` row) given, by its `index`, its own budget (every 5th, from 1 to `budget`) and, in a
    sampled job, its own seed (every `seed_every`-th) and temperature / top_p (every `knob_every`-th), from `rng`."""
    if index % 5 == 1:
        row["max_new_tokens"] = int(rng.integers(1, budget + 1))
    if sampled and index % seed_every == 2:
        row["seed"] = int(rng.integers(0, 2**31))
    if sampled and index % knob_every == 3:
        row["temperature"], row["top_p"] = 0.7, 0.9
    return row
