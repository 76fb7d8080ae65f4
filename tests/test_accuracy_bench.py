"""`python -m benchmarks.accuracy` (the int8 accuracy measure) on the tiny model: its perplexity equals one computed
here from the model's own logits, its windows score every token once, its agreement counts what it says."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from benchmarks import accuracy

CONTEXT, STRIDE = 16, 6
#: strided_windows(40, 16, 6) written out: windows 6 apart, each scoring the tokens past the previous one's end.
WINDOWS_40 = [(0, 1), (6, 16), (12, 22), (18, 28), (24, 34)]


@pytest.fixture(scope="module")
def text_ids():
    return np.random.default_rng(0).integers(3, 97, size=40).astype(np.int32)


def reference_nlls(model, ids, windows, context):
    """NLL per token 1.. from `model(window)` logits, log-softmax in float64 numpy: the harness's definition."""
    nlls = {}
    for begin, scored in windows:
        logits = np.asarray(model(ids[None, begin:begin + context]).logits[0], np.float64)
        log_probs = logits - logits.max(-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
        for token in range(scored, begin + len(logits)):
            assert token not in nlls
            nlls[token] = -log_probs[token - begin - 1, ids[token]]
    return np.array([nlls[token] for token in range(1, len(ids))])


def test_windows_score_every_token_once_after_enough_context():
    assert accuracy.strided_windows(40, CONTEXT, STRIDE) == WINDOWS_40
    # The last window moves back to end at the text's end; it scores only what the others did not.
    assert accuracy.strided_windows(37, CONTEXT, STRIDE) == [(0, 1), (6, 16), (12, 22), (18, 28), (21, 34)]
    assert accuracy.strided_windows(10, CONTEXT, STRIDE) == [(0, 1)]  # shorter than the context: one window
    for tokens, context, stride in [(100, 16, 1), (100, 16, 15), (97, 10, 4), (17, 16, 8), (1000, 64, 32)]:
        windows = accuracy.strided_windows(tokens, context, stride)
        scored = [token for index, (begin, first) in enumerate(windows)
                  for token in range(first, min(begin + context, tokens))]
        assert scored == list(range(1, tokens))
        for begin, first in windows[1:]:
            assert first - begin >= context - stride  # every scored token sees context - stride tokens or more
    for bad in [dict(stride=16), dict(stride=0), dict(context=0)]:
        with pytest.raises(ValueError, match=next(iter(bad))):
            accuracy.strided_windows(40, **{"context": CONTEXT, "stride": STRIDE, **bad})


def test_perplexity_equals_a_reference_from_the_models_logits(tiny_model, text_ids):
    expected = reference_nlls(tiny_model, text_ids, WINDOWS_40, CONTEXT)
    # Five windows two at a time: the last call repeats a window, whose values must not be scored twice.
    nlls = accuracy.token_nlls(tiny_model, text_ids, CONTEXT, STRIDE, rows=2)
    np.testing.assert_allclose(nlls, expected, rtol=1e-4, atol=1e-5)
    assert accuracy.perplexity(nlls) == pytest.approx(math.exp(expected.mean()), rel=1e-5)
    # One window holding the whole text, through the one-row decoding view: the plain forward's NLLs.
    whole = accuracy.token_nlls(tiny_model, text_ids, 64, 8, rows=1)
    np.testing.assert_allclose(whole, reference_nlls(tiny_model, text_ids, [(0, 1)], 64), rtol=1e-4, atol=1e-5)
    assert not np.allclose(whole[16:], nlls[16:], atol=1e-3)  # the windows did cut the context


def test_agreement_counts_prefixes_and_equal_positions():
    eos = [2]
    a = [[5, 6, 7, 8], [5, 6, 2, 9], [5, 6, 7, 8], [1, 2, 3, 4], [7, 2, 0, 0], [4, 4]]
    b = [[5, 6, 7, 8], [5, 6, 2, 4], [5, 9, 7, 8], [1, 3, 3, 4], [7, 8, 9, 2], [4, 4, 4, 4, 4]]
    result = accuracy.agreement(a, b, 4, eos)
    # Row 1: both end at the same eos, what follows it does not count. Row 4: A ended, B went on. Row 5: A stopped
    # after 2 tokens without an eos (its cut), B ran past the budget (cut at 4).
    assert result["matching_prefix"] == [4, 4, 1, 1, 1, 2]
    assert result["equal_fraction"] == [1.0, 1.0, 0.75, 0.25, 0.25, 0.5]
    assert result["rows_identical"] == 2
    assert result["mean_matching_prefix"] == pytest.approx(13 / 6)
    assert result["equal_fraction_overall"] == pytest.approx(15 / 24)
    assert accuracy.normalized_rows([[1, 2, 3]], 5, eos).tolist() == [[1, 2, accuracy.ENDED, accuracy.ENDED,
                                                                        accuracy.ENDED]]
    with pytest.raises(ValueError, match="prompts"):
        accuracy.agreement(a, b[:2], 4, eos)


def test_the_harness_on_one_model_twice_reports_equal_perplexity_and_full_agreement(chat_model_dir, tmp_path):
    words = np.random.default_rng(1).integers(3, 97, size=50)
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"w{word}" for word in words), encoding="utf-8")
    out = tmp_path / "report.json"
    report = accuracy.main(["--model", chat_model_dir, "--text", str(text), "--context", "16", "--stride", "8",
                            "--rows", "2", "--new-tokens", "8", "--prompts", "3", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    a, b = report["models"]["A"], report["models"]["B"]
    assert a["text_tokens"] == b["text_tokens"] == 50 and a["scored_tokens"] == 49
    assert a["perplexity"] == b["perplexity"] and report["perplexity_relative_change"] == 0
    assert 1 < a["perplexity"] < 1e4
    assert report["agreement"]["matching_prefix"] == [8, 8, 8] and report["agreement"]["rows_identical"] == 3
    assert len(a["answers"]) == 3 and a["answers"] == b["answers"]
