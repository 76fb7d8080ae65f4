"""`tfgen generate` end to end on a tiny checkpoint with a tokenizer."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

from tfgen import AutoModelForCausalLM, Tokenizer
from tfgen.cli import main

from conftest import word_level_tokenizer


@pytest.fixture(scope="module")
def model_dir(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint plus a word-level tokenizer over its 97 ids."""
    directory = tmp_path_factory.mktemp("cli_model")
    shutil.copytree(tiny_checkpoint[0], directory, dirs_exist_ok=True)
    word_level_tokenizer().save_pretrained(directory)
    return str(directory)


def expected_text(model_dir, prompt, **options):
    tokenizer = Tokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids = np.array([tokenizer.encode(prompt)])
    return tokenizer.decode(model.generate(ids, **options)[0].numpy(), skip_special_tokens=True)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "printed_at_end"])
def test_generate_prints_the_continuation(model_dir, capsys, stream):
    prompt = "w5 w17 w33"
    argv = ["generate", "--model", model_dir, prompt, "--max-new-tokens", "8", "--greedy"]
    assert main(argv + ([] if stream else ["--no-stream"])) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(prompt)
    assert printed.strip() == expected_text(model_dir, prompt, max_new_tokens=8, do_sample=False)


def test_sampling_options_and_seed(model_dir, capsys):
    argv = ["generate", "--model", model_dir, "w5 w6", "--max-new-tokens", "8", "--do-sample", "--seed", "1", "2",
            "--temperature", "0.9", "--top-k", "20", "--top-p", "0.95", "--no-stream"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out == first
    expected = expected_text(
        model_dir, "w5 w6", max_new_tokens=8, do_sample=True, seed=[1, 2], temperature=0.9, top_k=20, top_p=0.95
    )
    assert first.strip() == expected


def test_bad_option_is_one_clear_line(model_dir, capsys):
    assert main(["generate", "--model", model_dir, "w5", "--do-sample", "--temperature", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tfgen: error:") and "temperature" in err and "Traceback" not in err


def test_console_script_runs(model_dir):
    script = shutil.which("tfgen") or [sys.executable, "-m", "tfgen.cli"]
    command = ([script] if isinstance(script, str) else script) + [
        "generate", "--model", model_dir, "w9 w8", "--max-new-tokens", "4", "--no-stream"
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("w9 w8")


def test_greedy_flag_on_a_sampling_config_warns_nothing(model_dir, tmp_path, capsys):
    """`--greedy` overrides a model whose config samples; the config's temperature is then unused, which is
    not the user's doing, so no warning. The same call from Python does warn, once."""
    import json
    import warnings

    sampling_dir = tmp_path / "sampling_model"
    shutil.copytree(model_dir, sampling_dir)
    config = json.loads((sampling_dir / "generation_config.json").read_text())
    config.update(do_sample=True, temperature=0.7)
    (sampling_dir / "generation_config.json").write_text(json.dumps(config))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["generate", "--model", str(sampling_dir), "w5 w6", "--max-new-tokens", "4", "--greedy"]) == 0
    assert not [w for w in caught if "no effect" in str(w.message)]
    assert capsys.readouterr().out.startswith("w5 w6")
    model = AutoModelForCausalLM.from_pretrained(str(sampling_dir))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.generate(np.array([[5, 6]]), max_new_tokens=4, do_sample=False)
    no_effect = [w for w in caught if "no effect" in str(w.message)]
    assert len(no_effect) == 1 and "temperature" in str(no_effect[0].message)
    assert no_effect[0].filename == __file__  # points at the caller's line
