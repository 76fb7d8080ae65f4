"""`tfgen serve --model NAME|DIR|FILE.gguf`: no clash with `--model_name`, the export cached by the model's digest and
the export options (written once, reused, rebuilt when the model changes or the entry is damaged or was cut off),
EXPORT_DIR and --model refused together, the served name, and the start-up lines up to "ready on ..."."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import build_hf_gpt2

from tfgen.cli import main

# The smallest export that serves: one plain-graph signature, two new tokens, no slots.
QUICK = ["--no-jit", "--signatures", "greedy", "--max-new-tokens", "2", "--slots", "0", "--structured-inputs", "0"]


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("TFGEN_CACHE_DIR", str(root))
    return root


@pytest.fixture
def recorded(monkeypatch):
    """Records every export `tfgen serve` makes (and still makes it) and every `serve` call (without serving)."""
    import tfgen.serving
    from tfgen.commands import export as export_command
    from tfgen.commands import export_cache

    calls = {"exports": [], "served": []}

    def export(model_path, out_dir, **options):
        # In this process (the real command exports in a child, which a monkeypatch cannot reach).
        calls["exports"].append((model_path, out_dir, options))
        return export_command.export_model(model_path, out_dir, **options)

    def fake_serve(export_dir, **options):
        calls["served"].append(dict(options, export_dir=export_dir))

    monkeypatch.setattr(export_cache, "export_in_child", export)
    monkeypatch.setattr(tfgen.serving, "serve", fake_serve)
    return calls


@pytest.fixture(scope="module")
def own_model(tmp_path_factory, model_dir):
    """A copy of the tiny model that tests may rewrite."""
    directory = tmp_path_factory.mktemp("own") / "tiny-word"
    shutil.copytree(model_dir, directory)
    return str(directory)


def serve(*arguments) -> int:
    return main(["serve", "--port", "0", "--rest_api_port", "0", *arguments])


def test_model_no_longer_clashes_with_model_name(recorded, cache_root, own_model):
    """`--model` used to be "ambiguous option: --model could match --model-name, --model_name"; both spellings of
    TF Serving's `--model_name` still set the served name."""
    assert serve("--model", own_model, *QUICK) == 0
    assert recorded["served"][-1]["model_name"] == "tiny-word"  # the folder's name by default
    for flag in ("--model_name", "--model-name"):
        assert serve("--model", own_model, flag, "custom", *QUICK) == 0
        assert recorded["served"][-1]["model_name"] == "custom"
    # No prefix of a flag is taken any more, so none can clash again.
    with pytest.raises(SystemExit):
        serve("--model-n", "x", "--model", own_model)


def test_model_is_exported_once_then_served_from_the_cache(recorded, cache_root, own_model, caplog):
    import tfgen.serving

    with caplog.at_level("INFO", logger="tfgen.commands.export_cache"):
        from tfgen.commands.export_cache import cached_export

        first, name = cached_export(own_model, {"jit_compile": False, "signatures": ["greedy"], "max_new_tokens": 2,
                                                "slots": 0})
    assert name == "tiny-word" and len(recorded["exports"]) == 1
    assert Path(first).parent == cache_root / "exports" and (Path(first) / "1" / "saved_model.pb").is_file()
    assert "(first use)" in caplog.text and first in caplog.text
    caplog.clear()
    # The command with the same options: no export, the same folder, one line saying so.
    with caplog.at_level("INFO", logger="tfgen.commands.export_cache"):
        assert serve("--model", own_model, *QUICK) == 0
    assert len(recorded["exports"]) == 1 and recorded["served"][-1]["export_dir"] == first
    assert f"using the export cached in {first}" in caplog.text
    assert tfgen.serving.load_export(first, "tiny-word").signatures.keys() == {"greedy"}
    # Other export options are another entry.
    assert serve("--model", own_model, "--no-jit", "--signatures", "greedy", "--max-new-tokens", "3",
                 "--slots", "0") == 0
    assert len(recorded["exports"]) == 2 and recorded["served"][-1]["export_dir"] != first
    # No partial folder is left behind.
    assert not [path for path in os.listdir(cache_root / "exports") if path.startswith(".")]


def test_a_changed_model_gets_a_new_entry(recorded, cache_root, tmp_path, model_dir):
    directory = tmp_path / "changing"
    shutil.copytree(model_dir, directory)
    assert serve("--model", str(directory), *QUICK) == 0
    build_hf_gpt2(directory, seed=1)  # other weights, same names
    assert serve("--model", str(directory), *QUICK) == 0
    assert len(recorded["exports"]) == 2
    first, second = (served["export_dir"] for served in recorded["served"])
    assert first != second and os.path.isdir(first) and os.path.isdir(second)


