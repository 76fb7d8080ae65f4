"""Issue 31, items 1 and 2: `tfgen generate` answers through a model's chat template by default (`--raw` continues
plain text), runs an answer to its end within `tfgen.config.budget`'s budget and says when that budget cut it or the
answer is empty; the compile notice states the figures asked for and the buckets; `tfgen chat` keeps a conversation
over turns (piped stdin, /reset, /system, /save, Ctrl-C, a conversation too long for the context) and its second
answer on SmolLM2 uses the first turn and is in-process `generate()`'s on the rendered conversation."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tfgen import AutoModelForCausalLM, AutoTokenizer, Tokenizer
from tfgen.cli import main
from tfgen.config.budget import answer_budget, budget_cut_message
from tfgen.generation.mixin import TFGenerationMixin

POSITIONS = 64  # the tiny model's context (conftest.TINY_GPT2's n_positions)


@pytest.fixture(scope="module")
def tokenizer(chat_model_dir):
    return Tokenizer.from_pretrained(chat_model_dir)


_MODELS: dict = {}  # (use, path) -> the model: loaded once per module, so its compiled programs are shared


def model_for(path, use: str = "generate"):
    """The module's model of `path` for `use` ("generate": default buckets; "chat": the chat sets its own)."""
    key = (use, str(path))
    if key not in _MODELS:
        _MODELS[key] = AutoModelForCausalLM.from_pretrained(path)
    return _MODELS[key]


@pytest.fixture(autouse=True)
def shared_models(monkeypatch):
    """`tfgen generate` loads the module's models (`model_for`): its model is in-process `generate()`'s reference."""
    from tfgen.auto import models

    monkeypatch.setattr(models, "load_generation_model", lambda path, **options: model_for(path))


@pytest.fixture
def reference(chat_model_dir):
    """What in-process `generate()` gives on the tiny chat model (default buckets)."""
    return model_for(chat_model_dir)


@pytest.fixture
def calls(monkeypatch):
    """Every `generate` call: (prompt ids, options), in order."""
    recorded = []
    real_generate = TFGenerationMixin.generate

    def recording_generate(self, inputs, *args, **options):
        recorded.append((np.asarray(inputs).tolist()[0], options))
        return real_generate(self, inputs, *args, **options)

    monkeypatch.setattr(TFGenerationMixin, "generate", recording_generate)
    return recorded


def answer_of(model, ids, max_new_tokens):
    """In-process greedy `generate()` of one prompt: the new tokens (the columns after the prompt)."""
    return model.generate(np.array([ids]), max_new_tokens=max_new_tokens, do_sample=False)[0].numpy()[len(ids):]


def rendered(tokenizer, *contents, system=None):
    """The ids of a conversation of alternating user / assistant `contents`, the assistant's turn opened."""
    messages = [] if system is None else [{"role": "system", "content": system}]
    messages += [{"role": ("user", "assistant")[i % 2], "content": text} for i, text in enumerate(contents)]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


# --- tfgen generate -------------------------------------------------------------------------------------------------


def test_generate_answers_through_the_template_by_default_and_says_when_the_budget_cut_it(
    chat_model_dir, tokenizer, reference, calls, capsys
):
    assert main(["generate", "--model", chat_model_dir, "w20 w21", "--greedy", "--system", "w30"]) == 0
    out, err = capsys.readouterr()
    ids = rendered(tokenizer, "w20 w21", system="w30")
    # Without --chat: the system and user messages rendered, the budget is the commands' default within the context.
    budget = answer_budget(reference.generation_config, len(ids), POSITIONS)
    assert budget == POSITIONS - len(ids)
    assert calls[0][0] == ids and calls[0][1]["max_new_tokens"] == budget
    new_tokens = answer_of(reference, ids, budget)
    assert 2 not in new_tokens  # the tiny model runs to the end of the budget
    assert out == tokenizer.decode(new_tokens, skip_special_tokens=True) + "\n"  # the answer alone
    assert f"tfgen: {budget_cut_message(budget)}\n" in err
    # The compile notice: the figures asked for, the buckets beside them.
    assert (f"tfgen: compiling generate for batch 1, prompt length {len(ids)} (bucket 16), {budget} new tokens "
            "(bucket 64) ...") in err


