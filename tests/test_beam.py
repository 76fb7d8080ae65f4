"""tfgen.beam: `TFGenModelHandler` in Beam's RunInference and `python -m tfgen.beam` on the local runner write what
`tfgen batch` writes, row for row, whatever order and batches the rows come in (tiny Llama; the shipped SmolLM2)."""

from __future__ import annotations

import json
import os
import random

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.ml.inference.base import KeyedModelHandler, RunInference
from apache_beam.testing.util import assert_that, equal_to
from conftest import batch_reference, read_jsonl, with_row_options, word_level_tokenizer, write_jsonl
from llama_checkpoints import build_hf_model  # noqa: I001 (tests/ is on sys.path under pytest)

from tfgen.batch import run_batch_job
from tfgen.beam import TFGenModelHandler, main
from tfgen.beam.handler import BeamJob

NEW_TOKENS = 8
DIRECT = ["--runner=DirectRunner"]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A tiny random Llama (64 positions) with the word-level tokenizer ("w3" ... "w96")."""
    directory = tmp_path_factory.mktemp("beam_llama")
    build_hf_model("llama", directory)
    word_level_tokenizer().save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def loaded(llama_dir):
    """(model, tokenizer) as every handler of this process loads them: one model, so one set of compiled programs
    for the Beam pipelines and the `tfgen batch` runs they are compared with."""
    job = BeamJob(llama_dir, None, dict(batch_size=8, seed=[0, 0], raw=False, chat_template_kwargs=None,
                                        generate_kwargs={"max_new_tokens": NEW_TOKENS}))
    return job.model, job.tokenizer


def _rows(count: int, sampled: bool) -> list[dict]:
    """`count` rows with prompts of 1 to 40 words (three length buckets); sampled jobs give some rows their own
    seed, temperature, top_p or budget, greedy ones some rows their own budget."""
    rng = np.random.default_rng(7)
    rows = []
    for index in range(count):
        words = rng.integers(3, 97, rng.integers(1, 41))
        row = {"id": f"row-{index}" if index % 3 else index, "prompt": " ".join(f"w{w}" for w in words)}
        rows.append(with_row_options(row, index, rng, sampled, NEW_TOKENS, 7, 11))
    return rows


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_pipeline_writes_tfgen_batchs_rows_also_reshuffled_and_rebatched(loaded, llama_dir, tmp_path, sampled):
    """200 rows of mixed lengths: `python -m tfgen.beam` on the DirectRunner writes `tfgen batch`'s output file
    line for line; over the same rows reshuffled and cut into other Beam batches, every row's output is the same."""
    model, tokenizer = loaded
    rows = _rows(200, sampled)
    # What `tfgen batch` runs on its loaded model, and the same job's flags.
    source, expected, job = batch_reference(model, tokenizer, rows, tmp_path, sampled, NEW_TOKENS)
    output = tmp_path / "beam.jsonl"
    status = main(["--input", source, "--output", str(output), "--model", llama_dir, *job, *DIRECT])
    assert status == 0
    assert output.read_bytes() == expected.read_bytes()
    assert {row["finish_reason"] for row in read_jsonl(output)} >= {"length"}

    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    again = tmp_path / "shuffled.jsonl"
    status = main(["--input", write_jsonl(tmp_path / "shuffled_rows.jsonl", shuffled), "--output", str(again),
                   "--model", llama_dir, *job, "--min-batch-size", "1", "--max-batch-size", "13", *DIRECT])
    assert status == 0
    by_id = {json.dumps(row["id"]): row for row in read_jsonl(expected)}
    assert read_jsonl(again) == [by_id[json.dumps(row["id"])] for row in shuffled]


def test_tfrecord_input_gives_tfgen_batchs_rows(loaded, llama_dir, tmp_path):
    """tf.train.Example records (int64 id, input_ids) in, as `tfgen batch` reads them: the same output rows."""
    import tensorflow as tf

    model, tokenizer = loaded
    source = str(tmp_path / "rows.tfrecord")
    rng = np.random.default_rng(3)
    with tf.io.TFRecordWriter(source) as writer:
        for index in range(10):
            ids = rng.integers(3, 97, rng.integers(1, 30)).tolist()
            features = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[100 + index])),
                        "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    expected = tmp_path / "batch.jsonl"
    run_batch_job(model, source, expected, tokenizer=tokenizer, max_new_tokens=NEW_TOKENS, progress=False)
    output = tmp_path / "beam.jsonl"
    assert main(["--input", source, "--output", str(output), "--model", llama_dir, "--max-new-tokens",
                 str(NEW_TOKENS), *DIRECT]) == 0
    assert output.read_bytes() == expected.read_bytes()
    assert [row["id"] for row in read_jsonl(output)] == list(range(100, 110))