def test_an_interrupted_or_damaged_entry_is_exported_again(recorded, cache_root, own_model, monkeypatch):
    from tfgen.commands import export as export_command

    recording_export = export_command.export_model

    def interrupted(model_path, out_dir, **options):
        recording_export(model_path, out_dir, **options)
        raise KeyboardInterrupt  # Ctrl-C once the files are written, before the entry is complete

    monkeypatch.setattr(export_command, "export_model", interrupted)
    assert serve("--model", own_model, *QUICK) == 130
    assert os.listdir(cache_root / "exports") == []  # nothing half-written is left to be taken for an export
    monkeypatch.setattr(export_command, "export_model", recording_export)
    assert serve("--model", own_model, *QUICK) == 0
    assert len(recorded["exports"]) == 2
    entry = Path(recorded["served"][-1]["export_dir"])
    (entry / "1" / "saved_model.pb").unlink()  # damaged
    assert serve("--model", own_model, *QUICK) == 0
    assert len(recorded["exports"]) == 3 and recorded["served"][-1]["export_dir"] == str(entry)
    assert (entry / "1" / "saved_model.pb").is_file()


def test_export_dir_and_model_together_are_refused(recorded, own_model, tmp_path, capsys):
    assert serve(str(tmp_path), "--model", own_model) == 2
    error = capsys.readouterr().err
    assert "EXPORT_DIR" in error and "--model" in error and len(error.strip().splitlines()) == 1
    assert serve(str(tmp_path), "--no-jit") == 2
    assert "--no-jit" in capsys.readouterr().err
    assert serve("--model", own_model, "--slots", "-1") == 2
    assert "--slots" in capsys.readouterr().err
    assert recorded["exports"] == [] and recorded["served"] == []


def test_served_names_and_the_gguf_digest(tmp_path):
    from tfgen.commands.export_cache import model_digest, served_name

    assert served_name("smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert served_name("HuggingFaceTB/SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct"
    model = tmp_path / "my-model.Q8_0.gguf"
    model.write_bytes(b"GGUF" + bytes(100))
    assert served_name(str(model)) == "my-model.Q8_0"
    assert served_name(str(tmp_path) + "/") == tmp_path.name
    assert model_digest(model) == hashlib.sha256(model.read_bytes()).hexdigest()


def start_server(arguments: list[str], env: dict) -> str:
    """Starts `tfgen serve` with `arguments` in a process, waits for "ready on ...", stops it with SIGTERM (status
    0 asserted) and returns its stderr up to "ready"."""
    process = subprocess.Popen([sys.executable, "-m", "tfgen.cli", "serve", "--port", "0", "--rest_api_port", "0",
                                *arguments], stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("ready on REST port"):
                break
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, lines
    finally:
        process.kill()
    return "".join(lines)


def test_start_up_says_what_it_does_and_a_second_start_compiles_nothing(own_model, tmp_path):
    """A real `tfgen serve --model` process: exporting, loading, warming up, then "ready on REST port N, gRPC port M
    (S s)", each line once; SIGTERM ends it with status 0. A second start takes the export from the cache and every
    XLA program from the compile cache the first start filled: it adds no entry (the export runs in a child process;
    made in the serving process, it renamed the loaded functions and the second start compiled everything again)."""
    env = dict(os.environ, TFGEN_CACHE_DIR=str(tmp_path), PYTHONPATH=os.pathsep.join(sys.path),
               TFGEN_COMPILE_CACHE="1")
    arguments = ["--model", own_model, "--signatures", "greedy", "--max-new-tokens", "2", "--slots", "0"]
    text = start_server(arguments, env)
    for words in ("exporting tiny-word to", "(first use)", "loading", "warming up", "ready on REST port", "gRPC port"):
        assert words in text, text
    # Once each: TensorFlow's SavedModel writer no longer gives the root logger a second handler.
    assert "INFO:tfgen" not in text, text

    def compiled_programs():
        return sorted(path.name for path in (tmp_path / "xla").rglob("*") if path.is_file() and "runs" not in
                      path.parts)

    first = compiled_programs()
    assert first, "the first start compiled nothing into the cache"
    text = start_server(arguments, env)
    assert "using the export cached in" in text and "ready on REST port" in text, text
    assert compiled_programs() == first


def test_the_child_export_command_and_its_error(own_model, tmp_path, cache_root, caplog):
    """`serve --model` exports with `tfgen export` in a child: each option is that command's flag (`-q` when the
    command is quiet), and the child's one-line error is this process's ValueError (the line is not printed twice)."""
    from tfgen.commands.export_cache import export_command, export_in_child

    options = dict(jit_compile=False, text=False, signatures=["greedy", "sample"], max_new_tokens=5, slot_length=64)
    with caplog.at_level("INFO", logger="tfgen"):
        argv = export_command("m.gguf", "out", version=1, **options)
    assert argv[1:] == ["-m", "tfgen.cli", "export", "out", "--model", "m.gguf", "--version", "1", "--no-jit",
                        "--no-text", "--signatures", "greedy,sample", "--max-new-tokens", "5", "--slot-length", "64"]
    with caplog.at_level("WARNING", logger="tfgen"):
        assert export_command("m.gguf", "out", version=1, **options) == [*argv, "-q"]
    with pytest.raises(ValueError, match="stop_strings"):
        export_command("m.gguf", "out", version=1, stop_strings=True)
    with pytest.raises(ValueError, match="--max-new-tokens must be in") as raised:
        export_in_child(own_model, str(tmp_path / "out"), version=1, max_new_tokens=0)
    assert "tfgen: error" not in str(raised.value)
