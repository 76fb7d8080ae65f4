"""`tfgen bench` and tools/bench.py on the tiny checkpoint: the harness measures, compares and renders.

Speed itself is never asserted here (timed tests are flaky); what is asserted is that every library ran on the
same weights, produced the same greedy tokens, and that the report and plots carry the figures.
"""

from __future__ import annotations

import importlib.util
import json
import types
from pathlib import Path

import pytest

from tfgen.cli import main
from tfgen.commands import bench

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quick_run(tiny_checkpoint, tmp_path_factory):
    """A `--quick` run of tfgen and HF PyTorch on the tiny checkpoint: (exit code, stdout, results dict)."""
    directory = tmp_path_factory.mktemp("bench")
    results_path = directory / "results.json"
    import contextlib
    import io

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
    info = bench.checkpoint_info(tiny_checkpoint[0])
    embd, vocab, positions = 32, 97, 64
    assert info["vocab_size"] == vocab and info["n_layer"] == 2
    # The tied head reads the token embedding once per step; position embeddings are read one row at a time.
    assert info["weight_bytes_per_step"] == 4 * (info["parameters"] - positions * embd)


def load_tool():
    spec = importlib.util.spec_from_file_location("bench_tool", ROOT / "tools" / "bench.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_runs_merge_into_one_report(quick_run):
    """A second run with another batch size joins the first run's model; its cells sort by batch."""
    first = quick_run[2]
    second = json.loads(json.dumps(first))
    second["settings"]["batches"] = [4]
    for entry in second["models"]:
        entry["first_call"], entry["bandwidth_gbs"], entry["roofline_tokens_per_s"] = {}, None, None
        for cell in entry["cells"]:
            cell["batch"] = 4
    merged = load_tool().merge([second, first])
    assert merged["settings"]["batches"] == [4, 1]
    (entry,) = merged["models"]
    assert [cell["batch"] for cell in entry["cells"]] == [4, 1]
    assert entry["roofline_tokens_per_s"] == first["models"][0]["roofline_tokens_per_s"]
    assert "| greedy | 4 |" in bench.report_tables(merged)


def test_docs_render_from_saved_results(quick_run, tmp_path):
    tool = load_tool()
    results_path = tmp_path / "results.json"
    results_path.write_text(json.dumps(quick_run[2]))
    page = tmp_path / "performance.md"
    page.write_text(f"# Performance\n\nprose before\n\n{tool.BEGIN}\nold tables\n{tool.END}\n\nprose after\n")
    assert tool.main(["--from-json", str(results_path), "--docs", str(tmp_path)]) == 0
    text = page.read_text()
    assert "prose before" in text and "prose after" in text and "old tables" not in text
    assert "| greedy | 1 |" in text
    images = sorted(tmp_path.glob("perf_tokens_per_s_*.png"))
    assert images and images[0].stat().st_size > 1000 and images[0].name in text


def test_first_call_is_measured_in_a_fresh_process(tiny_checkpoint):
    options = types.SimpleNamespace(strategies=["greedy"], prompt_len=4, new_tokens=4, worker_timeout=600)
    report = bench.first_call_in_subprocess("tfgen", tiny_checkpoint[0], options)
    assert "error" not in report, report
    assert report["first_call_s"]["greedy"] > 0 and report["load_s"] > 0 and report["peak_rss_mb"] > 100


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
