"""Hostile batch files: a resumed job never certifies a row changed on disk, an over-long or absurdly nested input
line is a bad row with its line number (at no memory cost), and a full disk or a file size limit ends a run with
one line, the job resumable.

One in-process job (module fixture) writes the reference output most tests compare with: the tiny model with batch
4, window 4, 8 sampled tokens and prompts of at most 16 tokens, as tests/test_batch_reliability.py, so the files
share one compiled program. The two subprocesses are the memory check (no model) and `ulimit -f` (the CLI).
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tfgen import Tokenizer
from tfgen.batch import jobfiles as jobfiles_module
from tfgen.batch import joblock as joblock_module
from tfgen.batch import run_batch_job
from tfgen.batch.inputs import MAX_JSON_DEPTH
from tfgen.batch.jobfiles import JobFiles, OutputWriteError
from tfgen.batch.joblock import OutputLock
from tfgen.batch.rows import MIN_RECORD_BYTES, record_byte_limit

OPTIONS = dict(batch_size=4, window=4, seed=(3, 4), on_error="skip", progress=False, do_sample=True,
               max_new_tokens=8)
CLI_OPTIONS = ["--batch-size", "4", "--window", "4", "--seed", "3", "4", "--on-error", "skip", "--do-sample",
               "--max-new-tokens", "8", "--strategy", "default", "--no-progress"]
ROWS = 40


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return Tokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def reference(tiny_model, tokenizer, tmp_path_factory):
    """(input path, finished output path) of an uninterrupted job over 40 rows (ten windows of 4)."""
    directory = tmp_path_factory.mktemp("hostile_batch")
    rng = np.random.default_rng(11)
    prompts = directory / "prompts.jsonl"
    prompts.write_text("".join(
        json.dumps({"id": f"q{index}", "prompt": " ".join(f"w{t}" for t in rng.integers(3, 97, size=count))}) + "\n"
        for index, count in enumerate(rng.integers(1, 13, size=ROWS))))
    output = str(directory / "out.jsonl")
    assert run_batch_job(tiny_model, str(prompts), output, tokenizer=tokenizer, **OPTIONS).rows == ROWS
    return str(prompts), output


def read_bytes(path):
    with open(path, "rb") as file:
        return file.read()


def as_partial(reference_output, directory, lines=None):
    """A copy of the finished job in `directory` turned back into a running one: its output (or `lines` in its
    place) as `.partial`, beside the manifest and the row digests. Returns the copy's output path."""
    directory.mkdir()
    output = str(directory / "out.jsonl")
    for suffix in (".job.json", ".digests"):
        shutil.copyfile(reference_output + suffix, output + suffix)
    with open(output + ".partial", "wb") as file:
        file.write(read_bytes(reference_output) if lines is None else b"".join(lines))
    return output


def tampered(line: bytes) -> bytes:
    """The row with its text replaced: still valid JSON, same id."""
    row = json.loads(line)
    return (json.dumps({**row, "text": "TAMPERED"}, ensure_ascii=False) + "\n").encode()


def test_a_row_changed_in_the_partial_output_is_refused_naming_its_line(tiny_model, tokenizer, reference, tmp_path):
    prompts, finished = reference
    lines = read_bytes(finished).splitlines(keepends=True)

    def resume(output):
        return run_batch_job(tiny_model, prompts, output, tokenizer=tokenizer, **OPTIONS)

    # A middle line edited (valid JSON, same id): refused, naming the line, and nothing is touched.
    edited = [*lines[:5], tampered(lines[5]), *lines[6:20]]
    output = as_partial(finished, tmp_path / "edited", edited)
    with pytest.raises(ValueError, match=r"line 6 of .*out\.jsonl\.partial is not the row this job wrote there .*"
                                         r"changed since it was written.*`head -n 5`"):
        resume(output)
    assert read_bytes(output + ".partial") == b"".join(edited)
    assert not os.path.exists(output)
    # The way out the message gives: keep the lines before it; the rest is generated again, as an uninterrupted run.
    with open(output + ".partial", "wb") as file:
        file.write(b"".join(edited[:5]))
    assert resume(output).resumed_from == 5
    assert read_bytes(output) == read_bytes(finished)

    # A row of the last write (which a power loss can leave as garbage) is cut and generated again: never kept.
    output = as_partial(finished, tmp_path / "last_write", [*lines[:38], tampered(lines[38]), lines[39]])
    assert resume(output).resumed_from == 38
    assert read_bytes(output) == read_bytes(finished)

    # Without the digests (removed, or a job of an older tfgen) no row is vouched for: all are generated again.
    output = as_partial(finished, tmp_path / "no_digests", [*lines[:5], tampered(lines[5]), *lines[6:20]])
    os.remove(output + ".digests")
    assert resume(output).resumed_from == 0
    assert read_bytes(output) == read_bytes(finished)