def test_raw_continues_plain_text_and_an_answer_that_ends_is_not_reported(chat_model_dir, tokenizer, reference, calls,
                                                                            capsys):
    assert main(["generate", "--model", chat_model_dir, "w20 w21", "--raw", "--greedy", "--max-new-tokens", "6",
                 "--no-stream"]) == 0
    out, err = capsys.readouterr()
    plain = tokenizer.encode("w20 w21")
    assert calls[0][0] == plain and calls[0][1]["max_new_tokens"] == 6
    assert out == tokenizer.decode(plain + answer_of(reference, plain, 6).tolist(), skip_special_tokens=True) + "\n"
    # The user set the budget: a cut answer is theirs, no line. The notice gives the batch alone (no bucket differs).
    assert "cut" not in err
    assert "compiling generate for batch 1, prompt length 2 (bucket 16), 6 new tokens (bucket 16) ..." in err

    # An answer that ends at a stop string uses less than its budget: no line either.
    ids = rendered(tokenizer, "w20 w21")
    first = tokenizer.decode(answer_of(reference, ids, 3)).split()[2]
    assert main(["generate", "--model", chat_model_dir, "w20 w21", "--greedy", "--stop-string", first]) == 0
    out, err = capsys.readouterr()
    assert out.split() == tokenizer.decode(answer_of(reference, ids, 3)).split() and "cut" not in err


def test_flags_of_the_template_are_checked_before_anything_loads(chat_model_dir, model_dir, calls, capsys):
    assert main(["generate", "--model", chat_model_dir, "w5", "--raw", "--system", "w6"]) == 2
    assert capsys.readouterr().err == ("tfgen: error: --system is the system message of the chat template, which "
                                       "--raw leaves out\n")
    with pytest.raises(SystemExit) as done:  # argparse: one of them
        main(["generate", "--model", chat_model_dir, "w5", "--raw", "--chat"])
    assert done.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    assert main(["generate", "--model", model_dir, "w5", "--system", "w6"]) == 2
    assert "--system needs a chat template" in capsys.readouterr().err
    assert calls == []


def test_an_empty_answer_is_never_silent(chat_model_dir, tmp_path, capsys):
    # A generation config that allows only eos: the model ends every answer at once.
    directory = tmp_path / "ends_at_once"
    shutil.copytree(chat_model_dir, directory)
    config = json.loads((directory / "generation_config.json").read_text())
    config["suppress_tokens"] = [token for token in range(97) if token != 2]
    (directory / "generation_config.json").write_text(json.dumps(config))
    assert main(["generate", "--model", str(directory), "w20", "--greedy"]) == 0
    out, err = capsys.readouterr()
    assert out == "\n" and err.endswith("tfgen: the answer is empty: the model ended it at once (its first new "
                                        "token ended the text)\n") and "cut" not in err
    assert main(["generate", "--model", str(directory), "w20", "--greedy", "--raw"]) == 0
    out, err = capsys.readouterr()
    assert out == "w20\n" and "--raw continued the prompt as plain text" in err and "leave out --raw" in err


# --- tfgen chat (tiny model) ----------------------------------------------------------------------------------------


