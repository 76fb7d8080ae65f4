"""The benchmark harness (`benchmarks/`) and `tfgen bench` on the tiny checkpoint: it measures, compares and renders.

Speed itself is never asserted here (timed tests are flaky); what is asserted is that every library ran on the
same weights, produced the same greedy tokens, and that the report and plots carry the figures.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import types

import pytest

from benchmarks import checkpoints, first_call, report, run
from tfgen.cli import main
from tfgen.commands import bench as bench_command


@pytest.fixture(scope="module")
def quick_run(tiny_checkpoint, tmp_path_factory):
    """A `tfgen bench --quick` run of tfgen and HF PyTorch on the tiny checkpoint: (exit code, stdout, results)."""
    results_path = tmp_path_factory.mktemp("bench") / "results.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main([
            "bench", "--models", tiny_checkpoint[0], "--libraries", "tfgen,hf-torch", "--quick",
            "--json", str(results_path),
        ])
    return code, printed.getvalue(), json.loads(results_path.read_text())


def test_quick_run_measures_both_libraries_on_the_same_weights(quick_run):
    code, printed, results = quick_run
    assert code == 0
    (entry,) = results["models"]
    (cell,) = entry["cells"]
    assert (cell["strategy"], cell["batch"]) == ("greedy", 1)
    for library in ("tfgen", "hf-torch"):
        measured = cell["results"][library]
        assert "error" not in measured, measured
        assert measured["tokens_per_s"] > 0 and len(measured["seconds"]) == results["settings"]["runs"]
    # Greedy on the same weights: HF PyTorch produced exactly tfgen's tokens.
    assert cell["results"]["hf-torch"]["agreement_with_tfgen"] == 1.0
    assert entry["bandwidth_gbs"] > 0 and entry["roofline_tokens_per_s"] > 0
    assert "tfgen ÷ hf-torch" in printed and "% of roofline" in printed


def test_checkpoint_info_counts_the_bytes_a_decode_step_reads(tiny_checkpoint):
    info = checkpoints.checkpoint_info(tiny_checkpoint[0])
    embd, vocab, positions = 32, 97, 64
    assert info["vocab_size"] == vocab and info["n_layer"] == 2
    # The tied head reads the token embedding once per step; position embeddings are read one row at a time.
    assert info["weight_bytes_per_step"] == 4 * (info["parameters"] - positions * embd)


def test_runs_merge_into_one_report(quick_run):
    """A second run with another batch size joins the first run's model; its cells sort by batch."""
    first = quick_run[2]
    second = json.loads(json.dumps(first))
    second["settings"]["batches"] = [4]
    for entry in second["models"]:
        entry["first_call"], entry["bandwidth_gbs"], entry["roofline_tokens_per_s"] = {}, None, None
        for cell in entry["cells"]:
            cell["batch"] = 4
    merged = report.merge([second, first])
    assert merged["settings"]["batches"] == [4, 1]
    (entry,) = merged["models"]
    assert [cell["batch"] for cell in entry["cells"]] == [4, 1]
    assert entry["roofline_tokens_per_s"] == first["models"][0]["roofline_tokens_per_s"]
    assert "| greedy | 4 |" in report.report_tables(merged)


def test_docs_render_from_saved_results(quick_run, tmp_path):
    results_path = tmp_path / "results.json"
    results_path.write_text(json.dumps(quick_run[2]))
    page = tmp_path / "performance.md"
    page.write_text(f"# Performance\n\nprose before\n\n{report.BEGIN}\nold tables\n{report.END}\n\nprose after\n")
    assert run.main(["--from-json", str(results_path), "--docs", str(tmp_path)]) == 0
    text = page.read_text()
    assert "prose before" in text and "prose after" in text and "old tables" not in text
    assert "| greedy | 1 |" in text
    images = sorted(tmp_path.glob("perf_tokens_per_s_*.png"))
    assert images and images[0].stat().st_size > 1000 and images[0].name in text


