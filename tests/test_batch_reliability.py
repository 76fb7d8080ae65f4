"""Batch jobs that cannot lose or mix data: the output lock, the finished output's checksum, the model and tokenizer
digest, rows that are not text, and Ctrl-C.

One in-process job (module fixture) writes the finished output most tests start from; it uses the tiny model with
batch 4, 8 sampled tokens and prompts of at most 16 tokens, as tests/test_batch.py does, so the two files share one
compiled program. Everything else is refused before anything compiles, except the one subprocess (Ctrl-C).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tokenizers
from conftest import TINY_GPT2

from tfgen import AutoModelForCausalLM, Tokenizer
from tfgen.batch import JobInterrupted, batch_generate, run_batch_job
from tfgen.batch.jobfiles import JobFiles
from tfgen.batch.joblock import OutputLock

BATCH = 4
SEED = (3, 4)
OPTIONS = dict(batch_size=BATCH, window=4, seed=SEED, on_error="skip", progress=False, do_sample=True,
               max_new_tokens=8)
CLI_OPTIONS = ["--batch-size", "4", "--window", "4", "--seed", "3", "4", "--on-error", "skip", "--do-sample",
               "--max-new-tokens", "8", "--strategy", "default", "--no-progress"]
CRASHING_CLI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crash_batch_job.py")


def input_lines():
    """12 good rows (ids q0 ... q11, 1-12 words) and, on lines 5 and 9, JSON that decodes to lone surrogates."""
    rng = np.random.default_rng(7)
    lines = [json.dumps({"id": f"q{index}", "prompt": " ".join(f"w{t}" for t in rng.integers(3, 97, size=count))})
             for index, count in enumerate(rng.integers(1, 13, size=12))]
    lines.insert(4, '{"id": "s1", "prompt": "w5 \\ud800 w6"}')  # line 5: valid JSON, not text
    lines.insert(8, '{"id": "x\\udfff", "prompt": "w7"}')  # line 9: the id is not text
    return lines


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return Tokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def finished_job(tiny_model, tokenizer, tmp_path_factory):
    """(input path, output path) of a finished job; tests copy the output before changing it."""
    directory = tmp_path_factory.mktemp("reliability_job")
    prompts = directory / "prompts.jsonl"
    prompts.write_text("\n".join(input_lines()) + "\n")
    output = str(directory / "out.jsonl")
    result = run_batch_job(tiny_model, str(prompts), output, tokenizer=tokenizer, **OPTIONS)
    assert (result.rows, result.skipped) == (12, 2)
    return str(prompts), output


def copy_job(output, directory):
    """A copy of a finished job's output, manifest and row digests in `directory`; returns the copy's output path."""
    directory.mkdir()
    copy = str(directory / "out.jsonl")
    for suffix in ("", ".job.json", ".digests"):
        shutil.copyfile(output + suffix, copy + suffix)
    return copy


def read_bytes(path):
    with open(path, "rb") as file:
        return file.read()


def test_rows_that_are_not_text_are_bad_rows(tiny_model, tokenizer, finished_job, tmp_path):
    prompts, output = finished_job
    # Skipped like any bad row, with line numbers; the other rows are all generated.
    skipped = [json.loads(line) for line in open(output + ".skipped.jsonl", encoding="utf-8")]
    assert [(row["line"], row["id"]) for row in skipped] == [(5, "s1"), (9, None)]
    assert skipped[0]["error"].startswith("'prompt' holds a lone surrogate '\\ud800' at character 3")
    assert skipped[1]["error"].startswith("'id' holds a lone surrogate '\\udfff' at character 1")
    assert [json.loads(line)["id"] for line in open(output)] == [f"q{index}" for index in range(12)]
    # Without skip, the error names the lines, before anything is written.
    stopped = str(tmp_path / "stopped.jsonl")
    with pytest.raises(ValueError) as error:
        run_batch_job(tiny_model, prompts, stopped, tokenizer=tokenizer, **{**OPTIONS, "on_error": "stop"})
    assert "line 5: 'prompt' holds a lone surrogate" in str(error.value)
    assert "line 9: 'id' holds a lone surrogate" in str(error.value)
    assert os.listdir(tmp_path) == []
    # TFRecord strings must be UTF-8 (a UTF-8-encoded surrogate is not), named by record.
    records = str(tmp_path / "prompts.tfrecord")
    with tf.io.TFRecordWriter(records) as writer:
        for row_id, prompt in [(b"t1", b"w5 \xed\xa0\x80"), (b"t\xff", b"w5"), (b"t3", b"w6")]:
            features = {name: tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
                        for name, value in (("id", row_id), ("prompt", prompt))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    with pytest.raises(ValueError) as error:
        run_batch_job(tiny_model, records, stopped, tokenizer=tokenizer, **{**OPTIONS, "on_error": "stop"})
    assert "2 bad row(s)" in str(error.value)
    assert "record 1: feature 'prompt' is not UTF-8" in str(error.value)
    assert "record 2: feature 'id' is not UTF-8" in str(error.value)
    assert os.listdir(tmp_path) == ["prompts.tfrecord"]
    # In memory too, by index.
    with pytest.raises(ValueError, match=r"index 1: 'prompt' holds a lone surrogate '\\ud800' at character 1"):
        batch_generate(tiny_model, ["w5", "w\ud800"], tokenizer=tokenizer, max_new_tokens=8)


def test_a_text_the_tokenizer_refuses_is_one_bad_row(tiny_model, tokenizer, tmp_path):
    class Picky:
        """The job's tokenizer, failing on any text that holds "w13"."""

        def __call__(self, texts, **options):
            if any("w13" in text for text in texts):
                raise RuntimeError("cannot tokenize w13")
            return tokenizer(texts, **options)

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": 1, "prompt": "w5 w6"}\n{"id": 2, "prompt": "w12 w13"}\n{"id": 3, "input_ids": [4]}\n')
    with pytest.raises(ValueError) as error:
        run_batch_job(tiny_model, str(prompts), str(tmp_path / "out.jsonl"), tokenizer=Picky(),
                      **{**OPTIONS, "on_error": "stop"})
    assert "1 bad row(s)" in str(error.value)
    assert "line 2: the tokenizer failed on 'prompt': RuntimeError: cannot tokenize w13" in str(error.value)


