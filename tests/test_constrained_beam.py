"""Constrained beam search (`force_words_ids`, `constraints`) against HF transformers 4.55.4's PyTorch generate on the
same random weights, token for token: hypotheses, their scores, every step's scores and logits, beam indices.

The constraint state machine is checked against HF's own `ConstraintListState` token by token (cheap, eager), then
whole searches on a left-padded batch of two prompts: one GPT-2 program for a phrase and a one-of-several-words
constraint (`force_words_ids`; the same constraints as tfgen's or HF's constraint objects share it) under every
`early_stopping` / `length_penalty` (run-time knobs), one for several phrases, one on Llama; the errors come before
anything compiles. (The longest prompt comes first: HF's rows of a finished prompt copy row 0, see docs/design.md.)
"""

from __future__ import annotations

import collections
import itertools
import random

import numpy as np
import pytest
import tensorflow as tf
import torch
from conftest import left_padded_batch, word_level_tokenizer
from llama_checkpoints import build_hf_model
from transformers.generation import beam_constraints as hf_constraints

from tfgen import AutoModelForCausalLM, DisjunctiveConstraint, PhrasalConstraint, TextStreamer
from tfgen.decoding.constraint_states import ConstraintGraph
from tfgen.decoding.constraints import check_constraint_vocabulary, constraint_tables

PROMPTS = [[5, 17, 33, 8, 61, 12], [44, 3, 90]]
NEW_TOKENS = 12
OUTPUTS = dict(return_dict_in_generate=True, output_scores=True, output_logits=True)
CASES = [(False, 1.0), (False, 2.0), (True, 0.0), ("never", 0.5), ("never", -1.0)]
MIXED = dict(num_beams=2, num_return_sequences=2, **OUTPUTS)


# ----------------------------------------------------------------------------------------------------------
# The state machine, against HF's ConstraintListState


def _hf_constraint(words):
    return hf_constraints.PhrasalConstraint(list(words[0])) if len(words) == 1 else \
        hf_constraints.DisjunctiveConstraint([list(word) for word in words])


def _hf_advance_banks(state, tokens):
    """HF's banks of a beam's advance candidates, made as `step_sentence_constraint` makes them (stateful copies)."""
    states = []
    for token in tokens:
        new_state = state.copy(stateful=True)
        new_state.add(token)
        states.append(new_state)
    return [one.get_bank() for one in states]


@pytest.mark.parametrize("words", [
    (((4, 5),), ((6,),)),
    (((4, 5, 6),), ((4, 7),)),  # two phrases starting alike: the pending list's order decides
    (((4, 4, 5),), ((5, 6), (7,))),  # a repeated token; a broken phrase goes to the end of the list
    (((4, 5, 6), (4, 6, 5), (4, 5, 7), (8,)),),  # branching words: HF's copies share their progress
    (((9,),), ((4, 5), (6, 4, 5)), ((5, 6, 7),)),
])
def test_progress_matches_hf_constraint_list_state(words):
    """After each token of random sequences: completion, bank, and the advance candidates (tokens and banks)."""
    tables = constraint_tables(force_words_ids=[[list(w) for w in c] if len(c) > 1 else list(c[0]) for c in words])
    graph = ConstraintGraph(tables)
    alphabet = sorted({token for constraint in words for word in constraint for token in word}) + [3]
    rng = random.Random(0)
    sequences = [[rng.choice(alphabet) for _ in range(14)] for _ in range(16)]

    def hf_state(history):  # as HF does each step: a state rebuilt from the sequence (its copies may alter it)
        state = hf_constraints.ConstraintListState([_hf_constraint(c) for c in words])
        state.reset(history)
        return state

    ours = graph.initial(len(sequences))
    for length in range(15):
        candidates = graph.advance_candidates(ours)
        completed, banks = graph.completed(ours).numpy(), graph.bank(ours).numpy()
        for row, sequence in enumerate(sequences):
            state = hf_state(sequence[:length])
            assert (completed[row], banks[row]) == (state.completed, state.get_bank())
            valid = candidates.valid[row].numpy()
            advance = state.advance() if not state.completed else None
            assert candidates.tokens[row].numpy()[valid].tolist() == (advance or [])
            if advance:
                assert candidates.banks[row].numpy()[valid].tolist() == _hf_advance_banks(state, advance)
        if length < 14:
            ours = graph.add(ours, tf.constant([sequence[length] for sequence in sequences]))


