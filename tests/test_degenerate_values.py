"""Values that pass a type check but would give garbage or a raw TF error: each is refused with a message naming the
option before anything compiles, or the math stays defined (issue 13's "values" class; `docs/reliability.md`)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tensorflow as tf

from tfgen.config.knobs import KNOBS
from tfgen.memory import MEMORY_LIMIT_ENV

PROMPT = np.array([[5, 17, 42, 8]], np.int32)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"top_k": 2**31}, "top_k"),
        ({"pad_token_id": 2**31}, "pad_token_id"),
        ({"min_new_tokens": 2**31}, "min_new_tokens"),
        ({"no_repeat_ngram_size": 2**31}, "no_repeat_ngram_size"),
        ({"max_new_tokens": 2**31}, "max_new_tokens"),
        ({"num_beams": 2**40}, "num_beams"),
        ({"eos_token_id": [2, 2**33]}, "eos_token_id"),
        ({"pad_token_id": 97}, "pad_token_id.*vocabulary"),
        # Floats that are not numbers once they are float32: infinite, NaN, or subnormal (XLA flushes those to 0,
        # so a temperature of 1e-45 would divide by zero).
        ({"do_sample": True, "temperature": float("inf")}, "temperature"),
        ({"do_sample": True, "temperature": 1e-45}, "temperature"),
        ({"do_sample": True, "temperature": 1e39}, "temperature"),
        ({"repetition_penalty": float("nan")}, "repetition_penalty"),
        ({"repetition_penalty": 1e-50}, "repetition_penalty"),
        ({"num_beams": 2, "length_penalty": float("inf")}, "length_penalty"),
        ({"num_beams": 2, "num_beam_groups": 2, "diversity_penalty": float("inf")}, "diversity_penalty"),
        ({"penalty_alpha": float("nan"), "top_k": 4}, "penalty_alpha"),
        ({"sequence_bias": {(5,): float("nan")}}, "sequence_bias"),
        ({"exponential_decay_length_penalty": (2, float("nan"))}, "decay_factor"),
        ({"exponential_decay_length_penalty": (2, float("inf"))}, "decay_factor"),
        ({"exponential_decay_length_penalty": (2**31, 1.1)}, "start_index"),
        # |length_penalty| * ln(8) > 80: every hypothesis would score 0 or -inf in float32.
        ({"num_beams": 2, "length_penalty": -1e300}, "length_penalty"),
        ({"num_beams": 2, "length_penalty": 40.0}, "length_penalty"),
        # Contrastive search ranks top_k candidates of the 97-token vocabulary.
        ({"penalty_alpha": 0.5, "top_k": 98}, "top_k"),
    ],
)
def test_a_degenerate_value_is_refused_naming_its_option(tiny_model, options, match):
    traces = tiny_model.generate_trace_count
    with pytest.raises((ValueError, TypeError), match=match):
        tiny_model.generate(PROMPT, max_new_tokens=8, **options)
    assert tiny_model.generate_trace_count == traces  # refused before anything was traced


def test_a_moderate_length_penalty_is_accepted():
    from tfgen.decoding.beam import length_penalty_fits

    # 2.0 over 1000 tokens is fine; 40 over 8 tokens is not (40 * ln 8 = 83 > 80).
    assert bool(length_penalty_fits(2.0, 1000)) and bool(length_penalty_fits(-2.0, 1000))
    assert not bool(length_penalty_fits(40.0, 8)) and bool(length_penalty_fits(40.0, 1))


@pytest.mark.parametrize(
    "options",
    [
        {"num_beams": 10**6},
        {"do_sample": True, "num_return_sequences": 10**6, "seed": [1, 2]},
        {"penalty_alpha": 0.5, "top_k": 90, "max_new_tokens": 40},  # under a small memory limit, see below
    ],
)
def test_requests_that_cannot_fit_in_memory_are_refused_in_under_two_seconds(tiny_model, monkeypatch, options):
    options = dict(options)
    # A fixed limit, so that no machine tries the allocation: 1 GiB; or 1 MiB against the contrastive request's
    # 90 candidate rows of the tiny model's cache (2 layers x 2 x 32 floats per slot) over 48 slots, ~2 MiB.
    monkeypatch.setenv(MEMORY_LIMIT_ENV, str(1 << 20 if options.get("penalty_alpha") else 1 << 30))
    options.setdefault("max_new_tokens", 8)
    traces = tiny_model.generate_trace_count
    began = time.perf_counter()
    with pytest.raises(ValueError, match="needs at least .* available; lower"):
        tiny_model.generate(PROMPT, **options)
    assert time.perf_counter() - began < 2.0
    assert tiny_model.generate_trace_count == traces


def test_the_memory_estimate_counts_the_model_cache_exactly(tiny_model):
    from tfgen.request.size import cache_bytes

    cache = tiny_model.init_cache(3, 24)
    allocated = sum(int(tf.size(leaf)) * leaf.dtype.size for leaf in tf.nest.flatten(cache))
    assert cache_bytes(tiny_model, 3, 24) == allocated


def test_float_knobs_are_checked_for_finiteness_in_exported_graphs():
    values = tf.constant([1.0, float("inf"), float("nan"), 1e-45, 0.5], tf.float32)
    assert KNOBS["temperature"].accepts(values).numpy().tolist() == [True, False, False, False, True]
    lengths = tf.constant([1.0, -float("inf"), 3.0], tf.float64)
    assert KNOBS["length_penalty"].accepts(lengths).numpy().tolist() == [True, False, True]


def test_an_overflowing_temperature_keeps_the_distribution_defined():
    """HF's `scores / temperature` overflows float32 (100 / 1e-37) and its softmax turns NaN; here such a row
    becomes its greedy limit, and a row that does not overflow keeps HF's values exactly."""
    from tfgen.logits.spec import ProcessorSpec
    from tfgen.logits.warpers import apply_warpers

    scores = tf.constant([[100.0, 50.0, -100.0, -np.inf], [1.0, 2.0, 3.0, 4.0]])
    spec = ProcessorSpec().forced({"temperature": True})
    warped, _ = apply_warpers(spec, scores, {"temperature": np.array([1e-37, 0.5], "f4")})
    assert warped.numpy().tolist() == [[0.0, -np.inf, -np.inf, -np.inf], [2.0, 4.0, 6.0, 8.0]]