def test_a_row_changed_while_the_job_runs_is_never_certified(tiny_model, tokenizer, reference, tmp_path,
                                                            monkeypatch):
    prompts, finished = reference
    output = str(tmp_path / "out.jsonl")
    append = JobFiles.append

    def append_then_edit(files, records):
        append(files, records)
        if files.rows_written == 8:  # after the second window: another process edits row 2
            content = read_bytes(files.partial).splitlines(keepends=True)
            with open(files.partial, "wb") as file:
                file.write(b"".join([content[0], tampered(content[1]), *content[2:]]))

    monkeypatch.setattr(JobFiles, "append", append_then_edit)
    with pytest.raises(ValueError, match=r"line 2 of .*partial is not the row this job wrote there .*changed while "
                                         "the job ran"):
        run_batch_job(tiny_model, prompts, output, tokenizer=tokenizer, **OPTIONS)
    assert not os.path.exists(output)
    assert json.load(open(output + ".job.json"))["state"] == "running"  # no sha256 recorded for it


def test_over_long_and_deeply_nested_lines_are_bad_rows_with_their_line_numbers(tiny_model, tokenizer, tmp_path):
    limit = record_byte_limit(tiny_model.config.max_position_embeddings)
    assert limit == MIN_RECORD_BYTES  # 64 positions: the floor, 1 MiB
    long_prompt = "w5 " * (limit // 3 + 10)
    lines = [
        json.dumps({"id": "ok1", "prompt": "w5 w6"}),
        json.dumps({"id": "long", "prompt": long_prompt}),  # line 2: past the limit, never parsed
        "[" * 100_000 + "]" * 100_000,  # line 3: Python's parser would raise RecursionError
        json.dumps({"id": "ok2", "prompt": "[" * 300 + " w7"}),  # brackets inside a string do not nest
        json.dumps({"id": "meta", "input_ids": [5], "meta": json.loads("[" * 101 + "]" * 101)}),  # line 5
        json.dumps({"id": "ok3", "input_ids": [5, 6], "meta": {"a": [[1]]}}),
    ]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(lines))  # the last line without its newline
    output = str(tmp_path / "out.jsonl")
    with pytest.raises(ValueError) as error:
        run_batch_job(tiny_model, str(prompts), output, tokenizer=tokenizer, **{**OPTIONS, "on_error": "stop"})
    message = str(error.value)
    assert "3 bad row(s), nothing was generated" in message
    assert f"line 2: the line holds {len(lines[1]):,} bytes; a line may hold at most {limit:,}" in message
    assert f"line 3: JSON nested 100000 levels deep; at most {MAX_JSON_DEPTH} are allowed" in message
    assert f"line 5: JSON nested 102 levels deep; at most {MAX_JSON_DEPTH} are allowed" in message
    assert os.listdir(tmp_path) == ["prompts.jsonl"]
    # Skipped, the other rows are generated and the bad ones listed by line.
    result = run_batch_job(tiny_model, str(prompts), output, tokenizer=tokenizer, **OPTIONS)
    assert (result.rows, result.skipped) == (3, 3)
    assert [json.loads(line)["id"] for line in open(output)] == ["ok1", "ok2", "ok3"]
    assert [json.loads(line)["line"] for line in open(output + ".skipped.jsonl")] == [2, 3, 5]
    # A TFRecord record past the limit likewise.
    records = str(tmp_path / "prompts.tfrecord")
    with tf.io.TFRecordWriter(records) as writer:
        for row_id, prompt in [(b"t1", b"w5"), (b"t2", long_prompt.encode())]:
            features = {name: tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
                        for name, value in (("id", row_id), ("prompt", prompt))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    with pytest.raises(ValueError, match=f"record 2: the record holds [0-9,]+ bytes; a record may hold at most "
                                         f"{limit:,}"):
        run_batch_job(tiny_model, records, str(tmp_path / "r.jsonl"), tokenizer=tokenizer,
                      **{**OPTIONS, "on_error": "stop"})


_READ_HUGE_LINE = """
import json, sys, time
from tfgen.batch.inputs import input_records
from tfgen.batch.rows import RowRules, build_table, record_byte_limit

def kib(key):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key))

rules = RowRules(vocab_size=97, max_prompt_tokens=56, max_new_tokens=8, bos_token_id=1, tokenizer=None, unit="line")
list(input_records(sys.argv[2], "jsonl", 1 << 20))  # tf.io.gfile's first use, outside the measurement
with open("/proc/self/clear_refs", "w") as file:
    file.write("5")  # the peak (VmHWM) starts again from the current RSS
before, started = kib("VmRSS"), time.monotonic()
table, bad = build_table(input_records(sys.argv[1], "jsonl", record_byte_limit(64))[0], rules)
print(json.dumps({"peak_mb": (kib("VmHWM") - before) / 1024, "seconds": time.monotonic() - started,
                  "rows": len(table), "bad": [str(row) for row in bad]}))
"""


def test_a_210_mb_line_is_a_bad_row_read_in_bounded_memory(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    first, last = b'{"id": 1, "input_ids": [5]}\n', b'{"id": 3, "input_ids": [6, 7]}\n'
    with open(prompts, "wb") as file:
        file.write(first + b'{"id": 2, "prompt": "')
        for _ in range(210):
            file.write(b"w5 " * 349_525)  # 1 MiB at a time
        file.write(b'"}\n' + last)
    size = os.path.getsize(prompts)
    long_line = size - len(first) - len(last) - 1
    small = tmp_path / "small.jsonl"
    small.write_text('{"id": 1, "input_ids": [5]}\n')
    done = subprocess.run([sys.executable, "-c", _READ_HUGE_LINE, str(prompts), str(small)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    print(f"read {size / 1e6:.0f} MB with a {long_line / 1e6:.0f} MB line: {found}")
    assert found["rows"] == 2
    assert found["bad"] == [f"line 2: the line holds {long_line:,} bytes; a line may hold at most 1,048,576 (for this "
                            "model's positions), so its prompt could never fit"]
    assert found["peak_mb"] < 32  # one 1 MiB block at a time (the line was never held: 9 GB RSS before)


def test_a_file_size_limit_ends_the_command_with_one_line_and_the_same_command_resumes(
        tiny_model, tokenizer, model_dir, reference, tmp_path):
    prompts, finished = reference
    output = str(tmp_path / "out.jsonl")
    limit = 3000  # bytes per file: room for the manifest, the digests and the tokenizer's files, not the output
    assert os.path.getsize(finished) > limit > max(os.path.getsize(finished + suffix) for suffix in (".job.json",
                                                                                                       ".digests"))

    def limited():
        # As `ulimit -f`: a write past the limit raises SIGXFSZ, which Python ignores (from start-up, and inherited
        # here as ignored), so the write fails with EFBIG instead.
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    command = [sys.executable, "-m", "tfgen.cli", "batch", "--model", model_dir, "--input", prompts, "--output",
               output, *CLI_OPTIONS]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, preexec_fn=limited)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    last = done.stderr.splitlines()[-1]
    saved = read_bytes(finished)[:limit].count(b"\n") // 4 * 4  # the windows of 4 rows that fit whole
    assert last == (f"tfgen: error: output: could not write {output}.partial: File too large (the file size limit "
                    f"(`ulimit -f`) or the file system's largest file); {saved} of {ROWS} rows are saved in "
                    f"{output}.partial. Make room, then run the same command again to resume.")
    assert os.path.getsize(output + ".partial") == limit  # the rows flushed stay, and the write cut short
    resumed = run_batch_job(tiny_model, prompts, output, tokenizer=tokenizer, **OPTIONS)
    assert resumed.resumed_from == read_bytes(finished)[:limit].count(b"\n")  # whole rows of the cut write kept
    assert read_bytes(output) == read_bytes(finished)


def test_a_full_disk_ends_with_one_line_and_the_job_resumes(tiny_model, tokenizer, reference, tmp_path,
                                                           monkeypatch):
    prompts, finished = reference
    write_synced = jobfiles_module._write_synced
    output = str(tmp_path / "out.jsonl")
    # Writes: 1 the manifest; then per window its digests, then its rows. The disk fills up in the middle of the
    # third window's rows (half of them written), then in the middle of a window's digests.
    for failing, saved in ((7, 8), (4, 12)):
        calls = 0

        def full_disk(file, data):
            nonlocal calls
            calls += 1
            if calls == failing:
                write_synced(file, data[: len(data) // 2])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            write_synced(file, data)

        monkeypatch.setattr(jobfiles_module, "_write_synced", full_disk)
        with pytest.raises(OutputWriteError) as error:
            run_batch_job(tiny_model, prompts, output, tokenizer=tokenizer, **OPTIONS)
        written = "partial" if failing == 7 else "digests"
        assert str(error.value) == (
            f"output: could not write {output}.{written}: No space left on device (the disk is full); {saved} of "
            f"{ROWS} rows are saved in {output}.partial. Make room, then run the same command again to resume.")
        assert (error.value.errno, error.value.exit_status) == (errno.ENOSPC, 1)  # the command: one line, status 1
        monkeypatch.setattr(jobfiles_module, "_write_synced", write_synced)
    result = run_batch_job(tiny_model, prompts, output, tokenizer=tokenizer, **OPTIONS)
    assert result.resumed_from == 12
    assert read_bytes(output) == read_bytes(finished)


def test_no_room_for_the_tokenizer_digest_is_one_line(tiny_model, tokenizer, reference, tmp_path):
    prompts, _ = reference

    class Full:
        """The job's tokenizer, failing to save as the Rust tokenizer does on a file size limit."""

        def __call__(self, *args, **kwargs):
            return tokenizer(*args, **kwargs)

        def save_pretrained(self, directory):
            raise Exception("File too large (os error 27)")  # noqa: TRY002 (what the tokenizers library raises)

    with pytest.raises(OSError, match=r"^tokenizer: could not write it to a temporary folder .* to take its digest "
                                      r"for the job's manifest: Exception: File too large \(os error 27\)$"):
        run_batch_job(tiny_model, prompts, str(tmp_path / "out.jsonl"), tokenizer=Full(), **OPTIONS)


def test_no_room_for_the_lock_file_is_one_line_and_gives_the_lock_back(tmp_path, monkeypatch):
    class FullDisk:
        """The os module, with a disk that has no room for the lock's pid and host."""

        def __getattr__(self, name):
            return getattr(os, name)

        def write(self, descriptor, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    output = str(tmp_path / "out.jsonl")
    monkeypatch.setattr(joblock_module, "os", FullDisk())
    with pytest.raises(OSError) as error:
        OutputLock(output).acquire()
    assert str(error.value) == f"output: cannot write the job's lock file {output}.lock: No space left on device"
    assert error.value.errno == errno.ENOSPC
    monkeypatch.undo()
    lock = OutputLock(output)
    lock.acquire()  # given back, not held until the process ends
    lock.release()
