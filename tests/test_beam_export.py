"""tfgen.beam over a tfgen export: `python -m tfgen.beam --model EXPORT_DIR` (and `TFGenModelHandler(EXPORT_DIR)`)
runs the export's `greedy` / `sample` signatures with the tokenizer it carries and writes what `tfgen batch` writes
over the model folder it was exported from, byte for byte, whatever order the rows come in; options an export
cannot honour are refused naming them; the handler shares its model across processes; unknown row keys are bad
rows."""

from __future__ import annotations

import json
import os
import random
import shutil

import numpy as np
import pytest
from conftest import CHAT_TEMPLATE, batch_reference, read_jsonl, with_row_options, word_level_tokenizer, write_jsonl
from llama_checkpoints import build_hf_model  # noqa: I001 (tests/ is on sys.path under pytest)

from tfgen.batch import run_batch_job
from tfgen.beam import TFGenModelHandler, main

NEW_TOKENS = 8
DIRECT = ["--runner=DirectRunner"]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A tiny random Llama (64 positions) with the word-level tokenizer ("w3" ... "w96") and a chat template."""
    directory = tmp_path_factory.mktemp("beam_export_llama")
    build_hf_model("llama", directory)
    word_level_tokenizer().save_pretrained(directory)
    (directory / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return str(directory)


@pytest.fixture(scope="module")
def loaded(llama_dir):
    """(model, tokenizer) as `tfgen batch --model llama_dir` loads them: those every in-process handler of this
    process loads too, so one set of compiled programs serves the `tfgen batch` runs and the Beam jobs."""
    job = TFGenModelHandler(llama_dir, max_new_tokens=NEW_TOKENS).load_model()
    return job.model, job.tokenizer


@pytest.fixture(scope="module")
def export_dir(loaded, tmp_path_factory):
    """The model exported (XLA) with only the `greedy` and `sample` signatures and a buffer of NEW_TOKENS: the
    export base folder (version 1), carrying the tokenizer and its chat template."""
    from tfgen.export import export_saved_model

    model, tokenizer = loaded
    root = tmp_path_factory.mktemp("beam_exports") / "llama"
    export_saved_model(model, root, max_new_tokens=NEW_TOKENS, signatures=["greedy", "sample"], tokenizer=tokenizer,
                       text=False, slots=0)
    return str(root)


def _rows(count: int, sampled: bool) -> list[dict]:
    """`count` rows of 1 to 16 tokens: text prompts (1 to 12 words, rendered in the chat template: 4 tokens more),
    chats (a system turn and 1 to 7 words: 9 more), token ids; some with their own budget and, in a sampled job,
    their own seed, temperature or top_p. One length bucket (16 columns): each job compiles one program."""
    rng = np.random.default_rng(11)
    rows = []
    for index in range(count):
        words = [f"w{w}" for w in rng.integers(3, 97, rng.integers(1, 13))]
        row = {"id": f"row-{index}" if index % 3 else index}
        if index % 4 == 1:
            row["messages"] = [{"role": "system", "content": "w7 w8"}, {"role": "user", "content": " ".join(words[:7])}]
        elif index % 4 == 2:
            row["input_ids"] = rng.integers(3, 97, rng.integers(1, 17)).tolist()
        else:
            row["prompt"] = " ".join(words)
        rows.append(with_row_options(row, index, rng, sampled, NEW_TOKENS, 3, 7))
    return rows


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_pipeline_over_an_export_writes_tfgen_batchs_rows_also_reshuffled(loaded, export_dir, tmp_path, sampled):
    """40 rows of mixed lengths and kinds: the pipeline over the export writes `tfgen batch`'s output file over the
    model folder byte for byte; over the rows reshuffled and cut into other Beam batches, every row is the same."""
    model, tokenizer = loaded
    rows = _rows(40, sampled)
    source, expected, job = batch_reference(model, tokenizer, rows, tmp_path, sampled, NEW_TOKENS)
    output = tmp_path / "beam.jsonl"
    assert main(["--input", source, "--output", str(output), "--model", export_dir, *job, *DIRECT]) == 0
    assert output.read_bytes() == expected.read_bytes()
    written = read_jsonl(output)
    assert {row["finish_reason"] for row in written} >= {"length"} and all(row["text"] for row in written[:3])

    shuffled = rows[:]
    random.Random(5).shuffle(shuffled)
    again = tmp_path / "shuffled.jsonl"
    version_dir = os.path.join(export_dir, "1")  # a version folder names the export too
    assert main(["--input", write_jsonl(tmp_path / "shuffled_rows.jsonl", shuffled), "--output", str(again),
                 "--model", version_dir, *job, "--min-batch-size", "1", "--max-batch-size", "7", *DIRECT]) == 0
    by_id = {json.dumps(row["id"]): row for row in written}
    assert read_jsonl(again) == [by_id[json.dumps(row["id"])] for row in shuffled]


def test_options_an_export_cannot_honour_are_refused_naming_them(export_dir, tmp_path, capsys):
    """Before anything loads: an option the export fixed to another value (a penalty, stop strings, a regex), a
    budget over its buffer, a decoding whose signature it lacks, --quantize; the command says so in one line."""
    refusals = [
        (dict(repetition_penalty=1.3), r"repetition_penalty: the export fixed it when it was written"),
        (dict(stop_strings=["w5"]), r"stop_strings: the export fixed it"),
        (dict(regex="w5( w6)*"), r"regex: the export fixed it"),
        (dict(max_new_tokens=NEW_TOKENS + 1), rf"max_new_tokens: {NEW_TOKENS + 1} is over the export's buffer"),
        (dict(quantize="int8"), r"quantize: .* is an export"),
    ]
    for options, message in refusals:
        with pytest.raises(ValueError, match=message):
            TFGenModelHandler(export_dir, **{"max_new_tokens": NEW_TOKENS, **options})
    greedy_only = tmp_path / "greedy_only"
    shutil.copytree(os.path.join(export_dir, "1"), greedy_only / "1")
    info_file = greedy_only / "1" / "assets.extra" / "tfgen_export.json"
    info = json.loads(info_file.read_text())
    del info["signatures"]["sample"]
    info_file.write_text(json.dumps(info))
    with pytest.raises(ValueError, match=r"do_sample: the job samples, and the export has no 'sample' signature"):
        TFGenModelHandler(str(greedy_only), max_new_tokens=NEW_TOKENS, do_sample=True)
    source = write_jsonl(tmp_path / "rows.jsonl", [{"id": 1, "prompt": "w5"}])
    status = main(["--input", source, "--output", str(tmp_path / "out.jsonl"), "--model", export_dir,
                   "--max-new-tokens", "4", "--repetition-penalty", "1.5", *DIRECT])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "repetition_penalty: the export fixed it" in err
    assert not os.path.exists(tmp_path / "out.jsonl")


_USED: list = []  # the type of the job each run_inference got


class _Recording(TFGenModelHandler):
    """A handler noting what Beam hands `run_inference` (a module-level class: Beam pickles the handler by name)."""

    def run_inference(self, batch, model, inference_args=None):
        _USED.append(type(model).__name__)
        return super().run_inference(batch, model, inference_args)


@pytest.mark.parametrize("on_export", [False, True], ids=["model", "export"])
def test_a_model_shared_across_processes_gives_the_unshared_rows(llama_dir, export_dir, on_export):
    """`share_model_across_processes=True` (Beam's `large_model`: the job lives in one process of the machine and
    the workers call it through a proxy) on the DirectRunner: the same rows as the handler's own `generate`."""
    import apache_beam as beam
    from apache_beam.ml.inference.base import RunInference
    from apache_beam.testing.util import assert_that, equal_to

    rows = _rows(10, sampled=False)
    model = export_dir if on_export else llama_dir
    expected = TFGenModelHandler(model, max_new_tokens=NEW_TOKENS).load_model().generate(rows)
    _USED.clear()
    handler = _Recording(model, max_new_tokens=NEW_TOKENS, share_model_across_processes=True)
    assert handler.share_model_across_processes()
    with beam.Pipeline(argv=DIRECT) as pipeline:
        results = (pipeline | beam.Create(rows) | RunInference(handler)
                   | beam.Map(lambda result: json.dumps(result.inference, sort_keys=True)))
        assert_that(results, equal_to([json.dumps(row, sort_keys=True) for row in expected]))
    assert _USED and set(_USED) == {"_AutoProxyWrapper"}  # Beam's proxy to the one shared job: rows pickled through