def test_first_call_is_measured_in_a_fresh_process(tiny_checkpoint, tmp_path, monkeypatch):
    # From outside the checkout: the worker must find the `benchmarks` package all the same.
    monkeypatch.chdir(tmp_path)
    options = types.SimpleNamespace(strategies=["greedy"], prompt_len=4, new_tokens=4, worker_timeout=600)
    measured = first_call.first_call_in_subprocess("tfgen", tiny_checkpoint[0], options)
    assert "error" not in measured, measured
    assert measured["first_call_s"]["greedy"] > 0 and measured["load_s"] > 0 and measured["peak_rss_mb"] > 100


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--runs", "0"], "--runs must be positive"),
        (["--models", "no/such/dir"], "neither"),
        (["--first-call-only", "--no-first-call"], "contradict"),
    ],
)
def test_bad_options_are_one_clear_line(arguments, message, capsys):
    assert main(["bench", "--libraries", "tfgen", "--no-first-call", *arguments]) == 2
    assert message in capsys.readouterr().err


def test_unknown_library_is_rejected_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--libraries", "tfgen,vllm"])
    assert "vllm" in capsys.readouterr().err


def test_llama_cpp_is_unavailable_with_the_way_to_install_it(tmp_path, monkeypatch):
    from benchmarks.peers import Unavailable, load_runner

    with pytest.raises(Unavailable, match="GGUF files only"):
        load_runner("llama-cpp", str(tmp_path), 4)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # not installed, whatever this environment has
    with pytest.raises(Unavailable, match=r"llama-cpp-python is not installed \(pip install llama-cpp-python\)$"):
        load_runner("llama-cpp", str(tmp_path / "model.gguf"), 4)


def test_tfgen_bench_help_is_the_harness_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    assert printed.startswith("usage: tfgen bench") and "--from-json" in printed and "--docs" in printed


def test_bench_parser_imports_neither_the_harness_nor_tensorflow():
    """Building `tfgen bench`'s parser stays cheap: `tfgen --help` must not pay for the harness's imports."""
    probe = (
        "import argparse, sys\n"
        "from tfgen.commands import bench\n"
        "bench.add_parser(argparse.ArgumentParser().add_subparsers())\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('benchmarks', 'numpy', 'tensorflow')))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_bench_without_the_source_tree_says_where_the_harness_is(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_command, "BENCHMARKS_DIR", tmp_path / "benchmarks")
    assert main(["bench", "--quick"]) == 2
    assert "python -m benchmarks" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- keras-hub through tfgen


@pytest.fixture(scope="module")
def keras_hub_run(tmp_path_factory):
    """`python -m benchmarks.keras_hub_adapter` on the tiny random keras-hub Llama, every variant, greedy and beam at
    batch 2 for float32 and greedy for int8 / bfloat16: (exit code, stdout, results)."""
    pytest.importorskip("keras_hub")
    from benchmarks import keras_hub_adapter

    results_path = tmp_path_factory.mktemp("keras_hub_bench") / "results.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = keras_hub_adapter.main([
            "--model", "tiny-llama", "--strategies", "greedy,beam", "--batches", "2", "--runs", "1", "--warmup", "0",
            "--prompt-len", "4", "--new-tokens", "4", "--json", str(results_path),
        ])
    return code, printed.getvalue(), json.loads(results_path.read_text())