# ----------------------------------------------------------------------------------------------------------
# Whole searches against HF


def hf_generate(hf_model, ids, mask, **options):
    with torch.no_grad():
        return hf_model.generate(input_ids=torch.tensor(ids, dtype=torch.long),
                                 attention_mask=torch.tensor(mask, dtype=torch.long),
                                 max_new_tokens=NEW_TOKENS, pad_token_id=0, **options)


def assert_matches_hf(ours, hf_out):
    """Hypotheses (HF's width, then pad), their scores, each step's scores and logits, and the beam indices where
    HF gives them (it gives none when its best hypothesis missed a constraint)."""
    hf_sequences = hf_out.sequences.numpy()
    width = hf_sequences.shape[1]
    np.testing.assert_array_equal(ours.sequences.numpy()[:, :width], hf_sequences)
    assert (ours.sequences.numpy()[:, width:] == 0).all()
    np.testing.assert_allclose(ours.sequences_scores.numpy(), hf_out.sequences_scores.numpy(), atol=1e-4)
    assert len(ours.scores) == len(hf_out.scores) == len(ours.logits)
    for step, (our_scores, hf_scores) in enumerate(zip(ours.scores, hf_out.scores)):
        np.testing.assert_allclose(our_scores.numpy(), hf_scores.numpy(), atol=1e-4, err_msg=f"scores, step {step}")
        np.testing.assert_allclose(ours.logits[step].numpy(), hf_out.logits[step].numpy(), atol=1e-4)
    if hf_out.beam_indices is not None:
        np.testing.assert_array_equal(ours.beam_indices.numpy(), hf_out.beam_indices.numpy()[:, : len(ours.scores)])


def contains(row, word) -> bool:
    return any(list(row[i : i + len(word)]) == list(word) for i in range(len(row) - len(word) + 1))


@pytest.fixture(scope="module")
def batch():
    return left_padded_batch(PROMPTS)


@pytest.fixture(scope="module")
def words(hf_model, batch):
    """Tokens the model produces anyway (so that constraints meet its choices), from an unconstrained beam search:
    its most common bigrams and tokens; and two eos ids with which some search stops before the budget and HF's
    `output_scores` works (it fails when a hypothesis that missed a constraint follows one that met them)."""
    ids, mask = batch
    free = hf_generate(hf_model, ids, mask, num_beams=4, num_return_sequences=4, eos_token_id=None).numpy()
    free = free[:, ids.shape[1]:]
    tokens, counts = np.unique(free, return_counts=True)
    common = [int(token) for token in tokens[np.argsort(-counts, kind="stable")]]
    pairs = collections.Counter((int(a), int(b)) for row in free for a, b in zip(row, row[1:]) if a != b)
    bigrams = [list(pair) for pair, _ in pairs.most_common()]
    for chosen in ({"phrase": [common[0]], "other": next(b for b in bigrams if common[0] not in b)},
                   {"phrase": bigrams[0], "other": bigrams[2]}):
        chosen["token"] = next(t for t in common if t not in chosen["phrase"] + chosen["other"])
        mixed = [chosen["phrase"], [chosen["other"], [chosen["token"]]]]
        used = set(chosen["phrase"] + chosen["other"]) | {chosen["token"]}
        for eos in itertools.combinations([token for token in common[:10] if token not in used], 2):
            outputs = {}
            try:
                for case in sorted(CASES, key=lambda case: case[0] is not True):  # the likeliest to stop first
                    outputs[case] = hf_generate(hf_model, ids, mask, force_words_ids=mixed, eos_token_id=list(eos),
                                                early_stopping=case[0], length_penalty=case[1], **MIXED)
                    if len(outputs[case].scores) == NEW_TOKENS and case[0] is True:
                        break
            except RuntimeError:
                continue
            if len(outputs) == len(CASES):
                return dict(chosen, mixed=mixed, eos=list(eos), bigrams=bigrams, hf_outputs=outputs)
    pytest.fail("the random checkpoint gave no eos ids that stop constrained beam search early; change them")