def test_sampling_from_overflowed_scores_draws_among_the_infinite_ones():
    from tfgen.decoding.state import sample_from_scores

    scores = tf.constant([[np.inf, 1.0, np.inf, np.nan]] * 64)
    seeds = tf.constant(np.arange(128, dtype=np.int32).reshape(64, 2))
    drawn = sample_from_scores(scores, seeds, tf.constant(0)).numpy()
    assert set(drawn.tolist()) == {0, 2}


@pytest.mark.parametrize(
    "options, expected",
    [
        # 10 + logit divided by a temperature of 1.2e-38 overflows: the biased token is the greedy limit.
        ({"temperature": 1.2e-38, "sequence_bias": {(60,): 10.0}}, 60),
        # A seen token's positive score divided by a penalty of 1.2e-38 overflows to +inf: it is the only token left.
        ({"repetition_penalty": 1.2e-38, "sequence_bias": {(42,): 10.0}}, 42),
    ],
)
def test_overflowing_knobs_sample_their_limit_end_to_end(tiny_model, options, expected):
    sampled = tiny_model.generate(PROMPT, max_new_tokens=2, do_sample=True, top_k=0, seed=[3, 4], **options)
    assert sampled.numpy()[0, PROMPT.shape[1]] == expected


class _WrongShape:
    def __call__(self, input_ids, scores, cur_len):
        return scores[:, :1]


class _IntegerScores:
    def __call__(self, input_ids, scores, cur_len):
        return tf.cast(scores, tf.int32)


class _Broken:
    def __call__(self, input_ids, scores):  # one argument short
        return scores


@pytest.mark.parametrize(
    "processors, error, match",
    [
        ([_WrongShape()], ValueError, r"logits_processor\[0\] \(_WrongShape\) must return scores of shape"),
        ([_IntegerScores()], TypeError, r"logits_processor\[0\] \(_IntegerScores\) must return float scores"),
        ([_Broken()], TypeError, r"logits_processor\[0\] \(_Broken\) raised TypeError while generate traced it"),
        (_WrongShape(), TypeError, "logits_processor must be a list .* wrap a single one in a list"),
        ([_WrongShape], TypeError, "logits_processor entries must be"),
        (42, TypeError, "logits_processor must be a list"),
    ],
)
def test_a_broken_user_processor_is_named(tiny_model, processors, error, match):
    with pytest.raises(error, match=match):
        tiny_model.generate(PROMPT, max_new_tokens=2, logits_processor=processors)


def test_an_empty_prompt_with_its_empty_mask_starts_from_bos(tiny_model):
    """What a tokenizer returns for "": ids and mask of shape [1, 0]."""
    empty = np.zeros([1, 0], np.int32)
    from_empty = tiny_model.generate(empty, attention_mask=empty, max_new_tokens=3).numpy()
    from_bos = tiny_model.generate(np.array([[1]], np.int32), max_new_tokens=3).numpy()
    np.testing.assert_array_equal(from_empty, from_bos)


def test_an_export_no_request_could_fit_is_refused_before_writing(tiny_model, tmp_path, monkeypatch):
    from tfgen.export import export_saved_model

    monkeypatch.setenv(MEMORY_LIMIT_ENV, str(1 << 30))
    began = time.perf_counter()
    with pytest.raises(ValueError, match=r"1000000 beams \(num_beams\).*needs at least"):
        export_saved_model(tiny_model, tmp_path / "out", max_new_tokens=4, num_beams=10**6)
    assert time.perf_counter() - began < 2.0
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_an_empty_prompt_with_a_mask_of_another_shape_is_refused(tiny_model):
    with pytest.raises(ValueError, match=r"attention_mask has shape \(1, 3\), but input_ids has shape \(1, 0\)"):
        tiny_model.generate(np.zeros([1, 0], np.int32), attention_mask=np.ones([1, 3], np.int32), max_new_tokens=3)


def test_the_value_type_tests_refuse_bools_and_accept_numpy_scalars():
    from tfgen.value_types import is_integer, is_real

    assert is_integer(3) and is_integer(np.int64(3)) and not is_integer(True) and not is_integer(3.0)
    assert is_real(3) and is_real(np.float32(0.5)) and is_real(float("nan")) and not is_real(False)
    assert not is_real("3") and not is_integer(None)