def test_keras_hub_adapter_bench_runs_both_libraries_on_one_model(keras_hub_run):
    code, printed, results = keras_hub_run
    assert code == 0 and results["benchmark"] == "keras_hub_adapter"
    assert [entry["variant"] for entry in results["variants"]] == ["float32", "int8", "bfloat16"]
    float32, int8, bfloat16 = results["variants"]
    assert (float32["backbone"], float32["dtype_policy"], bfloat16["dtype_policy"]) == (
        "LlamaBackbone", "float32", "bfloat16")
    # Quantized weights are stored in fewer bytes: int8 kernels (plus their scales), bfloat16 halves.
    assert int8["weight_bytes"] < float32["weight_bytes"] and int8["quantize_s"] > 0
    assert bfloat16["weight_bytes"] * 2 == float32["weight_bytes"]
    assert [(cell["strategy"], cell["batch"]) for cell in float32["cells"]] == [("greedy", 2), ("beam", 2)]
    for entry in results["variants"]:
        for cell in entry["cells"]:
            for library in ("tfgen", "keras-hub"):
                measured = cell["results"][library]
                assert "error" not in measured, (entry["variant"], cell["strategy"], measured)
                assert measured["tokens_per_s"] > 0 and measured["compile_s"] > 0 and len(measured["seconds"]) == 1
            agreement = cell["results"]["keras-hub"]["agreement_with_tfgen"]
            assert 0.0 <= agreement <= 1.0
    # The same float32 model object: keras-hub's own greedy and beam search produced exactly tfgen's tokens.
    assert [cell["results"]["keras-hub"]["agreement_with_tfgen"] for cell in float32["cells"]] == [1.0, 1.0]
    # The reduced-precision rows compare tfgen's tokens with float32 tfgen's on the same prompts.
    for entry in (int8, bfloat16):
        (cell,) = entry["cells"]
        assert cell["strategy"] == "greedy" and 0.0 <= cell["results"]["tfgen"]["agreement_with_float32"] <= 1.0
    assert "| float32 (" in printed and "tfgen ÷ keras-hub" in printed and "| int8 (" in printed


def test_keras_hub_adapter_bench_renders_its_own_section(keras_hub_run, tmp_path):
    from benchmarks import keras_hub_adapter

    results_path = tmp_path / "results.json"
    results_path.write_text(json.dumps(keras_hub_run[2]))
    page = tmp_path / "performance.md"
    page.write_text(f"# Performance\n\n{report.BEGIN}\nmain tables\n{report.END}\n\nprose\n")
    with contextlib.redirect_stdout(io.StringIO()):
        assert keras_hub_adapter.main(["--from-json", str(results_path), "--docs", str(page)]) == 0
    text = page.read_text()
    # Appended as its own section; the main benchmark's block and the prose stay.
    assert "main tables" in text and "prose" in text and keras_hub_adapter.SECTION in text
    assert text.index("prose") < text.index(keras_hub_adapter.BEGIN) and "| bfloat16 (" in text
    # Rendering again replaces the block in place (a later run's re-measured cells are marked).
    again = json.loads(json.dumps(keras_hub_run[2]))
    again["variants"] = again["variants"][:1]
    (tmp_path / "again.json").write_text(json.dumps(again))
    with contextlib.redirect_stdout(io.StringIO()):
        keras_hub_adapter.main(["--from-json", f"{results_path},{tmp_path / 'again.json'}", "--docs", str(page)])
    text = page.read_text()
    assert text.count(keras_hub_adapter.BEGIN) == 1 and text.count(keras_hub_adapter.SECTION) == 1
    assert "| greedy \\* | 2 |" in text and "| int8 (" in text


# ---------------------------------------------------------------------------------------------- speculative decoding


class _CharTokenizer:
    """A stand-in for SmolLM2's tokenizer: a conversation's text as one id per character (so the repeated code of
    the prompts gives prompt lookup matches), no real chat template."""

    pad_token_id = 0

    def apply_chat_template(self, messages, add_generation_prompt=False):
        text = " ".join(message["content"] for message in messages)[:48]
        return [3 + ord(character) % 90 for character in text]

    def decode(self, ids):
        return " ".join(str(token) for token in ids)