def test_a_misspelled_row_key_is_a_bad_row_and_metadata_keys_are_named_once(loaded, export_dir, tmp_path, caplog,
                                                                              capfd):
    """`tfgen batch` (by line) and Beam (by id) refuse a row whose unknown key misspells a row key, suggesting it;
    other unknown keys are metadata (docs/batch.md), left out with one warning naming them."""
    import logging

    model, tokenizer = loaded
    rows = [{"id": "ok", "prompt": "w5", "source": "web"}, {"id": "t", "prompt": "w6", "temprature": 0.5},
            {"id": 3, "Top-P": 0.9, "input_ids": [5, 6]}, {"id": "m", "promt": "w7"}]
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(ValueError) as error:
        run_batch_job(model, source, tmp_path / "out.jsonl", tokenizer=tokenizer, max_new_tokens=NEW_TOKENS,
                      progress=False)
    message = str(error.value)
    assert "line 2: unknown key 'temprature' (did you mean 'temperature'?)" in message
    assert "line 3: unknown key 'Top-P' (did you mean 'top_p'?)" in message
    assert "line 4: unknown key 'promt' (did you mean 'prompt'?)" in message and "line 1" not in message

    status = main(["--input", source, "--output", str(tmp_path / "beam.jsonl"), "--model", export_dir,
                   "--max-new-tokens", str(NEW_TOKENS), *DIRECT])
    err = capfd.readouterr().err
    assert status == 2 and "row 't': unknown key 'temprature' (did you mean 'temperature'?)" in err
    assert "row 3: unknown key 'Top-P'" in err and "row 'ok'" not in err

    handler = TFGenModelHandler(export_dir, max_new_tokens=NEW_TOKENS)
    job = handler.load_model()
    with pytest.raises(ValueError, match=r"row 't': unknown key 'temprature' \(did you mean 'temperature'\?\)"):
        handler.run_inference(rows[:2], job)
    metadata = [{"id": f"meta-{index}", "prompt": "w5 w9", "category": "a", "prompt_id": index} for index in range(3)]
    with caplog.at_level(logging.WARNING):
        results = [handler.run_inference(metadata[index:index + 1], job)[0].inference for index in range(3)]
        expected = tmp_path / "metadata.jsonl"
        run_batch_job(model, write_jsonl(tmp_path / "metadata_rows.jsonl", metadata), expected,
                      tokenizer=tokenizer, max_new_tokens=NEW_TOKENS, progress=False)
    assert results == read_jsonl(expected)
    warnings = [record.getMessage() for record in caplog.records if "'category'" in record.getMessage()]
    assert len(warnings) == 2  # one for the three Beam batches of this process, one for the tfgen batch job
    assert all("left out as metadata: 'category', 'prompt_id'" in warning for warning in warnings)
