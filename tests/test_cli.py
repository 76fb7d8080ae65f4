"""The `tfgen` command line: `generate` end to end on a tiny checkpoint with a tokenizer, `--help` without
TensorFlow, no TensorFlow log lines, the shipped model as the default of `export` and `serve`, one-line errors for
hostile arguments, and Ctrl-C (status 130, no traceback, a second Ctrl-C ends the process at once)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_GPT2, word_level_tokenizer

from tfgen import AutoModelForCausalLM, Tokenizer
from tfgen.cli import main
from tfgen.commands.export_cache import DEFAULT_STRUCTURED_INPUTS
from tfgen.commands.serve import WHOLE_CALL_ONLY


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


def test_prompt_lookup_streams_the_greedy_text(model_dir, tiny_model, capsys, monkeypatch):
    from tfgen.decoding.speculative import SpeculativeLoop

    drafts = []  # the draft length of every speculative loop built (the CLI's model is its own, so it traces)
    real_init = SpeculativeLoop.__init__

    def recording_init(self, model, spec):
        real_init(self, model, spec)
        drafts.append(self.k)

    monkeypatch.setattr(SpeculativeLoop, "__init__", recording_init)
    prompt = "w5 w17 w33 w5 w17 w33 w5"
    assert main(["generate", "--model", model_dir, prompt, "--max-new-tokens", "8", "--greedy", "--prompt-lookup", "3",
                 "--max-matching-ngram-size", "3"]) == 0
    assert drafts and set(drafts) == {3}
    tokenizer = word_level_tokenizer()
    greedy = tiny_model.generate(np.array([tokenizer.encode(prompt)]), max_new_tokens=8, do_sample=False,
                                 jit_compile=False)
    assert capsys.readouterr().out.strip() == tokenizer.decode(greedy[0].numpy(), skip_special_tokens=True)


@pytest.mark.parametrize("options, message", [
    (["--prompt-lookup", "0"], "--prompt-lookup: `prompt_lookup_num_tokens` must be an integer from 1 to"),
    (["--prompt-lookup", "3", "--max-matching-ngram-size", "17"], "--max-matching-ngram-size: `max_matching_ngram"),
    (["--max-matching-ngram-size", "2"], "--max-matching-ngram-size needs --prompt-lookup"),
    (["--num-assistant-tokens", "5"], "--num-assistant-tokens needs --assistant-early-exit"),
    (["--assistant-early-exit", "0"], "--assistant-early-exit: `assistant_early_exit` must be"),
    (["--prompt-lookup", "3", "--assistant-early-exit", "1"], "choose one drafter"),
], ids=["zero_drafts", "huge_ngram", "ngram_alone", "drafts_alone", "zero_layers", "two_drafters"])
def test_drafting_flags_are_checked_before_the_model_loads(model_dir, capsys, options, message):
    assert main(["generate", "--model", model_dir, "w5"] + options) == 2  # refused before the tokenizer loads
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tfgen: error:") and message in err, err


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


@pytest.mark.parametrize("command", ["", "generate", "batch", "export", "serve", "bench", "pull"])
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
    from tfgen.generation.tf_startup import without_tf_lines_below as _without_tf_lines_below

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
    from tfgen.hub.default_model import DEFAULT_MODEL

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
        # The export `tfgen serve --model` would make: the `structured` signature for response_format included.
        assert model_path is None and options == {"structured_inputs": DEFAULT_STRUCTURED_INPUTS,
                                                  "leave_out": list(WHOLE_CALL_ONLY)}
        return real_export(model_path, out_dir, signatures=["greedy"], jit_compile=False, max_new_tokens=2)

    def fake_serve(export_dir, **options):
        served.update(options, export_dir=export_dir, name=tfgen.serving.load_export(export_dir).name)

    monkeypatch.setattr(export_command, "export_model", quick_export)
    monkeypatch.setattr(tfgen.serving, "serve", fake_serve)
    assert main(["serve", "--port", "0", "--rest_api_port", "0"]) == 0
    assert served["name"] == "stdlib-gpt2" and served["port"] == served["grpc_port"] == 0
    assert not os.path.exists(served["export_dir"])


def test_model_option_is_one_for_every_command_that_loads_a_model(capsys):
    helps = {}
    for command in ("generate", "batch", "export"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        helps[command] = re.search(r"--model MODEL (.*?shipped model)", text).group(1)
    assert len(set(helps.values())) == 1, helps
    assert all(word in helps["export"] for word in (".gguf", "hub id", "tfgen pull --list", "pulled on first use"))


def test_serve_help_defaults_match_the_server():
    import tfgen.serving
    from tfgen.commands import serve as serve_command

    assert serve_command.DEFAULT_PORT == tfgen.serving.DEFAULT_PORT
    assert serve_command.DEFAULT_MAX_REQUEST_BYTES == tfgen.serving.DEFAULT_MAX_REQUEST_BYTES


# --- hostile arguments ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options, named", [
    (["--max-new-tokens", "0"], "max_new_tokens"),
    (["--max-new-tokens", "-3"], "max_new_tokens"),
    (["--max-new-tokens", "99999999999"], "max_new_tokens"),
    (["--do-sample", "--seed", "99999999999", "1"], "seed"),
    (["--do-sample", "--temperature", "nan"], "temperature"),
    (["--top-p", "nan", "--do-sample"], "top_p"),
], ids=["zero_tokens", "negative_tokens", "huge_tokens", "huge_seed", "nan_temperature", "nan_top_p"])
def test_hostile_generate_options_are_one_clear_line(model_dir, capsys, options, named):
    assert main(["generate", "--model", model_dir, "w5"] + options) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tfgen: error:") and named in err, err


def test_empty_prompt_starts_from_bos(model_dir, tiny_model, capsys):
    """The README's promise: `tfgen generate ""` continues the model's bos token (was a mask-shape error)."""
    assert main(["generate", "--model", model_dir, "", "--max-new-tokens", "5", "--greedy", "--no-stream"]) == 0
    expected = tiny_model.generate(np.array([[TINY_GPT2["bos_token_id"]]]), max_new_tokens=5, do_sample=False)
    assert capsys.readouterr().out.strip() == word_level_tokenizer().decode(expected[0].numpy(), True).strip() != ""


def test_empty_prompt_without_bos_is_one_clear_line(model_dir, tmp_path, capsys):
    no_bos = tmp_path / "no_bos"
    shutil.copytree(model_dir, no_bos)
    for name in ("config.json", "generation_config.json"):
        config = json.loads((no_bos / name).read_text())
        config["bos_token_id"] = None
        (no_bos / name).write_text(json.dumps(config))
    assert main(["generate", "--model", str(no_bos), "", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tfgen: error:") and "bos_token_id" in err


@pytest.mark.parametrize("argv, named", [
    (["generate", "\udcff"], "argument prompt"),
    (["generate", "w5", "--stop-string", "ok", "--stop-string", "b\udce9te"], "argument --stop-string"),
    (["export", "out\udcff"], "argument OUT_DIR"),
], ids=["prompt", "stop_string", "out_dir"])
def test_arguments_that_are_not_utf8_are_one_clear_line(capsys, argv, named):
    """Bytes that are not UTF-8 reach Python as lone surrogates (surrogateescape): refused before anything runs."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tfgen: error:") and named in err and "UTF-8" in err
    assert "\\x" in err  # the offending bytes, as bytes