@pytest.fixture(scope="module")
def mixed(words):
    """A phrase and a one-of-several-words constraint."""
    return words["mixed"]


@pytest.fixture(scope="module")
def hf_mixed(words):
    """HF's searches with `mixed` for every (early_stopping, length_penalty) case."""
    return words["hf_outputs"]


@pytest.mark.parametrize("early_stopping, length_penalty", CASES)
def test_force_words_ids_match_hf(tiny_model, batch, words, mixed, hf_mixed, early_stopping, length_penalty):
    ids, mask = batch
    ours = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, pad_token_id=0,
                               force_words_ids=mixed, eos_token_id=words["eos"], early_stopping=early_stopping,
                               length_penalty=length_penalty, **MIXED)
    assert_matches_hf(ours, hf_mixed[early_stopping, length_penalty])


def test_the_cases_have_teeth(batch, words, mixed, hf_mixed):
    """Hypotheses that meet every constraint, hypotheses ended by eos, a search that stops before the budget."""
    width = batch[0].shape[1]
    rows = [row for out in hf_mixed.values() for row in out.sequences.numpy()[:, width:]]
    assert any(contains(row, mixed[0]) and (contains(row, mixed[1][0]) or mixed[1][1][0] in row) for row in rows)
    assert any(np.isin(row, words["eos"]).any() for row in rows)
    assert any(len(out.scores) < NEW_TOKENS for out in hf_mixed.values())


@pytest.mark.parametrize("kind", ["tfgen", "hf"])
def test_constraint_objects_match_force_words_ids(tiny_model, batch, words, mixed, hf_mixed, kind):
    """`constraints=` with tfgen's or HF's classes: the same tables, so the same program and results."""
    module = hf_constraints if kind == "hf" else None
    phrasal = module.PhrasalConstraint if module else PhrasalConstraint
    disjunctive = module.DisjunctiveConstraint if module else DisjunctiveConstraint
    ids, mask = batch
    traces = tiny_model.generate_trace_count
    ours = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, pad_token_id=0,
                               eos_token_id=words["eos"], **MIXED,
                               constraints=[phrasal(list(mixed[0])), disjunctive([list(w) for w in mixed[1]])])
    assert_matches_hf(ours, hf_mixed[False, 1.0])
    assert tiny_model.generate_trace_count == traces


def test_several_phrases_match_hf(tiny_model, hf_model, batch, words):
    ids, mask = batch
    options = dict(num_beams=3, force_words_ids=[words["bigrams"][1], [words["token"]], words["bigrams"][3]],
                   eos_token_id=words["eos"][:1], length_penalty=0.5, **OUTPUTS)
    hf_out = hf_generate(hf_model, ids, mask, **options)
    ours = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, pad_token_id=0, **options)
    assert_matches_hf(ours, hf_out)


def test_llama_matches_hf(tmp_path_factory, batch):
    directory = tmp_path_factory.mktemp("llama")
    hf_model = build_hf_model("llama", directory)
    model = AutoModelForCausalLM.from_pretrained(directory)
    ids, mask = batch
    free = hf_generate(hf_model, ids, mask, num_beams=3, eos_token_id=None).numpy()[:, ids.shape[1]:]
    phrase = [int(free[0, 3]), int(free[1, 5])]
    options = dict(num_beams=3, num_return_sequences=3, eos_token_id=int(free[1, 2]), early_stopping="never",
                   force_words_ids=[phrase, [[int(free[0, 1]), int(free[1, 1])], [int(free[0, 6]) + 1]]], **OUTPUTS)
    assert_matches_hf(model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, pad_token_id=0, **options),
                      hf_generate(hf_model, ids, mask, **options))


# ----------------------------------------------------------------------------------------------------------
# Errors, before anything compiles


class _Custom(hf_constraints.PhrasalConstraint):
    pass


