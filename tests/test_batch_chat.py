"""Chat batch jobs: `{"messages": [...]}` rows rendered with the model's chat template (and `prompt` rows as a user
message unless `--raw`), per-job `--stop-string`, `--regex`, `--json-schema`, `--chat-template-kwargs`, per-row
`max_new_tokens`, `temperature`, `top_p`, `seed` (honoured) and other option keys (refused by name), the default
budget and its stderr line, and a window that adapts to the job so that Ctrl-C saves what was finished.

The tiny tests share the session's tiny model (greedy and sampling programs of batch 4); the SmolLM2 test loads the
real model once and checks a 20-row chat job against in-process `generate()`, then interrupts and resumes it.
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
from conftest import copy_with_chat_template, left_padded_batch, read_jsonl, write_jsonl

from tfgen import Tokenizer
from tfgen.batch import JobInterrupted, batch_generate, row_seeds, run_batch_job
from tfgen.batch.jobfiles import JobFiles
from tfgen.cli import main
from tfgen.config.budget import budget_cut_message

BATCH = 4
NEW = 6
# Word-level (the tiny model's vocabulary is "w3" ... "w96"); `shout` is a template variable for
# --chat-template-kwargs.
TEMPLATE = ("{% for m in messages %}{{ bos_token }}{% if m.role == 'system' %}w10{% else %}w11{% endif %} "
            "{{ m.content }} {{ eos_token }}{% endfor %}{% if shout %} w13{% endif %}"
            "{% if add_generation_prompt %} w12{% endif %}")
CONVERSATIONS = [
    [{"role": "user", "content": "w20 w21"}],
    [{"role": "system", "content": "w30"}, {"role": "user", "content": "w40 w41 w42"}],
    [{"role": "user", "content": "w50"}, {"role": "assistant", "content": "w51 w52"},
     {"role": "user", "content": "w53 w54 w55 w56"}],
    [{"role": "user", "content": "w60 w61 w62 w63 w64 w65 w66 w67"}],
    [{"role": "user", "content": "w70", "name": "ann"}],  # keys besides role and content go to the template
]
PROMPTS = ["w80 w81", "w82 w83 w84 w85"]


@pytest.fixture(scope="module")
def chat_dir(model_dir, tmp_path_factory):
    """The tiny model with a chat template (`TEMPLATE`: conftest's, plus the `shout` keyword)."""
    return copy_with_chat_template(model_dir, tmp_path_factory.mktemp("batch_chat_model"), TEMPLATE)


@pytest.fixture(scope="module")
def chat_tokenizer(chat_dir):
    return Tokenizer.from_pretrained(chat_dir)


def alone(model, ids, seed=None, eos=2, **options):
    """(token_ids, finish_reason) of `model.generate` on one prompt alone, cut after the first `eos`. The prompt goes
    in as BATCH identical rows (rows never see each other), sharing the batch jobs' programs; `seed` is row 0's key
    (`[2]` as `generate` takes it, or a job's `[1, 2]` row key)."""
    if seed is not None and np.ndim(seed) == 2:
        seed = np.repeat(seed, BATCH, axis=0)
    row = model.generate(np.array([ids] * BATCH), seed=seed, **options).numpy()[0, len(ids):].tolist()
    if eos in row:
        return row[: row.index(eos) + 1], "eos"
    return row, "length"


def rendered(tokenizer, conversation, **kwargs):
    return tokenizer.apply_chat_template(conversation, add_generation_prompt=True, **kwargs)


def chat_rows():
    return ([{"id": f"c{index}", "messages": conversation} for index, conversation in enumerate(CONVERSATIONS)]
            + [{"id": f"p{index}", "prompt": prompt} for index, prompt in enumerate(PROMPTS)])


def test_message_and_prompt_rows_are_rendered_and_equal_generate_alone(tiny_model, chat_tokenizer):
    greedy = dict(do_sample=False, max_new_tokens=NEW)
    # In memory, a conversation may also be given as the list of messages itself.
    results = batch_generate(tiny_model, chat_rows() + [CONVERSATIONS[1]], tokenizer=chat_tokenizer,
                             batch_size=BATCH, **greedy)
    conversations = CONVERSATIONS + [[{"role": "user", "content": prompt}] for prompt in PROMPTS] + [CONVERSATIONS[1]]
    assert len(results) == len(conversations)
    for result, conversation in zip(results, conversations):
        tokens, reason = alone(tiny_model, rendered(chat_tokenizer, conversation), **greedy)
        assert (result["token_ids"], result["finish_reason"]) == (tokens, reason), result["id"]
        assert result["text"] == chat_tokenizer.decode(tokens, skip_special_tokens=True)
    # `raw`: prompt rows continue the plain text (messages rows still need and use the template).
    raw = batch_generate(tiny_model, chat_rows(), tokenizer=chat_tokenizer, batch_size=BATCH, raw=True, **greedy)
    for result, prompt in zip(raw[len(CONVERSATIONS):], PROMPTS):
        assert (result["token_ids"], result["finish_reason"]) == alone(tiny_model, chat_tokenizer.encode(prompt),
                                                                       **greedy)
    assert raw[: len(CONVERSATIONS)] == results[: len(CONVERSATIONS)]


def test_cli_chat_job_with_template_kwargs_stop_string_and_default_budget(chat_dir, tiny_model, chat_tokenizer,
                                                                           tmp_path, capsys):
    prompts = write_jsonl(tmp_path / "chats.jsonl", chat_rows())
    conversations = CONVERSATIONS + [[{"role": "user", "content": prompt}] for prompt in PROMPTS]
    prompt_ids = [rendered(chat_tokenizer, conversation, shout=True) for conversation in conversations]
    # No --max-new-tokens and no length in the model's config: the commands' budget, all the context the longest
    # prompt leaves (the tiny model has 64 positions), not HF's 20.
    budget = 64 - max(map(len, prompt_ids))
    assert 20 < budget < 1024
    plain = [alone(tiny_model, ids, do_sample=False, max_new_tokens=budget) for ids in prompt_ids]
    # A stop string that row c1 reaches after a few tokens.
    stop_at = 3
    stop = chat_tokenizer.decode(plain[1][0][stop_at - 1: stop_at])
    output = str(tmp_path / "out.jsonl")
    argv = ["batch", "--model", chat_dir, "--input", prompts, "--output", output, "--batch-size", str(BATCH),
            "--greedy", "--strategy", "default", "--no-progress", "--chat-template-kwargs", '{"shout": true}',
            "--stop-string", stop]
    assert main(argv) == 0
    err = capsys.readouterr().err
    rows = read_jsonl(output)
    cut = 0
    for row, (tokens, reason) in zip(rows, plain):
        texts = [chat_tokenizer.decode([token]) for token in tokens]
        stopped = next((index for index, text in enumerate(texts) if text == stop), None)
        if stopped is not None:
            tokens, reason = tokens[: stopped + 1], "stop"
        assert (row["token_ids"], row["finish_reason"]) == (tokens, reason), row["id"]
        cut += reason == "length"
    assert rows[1]["finish_reason"] == "stop" and len(rows[1]["token_ids"]) <= stop_at
    assert cut > 0
    assert (f"tfgen batch: {cut} of this run's {len(rows)} row(s) stopped at their budget (finish_reason "
            f"\"length\"): {budget_cut_message(budget)}\n") in err


def test_cli_regex_constrains_every_row(chat_dir, tmp_path, capsys):
    prompts = write_jsonl(tmp_path / "chats.jsonl", chat_rows()[:3])
    output = str(tmp_path / "out.jsonl")
    argv = ["batch", "--model", chat_dir, "--input", prompts, "--output", output, "--batch-size", str(BATCH),
            "--greedy", "--strategy", "default", "--no-progress", "--max-new-tokens", str(NEW), "--regex",
            "(w1[0-9])+"]
    assert main(argv) == 0, capsys.readouterr().err
    for row in read_jsonl(output):
        # The word-level tokens' texts are "w10" ... "w19" back to back, then eos where the pattern may end.
        assert row["token_ids"] and all(10 <= token <= 19 for token in row["token_ids"] if token != 2), row


@pytest.mark.parametrize("model, extra, expected, status", [
    ("plain", [], "line 2 is a chat ('messages'), which needs a chat template, and the model", 1),
    ("plain", ["--chat-template-kwargs", '{"shout": true}'], "--chat-template-kwargs: the model has no chat "
     "template to pass them to", 2),
    ("chat", ["--chat-template-kwargs", "[1]"], "--chat-template-kwargs: expected a JSON object", 2),
    ("chat", ["--chat-template-kwargs", "{shout"], "--chat-template-kwargs: not JSON", 2),
    ("chat", ["--chat-template-kwargs", '{"tokenize": true}'], "--chat-template-kwargs: 'tokenize' is set by the "
     "batch job", 2),
    ("chat", ["--json-schema", "SCHEMA"], "--json-schema: ", 2),
    ("chat", ["--regex", ""], "--regex: the pattern is empty", 2),
], ids=["messages_without_template", "kwargs_without_template", "kwargs_not_object", "kwargs_not_json",
        "kwargs_set_by_job", "schema_not_object", "empty_regex"])
def test_refusals_are_one_line_before_the_model_loads(model_dir, chat_dir, tmp_path, capsys, monkeypatch, model,
                                                      extra, expected, status):
    from tfgen.auto import models

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load_generation_model", no_load)
    schema = tmp_path / "schema.json"
    schema.write_text("[1, 2]")
    extra = [str(schema) if value == "SCHEMA" else value for value in extra]
    prompts = write_jsonl(tmp_path / "rows.jsonl", [{"id": 1, "prompt": "w5"}, {"id": 2, "messages": CONVERSATIONS[0]}])
    argv = ["batch", "--model", model_dir if model == "plain" else chat_dir, "--input", prompts, "--output",
            str(tmp_path / "out.jsonl"), "--strategy", "default", *extra]
    assert main(argv) == status
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tfgen: error: ") and expected in err, err


BAD_ROWS = [
    ({"id": 1, "messages": "w5"}, "'messages' must be a non-empty list of {'role', 'content'} objects, got a JSON str"),
    ({"id": 2, "messages": []}, "'messages' must be a non-empty list of {'role', 'content'} objects, got an "
     "empty list"),
    ({"id": 3, "messages": [{"role": "user", "content": "w5"}, {"content": "w6"}]}, "'messages[1]' has no 'role'"),
    ({"id": 4, "messages": [{"role": "user", "content": 5}]}, "'messages[0].content' must be a string, got a JSON int"),
    ({"id": 5, "messages": [5]}, "'messages[0]' must be an object with 'role' and 'content', got a JSON int"),
    ({"id": 6, "prompt": "w5", "messages": CONVERSATIONS[0]}, "needs exactly one of 'prompt' (text), 'messages'"),
    ({"id": 7, "prompt": "w5", "top_k": 5}, "'top_k': a per-row top_k is not supported; set it for the whole job"),
    ({"id": 8, "prompt": "w5", "max_tokens": 5}, "'max_tokens': use 'max_new_tokens'"),
    ({"id": 9, "prompt": "w5", "stop": ["w6"]}, "'stop': stop strings are set for the whole job (--stop-string)"),
    ({"id": 10, "prompt": "w5", "max_new_tokens": 0}, "'max_new_tokens' must be a positive integer, got 0"),
    ({"id": 11, "prompt": "w5", "max_new_tokens": NEW + 1}, f"'max_new_tokens' is {NEW + 1}, over the job's "
     f"max_new_tokens={NEW}"),
    ({"id": 12, "prompt": "w5", "temperature": 0.5}, "'temperature': the job decodes greedily, so a row's "
     "temperature would do nothing; sample with --do-sample"),
    ({"id": 13, "prompt": "w5", "seed": [1, 2]}, "'seed': the job decodes greedily"),
]


def test_bad_chat_rows_and_row_options_are_named_by_line_and_key(tiny_model, chat_tokenizer, tmp_path):
    rows = [{"id": 0, "prompt": "w5"}] + [row for row, _ in BAD_ROWS]
    prompts = write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(ValueError) as refused:
        run_batch_job(tiny_model, prompts, str(tmp_path / "out.jsonl"), tokenizer=chat_tokenizer, batch_size=BATCH,
                      do_sample=False, max_new_tokens=NEW, progress=False)
    message = str(refused.value)
    assert f"{len(BAD_ROWS)} bad row(s), nothing was generated" in message
    for line, (_, reason) in enumerate(BAD_ROWS, start=2):
        assert f"\n  line {line}: {reason}" in message, (line, message)
    # In a sampling job the sampling options are checked by value.
    values = [{"id": 1, "prompt": "w5", "temperature": -1}, {"id": 2, "prompt": "w5", "top_p": 2},
              {"id": 3, "prompt": "w5", "seed": "x"}, {"id": 4, "prompt": "w5", "seed": [1, 2**40]},
              {"id": 5, "prompt": "w5", "temperature": True}]
    with pytest.raises(ValueError) as refused:
        batch_generate(tiny_model, values, tokenizer=chat_tokenizer, batch_size=BATCH, do_sample=True,
                       max_new_tokens=NEW)
    message = str(refused.value)
    for expected in ("index 0: 'temperature' must be a number > 0", "index 1: 'top_p' must be a number in (0, 1]",
                     "index 2: 'seed' must be an integer or two integers [a, b], got 'x'",
                     "index 3: 'seed' values must fit in 32 bits", "index 4: 'temperature' must be a number"):
        assert expected in message, message


def test_row_options_are_honoured_and_part_of_the_input(tiny_model, chat_tokenizer, tmp_path):
    sampling = dict(do_sample=True, max_new_tokens=NEW)
    job_seed = (3, 4)
    rows = [
        {"id": "own-seed", "prompt": "w20 w21", "seed": [5, 6]},
        {"id": "int-seed", "prompt": "w22", "seed": 7},
        {"id": "cool", "prompt": "w23 w24 w25", "temperature": 0.5, "top_p": 0.8},
        {"id": "short", "prompt": "w26", "max_new_tokens": 2},
        {"id": "plain", "prompt": "w27 w28"},
    ]
    prompts = write_jsonl(tmp_path / "rows.jsonl", rows)
    output = str(tmp_path / "out.jsonl")
    result = run_batch_job(tiny_model, prompts, output, tokenizer=chat_tokenizer, batch_size=BATCH, seed=job_seed,
                           progress=False, **sampling)
    assert result.cut == sum(row["finish_reason"] == "length" for row in read_jsonl(output))
    written = {row["id"]: row for row in read_jsonl(output)}

    def expected(row, **options):
        ids = rendered(chat_tokenizer, [{"role": "user", "content": row["prompt"]}])
        return alone(tiny_model, ids, **{**sampling, **options})

    key = row_seeds(job_seed, ["plain"])
    assert written["own-seed"]["token_ids"] == expected(rows[0], seed=[5, 6])[0]
    assert written["int-seed"]["token_ids"] == expected(rows[1], seed=[0, 7])[0]
    cool = expected(rows[2], seed=row_seeds(job_seed, ["cool"]), temperature=0.5, top_p=0.8)
    assert written["cool"]["token_ids"] == cool[0]
    assert cool[0] != expected(rows[2], seed=row_seeds(job_seed, ["cool"]))[0]  # the row's knobs made a difference
    short = expected(rows[3], seed=row_seeds(job_seed, ["short"]))
    assert (written["short"]["token_ids"], written["short"]["finish_reason"]) == (short[0][:2], "length")
    assert written["plain"]["token_ids"] == expected(rows[4], seed=key)[0]
    # A row's options decide its output, so they are part of the input the job was run on.
    rows[2]["temperature"] = 0.6
    write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(ValueError, match="another input"):
        run_batch_job(tiny_model, prompts, output, tokenizer=chat_tokenizer, batch_size=BATCH, seed=job_seed,
                      progress=False, **sampling)


def interrupt_after(monkeypatch, limit: int) -> None:
    """Ctrl-C: SIGINT to this process once the job's files have taken `limit` bytes (the write that crosses it is
    cut there, as tests/crash_batch_job.py does in a subprocess)."""
    write = JobFiles.write
    written = 0

    def write_then_interrupt(files, data):
        nonlocal written
        crash = written + len(data) > limit
        data = data[: limit - written] if crash else data
        write(files, data)
        written += len(data)
        if crash:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(JobFiles, "write", write_then_interrupt)


def test_small_job_has_several_windows_so_ctrl_c_saves_rows(tiny_model, chat_tokenizer, tmp_path, monkeypatch):
    rows = [{"id": f"r{index}", "prompt": " ".join(f"w{20 + (index + k) % 70}" for k in range(1 + index % 5))}
            for index in range(20)]
    prompts = write_jsonl(tmp_path / "rows.jsonl", rows)
    options = dict(tokenizer=chat_tokenizer, batch_size=BATCH, do_sample=False, max_new_tokens=NEW, progress=False)
    reference = str(tmp_path / "reference.jsonl")
    run_batch_job(tiny_model, prompts, reference, **options)
    with open(reference + ".job.json") as file:
        assert json.load(file)["settings"]["window"] == BATCH  # 20 rows / 8, in whole groups: one group of 4
    with open(reference, "rb") as file:
        lines = file.readlines()
    output = str(tmp_path / "out.jsonl")
    interrupt_after(monkeypatch, sum(map(len, lines[:9])) + 5)  # in the third window's write
    with pytest.raises(JobInterrupted) as interrupted:
        run_batch_job(tiny_model, prompts, output, **options)
    assert (interrupted.value.saved, interrupted.value.rows) == (8, 20)
    monkeypatch.undo()
    assert run_batch_job(tiny_model, prompts, output, **options).resumed_from == 9  # the cut write held row 9 whole
    with open(output, "rb") as file, open(reference, "rb") as expected:
        assert file.read() == expected.read()


# ---- SmolLM2-135M-Instruct: 20 chat rows, row for row generate(); Ctrl-C and resume, byte for byte.

SMOLLM2_NEW = 16
QUESTIONS = ["What is the capital of France?", "Name a primary color.", "What is 2 + 2?", "Say hello in Spanish.",
             "Which planet is the largest?", "What do bees make?", "Name a fruit that is yellow.",
             "How many legs does a spider have?", "What is the opposite of hot?", "Which animal barks?",
             "What is frozen water called?", "Name a day of the week.", "What color is the sky on a clear day?",
             "How many days are in a week?", "What is the boiling point of water in Celsius?",
             "Which ocean is the largest?", "Who wrote Romeo and Juliet?", "What gas do plants breathe in?",
             "What is the square root of 9?", "Name a musical instrument with strings."]


@pytest.fixture(scope="module")
def smollm2():
    """(GGUF path, model, tokenizer) of SmolLM2-135M-Instruct (cached by `tfgen pull`)."""
    from tfgen import AutoModelForCausalLM, AutoTokenizer
    from tfgen.hub.pull import pull

    path = os.fspath(pull("smollm2-135m-instruct", progress=False))
    return path, AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def test_smollm2_chat_job_equals_generate_and_resumes_byte_for_byte(smollm2, tmp_path, monkeypatch):
    _, model, tokenizer = smollm2
    system = [{"role": "system", "content": "You are a helpful assistant. Answer in one short sentence, please."}]
    conversations = [(system if index % 3 == 0 else []) + [{"role": "user", "content": question}]
                     for index, question in enumerate(QUESTIONS)]
    prompts = write_jsonl(tmp_path / "chats.jsonl", [{"id": f"q{index}", "messages": conversation}
                                                     for index, conversation in enumerate(conversations)])
    # Every rendered chat is 33-48 tokens (one bucket), so the job and generate() share one compiled program.
    assert {model.generation_buckets.prompt_length(len(rendered(tokenizer, c))) for c in conversations} == {48}
    options = dict(tokenizer=tokenizer, batch_size=BATCH, do_sample=False, max_new_tokens=SMOLLM2_NEW,
                   progress=False)
    reference = str(tmp_path / "reference.jsonl")
    result = run_batch_job(model, prompts, reference, **options)
    assert (result.rows, result.skipped) == (20, 0)
    rows = read_jsonl(reference)
    (eos,) = model.generation_config.eos_token_ids()
    # generate() on the rendered chats, BATCH rows per call (left-padded; rows never see each other).
    for first in range(0, len(rows), BATCH):
        ids, mask = left_padded_batch([rendered(tokenizer, c) for c in conversations[first: first + BATCH]])
        sequences = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=SMOLLM2_NEW).numpy()
        for row, sequence in zip(rows[first: first + BATCH], sequences[:, ids.shape[1]:].tolist()):
            tokens, reason = (sequence[: sequence.index(eos) + 1], "eos") if eos in sequence else (sequence, "length")
            assert (row["token_ids"], row["finish_reason"]) == (tokens, reason), row["id"]
            assert row["text"] == tokenizer.decode(tokens, skip_special_tokens=True)
    assert any(row["text"].strip() for row in rows)
    # Ctrl-C (SIGINT) in the second window's write (the default window of a 20-row job is 4 rows), then the same
    # job again: it keeps what was saved and finishes with the rows an uninterrupted run writes.
    with open(reference, "rb") as file:
        lines = file.readlines()
    interrupt_after(monkeypatch, sum(map(len, lines[:6])) + 7)
    output = str(tmp_path / "out.jsonl")
    with pytest.raises(JobInterrupted) as interrupted:
        run_batch_job(model, prompts, output, **options)
    assert (interrupted.value.saved, interrupted.value.rows) == (4, 20)
    monkeypatch.undo()
    resumed = run_batch_job(model, prompts, output, **options)
    assert resumed.resumed_from == 6  # the cut write held rows 5 and 6 whole
    with open(output, "rb") as file, open(reference, "rb") as expected:
        assert file.read() == expected.read()
