"""`tfgen generate --chat`: the prompt (and `--system`) rendered with the model's chat template is what the model
receives, only the answer is printed (streamed or at the end), a model without a template is one line and status 1;
and `--model NAME` reaches a registered model through the resolver."""

from __future__ import annotations

import numpy as np
import pytest

from tfgen import AutoModelForCausalLM, Tokenizer
from tfgen.cli import main
from tfgen.generation.mixin import TFGenerationMixin


@pytest.fixture
def received(monkeypatch):
    """The prompt ids of every `generate` call, in order."""
    calls = []
    real_generate = TFGenerationMixin.generate

    def recording_generate(self, inputs, *args, **options):
        calls.append(np.asarray(inputs).tolist())
        return real_generate(self, inputs, *args, **options)

    monkeypatch.setattr(TFGenerationMixin, "generate", recording_generate)
    return calls


def expected_answer(directory, prompt_ids, max_new_tokens):
    model = AutoModelForCausalLM.from_pretrained(directory)
    sequence = model.generate(np.array([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False)[0].numpy()
    return Tokenizer.from_pretrained(directory).decode(sequence[len(prompt_ids):], skip_special_tokens=True)


@pytest.mark.parametrize("model_argument, stream", [("directory", True), ("registered_name", False)],
                         ids=["dir_streamed", "name_printed_at_end"])
def test_chat_sends_the_rendered_conversation_and_prints_the_answer(
    chat_model_dir, received, capsys, monkeypatch, tmp_path, model_argument, stream
):
    if model_argument == "registered_name":
        # `--model smollm2-135m-instruct` goes through the resolver; its pull is this tiny chat model here.
        from tfgen.hub import pull as model_pull

        monkeypatch.setenv("TFGEN_CACHE_DIR", str(tmp_path))
        monkeypatch.setattr(model_pull, "pull", lambda name, **options: chat_model_dir)
    model = chat_model_dir if model_argument == "directory" else "smollm2-135m-instruct"
    argv = ["generate", "--model", model, "--chat", "w20 w21", "--system", "w30", "--max-new-tokens", "6", "--greedy"]
    assert main(argv + ([] if stream else ["--no-stream"])) == 0
    # bos, system word, the system text, eos; bos, user word, the prompt, eos; the assistant's word.
    prompt_ids = [1, 10, 30, 2, 1, 11, 20, 21, 2, 12]
    tokenizer = Tokenizer.from_pretrained(chat_model_dir)
    messages = [{"role": "system", "content": "w30"}, {"role": "user", "content": "w20 w21"}]
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True) == prompt_ids
    printed = capsys.readouterr().out
    assert received == [[prompt_ids]]
    answer = expected_answer(chat_model_dir, prompt_ids, 6)
    assert printed.strip() == answer.strip() != ""  # the answer alone: no prompt, no special tokens


def test_chat_without_a_template_is_one_line_and_status_1(model_dir, received, capsys):
    assert main(["generate", "--model", model_dir, "--chat", "w5 w6"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tfgen: error: --chat needs a chat template") and model_dir in err
    assert received == []  # refused before anything was generated


def test_system_without_a_template_is_refused(model_dir, capsys):
    # A model with a template takes --system without --chat (its template applies by default): test_chat_command.py.
    assert main(["generate", "--model", model_dir, "w5", "--system", "w6"]) == 2
    assert "--system needs a chat template" in capsys.readouterr().err