@pytest.mark.parametrize("options, error, match", [
    (dict(force_words_ids="5"), ValueError, "force_words_ids"),
    (dict(force_words_ids=[]), ValueError, "force_words_ids"),
    (dict(force_words_ids=[[]]), ValueError, "force_words_ids"),
    (dict(force_words_ids=[[5, -1]]), ValueError, "force_words_ids"),
    (dict(force_words_ids=[[5, 2.0]]), ValueError, "force_words_ids"),
    (dict(force_words_ids=[[[5], [6, "x"]]]), ValueError, "force_words_ids"),
    (dict(force_words_ids=[[[5, 6], [5]]]), ValueError, "subset"),
    (dict(constraints=["a constraint"]), TypeError, "constraints"),
    (dict(constraints=[_Custom([5])]), TypeError, "_Custom"),
    (dict(constraints=[]), ValueError, "constraints"),
    (dict(force_words_ids=[[5]], num_beams=1), ValueError, "num_beams"),
    (dict(force_words_ids=[[5]], do_sample=True), ValueError, "do_sample"),
    (dict(force_words_ids=[[5]], num_beam_groups=2, diversity_penalty=0.5), ValueError, "num_beam_groups"),
    (dict(force_words_ids=[[5]], stop_strings=["w5"]), ValueError, "stop_strings"),
    (dict(force_words_ids=[[5]], stopping_criteria=[lambda ids, scores: ids[:, -1] == 5]), ValueError,
     "stopping_criteria"),
    (dict(force_words_ids=[[5]], streamer=TextStreamer), ValueError, "stream"),
    (dict(force_words_ids=[[5]], regex="w5|w6"), ValueError, "regex"),
])
def test_clear_errors_before_compiling(tiny_model, options, error, match):
    options = {"num_beams": 2, "max_new_tokens": 3, "tokenizer": word_level_tokenizer(), **options}
    if options.get("streamer") is TextStreamer:
        options["streamer"] = TextStreamer(options["tokenizer"])
    traces = tiny_model.generate_trace_count
    with pytest.raises(error, match=match):
        tiny_model.generate(np.array([[5, 6, 7]]), **options)
    assert tiny_model.generate_trace_count == traces


@pytest.mark.parametrize("make, match", [
    (lambda: PhrasalConstraint([]), "non-empty"),
    (lambda: PhrasalConstraint([1, -2]), "positive"),
    (lambda: DisjunctiveConstraint([[1, 2], [1, 2, 3]]), "subset"),
    (lambda: DisjunctiveConstraint([1, 2]), "list of lists"),
])
def test_constraint_classes_check_their_arguments_as_hf(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_token_outside_the_vocabulary_and_export_are_refused(tiny_model, tmp_path):
    from tfgen import GenerationConfig, export_saved_model

    vocab_size = tiny_model.config.vocab_size
    traces = tiny_model.generate_trace_count
    with pytest.raises(ValueError, match=rf"force_words_ids / constraints: token id {vocab_size} \(constraint 1, "
                       rf"\[\[7\], \[8, {vocab_size}\]\]\) is outside the model's vocabulary \[0, {vocab_size}\)"):
        tiny_model.generate(np.array([[5, 6, 7]]), num_beams=2, max_new_tokens=3,
                            force_words_ids=[[5, 6], [[7], [8, vocab_size]]])
    assert tiny_model.generate_trace_count == traces  # refused by the request layer, before compiling
    config = GenerationConfig(num_beams=2, force_words_ids=[[5]], max_new_tokens=3)
    with pytest.raises(ValueError, match="constrained_beam_search"):
        export_saved_model(tiny_model, tmp_path, config)


def test_the_vocabulary_check_names_the_constraint():
    tables = constraint_tables(force_words_ids=[[5, 6], [[7], [8, 99]]])
    check_constraint_vocabulary(tables, 100)
    with pytest.raises(ValueError, match=r"^force_words_ids / constraints: token id 99 \(constraint 1, \[\[7\], "
                       r"\[8, 99\]\]\) is outside the model's vocabulary \[0, 99\)\.$"):
        check_constraint_vocabulary(tables, 99)


def test_tables_are_shared_by_equal_constraints():
    assert constraint_tables(force_words_ids=[[5, 6], [[7], [8, 9]]]) == constraint_tables(
        constraints=[PhrasalConstraint([5, 6]), hf_constraints.DisjunctiveConstraint([[7], [8, 9]])])
    assert hash(constraint_tables(force_words_ids=[[5, 6]])) == hash(constraint_tables(force_words_ids=[[5, 6]]))
