"""The shipped default model (`saved_models/stdlib-gpt2`): loads in tfgen and in HF transformers alike,
generates, and its training report shows it beats a unigram baseline on held-out files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tfgen.hub import default_model as defaults

PROMPT = "def fibonacci(n):"
TOKENIZER_TEXTS = [
    PROMPT,
    "class Stack:\n    def push(self, item):\n        self._items.append(item)\n",
    "\tx = {'ключ': 'значение', \"emoji\": '🐍'}  # mixed\r\n",
    "<|endoftext|>import os\n",
]


@pytest.fixture(scope="module")
def model_dir() -> str:
    return defaults.default_model_path()


@pytest.fixture(scope="module")
def model(model_dir):
    from tfgen import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from tfgen import Tokenizer

    return Tokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def report(model_dir) -> dict:
    return json.loads((Path(model_dir) / "training_report.json").read_text(encoding="utf-8"))


def test_default_model_path_points_at_the_repository_checkpoint(model_dir):
    assert Path(model_dir).is_absolute()
    assert Path(model_dir) == Path(defaults.__file__).resolve().parents[2] / "saved_models" / "stdlib-gpt2"
    assert sum(path.stat().st_size for path in Path(model_dir).iterdir()) < 40 * 2**20


def test_missing_default_model_raises_oserror(monkeypatch, tmp_path):
    monkeypatch.setattr(defaults, "DEFAULT_MODEL", str(tmp_path / "absent"))
    with pytest.raises(OSError, match="model.safetensors"):
        defaults.default_model_path()


def test_logits_match_hf_transformers(model, tokenizer, model_dir):
    import torch
    import transformers

    hf_model = transformers.GPT2LMHeadModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    ids = np.asarray([tokenizer.encode(TOKENIZER_TEXTS[1])], np.int32)
    ours = model(ids).logits.numpy()
    with torch.no_grad():
        theirs = hf_model(torch.from_numpy(ids).long()).logits.numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)


def test_tokenizer_ids_match_hf_auto_tokenizer(tokenizer, model_dir):
    import transformers

    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    for text in TOKENIZER_TEXTS:
        assert tokenizer.encode(text) == hf_tokenizer(text)["input_ids"], text
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (hf_tokenizer.eos_token_id, hf_tokenizer.pad_token_id)


def test_generation_config_holds_the_sampling_defaults(model, tokenizer):
    config = model.generation_config
    assert config.do_sample is True
    assert (config.temperature, config.top_p, config.top_k, config.max_new_tokens) == (0.8, 0.95, 50, 64)
    assert config.eos_token_id == config.pad_token_id == tokenizer.eos_token_id


def test_greedy_generation_continues_the_prompt(model, tokenizer):
    encoded = tokenizer(PROMPT)
    sequences = model.generate(
        encoded["input_ids"],
        attention_mask=encoded["attention_mask"],
        max_new_tokens=12,
        do_sample=False,
        temperature=None,  # unset the checkpoint's sampling knobs, which greedy search would warn about
        top_p=None,
    ).numpy()
    new_tokens = sequences[0, encoded["input_ids"].shape[1] :]
    text = tokenizer.decode(sequences[0], skip_special_tokens=True)
    assert text.startswith(PROMPT)
    assert len(text) > len(PROMPT) and new_tokens[0] != tokenizer.eos_token_id


def test_report_matches_checkpoint_and_beats_unigram(report, model_dir):
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    for key in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
        assert report["model"][key] == config[key], key
    evaluation = report["eval"]
    assert evaluation["targets"] > 10_000
    assert evaluation["model_cross_entropy"] < evaluation["unigram_cross_entropy"]
    assert evaluation["model_perplexity"] == pytest.approx(np.exp(evaluation["model_cross_entropy"]), rel=1e-3)


def test_readme_quick_start_shows_what_the_command_prints(capsys):
    """The README's first command and the output printed under it stay true (same seed, same text)."""
    import re
    import shlex

    from tfgen.cli import main

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    command, shown = re.search(r"```bash\n(tfgen generate [^\n]+)\n```\n\n```\n(.*?)\n```", readme, re.S).groups()
    argv = shlex.split(command)[1:]
    assert "--seed" in argv  # a sampled example is reproducible only with its seed
    assert main(argv) == 0
    assert capsys.readouterr().out.rstrip() == shown.rstrip()