@pytest.fixture(scope="module")
def speculative_run(tmp_path_factory):
    """`python -m benchmarks.speculative` on a tiny random Llama (weights spread wide, so greedy choices are not
    near-ties) with a character tokenizer: one ad-hoc group with every kind of config, and the step timing."""
    import keras

    from benchmarks import speculative
    from tfgen.models.llama import LlamaConfig, LlamaForCausalLM

    keras.utils.set_random_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.3, bos_token_id=1, eos_token_id=2,
        pad_token_id=0))
    results_path = tmp_path_factory.mktemp("speculative_bench") / "results.json"
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed), \
            contextlib.redirect_stderr(io.StringIO()):
        patch.setattr(speculative, "load_model", lambda: (model, _CharTokenizer(), "tiny-llama"))
        code = speculative.main([
            "--groups", "1:code:greedy,pl-k4-n2,ee-l1-k2,as-l1-k2;2:code:sample,sample-pl-k3-n2", "--runs", "1",
            "--warmup", "0", "--new-tokens", "6", "--exit-agreement", "1", "--step-timing",
            "--step-cases", "1:1:stored,1:3:view:0:row,1:1:none:1", "--step-iterations", "2", "--step-repeats", "1",
            "--step-buffer", "16", "--json", str(results_path),
        ])
    return code, printed.getvalue(), json.loads(results_path.read_text())


def test_speculative_bench_measures_every_drafter_against_plain_decoding(speculative_run):
    code, printed, results = speculative_run
    assert code == 0 and results["benchmark"] == "speculative"
    greedy, sampled = results["groups"]
    assert (greedy["batch"], sampled["batch"]) == (1, 2) and greedy["prefill"]["median_s"] > 0
    assert list(greedy["results"]) == ["greedy", "pl-k4-n2", "ee-l1-k2", "as-l1-k2"]
    for group in results["groups"]:
        for name, result in group["results"].items():
            # Speculative decoding is exact: every row has the baseline's tokens (greedy, and sampling with a seed).
            assert result["rows_equal_to_baseline"] == group["batch"], (name, result)
            assert result["tokens_per_s"] > 0 and len(result["seconds"]) == 1
            if name not in ("greedy", "sample"):
                assert 0.0 <= result["acceptance"] <= 1.0 and result["tokens_per_round"] >= 1.0
                assert max(result["draft_rounds"]) == result["loop_rounds"] > 0
    # Batch-1 greedy groups measure how often the first layers' argmax is the model's (none for sampling).
    assert set(greedy["exit_agreement"]) == {"1"} and "exit_agreement" not in sampled
    assert [(row["tokens"], row["head"], row["layers"], row["index"]) for row in results["step_timing"]] == [
        (1, "stored", 2, "scalar"), (3, "view", 2, "row"), (1, "none", 1, "scalar")]
    assert "| prompt lookup k=4, n=2 |" in printed and "assistant (1-layer copy), K=2" in printed
    assert "sampling + prompt lookup k=3, n=2" in printed and "| 1 | 3 | view | 2 | row |" in printed


def test_speculative_bench_renders_its_own_section(speculative_run, tmp_path):
    from benchmarks import speculative

    results_path = tmp_path / "results.json"
    results_path.write_text(json.dumps(speculative_run[2]))
    page = tmp_path / "performance.md"
    page.write_text(f"# Performance\n\n{report.BEGIN}\nmain tables\n{report.END}\n\nprose\n")
    with contextlib.redirect_stdout(io.StringIO()):
        assert speculative.main(["--from-json", f"{results_path},{results_path}", "--docs", str(page)]) == 0
    text = page.read_text()
    assert "main tables" in text and text.index("prose") < text.index(speculative.BEGIN)
    assert text.count(speculative.SECTION) == 1 and "| early exit L=1, K=2 \\* |" in text


def test_speculative_bench_config_names():
    from benchmarks import speculative

    assert speculative.config_options("pl-k8-n3") == {
        "do_sample": False, "prompt_lookup_num_tokens": 8, "max_matching_ngram_size": 3}
    assert speculative.config_options("sample-ee-l15-k3")["assistant_early_exit"] == 15
    assert speculative.split_groups("b1-code,b4-code;2:story:greedy,pl-k4-n2") == [
        "b1-code", "b4-code", "2:story:greedy,pl-k4-n2"]
    for bad in ("pl-k8", "sample-greedy", "ee-k3-l8"):
        with pytest.raises(ValueError):
            speculative.config_options(bad)
