"""Speculative decoding (assisted generation): greedy gives plain greedy's tokens with every drafter, sampling draws
from the model's own distribution, rows advance by their own counts, and what cannot run exactly is refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf
from conftest import word_level_tokenizer

from tfgen import GenerationConfig
from tfgen.generation.programs import generate_program
from tfgen.models.gpt2 import GPT2Config, GPT2LMHeadModel
from tfgen.models.llama import LlamaConfig, LlamaForCausalLM
from tfgen.request.prepare import prepare_request

# Rows that repeat themselves (so prompt lookup finds matches), of different lengths (left padding).
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 12, 13, 9, 10, 11, 12, 13, 9, 10], [20, 21, 22, 20, 21]]
DRAFTERS = {
    "prompt_lookup": dict(prompt_lookup_num_tokens=4),
    "early_exit": dict(assistant_early_exit=1, num_assistant_tokens=3),
    "assistant": dict(num_assistant_tokens=3),  # the assistant model is added by the test
}


def padded(prompts, pad=0):
    width = max(len(row) for row in prompts)
    ids = np.full([len(prompts), width], pad, np.int32)
    for index, row in enumerate(prompts):
        ids[index, width - len(row):] = row
    return ids, (ids != pad).astype(np.int32)


def tiny_llama(seed=0, **overrides):
    keras_seed(seed)
    options = dict(model_type="llama", vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.3,
                   bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(LlamaConfig(**{**options, **overrides}))


def keras_seed(seed):
    import keras

    keras.utils.set_random_seed(seed)


@pytest.fixture(scope="module")
def models(tiny_model):
    """name -> (model, its assistant): the shared tiny GPT-2, a Llama and a Mistral with a 6-slot sliding window."""
    llama = tiny_llama()
    mistral = tiny_llama(seed=1, model_type="mistral", sliding_window=6)
    keras_seed(2)
    gpt2_assistant = GPT2LMHeadModel(GPT2Config(vocab_size=97, n_positions=64, n_embd=16, n_layer=1, n_head=2,
                                                initializer_range=0.3, bos_token_id=1, eos_token_id=2, pad_token_id=0))
    return {"gpt2": (tiny_model, gpt2_assistant), "llama": (llama, tiny_llama(seed=3, num_hidden_layers=1)),
            "mistral": (mistral, llama)}


def run(model, ids, mask, **options):
    """(sequences, the program's result dict) of one compiled generate call."""
    request = prepare_request(model, ids, attention_mask=mask, **options)
    program, _ = generate_program(model, request)
    result = program(request.inputs)
    return model.generate(ids, attention_mask=mask, **options).numpy(), result


@pytest.mark.parametrize("family, drafter", [
    ("gpt2", "prompt_lookup"), ("llama", "prompt_lookup"), ("mistral", "prompt_lookup"),
    ("gpt2", "early_exit"), ("llama", "early_exit"), ("gpt2", "assistant"),
])  # the Llama assistant runs in test_seeded_speculative_sampling_repeats_and_is_batch_invariant
def test_greedy_speculative_equals_plain_greedy(models, family, drafter):
    model, assistant = models[family]
    ids, mask = padded(PROMPTS)
    options = dict(max_new_tokens=14, do_sample=False)
    free = model.generate(ids, attention_mask=mask, eos_token_id=None, **options).numpy()[:, ids.shape[1]:]
    # An eos that some rows reach mid-way, at different steps, so rows finish unevenly.
    eos = next(int(token) for token in free[0, 3:10] if token not in free[0, :3])
    extra = dict(DRAFTERS[drafter], **({"assistant_model": assistant} if drafter == "assistant" else {}))
    for eos_option in (dict(eos_token_id=None), dict(eos_token_id=eos)):
        plain = model.generate(ids, attention_mask=mask, **options, **eos_option).numpy()
        speculative, result = run(model, ids, mask, **options, **eos_option, **extra)
        np.testing.assert_array_equal(speculative, plain)
    assert (plain[0, ids.shape[1]:] == 0).any(), "the eos ends row 0 early"
    rounds = result["draft_rounds"].numpy()[:3]
    assert (rounds >= 1).all() and (rounds <= 14).all()


def test_rows_advance_by_their_own_accepted_counts(models):
    """A row whose continuation the prompt predicts accepts drafts while the others do not, in one batch."""
    model, _ = models["gpt2"]
    ids, mask = padded(PROMPTS)
    free = model.generate(ids, attention_mask=mask, max_new_tokens=14, eos_token_id=None).numpy()
    # Prompts that already hold each row's own greedy continuation: prompt lookup drafts it exactly.
    grounded = [list(row[ids.shape[1]:]) + [3, 4] + list(prompt) for row, prompt in zip(free, PROMPTS)]
    grounded[2] = PROMPTS[2]
    ids2, mask2 = padded(grounded)
    plain = model.generate(ids2, attention_mask=mask2, max_new_tokens=14, eos_token_id=None).numpy()
    speculative, result = run(model, ids2, mask2, max_new_tokens=14, eos_token_id=None, prompt_lookup_num_tokens=4)
    np.testing.assert_array_equal(speculative, plain)
    accepted, rounds = result["draft_accepted"].numpy()[:3], result["draft_rounds"].numpy()[:3]
    assert rounds[0] < 14 and accepted[0] > 0 and len(set(rounds.tolist())) > 1, (accepted, rounds)


def test_prompt_lookup_matches_hf_assisted_generation(models, hf_model):
    import torch

    model, _ = models["gpt2"]
    ids = np.array([PROMPTS[1]], np.int32)
    ours = model.generate(ids, max_new_tokens=12, prompt_lookup_num_tokens=3).numpy()
    theirs = hf_model.generate(torch.tensor(ids, dtype=torch.long),
                               attention_mask=torch.ones(ids.shape, dtype=torch.long), max_new_tokens=12,
                               do_sample=False, prompt_lookup_num_tokens=3, pad_token_id=0)
    np.testing.assert_array_equal(ours[:, :theirs.shape[1]], theirs.numpy())


def test_processors_see_each_verified_position_in_its_own_context(models):
    """Repetition penalty, n-gram bans and sampling warpers read the tokens before each drafted position, so the
    speculative tokens equal plain decoding's (greedy and, with prompt lookup, seeded sampling)."""
    model, _ = models["llama"]
    ids, mask = padded(PROMPTS)
    sampling = dict(max_new_tokens=12, repetition_penalty=1.4, no_repeat_ngram_size=3, min_new_tokens=4,
                    do_sample=True, temperature=0.8, top_k=20, top_p=0.9, seed=[4, 5])
    plain = model.generate(ids, attention_mask=mask, **sampling).numpy()
    speculative = model.generate(ids, attention_mask=mask, prompt_lookup_num_tokens=3, **sampling).numpy()
    np.testing.assert_array_equal(speculative, plain)


def test_scores_stop_strings_and_streaming(models):
    model, _ = models["gpt2"]
    tokenizer = word_level_tokenizer()
    ids, mask = padded(PROMPTS)
    free = model.generate(ids, attention_mask=mask, max_new_tokens=10, eos_token_id=None).numpy()[:, ids.shape[1]:]
    stop = tokenizer.decode([int(free[1, 4]), int(free[1, 5])])
    options = dict(max_new_tokens=10, return_dict_in_generate=True, output_scores=True, output_logits=True,
                   stop_strings=[stop], tokenizer=tokenizer)
    plain = model.generate(ids, attention_mask=mask, **options)
    streamed = []
    speculative = model.generate(ids, attention_mask=mask, prompt_lookup_num_tokens=3,
                                 streamer=lambda column: streamed.append(np.asarray(column)), **options)
    np.testing.assert_array_equal(speculative.sequences, plain.sequences)
    assert len(speculative.scores) == len(plain.scores) == len(speculative.logits)
    for ours, theirs in zip(speculative.scores + speculative.logits, plain.scores + plain.logits):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    stream = np.concatenate([np.reshape(column, [len(PROMPTS), -1]) for column in streamed], axis=1)
    steps = len(plain.scores)
    np.testing.assert_array_equal(stream[:, -steps:], plain.sequences[:, ids.shape[1]:][:, :steps])


def test_seeded_speculative_sampling_repeats_and_is_batch_invariant(models):
    model, assistant = models["llama"]
    ids, mask = padded(PROMPTS)
    options = dict(max_new_tokens=10, do_sample=True, seed=[[1, 2], [3, 4], [5, 6]], assistant_model=assistant,
                   num_assistant_tokens=3)
    first = model.generate(ids, attention_mask=mask, **options).numpy()
    np.testing.assert_array_equal(model.generate(ids, attention_mask=mask, **options).numpy(), first)
    # The rows in another order, next to other padding: each row's tokens follow its own seed only.
    order = [2, 0, 1]
    moved = model.generate(ids[order], attention_mask=mask[order],
                           **{**options, "seed": np.array(options["seed"])[order]}).numpy()
    np.testing.assert_array_equal(moved, first[order])


def test_new_prompts_of_a_bucket_do_not_recompile(models):
    model, _ = models["gpt2"]
    ids, mask = padded(PROMPTS)
    model.generate(ids, attention_mask=mask, max_new_tokens=14, prompt_lookup_num_tokens=4)
    traces = model.generate_trace_count
    other, other_mask = padded([[30, 31, 32, 30, 31], [40, 41], [50, 51, 52, 53, 54, 55, 56]])
    model.generate(other, attention_mask=other_mask, max_new_tokens=11, prompt_lookup_num_tokens=4, eos_token_id=7)
    assert model.generate_trace_count == traces


def _chi_square_p_value(observed: np.ndarray, expected_probabilities: np.ndarray) -> float:
    """Upper-tail p-value of Pearson's chi-square statistic (Wilson-Hilferty approximation of its distribution)."""
    expected = expected_probabilities * observed.sum()
    kept = expected > 0
    statistic = float((((observed - expected) ** 2)[kept] / expected[kept]).sum())
    if (observed[~kept] > 0).any():
        return 0.0
    dof = int(kept.sum()) - 1
    z = ((statistic / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_speculative_sampling_draws_from_the_models_distribution():
    """2048 seeded rows of one prompt, 3 tokens each through an assistant whose distribution differs from the model's:
    the joint distribution of the first two tokens and the marginal of the third match the model's exact ones (the
    tokens after the first come from the acceptance rule), and do not match the assistant's."""
    vocab = 8
    model = tiny_llama(seed=5, vocab_size=vocab, hidden_size=16, intermediate_size=32, initializer_range=0.6,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None)
    assistant = tiny_llama(seed=6, vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           initializer_range=0.6, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    rows, prompt = 2048, [3, 1, 4]
    ids = np.tile(np.array([prompt], np.int32), [rows, 1])
    seeds = np.stack([np.arange(rows), np.full(rows, 77)], axis=1).astype(np.int32)
    options = dict(max_new_tokens=3, do_sample=True, top_k=0, seed=seeds, pad_token_id=0)
    tokens = model.generate(ids, assistant_model=assistant, num_assistant_tokens=2, **options).numpy()[:, 3:]

    def exact(net):
        """p(t0, t1) [V, V] and p(t2) [V] of `net`, from its plain forward over every two-token continuation."""
        pairs = np.array([[a, b] for a in range(vocab) for b in range(vocab)], np.int32)
        full = np.concatenate([np.tile(np.array([prompt], np.int32), [vocab * vocab, 1]), pairs], axis=1)
        probs = tf.nn.softmax(net(full).logits).numpy()  # [V*V, 5, V]
        first = probs[0, 2]
        second = probs[::vocab, 3]  # rows (a, 0): p(t1 | a)
        joint = first[:, None] * second
        third = (joint.reshape(-1, 1) * probs[:, 4]).sum(axis=0)
        return joint, third

    joint, third = exact(model)
    observed_joint = np.bincount(tokens[:, 0] * vocab + tokens[:, 1], minlength=vocab * vocab).astype(float)
    observed_third = np.bincount(tokens[:, 2], minlength=vocab).astype(float)
    assert _chi_square_p_value(observed_joint, joint.reshape(-1)) > 1e-3
    assert _chi_square_p_value(observed_third, third) > 1e-3
    assistant_joint, assistant_third = exact(assistant)
    assert _chi_square_p_value(observed_joint, assistant_joint.reshape(-1)) < 1e-6
    assert _chi_square_p_value(observed_third, assistant_third) < 1e-6


@pytest.mark.parametrize("options, error, match", [
    (dict(prompt_lookup_num_tokens=3, logits_processor=[lambda ids, scores, cur_len: scores]), ValueError,
     "logits_processor"),
    (dict(prompt_lookup_num_tokens=3, assistant_early_exit=1), ValueError, "one drafter"),
    (dict(assistant_early_exit=2), ValueError, "assistant_early_exit.*below the model's 2 layers"),
    (dict(assistant_model="small"), TypeError, "assistant_model"),
    (dict(prompt_lookup_num_tokens=0), ValueError, "prompt_lookup_num_tokens"),
    (dict(prompt_lookup_num_tokens=65), ValueError, "prompt_lookup_num_tokens"),
    (dict(num_assistant_tokens_schedule="heuristic", assistant_early_exit=1), ValueError,
     "num_assistant_tokens_schedule"),
])
def test_refusals_come_before_compiling(models, options, error, match):
    model, _ = models["gpt2"]
    traces = model.generate_trace_count
    with pytest.raises(error, match=match):
        model.generate(np.array([[5, 6, 7]]), max_new_tokens=4, **options)
    assert model.generate_trace_count == traces


def test_an_assistant_with_another_vocabulary_is_refused(models):
    model, _ = models["gpt2"]
    with pytest.raises(ValueError, match="assistant_model: its vocabulary has 50 tokens"):
        model.generate(np.array([[5, 6, 7]]), max_new_tokens=4, assistant_model=tiny_llama(vocab_size=50))


def test_assisted_options_in_beam_search_are_ignored_with_a_warning(models):
    model, assistant = models["gpt2"]
    with pytest.warns(UserWarning, match="assistant_model.*ignored"):
        model.generate(np.array([[5, 6, 7]]), max_new_tokens=3, num_beams=2, assistant_model=assistant)
    config = GenerationConfig(prompt_lookup_num_tokens=3)
    assert config.get_generation_mode().value == "assisted_generation"


def test_a_model_without_per_row_cache_slots_is_refused(models, monkeypatch):
    model, _ = models["gpt2"]
    monkeypatch.setattr(type(model), "row_cache_index", False)
    with pytest.raises(ValueError, match="model: GPT2LMHeadModel does not declare `row_cache_index = True`"):
        model.generate(np.array([[5, 6, 7]]), max_new_tokens=4, prompt_lookup_num_tokens=3)


def test_encoder_repetition_penalty_reads_the_prompt_in_every_round(models):
    """HF applies `encoder_repetition_penalty` to a decoder-only model's prompt; the verified positions see it too."""
    model, _ = models["llama"]
    ids, mask = padded(PROMPTS)
    options = dict(max_new_tokens=12, encoder_repetition_penalty=3.0)
    plain = model.generate(ids, attention_mask=mask, **options).numpy()
    assert (plain != model.generate(ids, attention_mask=mask, max_new_tokens=12).numpy()).any()  # it acts
    speculative = model.generate(ids, attention_mask=mask, prompt_lookup_num_tokens=3, **options).numpy()
    np.testing.assert_array_equal(speculative, plain)