def test_keyed_model_handler_keeps_keys_and_returns_batch_rows(loaded, llama_dir):
    """`KeyedModelHandler(TFGenModelHandler)`: each key comes back with its row's `PredictionResult`, whose
    inference is the row `tfgen batch` writes (text, token ids, finish reason)."""
    from tfgen.batch import batch_generate

    model, tokenizer = loaded
    rows = _rows(12, sampled=False)
    expected = batch_generate(model, rows, tokenizer=tokenizer, max_new_tokens=NEW_TOKENS)
    handler = KeyedModelHandler(TFGenModelHandler(llama_dir, max_new_tokens=NEW_TOKENS, max_batch_size=5))
    with beam.Pipeline(argv=DIRECT) as pipeline:
        results = (pipeline
                   | beam.Create([(f"key-{index}", row) for index, row in enumerate(rows)])
                   | RunInference(handler)
                   | beam.MapTuple(lambda key, result: (key, result.example["id"], result.inference)))
        assert_that(results, equal_to([(f"key-{index}", row["id"], output)
                                       for index, (row, output) in enumerate(zip(rows, expected))]))
    assert {"text", "token_ids", "finish_reason", "id"} == set(expected[0])


def test_bad_options_and_models_are_refused_naming_them_before_loading(tmp_path, capsys):
    with pytest.raises(ValueError, match="'temprature' \\(did you mean 'temperature'\\?\\)"):
        TFGenModelHandler(str(tmp_path), max_new_tokens=4, temprature=0.5)
    with pytest.raises(FileNotFoundError, match="no_such_model"):
        TFGenModelHandler(str(tmp_path / "no_such_model"), max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens: required"):
        TFGenModelHandler(str(tmp_path))
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        TFGenModelHandler(str(tmp_path), batch_size=0, max_new_tokens=4)
    with pytest.raises(ValueError, match="min_batch_size=9 is over max_batch_size=4"):
        TFGenModelHandler(str(tmp_path), min_batch_size=9, max_batch_size=4, max_new_tokens=4)
    with pytest.raises(TypeError, match="model: a path"):
        TFGenModelHandler(None, max_new_tokens=4)
    source = write_jsonl(tmp_path / "rows.jsonl", [{"id": 1, "prompt": "w5"}])
    status = main(["--input", source, "--output", str(tmp_path / "out.jsonl"), "--model",
                   str(tmp_path / "no_such_model"), "--max-new-tokens", "4", *DIRECT])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "no_such_model" in err
    (tmp_path / "bad.jsonl").write_text('{"id": 1, "prompt": "w5"}\n{"id": 1, "prompt": "w6"}\nnot json\n')
    status = main(["--input", str(tmp_path / "bad.jsonl"), "--output", str(tmp_path / "out.jsonl"), "--model",
                   str(tmp_path), "--max-new-tokens", "4", *DIRECT])
    err = capsys.readouterr().err
    assert status == 2 and "line 2: duplicate id 1 (first on line 1)" in err and "line 3: malformed JSON" in err
    assert not os.path.exists(tmp_path / "out.jsonl")


def test_bad_rows_fail_the_pipeline_naming_the_row(loaded, llama_dir):
    """A row with an option a job cannot take per row, or a bad value, fails the bundle naming the row's id and
    the option (Beam's retries would fail the same way: nothing is written)."""
    handler = TFGenModelHandler(llama_dir, max_new_tokens=NEW_TOKENS)
    job = handler.load_model()
    with pytest.raises(ValueError, match=r"row 'b': 'top_k': a per-row top_k is not supported") as error:
        handler.run_inference([{"id": "a", "prompt": "w5"}, {"id": "b", "prompt": "w6", "top_k": 3}], job)
    assert "row 'a'" not in str(error.value)
    with pytest.raises(ValueError, match=r"row 7: 'max_new_tokens' is 99, over the job's max_new_tokens=8"):
        handler.run_inference([{"id": 7, "prompt": "w5", "max_new_tokens": 99}], job)
    with pytest.raises(ValueError, match=r"inference_args: not taken"):
        handler.run_inference([{"id": 7, "prompt": "w5"}], job, {"temperature": 2.0})
    with pytest.raises(Exception, match=r"row 'x': 'temperature': the job decodes greedily"):
        with beam.Pipeline(argv=DIRECT) as pipeline:
            _ = (pipeline | beam.Create([{"id": "x", "prompt": "w5", "temperature": 0.5}])
                 | RunInference(handler))


def test_the_command_names_a_bad_row_in_one_line(loaded, llama_dir, tmp_path, capfd):
    source = write_jsonl(tmp_path / "rows.jsonl", [{"id": "ok", "prompt": "w5"}, {"id": "x", "prompt": "w6",
                                                                                    "top_k": 2}])
    status = main(["--input", source, "--output", str(tmp_path / "out.jsonl"), "--model", llama_dir,
                   "--max-new-tokens", "4", *DIRECT])
    err = capfd.readouterr().err
    assert status == 2 and "row 'x': 'top_k': a per-row top_k is not supported" in err
    assert "Traceback" not in err and not os.path.exists(tmp_path / "out.jsonl")


def test_the_shipped_model_in_a_pipeline_writes_tfgen_batchs_rows(tmp_path):
    """SmolLM2-135M-Instruct (the shipped model; prompts go in its chat template): 8 rows, greedy, as tfgen batch."""
    from tfgen.hub.pull import pull

    gguf = os.fspath(pull("smollm2-135m-instruct", progress=False))
    # Short prompts: with the template's system turn, one length bucket, so one compiled program.
    rows = [{"id": index, "prompt": prompt} for index, prompt in enumerate(
        ["What is the capital of France?", "Hi", "Name a colour.", "2+2=", "Say yes.", "Name a sea.", "Why?",
         "Count to three."])]
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    output = tmp_path / "beam.jsonl"
    assert main(["--input", source, "--output", str(output), "--model", gguf, "--max-new-tokens", "3",
                 *DIRECT]) == 0
    job = TFGenModelHandler(gguf, max_new_tokens=3).load_model()  # the model the pipeline loaded, not another
    expected = tmp_path / "batch.jsonl"
    run_batch_job(job.model, source, expected, tokenizer=job.tokenizer, max_new_tokens=3, progress=False)
    assert output.read_bytes() == expected.read_bytes()


def test_the_shipped_model_samples_as_tfgen_batch_whatever_the_order(tmp_path):
    """SmolLM2-135M-Instruct, a sampled job of 48 chat rows (some with their own seed, temperature and top_p): the
    pipeline's file equals `tfgen batch`'s, and again with the rows reshuffled and batched differently."""
    from tfgen.hub.pull import pull

    gguf = os.fspath(pull("smollm2-135m-instruct", progress=False))
    subjects = ["France", "tea", "rain", "the moon", "a cat", "music", "bread", "Rome", "ice", "a river", "salt",
                "chess", "wind", "glass", "paper", "a bee"]
    rows = []
    for index in range(48):
        # Short prompts (1 to 6 words): with the template's system turn, one length bucket, one compiled program.
        row = {"id": index, "prompt": " ".join(["Tell", "me", "about"][:index % 4] + [subjects[index % 16]])}
        if index % 5 == 1:
            row["seed"] = 1000 + index
        if index % 7 == 2:
            row["temperature"], row["top_p"] = 0.7, 0.9
        rows.append(row)
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    options = ["--max-new-tokens", "3", "--do-sample", "--seed", "5", "6"]
    output = tmp_path / "beam.jsonl"
    assert main(["--input", source, "--output", str(output), "--model", gguf, *options, *DIRECT]) == 0
    job = TFGenModelHandler(gguf, max_new_tokens=3).load_model()  # the model the pipeline loaded, not another
    expected = tmp_path / "batch.jsonl"
    run_batch_job(job.model, source, expected, tokenizer=job.tokenizer, max_new_tokens=3, do_sample=True,
                  seed=[5, 6], progress=False)
    assert output.read_bytes() == expected.read_bytes()
    assert len({row["text"] for row in read_jsonl(expected)}) > 10  # sampled answers, not one repeated text
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)
    again = tmp_path / "again.jsonl"
    assert main(["--input", write_jsonl(tmp_path / "shuffled.jsonl", shuffled), "--output", str(again), "--model",
                 gguf, *options, "--max-batch-size", "5", *DIRECT]) == 0
    by_id = {row["id"]: row for row in read_jsonl(again)}
    assert [by_id[row["id"]] for row in read_jsonl(expected)] == read_jsonl(expected)
