"""Parity of tfgen's in-graph logits processors with HF transformers' PyTorch ones (`_get_logits_processor`)."""

from __future__ import annotations

import types

import numpy as np
import pytest
import tensorflow as tf
import torch
import transformers
from transformers.generation.logits_process import LogitsProcessor as HFLogitsProcessor
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.utils import GenerationMixin

from tfgen.logits.context import ProcessorContext
from tfgen.logits.pipeline import LogitsProcessor, apply_processors, resolve_processors

VOCAB = 48
BATCH = 3
WIDTH = 16
START = 2
PROMPT_LEN = 6
EOS = [2, 9]
CUR_LENS = (1, 6, 7, 10, 14)


def make_buffer(seed: int = 3) -> np.ndarray:
    """[BATCH, WIDTH] token buffer: a small alphabet in the visible region (so n-grams and bad-word prefixes
    recur), distinctive ids before `START`, and ids the processors must ignore after the visible region."""
    rng = np.random.default_rng(seed)
    buffer = rng.integers(0, 6, size=(BATCH, WIDTH)).astype(np.int32)
    buffer[:, :START] = rng.integers(20, 30, size=(BATCH, START))
    buffer[0, START + 5 : START + 10] = [3, 1, 4, 3, 1]  # a trigram ban at cur_len 10
    buffer[1, START + 5 : START + 7] = [0, 2]  # completes the 3-token bad word / biased sequence at cur_len 7
    return buffer


BUFFER = make_buffer()
SCORES = np.random.default_rng(1).normal(0.0, 3.0, size=(BATCH, VOCAB)).astype(np.float32)


class _HFGenerator(GenerationMixin):
    """Just enough of a model for HF's `_get_logits_processor`."""


def hf_reference(options, scores, cur_len, *, prompt_len=PROMPT_LEN, buffer=BUFFER, user_processors=()):
    """HF's own processor list for `options`, run on the visible part of the buffer."""
    config = transformers.GenerationConfig(**options)
    eos = config.eos_token_id
    config._eos_token_tensor = None if eos is None else torch.tensor(np.atleast_1d(eos))
    processors = _HFGenerator()._get_logits_processor(
        config, input_ids_seq_length=prompt_len, logits_processor=LogitsProcessorList(user_processors), device="cpu",
        # A decoder-only model's `encoder_input_ids` are its prompt (HF's generate passes the prompt tensor).
        encoder_input_ids=torch.from_numpy(buffer[:, START : START + prompt_len].astype(np.int64)),
    )
    input_ids = torch.from_numpy(buffer[:, START : START + cur_len].astype(np.int64))
    return processors(input_ids, torch.from_numpy(scores.copy())).numpy()


def context(cur_len, *, prompt_len=PROMPT_LEN, max_length=20, buffer=BUFFER) -> ProcessorContext:
    # HF's `encoder_input_ids` of a decoder-only model: its prompt (the columns before START are not HF's).
    prompt = np.where(np.arange(START + prompt_len) >= START, buffer[:, : START + prompt_len], -1)
    return ProcessorContext(
        sequences=tf.constant(buffer),
        start=tf.constant(START),
        cur_len=tf.constant(cur_len),
        prompt_len=tf.constant(prompt_len),
        max_length=tf.constant(np.broadcast_to(np.int32(max_length), [buffer.shape[0]])),
        encoder_ids=tf.constant(prompt.astype(np.int32)),
    )


def ours(options, scores, cur_len, *, prompt_len=PROMPT_LEN, buffer=BUFFER, user_processors=()):
    config = transformers.GenerationConfig(**options)
    resolved = resolve_processors(config, VOCAB, num_beams=config.num_beams)
    spec, knobs = resolved.spec, resolved.knobs(buffer.shape[0])
    ctx = context(cur_len, prompt_len=prompt_len, max_length=config.max_length, buffer=buffer)
    return apply_processors(spec, scores, ctx, knobs, user_processors).numpy()


def assert_same_scores(actual, expected):
    np.testing.assert_array_equal(np.isneginf(actual), np.isneginf(expected))
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