def test_serve_model_leaves_the_whole_call_only_signatures_out_unless_named(monkeypatch, tmp_path):
    """`tfgen serve --model` exports every signature but beam_search / contrastive / prompt_lookup; `--signatures`
    names its own set instead, `--signatures all` every one."""
    import tfgen.serving
    from tfgen.commands import export_cache

    exported = []
    monkeypatch.setattr(export_cache, "cached_export", lambda model, options: exported.append(options) or
                        (str(tmp_path), "m"))
    monkeypatch.setattr(tfgen.serving, "serve", lambda export_dir, **options: None)
    for flags in ([], ["--signatures", "all"], ["--signatures", "greedy,beam_search"]):
        assert main(["serve", "--model", "m", "--port", "0", "--rest_api_port", "0", *flags]) == 0
    assert [(options.get("signatures"), options.get("leave_out")) for options in exported] == [
        (None, list(WHOLE_CALL_ONLY)), (None, None), (["greedy", "beam_search"], None)]
    argv = export_cache.export_command("m.gguf", "out", version=1, leave_out=list(WHOLE_CALL_ONLY))
    assert argv[argv.index("--leave-out") + 1] == ",".join(WHOLE_CALL_ONLY)  # the child `tfgen export`'s flag


def test_export_leave_out_writes_the_default_signatures_but_those(model_dir, tmp_path, capsys):
    out = tmp_path / "lean"
    assert main(["export", str(out), "--model", model_dir, "--no-jit", "--no-text", "--max-new-tokens", "2",
                 "--slots", "0", "--leave-out", "beam_search,contrastive,prompt_lookup,serving_default"]) == 0
    info = json.loads((out / "1" / "assets.extra" / "tfgen_export.json").read_text())
    assert sorted(info["signatures"]) == ["greedy", "sample"]


