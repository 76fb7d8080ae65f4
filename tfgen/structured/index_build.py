"""Builds a token automaton in a child process (`python -m tfgen.structured.index_build`), so that a build can be
stopped at a deadline: outlines-core's `Index` runs in native code that cannot be interrupted, and some patterns take
exponential time (a JSON string's `maxLength: 20` takes minutes). The parent (`automaton.build_automaton`) writes
`(spelled tokens, placeholder eos, vocab size, pattern, most states)` pickled on stdin and reads
`("ok", TokenAutomaton)` or `("error", message)` back from stdout.
"""

from __future__ import annotations

import collections
import pickle
import sys
import time

import numpy as np

from tfgen.structured.automaton import (
    MAX_AUTOMATON_STATES,
    MIN_CLASSES,
    MIN_STATES,
    START_STATE,
    TokenAutomaton,
    padded_size,
)
from tfgen.structured.pattern_check import compile_failure


def build_index_tables(spelled: dict[int, bytes], placeholder_eos: int, vocab_size: int, pattern: str,
                       max_states: int = MAX_AUTOMATON_STATES):
    """outlines-core's `Index` of `pattern` over the `spelled` tokens, as a `TokenAutomaton` (ValueError when the
    pattern is not a regex outlines-core supports or its automaton is too large)."""
    from outlines_core import Index, Vocabulary  # lazy: only structured output needs it

    ids_by_bytes = collections.defaultdict(list)
    for token_id, text in spelled.items():
        ids_by_bytes[text].append(token_id)
    began = time.perf_counter()
    try:
        index = Index(pattern, Vocabulary(placeholder_eos, dict(ids_by_bytes)))
    except ValueError as err:
        failure = compile_failure(pattern, str(err))
        raise ValueError(failure or f"{pattern!r} cannot constrain this model's output: {err}") from None
    return automaton_tables(index, placeholder_eos, vocab_size, pattern, began, max_states)


def automaton_tables(index, placeholder_eos: int, vocab_size: int, pattern: str, began: float,
                     max_states: int = MAX_AUTOMATON_STATES) -> TokenAutomaton:
    """The class-compressed tables of an outlines-core `Index` (see `tfgen.structured.automaton`). ValueError when
    it has more than `max_states` states or no token can start a match (the messages name no option: the
    parent prefixes it)."""
    transitions = index.get_transitions()
    finals = set(index.get_final_states())
    initial = index.get_initial_state()
    if len(transitions) + 1 > max_states:
        raise ValueError(f"its automaton has {len(transitions) + 1} states, over the limit of {max_states} "
                         "(tfgen.structured.automaton.MAX_AUTOMATON_STATES).")
    # Our numbering: 0 dead, 1 the start, then the rest in outlines' order.
    others = sorted((set(transitions) | finals) - {initial})
    number = {state: position for position, state in enumerate([initial, *others], start=START_STATE)}
    states = len(number) + 1

    sources, tokens, targets = [], [], []
    for state, moves in transitions.items():
        moves = {token: target for token, target in moves.items() if token != placeholder_eos and token < vocab_size}
        sources.append(np.full(len(moves), number[state], np.int64))
        tokens.append(np.fromiter(moves.keys(), np.int64, len(moves)))
        targets.append(np.fromiter((number[target] for target in moves.values()), np.int64, len(moves)))
    sources, tokens, targets = (np.concatenate(part) if part else np.zeros([0], np.int64)
                                for part in (sources, tokens, targets))
    # Tokens with the same column (target per state) get the same random-weighted sum; a collision of two different
    # columns is checked for below rather than assumed away.
    weights = np.random.default_rng(0).integers(1, 2**62, size=states, dtype=np.uint64)
    column_hash = np.zeros(vocab_size, np.uint64)
    np.add.at(column_hash, tokens, weights[sources] * targets.astype(np.uint64))
    # Class 0 is the all-dead column (hash 0): ids that no state allows, such as special tokens.
    distinct, token_class = np.unique(np.concatenate([[0], column_hash]).astype(np.uint64), return_inverse=True)
    token_class = token_class[1:].astype(np.int32)
    classes = len(distinct)
    next_state = np.zeros([padded_size(states, MIN_STATES), padded_size(classes, MIN_CLASSES)], np.int32)
    next_state[sources, token_class[tokens]] = targets
    allowed_per_class = np.bincount(token_class, minlength=classes)
    if (next_state[sources, token_class[tokens]] != targets).any() or int(
        ((next_state[:states, :classes] > 0) * allowed_per_class[None, :]).sum()
    ) != len(tokens):
        raise RuntimeError("token classes collided while compressing the automaton; please report this pattern")
    if (next_state[START_STATE] == 0).all() and initial not in finals:
        raise ValueError(f"no token of the vocabulary can start a match of {pattern!r}.")
    accepting = np.zeros([next_state.shape[0]], np.bool_)
    accepting[[number[state] for state in finals]] = True
    return TokenAutomaton(
        pattern=pattern, next_state=next_state, token_class=token_class, accepting=accepting, states=states,
        classes=classes, build_seconds=time.perf_counter() - began,
    )


def main() -> None:
    request = pickle.load(sys.stdin.buffer)
    try:
        result = ("ok", build_index_tables(*request))
    except (ValueError, RuntimeError) as err:
        result = ("error", str(err))
    pickle.dump(result, sys.stdout.buffer)


if __name__ == "__main__":
    main()