SAMPLE = dict(do_sample=True, top_k=0)
CASES = {
    "repetition_penalty": dict(repetition_penalty=1.4),
    "repetition_reward": dict(repetition_penalty=0.7),
    "encoder_repetition_penalty": dict(encoder_repetition_penalty=1.6),
    "encoder_repetition_reward": dict(encoder_repetition_penalty=0.6),
    "no_repeat_unigram": dict(no_repeat_ngram_size=1),
    "no_repeat_bigram": dict(no_repeat_ngram_size=2),
    "no_repeat_trigram": dict(no_repeat_ngram_size=3),
    # [2] and [9] are eos bans, which HF drops.
    "bad_words": dict(bad_words_ids=[[5], [1, 3], [0, 2, 4], [9], [2], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 7]]),
    "sequence_bias": dict(sequence_bias={(5,): -2.5, (1, 3): 4.0, (0, 2, 4): -1.0, (3,): 1.5}),
    "min_length": dict(min_length=8),
    "min_new_tokens": dict(min_new_tokens=3),
    "forced_bos": dict(forced_bos_token_id=4),
    "forced_eos": dict(forced_eos_token_id=[7, 2], max_length=11),
    "exponential_decay": dict(exponential_decay_length_penalty=(2, 1.5)),
    "suppress_tokens": dict(suppress_tokens=[1, 5, 30]),
    "begin_suppress_tokens": dict(begin_suppress_tokens=[2, 6]),
    "renormalize": dict(renormalize_logits=True),
    "temperature": dict(SAMPLE, temperature=0.6),
    "top_k": dict(SAMPLE, top_k=5),
    "top_p": dict(SAMPLE, top_p=0.8),
    "min_p": dict(SAMPLE, min_p=0.1),
    "typical_p": dict(SAMPLE, typical_p=0.7),
    "epsilon": dict(SAMPLE, epsilon_cutoff=0.02),
    "eta": dict(SAMPLE, eta_cutoff=0.05),
    "eta_after_top_k": dict(SAMPLE, top_k=10, eta_cutoff=0.1),  # entropy over -inf scores
    "processors_and_warpers": dict(
        repetition_penalty=1.3, no_repeat_ngram_size=2, bad_words_ids=[[5], [1, 3]], min_new_tokens=3,
        suppress_tokens=[11], begin_suppress_tokens=[12], forced_eos_token_id=2, max_length=15,
        do_sample=True, temperature=0.7, top_k=12, top_p=0.9, min_p=0.05, typical_p=0.95,
        epsilon_cutoff=0.001, eta_cutoff=0.002, renormalize_logits=True,
    ),
    # num_beams > 1 makes every warper keep len(eos) + 1 = 3 tokens.
    "beam_min_tokens_to_keep": dict(
        num_beams=2, do_sample=True, top_k=1, top_p=0.3, min_p=0.9, typical_p=0.2, epsilon_cutoff=0.3, eta_cutoff=0.3
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_hf(name):
    options = dict(CASES[name], eos_token_id=EOS)
    changed = False
    for cur_len in CUR_LENS:
        expected = hf_reference(options, SCORES, cur_len)
        assert_same_scores(ours(options, SCORES, cur_len), expected)
        changed |= not np.array_equal(expected, SCORES)
    assert changed, "the case never triggers its processor"


def test_multi_token_bans_trigger():
    """The buffer really completes banned / biased prefixes, so the multi-token paths are exercised."""
    options = dict(bad_words_ids=[[1, 3], [0, 2, 4]], eos_token_id=EOS)
    banned = np.stack([np.isneginf(hf_reference(options, SCORES, cur_len)) for cur_len in CUR_LENS])
    assert banned[..., 3].any() and banned[..., 4].any()


def test_sequence_longer_than_context_is_ignored():
    # HF skips a biased sequence longer than input_ids; a short cur_len must not read columns before `start`.
    buffer = BUFFER.copy()
    buffer[:, START - 1] = 1
    options = dict(sequence_bias={(1, 3): 4.0}, bad_words_ids=[[1, 4]], eos_token_id=EOS)
    assert_same_scores(ours(options, SCORES, 1, buffer=buffer), hf_reference(options, SCORES, 1, buffer=buffer))
    assert np.array_equal(ours(options, SCORES, 1, buffer=buffer), SCORES)


def test_begin_suppress_waits_for_forced_bos_after_one_token_prompt():
    options = dict(forced_bos_token_id=4, begin_suppress_tokens=[2, 6], eos_token_id=EOS)
    for cur_len in (1, 2, 3):
        expected = hf_reference(options, SCORES, cur_len, prompt_len=1)
        assert_same_scores(ours(options, SCORES, cur_len, prompt_len=1), expected)
    assert np.isneginf(hf_reference(options, SCORES, 2, prompt_len=1)[:, [2, 6]]).all()


def test_remove_invalid_values():
    scores = SCORES.copy()
    scores[0, 3], scores[1, 4], scores[2, 5] = np.nan, np.inf, -np.inf
    options = dict(remove_invalid_values=True, suppress_tokens=[7], eos_token_id=EOS)
    assert_same_scores(ours(options, scores, 7), hf_reference(options, scores, 7))


PER_ROW_VALUES = {  # one value per row; neutral values must leave their row untouched
    "temperature": [0.5, 1.0, 1.3],
    "top_k": [3, 0, 10],
    "top_p": [1.0, 0.7, 0.9],
    "min_p": [0.0, 0.2, 0.05],
    "typical_p": [0.8, 1.0, 0.95],
    "epsilon_cutoff": [0.0, 0.01, 0.02],
    "eta_cutoff": [0.03, 0.0, 0.01],
    "repetition_penalty": [1.5, 1.0, 0.8],
    "min_length": [0, 9, 7],
    "min_new_tokens": [6, 0, 1],
    "exponential_decay_start": [1, 3, 2],  # (HF turns a -inf eos score into nan once decay starts)
    "exponential_decay_factor": [1.0, 1.3, 1.1],  # row 0: neutral although its eos score is -inf (min_new_tokens)
}


def per_row_knobs(spec_options, values):
    """Spec and knobs for `spec_options`, with the per-row knobs of `values` replaced."""
    config = transformers.GenerationConfig(**spec_options)
    resolved = resolve_processors(config, VOCAB)
    spec, knobs = resolved.spec, resolved.knobs(BATCH)
    for name, row_values in values.items():
        knobs[name] = np.asarray(row_values, knobs[name].dtype)
    return spec, knobs


def test_per_row_knobs_match_hf_row_by_row():
    base = dict(
        do_sample=True, temperature=0.9, top_k=4, top_p=0.9, min_p=0.1, typical_p=0.9, epsilon_cutoff=0.01,
        eta_cutoff=0.01, repetition_penalty=1.2, min_length=3, min_new_tokens=2, forced_eos_token_id=7,
        exponential_decay_length_penalty=(1, 1.5), eos_token_id=EOS,
    )
    max_lengths = [11, 12, 16]
    spec, knobs = per_row_knobs(base, PER_ROW_VALUES)
    for cur_len in (6, 7, 10, 11):
        ctx = context(cur_len, max_length=max_lengths)
        actual = apply_processors(spec, SCORES, ctx, knobs).numpy()
        for row in range(BATCH):
            row_options = dict(base, max_length=max_lengths[row])
            row_options.update({name: values[row] for name, values in PER_ROW_VALUES.items()})
            decay = (row_options.pop("exponential_decay_start"), row_options.pop("exponential_decay_factor"))
            row_options["exponential_decay_length_penalty"] = decay if decay[1] != 1.0 else None
            expected = hf_reference(row_options, SCORES[row : row + 1], cur_len, buffer=BUFFER[row : row + 1])
            assert_same_scores(actual[row : row + 1], expected)


@pytest.mark.parametrize("cap", [8, 0])
@pytest.mark.parametrize("top_ks", [(3, 8, 20), (3, 0, 6)])
def test_top_k_candidate_cap(cap, top_ks):
    """With a cap below the vocabulary, top-p / typical-p run on the top-k candidates when every row is top-k
    filtered and on the full vocabulary otherwise (a row with k=0); a k above the cap is clamped to it."""
    base = dict(do_sample=True, top_k=5, top_p=0.95, typical_p=0.9, min_p=0.01, eos_token_id=EOS)
    spec, knobs = per_row_knobs(base, {"top_k": top_ks})
    spec = spec.forced({"top_k": cap})
    actual = apply_processors(spec, SCORES, context(7), knobs).numpy()
    for row, k in enumerate(top_ks):
        row_options = dict(base, top_k=min(k, cap) if cap else k)
        assert_same_scores(actual[row : row + 1], hf_reference(row_options, SCORES[row : row + 1], 7))


@pytest.mark.parametrize(
    "top_ks, tie_width, complete",
    [((3, 8, 5), 0, True), ((3, 0, 5), 0, False), ((3, 8, 5), 12, False)],
    ids=["all_rows_top_k", "a_row_without_top_k", "ties_past_the_cap"],
)
def test_sampling_candidates(top_ks, tie_width, complete):
    """`return_candidates` leaves the scores alone and returns each row's `top_k_cap` best ids in id order, with
    `complete` telling whether they hold every finite score (eagerly and under XLA alike)."""
    scores = SCORES.copy()
    scores[0, :tie_width] = scores.max() + 1.0  # a tie at the top wider than the cap keeps all its tokens
    spec, knobs = per_row_knobs(dict(do_sample=True, top_k=5, top_p=0.9, eos_token_id=EOS), {"top_k": top_ks})
    spec = spec.forced({"top_k": 8})
    knobs = {name: tf.constant(value) for name, value in knobs.items()}
    plain = apply_processors(spec, scores, context(7), knobs).numpy()
    run = lambda s, k: apply_processors(spec, s, context(7), k, return_candidates=True)  # noqa: E731
    for processed, candidates in (run(scores, knobs), tf.function(run, jit_compile=True)(scores, knobs)):
        np.testing.assert_array_equal(processed.numpy(), plain)
        ids = candidates.ids.numpy()
        assert ids.shape == (BATCH, 8) and (np.diff(ids, axis=1) > 0).all()
        if not tie_width:
            np.testing.assert_array_equal(ids, np.sort(np.argsort(-scores, axis=1)[:, :8], axis=1))
        holds_all = all(set(np.flatnonzero(np.isfinite(row))) <= set(row_ids) for row, row_ids in zip(plain, ids))
        assert bool(candidates.complete) == holds_all == complete
    no_top_k = resolve_processors(types.SimpleNamespace(do_sample=True, top_p=0.9), VOCAB).spec
    assert apply_processors(no_top_k, SCORES, context(7), knobs, return_candidates=True)[1] is None


def test_the_knob_schema_names_the_declared_warpers_in_order():
    """The warpers are declared as processors (`tfgen.logits.warpers`) and flagged in the knob schema, which the
    config layer reads (HF's sampling-only options): both lists must be one."""
    from tfgen.config.knobs import WARPER_KNOBS
    from tfgen.logits.pipeline import PIPELINE

    assert tuple(processor.name for processor in PIPELINE if processor.warper) == WARPER_KNOBS


def test_top_k_cap_rule():
    config = types.SimpleNamespace(do_sample=True, top_k=5)
    assert resolve_processors(config, VOCAB).spec.top_k_cap == 0  # 64 >= vocabulary: sort everything
    assert resolve_processors(config, 1000).spec.top_k_cap == 64
    assert resolve_processors(types.SimpleNamespace(do_sample=True, top_k=100), 1000).spec.top_k_cap == 128
    assert not resolve_processors(types.SimpleNamespace(do_sample=False, top_k=100), 1000).spec.is_on("top_k")


def test_min_tokens_to_keep_only_shapes_beam_sampling():
    """The number of eos ids changes min_tokens_to_keep, a static part of the program key; without sampling no
    warper reads it, so plain beam search with 1 or 3 eos ids must select the same program."""
    spec = lambda **options: resolve_processors(types.SimpleNamespace(**options), VOCAB, num_beams=4).spec  # noqa
    assert spec(do_sample=False, eos_token_id=2) == spec(do_sample=False, eos_token_id=[2, 3, 4])
    assert spec(do_sample=False, eos_token_id=[2, 3, 4]).min_tokens_to_keep == 1
    sampled = resolve_processors(types.SimpleNamespace(do_sample=True, eos_token_id=[2, 3]), VOCAB, num_beams=4).spec
    assert sampled.min_tokens_to_keep == 3


class BoostLastToken(LogitsProcessor):
    """Adds 5 to the score of each row's most recent token (HF-TF convention: cur_len indexes the buffer)."""

    def __call__(self, input_ids, scores, cur_len):
        last = tf.gather(input_ids, cur_len - 1, axis=1)
        return scores + 5.0 * tf.one_hot(last, scores.shape[-1])


class TorchBoostLastToken(HFLogitsProcessor):
    def __call__(self, input_ids, scores):
        return scores + 5.0 * torch.nn.functional.one_hot(input_ids[:, -1], scores.shape[-1])


class TorchShift(HFLogitsProcessor):
    def __call__(self, input_ids, scores):
        return scores - 0.5 * scores.mean(dim=-1, keepdim=True)


def test_user_processors_run_between_processors_and_warpers():
    options = dict(repetition_penalty=1.5, do_sample=True, top_k=0, temperature=0.5, top_p=0.8, eos_token_id=EOS)

    def shift(input_ids, scores, cur_len):
        return scores - 0.5 * tf.reduce_mean(scores, axis=-1, keepdims=True)

    for cur_len in (6, 10):
        actual = ours(options, SCORES, cur_len, user_processors=(BoostLastToken(), shift))
        expected = hf_reference(options, SCORES, cur_len, user_processors=(TorchBoostLastToken(), TorchShift()))
        assert_same_scores(actual, expected)


@pytest.mark.parametrize("bad", [42, BoostLastToken])
def test_user_processor_type_is_checked(bad):
    with pytest.raises(TypeError, match="logits_processor"):
        apply_processors(resolve_processors(types.SimpleNamespace(), VOCAB).spec, SCORES, context(6), {}, [bad])


def test_xla_matches_eager():
    options = dict(
        CASES["processors_and_warpers"], sequence_bias={(1, 3): 2.0, (4,): -1.0}, forced_bos_token_id=4,
        exponential_decay_length_penalty=(1, 1.2), min_length=8, eos_token_id=EOS,
    )
    config = transformers.GenerationConfig(**options)
    spec = resolve_processors(config, VOCAB).spec.forced({"top_k": 16})
    user = (BoostLastToken(),)
    compiled = tf.function(
        lambda scores, ctx, knobs: apply_processors(spec, scores, ctx, knobs, user), jit_compile=True
    )
    buffer = BUFFER.copy()
    buffer[:, -1] = -7  # an unwritten column holding an invalid id must be harmless
    for top_ks in ([12, 12, 12], [12, 0, 30]):  # every row top-k filtered (candidate path), then not
        knobs = resolve_processors(config, VOCAB).knobs(BATCH)
        knobs["top_k"] = np.array(top_ks, np.int32)
        knobs = {name: tf.constant(value) for name, value in knobs.items()}
        for cur_len in (1, 6, 9, 13):
            ctx = context(cur_len, max_length=config.max_length, buffer=buffer)
            eager = apply_processors(spec, SCORES, ctx, knobs, user).numpy()
            assert_same_scores(compiled(SCORES, ctx, knobs).numpy(), eager)
    assert compiled.experimental_get_tracing_count() == 1


@pytest.mark.parametrize(
    "options, option_name",
    [
        (dict(do_sample=True, top_k=-2), "top_k"),
        (dict(do_sample=True, temperature=0.0), "temperature"),
        (dict(bad_words_ids=[[3, VOCAB]]), "bad_words_ids"),
        (dict(bad_words_ids=[[2]], eos_token_id=2), "bad_words_ids"),
        (dict(sequence_bias={(): 1.0}), "sequence_bias"),
        (dict(eos_token_id=-1), "eos_token_id"),
    ],
)
def test_invalid_options_raise(options, option_name):
    with pytest.raises(ValueError, match=option_name):
        resolve_processors(types.SimpleNamespace(**options), VOCAB)


def test_missing_knob_is_named():
    config = types.SimpleNamespace(do_sample=True, top_p=0.5)
    resolved = resolve_processors(config, VOCAB)
    spec, knobs = resolved.spec, resolved.knobs(SCORES.shape[0])
    del knobs["top_p"]
    with pytest.raises(ValueError, match="top_p"):
        apply_processors(spec, SCORES, context(6), knobs)


class ForceTokenAfter(LogitsProcessor):
    """Forces `token` once `cur_len` passes `after`, with a Python `if` on a tensor — code that only traces
    with autograph, which generate() turns on for calls with user processors."""

    def __init__(self, token: int, after: int):
        self.token, self.after = token, after

    def __call__(self, input_ids, scores, cur_len):
        if cur_len > self.after:
            scores = tf.where(tf.range(tf.shape(scores)[-1]) == self.token, 0.0, float("-inf")) + 0 * scores
        return scores


def test_user_processor_with_python_control_flow_runs_compiled(tiny_model):
    ids = np.array([[5, 6, 7]], np.int32)
    # cur_len is a buffer index: the prompt is left-padded to its 16-column bucket, so the first new token is
    # chosen at 16, and tokens from the third one (cur_len 18 > 17) on are forced.
    forced = ForceTokenAfter(token=11, after=17)
    compiled = tiny_model.generate(ids, max_new_tokens=6, eos_token_id=None, logits_processor=[forced]).numpy()
    eager = tiny_model.generate(
        ids, max_new_tokens=6, eos_token_id=None, logits_processor=[forced], jit_compile=False
    ).numpy()
    np.testing.assert_array_equal(compiled, eager)
    plain = tiny_model.generate(ids, max_new_tokens=6, eos_token_id=None).numpy()
    np.testing.assert_array_equal(compiled[0, 3:5], plain[0, 3:5])
    assert (compiled[0, 5:] == 11).all() and not (plain[0, 5:] == 11).all()