_HOLD_LOCK = """
import sys
from tfgen.batch.jobfiles import JobFiles
from tfgen.batch.joblock import OutputLock
OutputLock(sys.argv[1]).acquire()
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_second_run_on_a_locked_output_refuses_naming_the_first(tiny_model, tokenizer, finished_job):
    prompts, output = finished_job
    manifest = read_bytes(output + ".job.json")
    # Held by another process (it only takes the lock, as a running job does first).
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, output], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        expected = f"being written by another tfgen batch run \\(pid {holder.pid} on host {socket.gethostname()}"
        with pytest.raises(ValueError, match=expected):
            run_batch_job(tiny_model, prompts, output, tokenizer=tokenizer, **OPTIONS)
        assert read_bytes(output + ".job.json") == manifest  # refused before touching the job's files
    finally:
        holder.kill()  # SIGKILL: the OS releases its lock, nothing else does
        holder.wait()
    assert os.path.exists(output + ".lock")  # left behind by the killed holder, and no obstacle:
    again = run_batch_job(tiny_model, prompts, output, tokenizer=tokenizer, **OPTIONS)
    assert (again.resumed_from, again.new_tokens) == (12, 0)
    assert not os.path.exists(output + ".lock")  # a run removes its lock file when it ends
    # Held by this process (another open of the lock file conflicts as well); a refused run leaves it held. The
    # job's files take the lock themselves too (a run checks it early, then holds it from opening the files on).
    lock = OutputLock(output)
    lock.acquire()
    try:
        with pytest.raises(ValueError, match=f"pid {os.getpid()} on host"):
            run_batch_job(tiny_model, prompts, output, tokenizer=tokenizer, **OPTIONS)
        with pytest.raises(ValueError, match=f"pid {os.getpid()} on host"):
            JobFiles(output).start({}, [])
        assert lock.held
    finally:
        lock.release()
    # A run refused for another reason releases the lock it took.
    with pytest.raises(ValueError, match="another seed"):
        run_batch_job(tiny_model, prompts, output, tokenizer=tokenizer, **{**OPTIONS, "seed": (9, 9)})
    lock.acquire()
    lock.release()


def test_a_finished_output_that_was_changed_is_refused(tiny_model, tokenizer, finished_job, tmp_path):
    prompts, output = finished_job
    original = read_bytes(output)
    lines = original.splitlines(keepends=True)

    def rerun(copy):
        return run_batch_job(tiny_model, prompts, copy, tokenizer=tokenizer, **OPTIONS)

    cases = {
        "truncated": (original[:-10], "11 complete line(s) and an unfinished last line, but the job wrote 12 rows"),
        "line removed": (b"".join(lines[:5] + lines[6:]), "11 complete line(s), but the job wrote 12 rows"),
        "byte changed": (original.replace(b'"q3"', b'"q9"'), "12 lines as the job wrote, but other bytes"),
    }
    for name, (content, message) in cases.items():
        copy = copy_job(output, tmp_path / name.replace(" ", "_"))
        with open(copy, "wb") as file:
            file.write(content)
        with pytest.raises(ValueError, match=re.escape(f"it holds {message}") + ".*truncated or changed after"):
            rerun(copy)
        assert read_bytes(copy) == content, name  # refused, not overwritten
    # The way out the message gives for a truncated file: its complete rows are kept, the rest generated again.
    copy = str(tmp_path / "truncated" / "out.jsonl")
    os.rename(copy, copy + ".partial")
    assert rerun(copy).resumed_from == 11
    assert read_bytes(copy) == original


def test_resuming_with_another_weight_or_tokenizer_is_refused(tiny_model, tokenizer, model_dir, finished_job):
    prompts, output = finished_job
    # The same checkpoint loaded again (Keras names its variables "..._1/...") is the same model.
    reloaded = AutoModelForCausalLM.from_pretrained(model_dir)
    assert run_batch_job(reloaded, prompts, output, tokenizer=tokenizer, **OPTIONS).resumed_from == 12
    # One value changed, the last of the last weight with more than 64 values.
    weight = [weight for weight in reloaded.weights if np.prod(weight.shape) > 64][-1]
    values = np.array(weight.numpy())
    values.reshape(-1)[-1] += 1e-3
    weight.assign(values)
    with pytest.raises(ValueError, match="belongs to a job with another model"):
        run_batch_job(reloaded, prompts, output, tokenizer=tokenizer, **OPTIONS)
    # A tokenizer with one other token text decodes other text.
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, TINY_GPT2["vocab_size"] - 1)}, "x96": 96}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w3"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    other = Tokenizer(backend, eos_token="</s>", pad_token="<pad>", bos_token="<s>")
    with pytest.raises(ValueError, match=r"belongs to a job with another (input, )?tokenizer"):
        run_batch_job(tiny_model, prompts, output, tokenizer=other, **OPTIONS)


def test_ctrl_c_stops_cleanly_and_the_same_command_resumes(tiny_model, tokenizer, model_dir, finished_job, tmp_path):
    prompts, reference = finished_job
    reference_lines = read_bytes(reference).splitlines(keepends=True)
    output = str(tmp_path / "out.jsonl")
    # SIGINT (what Ctrl-C sends) arrives in the middle of row 6's line, i.e. inside the second window's write.
    cut = sum(map(len, reference_lines[:5])) + 20
    command = [sys.executable, CRASHING_CLI, str(cut), "SIGINT", "batch", "--model", model_dir, "--input", prompts,
               "--output", output, *CLI_OPTIONS]
    interrupted = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert interrupted.returncode == 130, interrupted.stderr[-3000:]
    assert "Traceback" not in interrupted.stderr
    assert interrupted.stderr.endswith(f"tfgen batch: interrupted (4 of 12 rows are saved in {output}.partial); "
                                       "run the same command again to resume.\n")
    assert os.path.getsize(output + ".partial") == cut  # what was written stays; the next run cuts the torn line
    assert not os.path.exists(output + ".lock")
    # The same job resumed (here in this process): every id once, the rows an uninterrupted run writes.
    resumed = run_batch_job(tiny_model, prompts, output, tokenizer=tokenizer, **OPTIONS)
    assert resumed.resumed_from == 5  # the cut write held row 5's whole line
    assert read_bytes(output) == read_bytes(reference)
    # In Python, Ctrl-C is a KeyboardInterrupt that says where the job stands.
    assert issubclass(JobInterrupted, KeyboardInterrupt)
    assert str(JobInterrupted(output, 4, 12)).startswith(f"interrupted (4 of 12 rows are saved in {output}.partial)")
