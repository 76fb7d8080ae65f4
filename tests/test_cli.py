"""The `tfgen` command line: `generate` end to end on a tiny checkpoint with a tokenizer, `--help` without
TensorFlow, no TensorFlow log lines, and the shipped model as the default of `export` and `serve`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tfgen import AutoModelForCausalLM, Tokenizer
from tfgen.cli import main

from conftest import TINY_GPT2, word_level_tokenizer


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


# --- `--help` without TensorFlow, a quiet run, the shipped model as default of export and serve ---------------------

# TensorFlow C++ log lines (glog format, absl's early-logging notice, CUDA probes) and its Python warnings.
TF_NOISE = re.compile(r"^[IWEF]\d{4} |absl::InitializeLog|cuda|cuInit|cudart|oneDNN|cpu_feature_guard|retracing|"
                      r"^WARNING:tensorflow", re.IGNORECASE)


@pytest.mark.parametrize("command", ["", "generate", "batch", "export", "serve", "bench"])
def test_help_imports_no_tensorflow(command):
    code = (
        "import sys\n"
        "from tfgen.cli import main\n"
        "try:\n"
        f"    main({[command, '--help'] if command else ['--help']!r})\n"
        "except SystemExit as done:\n"
        "    assert done.code == 0, done.code\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] in ('tensorflow', 'keras')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: tfgen" in done.stdout
    assert done.stdout.splitlines()[-1] == "[]"


def test_generate_prints_no_tensorflow_lines(tmp_path):
    """A plain `tfgen generate` of the shipped model, with a cold then a warm compile cache: stdout has the text,
    stderr only tfgen's own lines (the compile notice)."""
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(TFGEN_CACHE_DIR=str(tmp_path / "cache"), TFGEN_COMPILE_CACHE="1")
    script = shutil.which("tfgen")
    command = ([script] if script else [sys.executable, "-m", "tfgen.cli"]) + [
        "generate", "def f(x):", "--greedy", "--max-new-tokens", "4", "--no-stream"
    ]
    outputs = []
    for _ in ("cold", "warm"):
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("def f(x):")
        lines = done.stderr.splitlines()
        assert [line for line in lines if TF_NOISE.search(line)] == []
        assert all(line.startswith("tfgen: ") for line in lines), lines
        assert any("compil" in line for line in lines)
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]


def test_tensorflow_start_up_lines_below_the_level_are_dropped():
    from tfgen.cli import _without_tf_lines_below

    captured = (
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        "I0000 00:00:1795452449.924579    3605 cudart_stub.cc:31] Could not find cuda drivers on your machine.\n"
        "W0000 00:00:1795452449.924579    3605 some.cc:1] a warning\n"
        "E0101 10:11:12.123456    3605 other.cc:2] an error\n"
        "a Python warning printed during the import\n"
    )
    assert _without_tf_lines_below(captured, 3) == "a Python warning printed during the import\n"
    assert _without_tf_lines_below(captured, 2).splitlines()[0].endswith("an error")
    assert _without_tf_lines_below(captured, 0) == captured


def test_tensorflow_python_warnings_hidden_during_a_command(monkeypatch):
    import logging

    from tfgen.cli import _quiet_tensorflow

    tf_logger = logging.getLogger("tensorflow")
    level = tf_logger.level
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    with _quiet_tensorflow():
        assert not tf_logger.isEnabledFor(logging.WARNING)  # e.g. "triggered tf.function retracing"
    assert tf_logger.level == level


@pytest.mark.parametrize("quiet", [False, True], ids=["notice", "quiet"])
def test_compile_notice_and_quiet_flag(model_dir, capsys, quiet):
    argv = ["generate", "--model", model_dir, "w5 w17", "--max-new-tokens", "3", "--greedy", "--no-stream"]
    assert main((["--quiet"] if quiet else []) + argv) == 0
    err = capsys.readouterr().err
    assert ("tfgen: compiling generate" in err) != quiet


def test_export_defaults_to_the_shipped_model(tmp_path, capsys):
    from tfgen.defaults import DEFAULT_MODEL

    out = tmp_path / "exported"
    assert main(["export", str(out), "--no-jit", "--signatures", "greedy", "--max-new-tokens", "2"]) == 0
    assert capsys.readouterr().out.strip() == str(out / "1")
    exported = json.loads((out / "1" / "assets.extra" / "generation_config.json").read_text())
    shipped = json.loads((Path(DEFAULT_MODEL) / "generation_config.json").read_text())
    assert exported["eos_token_id"] == shipped["eos_token_id"] != TINY_GPT2["eos_token_id"]


def test_serve_without_export_dir_serves_the_shipped_model(monkeypatch):
    """`tfgen serve` exports the shipped model to a temporary folder, serves it under the model's name, and
    removes the folder when the server stops."""
    import tfgen.serving
    from tfgen.commands import export as export_command

    real_export = export_command.export_model
    served = {}

    def quick_export(model_path, out_dir, **options):
        assert model_path is None and options == {}
        return real_export(model_path, out_dir, signatures=["greedy"], jit_compile=False, max_new_tokens=2)

    def fake_serve(export_dir, **options):
        served.update(options, export_dir=export_dir, name=tfgen.serving.load_export(export_dir).name)

    monkeypatch.setattr(export_command, "export_model", quick_export)
    monkeypatch.setattr(tfgen.serving, "serve", fake_serve)
    assert main(["serve", "--port", "0"]) == 0
    assert served["name"] == "stdlib-gpt2" and served["port"] == 0
    assert not os.path.exists(served["export_dir"])


def test_serve_help_defaults_match_the_server():
    import tfgen.serving
    from tfgen.commands import serve as serve_command

    assert serve_command.DEFAULT_PORT == tfgen.serving.DEFAULT_PORT
    assert serve_command.DEFAULT_MAX_REQUEST_BYTES == tfgen.serving.DEFAULT_MAX_REQUEST_BYTES