def chat(monkeypatch, capsys, lines, *argv, stdin=None, shared=True):
    """Runs `tfgen chat` in-process on `lines` as piped stdin (`shared`: on the module's chat model of its
    `--model`); returns (status, stdout, stderr)."""
    from tfgen.auto import models

    if shared:
        monkeypatch.setattr(models, "load_generation_model", lambda path, **options: model_for(path, "chat"))
    monkeypatch.setattr(sys, "stdin", stdin or io.StringIO("".join(line + "\n" for line in lines)))
    status = main(["chat", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_chat_turns_use_the_conversation_and_save_reset_system_work(
    chat_model_dir, tokenizer, calls, capsys, monkeypatch, tmp_path
):
    # In-process generate() in the chat's buckets: one program for them all.
    reference = model_for(chat_model_dir, "chat")
    traces = reference.generate_trace_count
    saved = tmp_path / "conversation.json"
    lines = ["w20 w21", "", "w22", f"/save {saved}", "/reset", "w22", "/system w30", "w23", "/help", "/bogus"]
    status, out, err = chat(monkeypatch, capsys, lines, "--model", chat_model_dir, "--greedy", "--max-new-tokens", "5")
    assert status == 0
    # At most one compiled program for the four turns: the chat's prompt-length bucket holds the whole conversation.
    # A streamed program is traced as two (the loop's start and its chunk).
    assert reference.generate_trace_count - traces <= 2
    prompts = [ids for ids, _ in calls]
    answer = [tokenizer.decode(answer_of(reference, ids, 5), skip_special_tokens=True) for ids in (
        rendered(tokenizer, "w20 w21"),
    )]
    second = rendered(tokenizer, "w20 w21", answer[0], "w22")
    answer.append(tokenizer.decode(answer_of(reference, second, 5), skip_special_tokens=True))
    after_reset = rendered(tokenizer, "w22")
    answer.append(tokenizer.decode(answer_of(reference, after_reset, 5), skip_special_tokens=True))
    with_system = rendered(tokenizer, "w22", answer[2], "w23", system="w30")
    answer.append(tokenizer.decode(answer_of(reference, with_system, 5), skip_special_tokens=True))
    # Each turn renders the whole conversation; /reset forgets it, /system comes first and keeps the turns.
    assert prompts == [rendered(tokenizer, "w20 w21"), second, after_reset, with_system]
    assert out == "".join(text + "\n" for text in answer)  # stdout: the answers, nothing else
    assert json.loads(saved.read_text()) == {"messages": [
        {"role": "user", "content": "w20 w21"}, {"role": "assistant", "content": answer[0]},
        {"role": "user", "content": "w22"}, {"role": "assistant", "content": answer[1]},
    ]}
    assert "tfgen: the conversation is reset" in err and "tfgen: system message set" in err
    assert "/save FILE" in err and "unknown command /bogus; /help lists the commands" in err
    assert ">>>" not in out + err  # no prompt decorations on piped stdin


def test_chat_verbose_follows_each_answer_with_its_timings_line(chat_model_dir, capsys, monkeypatch):
    status, out, err = chat(monkeypatch, capsys, ["w20 w21", "w22"], "--model", chat_model_dir, "--greedy",
                            "--max-new-tokens", "5", "--verbose")
    assert status == 0
    lines = [line for line in err.splitlines() if " | total " in line]
    assert len(lines) == 2, err  # one per answer
    assert lines[0].startswith("tfgen: load ") and "generated " in lines[0]
    assert not lines[1].startswith("tfgen: load ") and "generated " in lines[1]  # the load is the first answer's
    status, out, err = chat(monkeypatch, capsys, ["w20 w21"], "--model", chat_model_dir, "--greedy",
                            "--max-new-tokens", "5")
    assert " | total " not in err  # without --verbose, no line


def test_chat_says_when_the_conversation_outgrows_the_context(chat_model_dir, tokenizer, calls, capsys,
                                                              monkeypatch):
    long_message = " ".join(f"w{3 + i % 90}" for i in range(POSITIONS))
    status, out, err = chat(monkeypatch, capsys, [long_message, "w20", "w21"], "--model", chat_model_dir, "--greedy")
    assert status == 0
    # The long message is dropped; "w20" starts afresh and takes the budget the context leaves (cut: said); then the
    # conversation with "w21" no longer fits. Each time one line, and the chat goes on.
    too_long = len(rendered(tokenizer, long_message))
    assert (f"tfgen: the conversation ({too_long} tokens) no longer fits the model's context of {POSITIONS} positions; "
            "/reset to start again (or a shorter message)\n") in err
    assert err.count("no longer fits") == 2 and "Traceback" not in err
    budget = POSITIONS - len(rendered(tokenizer, "w20"))
    assert [options["max_new_tokens"] for _, options in calls] == [budget]
    assert f"tfgen: {budget_cut_message(budget)}\n" in err and out.count("\n") == 1
    # A --max-new-tokens the context cannot hold is said the same way.
    status, out, err = chat(monkeypatch, capsys, ["w20"], "--model", chat_model_dir, "--max-new-tokens", str(POSITIONS))
    assert status == 0 and f"(5 tokens and --max-new-tokens {POSITIONS}) no longer fits" in err and len(calls) == 1


def test_ctrl_c_stops_the_answer_keeps_what_was_shown_and_a_second_leaves(
    chat_model_dir, tokenizer, calls, capsys, monkeypatch, tmp_path
):
    from tfgen.commands import interrupts
    from tfgen.generation.streaming import TextStreamer

    monkeypatch.setattr(interrupts, "REDELIVERY_SECONDS", 0.2)
    real_put = TextStreamer.put
    puts = []

    def put(self, token_ids):
        puts.append(len(calls))
        real_put(self, token_ids)
        if len(calls) == 1 and len(puts) == 3:  # the first answer, after two pieces of it
            os.kill(os.getpid(), signal.SIGINT)
        if len(calls) == 2 and puts.count(2) == 1:
            time.sleep(0.6)  # a handled Ctrl-C is not delivered again meanwhile

    monkeypatch.setattr(TextStreamer, "put", put)
    saved = tmp_path / "c.json"

    class Stdin(io.StringIO):
        def readline(self, *args):
            line = super().readline(*args)
            if line == "":  # Ctrl-C at the prompt ends the chat: the next line is never answered
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
                return "w40\n"
            return line

    status, out, err = chat(monkeypatch, capsys, [], "--model", chat_model_dir, "--greedy", "--max-new-tokens", "5",
                            stdin=Stdin(f"w20 w21\nw22\n/save {saved}\n"))
    assert status == 0 and "tfgen: interrupted" not in err
    assert "tfgen: answer stopped (Ctrl-C); what was shown stays in the conversation" in err
    messages = json.loads(saved.read_text())["messages"]
    shown = messages[1]["content"]
    assert 0 < len(shown.split()) < 5 and out.startswith(shown + "\n")
    assert calls[1][0] == rendered(tokenizer, "w20 w21", shown, "w22")  # the next turn sees what was shown
    assert len(messages) == 4 and len(calls) == 2


def test_chat_needs_a_template_and_checks_its_flags_first(model_dir, chat_model_dir, calls, capsys, monkeypatch):
    status, out, err = chat(monkeypatch, capsys, ["w5"], "--model", model_dir)
    assert status == 1 and err.startswith("tfgen: error: tfgen chat needs a chat template") and err.count("\n") == 1
    status, out, err = chat(monkeypatch, capsys, ["w5"], "--model", chat_model_dir, "--temperature", "-1")
    assert status == 2 and err.startswith("tfgen: error: --temperature") and calls == []


def test_chat_help_imports_no_tensorflow():
    code = ("import sys\nfrom tfgen.cli import main\ntry:\n    main(['chat', '--help'])\nexcept SystemExit as done:\n"
            "    assert done.code == 0\nprint(sorted(n for n in sys.modules if n.split('.')[0] == 'tensorflow'))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "/reset" not in done.stdout and "--max-new-tokens" in done.stdout and done.stdout.endswith("[]\n")


# --- tfgen chat on SmolLM2 (the "done when") ----------------------------------------------------------------

SMOLLM2_TURNS = ["My name is Alice. Please remember it.", "What is my name?"]
# Greedy SmolLM2 repeats the name at this length (at 48 its longer first answer leads it astray).
SMOLLM2_NEW_TOKENS = 40


@pytest.mark.slow  # the real model: two SmolLM2 compiles (the chat's streamed program, the reference's whole one)
def test_smollm2_chat_second_answer_uses_the_first_turn_and_is_generates(capsys, monkeypatch, tmp_path):
    from tfgen.auto import models
    from tfgen.hub.pull import pull

    path = os.fspath(pull("smollm2-135m-instruct", progress=False))
    loaded, answers = [], []
    real_load, real_generate = AutoModelForCausalLM.from_pretrained, TFGenerationMixin.generate

    def load(*args, **options):
        loaded.append(real_load(*args, **options))
        return loaded[-1]

    def recording_generate(self, inputs, *args, **options):
        sequences = real_generate(self, inputs, *args, **options)
        answers.append(sequences[0].numpy()[len(inputs[0]):])
        return sequences

    monkeypatch.setattr(models, "load_generation_model", load)
    monkeypatch.setattr(TFGenerationMixin, "generate", recording_generate)
    saved = tmp_path / "smollm2.json"
    status, out, err = chat(monkeypatch, capsys, [*SMOLLM2_TURNS, f"/save {saved}"], "--model", "smollm2-135m-instruct",
                            "--greedy", "--max-new-tokens", str(SMOLLM2_NEW_TOKENS), shared=False)
    assert status == 0, err
    messages = json.loads(saved.read_text())["messages"]
    first, second = messages[1]["content"], messages[3]["content"]
    assert out == first + "\n" + second + "\n"
    assert "Alice" in second, second

    monkeypatch.setattr(TFGenerationMixin, "generate", real_generate)
    model, tokenizer = loaded[0], AutoTokenizer.from_pretrained(path)
    conversation = [{"role": "user", "content": SMOLLM2_TURNS[0]}, {"role": "assistant", "content": first},
                    {"role": "user", "content": SMOLLM2_TURNS[1]}]
    ids = tokenizer.apply_chat_template(conversation, add_generation_prompt=True)
    expected = answer_of(model, ids, SMOLLM2_NEW_TOKENS)
    np.testing.assert_array_equal(answers[1], expected)  # token for token
    assert tokenizer.decode(expected, skip_special_tokens=True) == second
    # Without the first turn the model does not know the name: the second answer used it.
    alone = tokenizer.apply_chat_template(conversation[2:], add_generation_prompt=True)
    assert "Alice" not in tokenizer.decode(answer_of(model, alone, SMOLLM2_NEW_TOKENS), skip_special_tokens=True)


def test_export_without_max_new_tokens_buffers_a_whole_answer(model_dir, tmp_path, capsys):
    # The server's default: a request without max_new_tokens may use the export's whole buffer, which `tfgen export`
    # now sizes by the answer budget (HF's 20 before): 64 positions leave 32 for an answer after half the context.
    from tfgen.config.budget import export_budget
    from tfgen.config.generation_config import GenerationConfig

    assert main(["export", str(tmp_path / "out"), "--model", model_dir, "--no-jit", "--signatures", "greedy",
                 "--no-text"]) == 0
    recorded = json.loads((tmp_path / "out" / "1" / "assets.extra" / "tfgen_export.json").read_text())
    assert recorded["max_new_tokens"] == export_budget(GenerationConfig(), POSITIONS) == POSITIONS // 2
    assert export_budget(GenerationConfig(), 8192) == 1024
    assert export_budget(GenerationConfig(max_new_tokens=7), 64) is None  # the config's length stays
