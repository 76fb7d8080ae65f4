"""Batch generation: exact per-row results, 2 replicas == 1 device, crash-and-resume, bad input, the command line.

Every test of the tiny model uses prompts of at most 16 tokens and 8 new tokens, batch 4, so the in-process tests
share two compiled programs (greedy, sampling) with each other; the subprocess tests and the shipped-model test
compile their own.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import write_jsonl  # noqa: I001 (tests/ is on sys.path under pytest)

from tfgen import Tokenizer
from tfgen.batch import batch_generate, row_seeds, run_batch_job
from tfgen.cli import main
from tfgen.hub import default_model as defaults

BATCH = 4
MAX_NEW = 8
SEED = (3, 4)
SAMPLE = dict(do_sample=True, max_new_tokens=MAX_NEW)
GREEDY = dict(do_sample=False, max_new_tokens=MAX_NEW)
_rng = np.random.default_rng(0)
# Ragged lengths (1-14 tokens), so groups need left padding and sorting reorders rows.
PROMPT_IDS = [_rng.integers(3, 97, size=int(n)).tolist() for n in _rng.integers(1, 15, size=10)]


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return Tokenizer.from_pretrained(model_dir)


def generated_alone(model, prompt, seed=None, **options):
    """(token_ids, finish_reason) of `model.generate` on the prompt alone, cut after the first eos.

    The prompt goes in as BATCH identical rows (each with the row's key), which is the same as alone since rows
    never see each other, and shares the compiled program of the batch jobs below.
    """
    eos = options.get("eos_token_id", model.generation_config.eos_token_id)
    seeds = None if seed is None else np.repeat(seed, BATCH, axis=0)
    row = model.generate(np.array([prompt] * BATCH), seed=seeds, **options).numpy()[0, len(prompt) :].tolist()
    if eos in row:
        return row[: row.index(eos) + 1], "eos"
    return row, "length"


def job_log(caplog):
    """(level, message) of the batch package's log records."""
    records = [record for record in caplog.records if record.name.startswith("tfgen.batch")]
    return [(record.levelname, record.getMessage()) for record in records]


def test_greedy_rows_equal_generate_alone(tiny_model):
    # An eos that row 0 produces early (found by a plain greedy run), so "eos" endings and trimming get exercised.
    eos = generated_alone(tiny_model, PROMPT_IDS[0], **GREEDY)[0][2]
    options = dict(GREEDY, eos_token_id=eos, pad_token_id=0)
    results = batch_generate(tiny_model, PROMPT_IDS, batch_size=BATCH, window=6, **options)
    assert [result["id"] for result in results] == list(range(len(PROMPT_IDS)))
    for prompt, result in zip(PROMPT_IDS, results):
        tokens, reason = generated_alone(tiny_model, prompt, **options)
        assert (result["token_ids"], result["finish_reason"]) == (tokens, reason)
        assert result["text"] is None  # no tokenizer
    assert results[0]["finish_reason"] == "eos" and results[0]["token_ids"][-1] == eos
    assert any(result["finish_reason"] == "length" for result in results)


def test_sampled_rows_depend_on_job_seed_and_id_only(tiny_model):
    rows = [{"id": f"row-{index}", "input_ids": prompt} for index, prompt in enumerate(PROMPT_IDS)]
    results = batch_generate(tiny_model, rows, batch_size=BATCH, window=6, seed=SEED, **SAMPLE)
    for row, result in zip(rows, results):
        expected = generated_alone(tiny_model, row["input_ids"], seed=row_seeds(SEED, [row["id"]]), **SAMPLE)
        assert (result["token_ids"], result["finish_reason"]) == expected
    # Other batches, order and window: every row keeps its tokens.
    shuffled = batch_generate(tiny_model, rows[::-1], batch_size=BATCH, window=4, seed=SEED, **SAMPLE)
    assert shuffled == results[::-1]
    other_seed = batch_generate(tiny_model, rows, batch_size=BATCH, window=6, seed=(5, 6), **SAMPLE)
    assert [r["token_ids"] for r in other_seed] != [r["token_ids"] for r in results]
    # Keys come from the id's JSON text: the integer 1 and the string "1" are different rows.
    assert (row_seeds(SEED, [1]) != row_seeds(SEED, ["1"])).any()


_TWO_REPLICAS = """
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from tfgen import AutoModelForCausalLM
from tfgen.batch import batch_generate
model_dir, prompts = sys.argv[1], json.loads(sys.argv[2])
mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with mirrored.scope():
    mirrored_model = AutoModelForCausalLM.from_pretrained(model_dir)
report = {"replicas": mirrored.num_replicas_in_sync}
for name, options in json.loads(sys.argv[3]).items():
    report[name] = batch_generate(mirrored_model, prompts, strategy=mirrored, **options)
print(json.dumps(report))
"""


@pytest.mark.slow
def test_two_cpu_replicas_equal_one_device(tiny_model, model_dir):
    # 10 rows, window 10, batch 4: groups of 4, 4 and 2 rows, so the second step also runs a filler group.
    runs = {
        "greedy": dict(batch_size=BATCH, window=10, **GREEDY),
        "sampled": dict(batch_size=BATCH, window=10, seed=SEED, **SAMPLE),
    }
    done = subprocess.run(
        [sys.executable, "-c", _TWO_REPLICAS, model_dir, json.dumps(PROMPT_IDS), json.dumps(runs)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["replicas"] == 2
    for name, options in runs.items():
        single_device = batch_generate(tiny_model, PROMPT_IDS, **options)
        assert report[name] == json.loads(json.dumps(single_device)), name


# ----------------------------------------------------------------------------------------------------------
# Files: resume, bad input


def short_and_long_prompts():
    """16 prompts of 1-12 words (16-token bucket), then 16 of 20-30 words (32-token bucket)."""
    rng = np.random.default_rng(1)
    counts = list(rng.integers(1, 13, size=16)) + list(rng.integers(20, 31, size=16))
    return [
        {"id": f"q{index}", "prompt": " ".join(f"w{token}" for token in rng.integers(3, 97, size=int(count)))}
        for index, count in enumerate(counts)
    ]


@pytest.fixture(scope="module")
def resumable_job(tiny_model, tokenizer, tmp_path_factory):
    """(input path, reference output path, CLI arguments) of an uninterrupted in-process run."""
    directory = tmp_path_factory.mktemp("batch_job")
    prompts = write_jsonl(directory / "prompts.jsonl", short_and_long_prompts())
    reference = str(directory / "reference.jsonl")
    result = run_batch_job(
        tiny_model, prompts, reference, tokenizer=tokenizer, batch_size=BATCH, window=8, seed=SEED,
        progress=False, **SAMPLE,
    )
    assert (result.rows, result.skipped, result.resumed_from) == (32, 0, 0)
    arguments = ["--input", prompts, "--batch-size", str(BATCH), "--window", "8", "--seed", *map(str, SEED),
                 "--do-sample", "--max-new-tokens", str(MAX_NEW), "--strategy", "default"]
    return prompts, reference, arguments


# Runs `tfgen batch` in a process that SIGKILLs itself after appending a given number of output bytes.
CRASHING_CLI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crash_batch_job.py")


def cli(model_dir, arguments, output, crash_after_bytes=None):
    """`tfgen batch` in a subprocess (stdout and stderr piped), crashing after `crash_after_bytes` if given."""
    launcher = ["-m", "tfgen.cli"] if crash_after_bytes is None else [CRASHING_CLI, str(crash_after_bytes)]
    command = [sys.executable, *launcher, "batch", "--model", model_dir, "--output", output, *arguments]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_cli_killed_twice_then_resumed_equals_uninterrupted_run(model_dir, resumable_job, tmp_path):
    _, reference, arguments = resumable_job
    with open(reference, "rb") as file:
        reference_lines = file.readlines()
    output = str(tmp_path / "out.jsonl")
    partial = output + ".partial"

    # 1. The process SIGKILLs itself in the middle of row 14's line (inside the second window's write).
    cut = sum(map(len, reference_lines[:13])) + 20
    first = cli(model_dir, arguments, output, crash_after_bytes=cut)
    assert first.wait(timeout=600) == -signal.SIGKILL, first.communicate()[1][-3000:]
    assert os.path.getsize(partial) == cut and not os.path.exists(output)

    # 2. Resumed, then SIGKILLed from outside once the short-prompt windows are written: it is then compiling the
    # program for the long prompts (seconds), so the kill lands mid-job every time.
    second = cli(model_dir, arguments, output)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and second.poll() is None:
        with open(partial, "rb") as file:
            if file.read().count(b"\n") >= 16:
                break
        time.sleep(0.01)
    second.send_signal(signal.SIGKILL)
    _, stderr = second.communicate(timeout=60)
    assert second.returncode == -signal.SIGKILL, stderr[-3000:]
    assert "tfgen: resuming: 13 of 32 rows already written (dropped 20 bytes of an interrupted write)" in stderr
    with open(partial, "rb") as file:
        assert file.readlines() == reference_lines[:16]  # the torn line was cut, nothing doubled

    # 3. Resumed to the end: byte for byte the uninterrupted run's output.
    third = cli(model_dir, arguments, output)
    _, stderr = third.communicate(timeout=600)
    assert third.returncode == 0, stderr[-3000:]
    with open(output, "rb") as file:
        assert file.readlines() == reference_lines
    assert not os.path.exists(partial)
    assert json.load(open(output + ".job.json"))["state"] == "complete"
    assert "tfgen: resuming: 16 of 32 rows already written\n" in stderr and "16 already done" in stderr
    assert "| 32/32 [" in stderr and "tok/s]" in stderr  # the progress bar's last state


def test_resume_drops_garbage_left_by_a_power_loss(tiny_model, tokenizer, resumable_job, tmp_path, caplog):
    prompts, reference, _ = resumable_job
    with open(reference, "rb") as file:
        reference_lines = file.readlines()
    output = str(tmp_path / "out.jsonl")
    manifest = json.load(open(reference + ".job.json"))
    with open(output + ".job.json", "w") as file:
        json.dump({**manifest, "state": "running"}, file)
    # Ten synced rows, then blocks the file system extended but never wrote (zeros), holding a newline. The row
    # digests of the two windows written so far were synced before their rows (the second window's write is the
    # one the power loss interrupted).
    with open(output + ".partial", "wb") as file:
        file.write(b"".join(reference_lines[:10]) + b"\0" * 40 + b"\n" + b"\0" * 9)
    with open(reference + ".digests", "rb") as source, open(output + ".digests", "wb") as file:
        file.write(b"".join(source.readlines()[:2]))
    caplog.set_level(logging.INFO, logger="tfgen.batch")
    bar = io.StringIO()
    result = run_batch_job(tiny_model, prompts, output, tokenizer=tokenizer, batch_size=BATCH, window=8, seed=SEED,
                           progress_stream=bar, **SAMPLE)
    assert result.resumed_from == 10
    resumed = "resuming: 10 of 32 rows already written (dropped 50 bytes of an interrupted write)"
    assert job_log(caplog) == [("INFO", resumed)]
    assert "| 10/32 [" in bar.getvalue() and "| 32/32 [" in bar.getvalue() and "tok/s]" in bar.getvalue()
    with open(output, "rb") as file:
        assert file.readlines() == reference_lines


def test_finished_foreign_and_changed_jobs(tiny_model, tokenizer, resumable_job, tmp_path):
    prompts, reference, _ = resumable_job
    options = dict(tokenizer=tokenizer, batch_size=BATCH, window=8, seed=SEED, progress=False, **SAMPLE)
    # A finished job run again does nothing.
    again = run_batch_job(tiny_model, prompts, reference, **options)
    assert (again.resumed_from, again.new_tokens) == (32, 0)
    # Another seed (or input, model, batching) must not be mixed into existing results.
    with pytest.raises(ValueError, match="another seed"):
        run_batch_job(tiny_model, prompts, reference, **{**options, "seed": (9, 9)})
    # A file that no batch job wrote is never overwritten.
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text("precious\n")
    with pytest.raises(ValueError, match="no tfgen batch job wrote it"):
        run_batch_job(tiny_model, prompts, str(foreign), **options)
    assert foreign.read_text() == "precious\n"


BAD_LINES = [
    {"id": "a", "input_ids": PROMPT_IDS[0]},  # line 1: fine
    '{"id": "b", "input_ids": [5, 6',  # line 2: malformed JSON
    {"input_ids": [5, 6]},  # line 3: no id
    {"id": "a", "input_ids": [7]},  # line 4: duplicate id
    {"id": "c", "input_ids": [5] * 60},  # line 5: 60 + 8 new tokens > 64 positions
    {"id": "d", "input_ids": [5, 97]},  # line 6: outside the vocabulary
    "",  # line 7: blank, not a row
    {"id": "e", "prompt": "w9 w8 w7"},  # line 8: fine
]
BAD_REASONS = {2: "malformed JSON", 3: "missing 'id'", 4: "duplicate id 'a' (first on line 1)",
               5: "the prompt has 60 tokens", 6: "token id 97 is outside the vocabulary"}


def test_bad_rows_stop_before_generating(tiny_model, tokenizer, model_dir, tmp_path, capsys):
    prompts = write_jsonl(tmp_path / "bad.jsonl", BAD_LINES)
    output = str(tmp_path / "out.jsonl")
    with pytest.raises(ValueError) as error:
        run_batch_job(tiny_model, prompts, output, tokenizer=tokenizer, batch_size=BATCH, progress=False, **GREEDY)
    message = str(error.value)
    for line, reason in BAD_REASONS.items():
        assert f"line {line}: {reason}" in message
    assert "line 1:" not in message and "line 7:" not in message and "line 8:" not in message
    assert os.listdir(tmp_path) == ["bad.jsonl"]  # nothing written, not even a manifest
    # The command line says the same in one clean message (exit status 2).
    # (With the budget GREEDY sets: without one the job's budget is what the longest prompt leaves, so line 5 fits.)
    assert main(["batch", "--model", model_dir, "--input", prompts, "--output", output, "--strategy", "default",
                 "--max-new-tokens", str(MAX_NEW)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tfgen: error:") and "line 5: the prompt has 60 tokens" in err and "Traceback" not in err
    # In memory, the index names the prompt.
    with pytest.raises(ValueError, match=r"index 1: 'input_ids' must be a list of integers"):
        batch_generate(tiny_model, [[5, 6], {"id": 9, "input_ids": "5 6"}], **GREEDY)


def test_bad_rows_skipped_are_listed(tiny_model, tokenizer, tmp_path, caplog):
    prompts = write_jsonl(tmp_path / "bad.jsonl", BAD_LINES)
    output = str(tmp_path / "out.jsonl")
    result = run_batch_job(tiny_model, prompts, output, tokenizer=tokenizer, batch_size=BATCH, on_error="skip",
                           progress=False, **GREEDY)
    assert (result.rows, result.skipped) == (2, 5)
    rows = [json.loads(line) for line in open(output)]
    good_rows = [BAD_LINES[0], BAD_LINES[-1]]
    expected = batch_generate(tiny_model, good_rows, tokenizer=tokenizer, batch_size=BATCH, **GREEDY)
    assert rows == expected
    assert rows[1]["text"] == tokenizer.decode(rows[1]["token_ids"], skip_special_tokens=True)
    skipped = [json.loads(line) for line in open(output + ".skipped.jsonl")]
    assert [row["line"] for row in skipped] == list(BAD_REASONS)
    assert [row["id"] for row in skipped] == [None, None, "a", "c", "d"]
    [(level, message)] = job_log(caplog)
    assert level == "WARNING" and message.startswith(f"skipping 5 bad row(s), listed in {output}.skipped.jsonl:")
    for row in skipped:
        assert row["error"].startswith(BAD_REASONS[row["line"]])
        assert f"line {row['line']}: {BAD_REASONS[row['line']]}" in message


def test_tfrecord_input(tiny_model, tmp_path, caplog):
    path = str(tmp_path / "prompts.tfrecord")

    def feature(values, kind):
        if kind == "bytes":
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    with tf.io.TFRecordWriter(path) as writer:
        for index, prompt in enumerate(PROMPT_IDS[:3]):
            row_id = feature([f"t{index}".encode()], "bytes") if index != 1 else feature([41], "int64")
            features = {"id": row_id, "input_ids": feature(prompt, "int64")}
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
        no_ids = {"id": feature([b"t3"], "bytes")}
        writer.write(tf.train.Example(features=tf.train.Features(feature=no_ids)).SerializeToString())
    output = str(tmp_path / "out.jsonl")
    result = run_batch_job(tiny_model, path, output, batch_size=BATCH, on_error="skip", progress=False, **GREEDY)
    assert (result.rows, result.skipped) == (3, 1)
    [(_, message)] = job_log(caplog)
    assert "record 4: needs exactly one of 'prompt' (text), 'messages' (a chat) and 'input_ids' (token ids)" in message
    rows = [json.loads(line) for line in open(output)]
    expected = batch_generate(
        tiny_model, [{"id": row_id, "input_ids": p} for row_id, p in zip(["t0", 41, "t2"], PROMPT_IDS)],
        batch_size=BATCH, **GREEDY,
    )
    assert rows == expected


def test_stop_strings_end_rows_with_the_jobs_tokenizer(tiny_model, tokenizer):
    options = dict(GREEDY, eos_token_id=None, pad_token_id=0)
    free = batch_generate(tiny_model, PROMPT_IDS, batch_size=BATCH, window=6, **options)
    # A word that row 0 writes mid-way: every row stops right after its first occurrence, none after the budget.
    # Two digits (ids stay below 97), so no other token's text starts with it and matches.
    stop_word = f"w{next(token for token in free[0]['token_ids'][1:] if token >= 10)}"
    stopped = batch_generate(tiny_model, PROMPT_IDS, batch_size=BATCH, window=6, tokenizer=tokenizer,
                             stop_strings=[stop_word], **options)
    stop_id = tokenizer.encode(stop_word, add_special_tokens=False)[0]
    for before, after in zip(free, stopped):
        if stop_id in before["token_ids"]:
            end = before["token_ids"].index(stop_id) + 1
            assert (after["token_ids"], after["finish_reason"]) == (before["token_ids"][:end], "stop")
        else:
            assert (after["token_ids"], after["finish_reason"]) == (before["token_ids"], "length")
    assert stopped[0]["finish_reason"] == "stop" and len(stopped[0]["token_ids"]) < MAX_NEW


def test_options_a_batch_cannot_honour_per_row(tiny_model):
    with pytest.raises(ValueError, match="max_length"):
        batch_generate(tiny_model, PROMPT_IDS, max_length=20)
    with pytest.raises(ValueError, match="min_length"):
        batch_generate(tiny_model, PROMPT_IDS, min_length=20)
    with pytest.raises(ValueError, match="num_return_sequences"):
        batch_generate(tiny_model, PROMPT_IDS, num_return_sequences=2, do_sample=True)
    with pytest.raises(ValueError, match="seed"):
        batch_generate(tiny_model, PROMPT_IDS, seed=[1, 2, 3])
    with pytest.raises(ValueError, match="batch_size"):
        batch_generate(tiny_model, PROMPT_IDS, batch_size=0)
    with pytest.raises(ValueError, match="max_time"):
        batch_generate(tiny_model, PROMPT_IDS, max_time=5.0)
    with pytest.raises(ValueError, match="stopping_criteria"):
        batch_generate(tiny_model, PROMPT_IDS, stopping_criteria=[lambda ids, scores: ids[:, -1] == 5])
    with pytest.raises(ValueError, match="stop_strings.*tokenizer"):
        batch_generate(tiny_model, PROMPT_IDS, stop_strings=["w5"])
    elsewhere = tf.distribute.OneDeviceStrategy("/cpu:0")  # the model was not loaded under its scope
    with pytest.raises(ValueError, match=r"strategy\.scope\(\)"):
        batch_generate(tiny_model, PROMPT_IDS, strategy=elsewhere)


# ----------------------------------------------------------------------------------------------------------
# The command line


def test_cli_defaults_to_the_shipped_model(tmp_path, capsys):
    rows = [{"id": "add", "prompt": "def add(a, b):"}, {"id": 2, "prompt": "import os"}]
    prompts = write_jsonl(tmp_path / "prompts.jsonl", rows)
    output = str(tmp_path / "out.jsonl")
    arguments = ["--input", prompts, "--output", output, "--max-new-tokens", "4", "--strategy", "default"]
    assert main(["batch", *arguments, "--no-progress"]) == 0
    results = [json.loads(line) for line in open(output)]
    assert [result["id"] for result in results] == ["add", 2]
    tokenizer = Tokenizer.from_pretrained(defaults.DEFAULT_MODEL)  # the tokenizer follows the model
    for result in results:
        assert 1 <= len(result["token_ids"]) <= 4
        assert result["text"] == tokenizer.decode(result["token_ids"], skip_special_tokens=True)
    assert "tfgen batch: 2 rows in " in capsys.readouterr().err