@pytest.mark.parametrize("argv, error", [
    (["--leave-out", "beam"], "leave_out: unknown signature 'beam'"),
    (["--leave-out", "serving_default,greedy,sample,beam_search,contrastive,prompt_lookup,generate_text"],
     "leave_out: names every signature"),
    (["--leave-out", "greedy", "--signatures", "sample"], r"signatures and leave_out \(--signatures, --leave-out\)"),
], ids=["unknown", "every", "both"])
def test_export_leave_out_refusals(model_dir, tmp_path, capsys, argv, error):
    assert main(["export", str(tmp_path / "out"), "--model", model_dir, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.match(f"tfgen: error: {error}", err)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("option, value", [("--num-beams", "1000000"), ("--num-beams", "1"),
                                           ("--contrastive-top-k", "0"), ("--max-new-tokens", "-1"),
                                           ("--prompt-lookup", "0"), ("--max-matching-ngram-size", "17")])
def test_export_refuses_sizes_out_of_range_before_loading_the_model(model_dir, tmp_path, capsys, option, value):
    assert main(["export", str(tmp_path / "out"), "--model", model_dir, option, value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tfgen: error: {option}") and "must be" in err
    assert not (tmp_path / "out").exists()


# --- Ctrl-C ----------------------------------------------------------------------------------------------------------


def test_ctrl_c_while_compiling_ends_with_130_and_one_line():
    """SIGINT half a second after the compile notice, while XLA compiles the shipped model's program (seconds; its
    200 tokens then take about one more): one line, status 130, no traceback."""
    command = [sys.executable, "-m", "tfgen.cli", "generate", "def f(x):", "--greedy", "--max-new-tokens", "200"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        for line in process.stderr:
            seen.append(line)
            if "compiling generate" in line:
                time.sleep(0.5)
                process.send_signal(signal.SIGINT)
                break
        _, rest = process.communicate(timeout=60)
    finally:
        process.kill()
    err = "".join(seen) + rest
    assert process.returncode == 130, err
    assert err.rstrip().endswith("tfgen: interrupted") and "Traceback" not in err and "KeyboardInterrupt" not in err


# A stand-in for a long XLA compile: the main thread blocked in C, where Python cannot run its signal handler
# (glibc's sigwait retries on EINTR), until SIGUSR2 releases it.
BLOCKED_IN_C = """
import ctypes, signal, sys
from tfgen.commands.interrupts import interrupt_guard
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
libc = ctypes.CDLL(None)
wait_set, got = ctypes.create_string_buffer(128), ctypes.c_int()
libc.sigemptyset(wait_set)
libc.sigaddset(wait_set, int(signal.SIGUSR2))
try:
    with interrupt_guard():
        print("blocked", flush=True)
        libc.sigwait(wait_set, ctypes.byref(got))
        for _ in range(100):
            sum(range(1000))
        print("interrupt lost", flush=True)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
"""


@pytest.mark.parametrize("second_signal", [signal.SIGINT, signal.SIGUSR2], ids=["second_sigint", "compile_returns"])
def test_sigint_during_a_blocking_c_call(second_signal):
    """The first SIGINT cannot stop C code, but is acted on as soon as control returns to Python; a second SIGINT
    ends the process at once (status 130, one line) even while the main thread is still in C."""
    process = subprocess.Popen([sys.executable, "-c", BLOCKED_IN_C], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        assert process.stdout.readline() == "blocked\n"
        time.sleep(0.3)  # into sigwait (it prints just before)
        process.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert process.poll() is None  # still in C
        process.send_signal(second_signal)
        sent = time.monotonic()
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert time.monotonic() - sent < 10
    if second_signal == signal.SIGINT:
        assert (process.returncode, out, err) == (130, "", "tfgen: interrupted\n")
    else:
        assert (process.returncode, out, err) == (0, "KeyboardInterrupt\n", "")


def swallow_an_interrupt():
    """Like library code with a bare `except:` (Keras's `shape()`, TensorFlow's ConcreteFunctionGarbageCollector)."""
    try:
        signal.raise_signal(signal.SIGINT)  # Python runs the handler right here, inside the `try`
    except BaseException:  # noqa: BLE001 (the interrupt itself is what is caught)
        pass


def test_an_interrupt_lost_in_library_code_is_delivered_again(capsys):
    from tfgen.commands.interrupts import REDELIVERY_SECONDS, interrupt_guard

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt), interrupt_guard():
        swallow_an_interrupt()  # the first KeyboardInterrupt is lost ...
        while time.monotonic() - started < 20:  # ... and the command would carry on
            time.sleep(0.01)
    assert REDELIVERY_SECONDS <= time.monotonic() - started < 10
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


class InterruptedFinalizer:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)  # its KeyboardInterrupt escapes __del__, where Python cannot raise it


def test_an_interrupt_raised_in_a_finalizer_is_delivered_again_without_a_report(capsys):
    from tfgen.commands.interrupts import interrupt_guard

    reports = []
    previous_hook, sys.unraisablehook = sys.unraisablehook, reports.append
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt), interrupt_guard():
            instance = InterruptedFinalizer()
            del instance  # Python would print "Exception ignored in ...: KeyboardInterrupt" and carry on
            time.sleep(20)  # the interrupt comes again, and ends the wait as a Ctrl-C does
    finally:
        sys.unraisablehook = previous_hook
    assert time.monotonic() - started < 10
    assert reports == []


def test_an_interrupt_that_tensorflow_turns_into_an_error_still_ends_as_interrupted(monkeypatch, capsys):
    """TensorFlow reports a KeyboardInterrupt raised while it converts a Python sequence as a ValueError ("Attempt to
    convert a value ... with an unsupported type"): the command still ends as interrupted, not as bad input."""
    import tensorflow as tf

    from tfgen.commands import generate

    class InterruptedWhileConverted:
        signalled = False

        def __len__(self):
            return 1

        def __getitem__(self, index):
            if not self.signalled:  # one Ctrl-C (TensorFlow tries more than one way to convert)
                self.signalled = True
                signal.raise_signal(signal.SIGINT)
            raise IndexError(index)

    def run(args):
        tf.constant(InterruptedWhileConverted())

    monkeypatch.setattr(generate, "run", run)
    assert main(["generate", "w5"]) == 130
    assert capsys.readouterr().err == "tfgen: interrupted\n"
