"""Stopping inside the compiled loop: stop strings token-exact with HF PyTorch on a real byte-level BPE tokenizer
(the shipped model's), `max_time` cutting a long run, user stopping criteria, HF's criteria classes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tfgen
from tfgen.hub import default_model as defaults

PROMPTS = ["def parse(text):\n", "import os\n\nclass Cache:"]
NEW_TOKENS = 24
# The shipped model's pad id (its config's), written after a row stopped.
PAD = 0
# The shipped config samples with temperature and top-p; greedy search leaves them out (HF would warn).
GREEDY = dict(do_sample=False, top_p=None, temperature=None)


@pytest.fixture(scope="module")
def model_dir() -> str:
    return defaults.default_model_path()


@pytest.fixture(scope="module")
def model(model_dir):
    return tfgen.AutoModelForCausalLM.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return tfgen.Tokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def hf(model_dir):
    """(HF PyTorch model, HF tokenizer) on the same files."""
    import transformers

    hf_model = transformers.GPT2LMHeadModel.from_pretrained(model_dir).eval()
    hf_tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=f"{model_dir}/tokenizer.json")
    return hf_model, hf_tokenizer


@pytest.fixture(scope="module")
def batch(tokenizer):
    encoded = tokenizer(PROMPTS, return_tensors="np")
    return encoded["input_ids"], encoded["attention_mask"]


def _stop_strings_inside(tokenizer, sequences, prompt_width) -> list[str]:
    """Three-character stop strings taken from the middle of each row's generated text, where they start inside
    one token and end inside a later one (the case that needs the precomputed tables)."""
    chosen = []
    for row in sequences:
        generated = row[prompt_width:].tolist()
        pieces = [tokenizer.decode([token]) for token in generated]
        offset = 0
        for index, piece in enumerate(pieces[:-2]):
            offset += len(piece)
            if index >= 3 and len(piece) >= 2 and len(pieces[index + 1]) >= 2:
                text = "".join(pieces)
                candidate = text[offset - 1 : offset + 2]
                if candidate.strip() and "\ufffd" not in candidate:
                    chosen.append(candidate)
                    break
    assert chosen, "the generated text offered no stop string crossing a token boundary"
    return chosen


def _hf_generate(hf, input_ids, attention_mask, **options):
    import torch

    hf_model, hf_tokenizer = hf
    out = hf_model.generate(
        torch.tensor(input_ids, dtype=torch.long), attention_mask=torch.tensor(attention_mask, dtype=torch.long),
        tokenizer=hf_tokenizer, max_new_tokens=NEW_TOKENS, pad_token_id=PAD, **options,
    )
    return out.numpy()


def _padded(sequences: np.ndarray, width: int, pad: int) -> np.ndarray:
    return np.pad(sequences, [(0, 0), (0, width - sequences.shape[1])], constant_values=pad)


@pytest.mark.parametrize(
    "options",
    [dict(do_sample=False), dict(do_sample=False, num_beams=3), dict(do_sample=False, penalty_alpha=0.6, top_k=4)],
    ids=["greedy", "beam", "contrastive"],
)
def test_stop_strings_match_hf_pytorch(model, tokenizer, hf, batch, options):
    ids, mask = batch
    # The model's eos id stays: without one HF keeps generating real tokens in rows a stop string ended (it pads
    # finished rows only when it has an eos criterion); tfgen always pads them.
    options = dict(options, **GREEDY)
    free = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, **options).numpy()
    stop_strings = _stop_strings_inside(tokenizer, free, ids.shape[1])
    ours = model.generate(
        ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, stop_strings=stop_strings, tokenizer=tokenizer,
        **options,
    ).numpy()
    theirs = _hf_generate(hf, ids, mask, stop_strings=stop_strings, **options)
    np.testing.assert_array_equal(ours, _padded(theirs, ours.shape[1], PAD))
    assert (ours != free).any(), "the stop strings cut the output short"
    if options.get("num_beams", 1) == 1 and not options.get("penalty_alpha"):
        eager = model.generate(
            ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, stop_strings=stop_strings, tokenizer=tokenizer,
            jit_compile=False, **options,
        ).numpy()
        np.testing.assert_array_equal(eager, ours)


def test_seeded_sampling_stops_where_the_text_first_ends_with_a_stop_string(model, tokenizer, batch):
    import torch
    import transformers
    from transformers.generation.stopping_criteria import StopStringCriteria

    ids, mask = batch
    options = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=True, seed=[5, 6], eos_token_id=None)
    free = model.generate(ids, **options).numpy()
    stop_strings = _stop_strings_inside(tokenizer, free, ids.shape[1])
    stopped = model.generate(ids, stop_strings=stop_strings, tokenizer=tokenizer, **options).numpy()
    tokenizer_file = f"{defaults.default_model_path()}/tokenizer.json"
    hf_tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=tokenizer_file)
    criterion = StopStringCriteria(hf_tokenizer, stop_strings)
    width = ids.shape[1]
    for row in range(len(PROMPTS)):
        ends = [step for step in range(1, NEW_TOKENS + 1)
                if criterion(torch.tensor(free[row : row + 1, : width + step]), None).item()]
        assert ends, "each row's free text contains its stop string"
        end = width + ends[0]
        np.testing.assert_array_equal(stopped[row, :end], free[row, :end])
        assert (stopped[row, end:] == PAD).all()


def test_stop_strings_need_a_tokenizer_and_group_beams_refuse_them(model, tokenizer, batch):
    ids, mask = batch
    traces = model.generate_trace_count
    with pytest.raises(ValueError, match="stop_strings.*tokenizer"):
        model.generate(ids, attention_mask=mask, max_new_tokens=4, stop_strings=["x"])
    with pytest.raises(ValueError, match="stop_strings"):
        model.generate(ids, attention_mask=mask, max_new_tokens=4, stop_strings=[""], tokenizer=tokenizer)
    with pytest.raises(ValueError, match="group beam search"):
        model.generate(ids, attention_mask=mask, max_new_tokens=4, num_beams=4, num_beam_groups=2,
                       diversity_penalty=0.5, stop_strings=["x"], tokenizer=tokenizer)
    assert model.generate_trace_count == traces


@pytest.mark.parametrize("options", [dict(), dict(num_beams=2)], ids=["greedy", "beam"])
def test_max_time_cuts_a_long_run_within_one_chunk(model, batch, options):
    ids, mask = batch
    budget = 200
    common = dict(attention_mask=mask, max_new_tokens=budget, eos_token_id=None, **GREEDY, **options)
    full = model.generate(ids, **common).numpy()
    # The deadline passes before the first chunk returns: its tokens (the first one and a chunk of steps), then
    # one last step for every row; beam search closes its hypotheses at that length.
    cut = model.generate(ids, max_time=1e-6, **common).numpy()
    kept = ids.shape[1] + 1 + tfgen.generation.mixin.MAX_TIME_CHUNK_STEPS + 1
    assert (cut[:, kept:] == PAD).all() and (cut[:, kept - 1] != PAD).any()
    if not options:
        np.testing.assert_array_equal(cut[:, :kept], full[:, :kept])
    # A roomy budget changes nothing.
    np.testing.assert_array_equal(model.generate(ids, max_time=600.0, **common).numpy(), full)


def test_a_user_stopping_criterion_runs_in_the_loop(model, batch):
    ids, mask = batch
    common = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, **GREEDY)
    free = model.generate(ids, eos_token_id=None, **common).numpy()
    stop_token = int(free[0, ids.shape[1] + 5])
    by_eos = model.generate(ids, eos_token_id=stop_token, **common).numpy()

    class LastTokenIs(tfgen.StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == stop_token

    for jit_compile in (True, False):
        by_criterion = model.generate(
            ids, eos_token_id=None, stopping_criteria=[LastTokenIs()], jit_compile=jit_compile, **common
        ).numpy()
        # Pad is the model's eos id, so stopping on the token equals treating it as eos.
        np.testing.assert_array_equal(by_criterion, by_eos)


def test_hf_named_criteria_stand_for_their_options(model, tokenizer, batch):
    ids, mask = batch
    common = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, eos_token_id=None, **GREEDY)
    free = model.generate(ids, **common).numpy()
    stop_strings = _stop_strings_inside(tokenizer, free, ids.shape[1])
    by_option = model.generate(ids, stop_strings=stop_strings, tokenizer=tokenizer, **common).numpy()
    by_criterion = model.generate(
        ids, stopping_criteria=tfgen.StoppingCriteriaList([tfgen.StopStringCriteria(tokenizer, stop_strings)]),
        **common,
    ).numpy()
    np.testing.assert_array_equal(by_criterion, by_option)
    with pytest.raises(ValueError, match="MaxLengthCriteria"):
        model.generate(ids, stopping_criteria=[tfgen.MaxLengthCriteria(10)], **common)
    with pytest.raises(ValueError, match="max_time"):
        model.generate(ids, max_time=5.0, stopping_criteria=[tfgen.MaxTimeCriteria(3.0)], **common)
    # A built-in criterion inside a nested list still stands for its option (never traced with a frozen clock).
    inner = tfgen.StoppingCriteriaList([tfgen.StopStringCriteria(tokenizer, stop_strings)])
    nested = tfgen.StoppingCriteriaList([inner])
    np.testing.assert_array_equal(model.generate(ids, stopping_criteria=[nested], **common).numpy(), by_option)
    with pytest.raises(TypeError, match="stopping_criteria"):
        model.generate(ids, stopping_criteria=[42], **common)
    # The criteria classes also work on their own, on HF-shaped ids.
    row = tf.constant(free[:1, : ids.shape[1] + 3])
    assert bool(tfgen.EosTokenCriteria(int(free[0, ids.shape[1] + 2]))(row, None)[0])
    assert bool(tfgen.MaxLengthCriteria(row.shape[1])(row, None)[0])


def test_a_criterion_returning_the_wrong_shape_is_named(model, batch):
    ids, mask = batch
    with pytest.raises(ValueError, match="stopping_criteria.*one bool per row"):
        model.generate(ids, attention_mask=mask, max_new_tokens=4, jit_compile=False, **GREEDY,
                       stopping_criteria=[lambda input_ids, scores: tf.zeros([7], tf.bool)])


def test_an_export_stops_on_the_strings_fixed_at_export(model, tokenizer, batch, tmp_path):
    ids, mask = batch
    common = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, **GREEDY)
    free = model.generate(ids, **common).numpy()
    stop_strings = _stop_strings_inside(tokenizer, free, ids.shape[1])
    expected = model.generate(ids, stop_strings=stop_strings, tokenizer=tokenizer, **common).numpy()
    with pytest.raises(ValueError, match="stop_strings.*tokenizer"):
        tfgen.export_saved_model(model, tmp_path / "no_tokenizer", stop_strings=stop_strings, jit_compile=False)
    directory = tfgen.export_saved_model(
        model, tmp_path / "export", max_new_tokens=NEW_TOKENS, signatures=["greedy"], jit_compile=False,
        tokenizer=tokenizer, stop_strings=stop_strings,
    )
    loaded = tf.saved_model.load(directory)
    out = loaded.signatures["greedy"](
        input_ids=tf.constant(ids), attention_mask=tf.constant(mask),
        max_new_tokens=tf.fill([len(PROMPTS)], NEW_TOKENS),
    )
    np.testing.assert_array_equal(out["sequences"].numpy(), expected)
    stopped_at = [ids.shape[1] + int(np.flatnonzero(row[ids.shape[1]:] == PAD)[0]) if (row[ids.shape[1]:] == PAD).any()
                  else expected.shape[1] for row in expected]
    np.testing.assert_array_equal(out["sequence_lengths"].numpy(), stopped_at)


def test_the_command_line_stops_on_a_stop_string(model, tokenizer, capsys):
    from tfgen.cli import main

    prompt = PROMPTS[0]
    encoded = tokenizer(prompt, return_tensors="np")
    free = model.generate(encoded["input_ids"], max_new_tokens=NEW_TOKENS, **GREEDY).numpy()
    stop = _stop_strings_inside(tokenizer, free, encoded["input_ids"].shape[1])[0]
    assert main(["generate", prompt, "--greedy", "--max-new-tokens", str(NEW_TOKENS), "--no-stream",
                 "--stop-string", stop]) == 0
    text = capsys.readouterr().out.rstrip("\n")
    # The last token may run past the stop string's end (HF's rules allow that overhang).
    assert text.startswith(prompt) and stop in text[len(prompt):]
    assert len(text) < len(tokenizer.decode(free[0], skip_special_tokens=True))
