"""A regex (or a JSON schema, through its regex) as a token-level automaton over a model's vocabulary, in tables a
compiled decoding loop can index.

outlines-core's `Index` builds the automaton: from each state, the token ids that keep the text a prefix of a
match, and the state each leads to. Stored densely that is `[states, vocab]` (107 MB for a five-field JSON schema
over SmolLM2's 49k tokens), but most tokens behave alike everywhere: every token made of plain letters does the
same thing in every state of a free string, and nothing anywhere else. Tokens with the same column are one class,
so the tables are

    next_state   int32 [S, C]  the state after a token of class c in state s; 0 = not allowed
    token_class  int32 [V]     each id's class (0 = allowed nowhere: special tokens, ids past the tokenizer)
    accepting    bool  [S]     states where the text is a whole match (eos is allowed there, and only there)

(0.5 MB for that schema: 212 classes). State 0 is dead and state 1 is the start. `S` and `C` are padded to
powers of two, so automata of similar size share one compiled program (the tables are program inputs).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
import weakref
from collections.abc import Sequence

import numpy as np

from tfgen.structured.json_schema import schema_regex
from tfgen.text.token_text import token_bytes

DEAD_STATE = 0
START_STATE = 1
# Smallest padded table sizes: tiny automata share one program.
_MIN_STATES = 16
_MIN_CLASSES = 16
_CACHE_SIZE = 32


@dataclasses.dataclass(frozen=True, eq=False)
class TokenAutomaton:
    """A token-level automaton (see the module docstring); compared by identity (one instance per pattern and
    vocabulary, from `build_automaton`'s cache).

    pattern: the regex it matches (a JSON schema's regex for `json_schema`). states / classes: the real sizes
    (the dead state and class 0 included) before padding. build_seconds: time to build it.
    """

    pattern: str
    next_state: np.ndarray
    token_class: np.ndarray
    accepting: np.ndarray
    states: int
    classes: int
    build_seconds: float

    @property
    def nbytes(self) -> int:
        """Bytes of the three tables (what a program holds)."""
        return self.next_state.nbytes + self.token_class.nbytes + self.accepting.nbytes

    def knobs(self) -> dict[str, np.ndarray]:
        """The tables as the program's knobs (`tfgen.config.knobs`: `grammar_next`, `grammar_token_class`,
        `grammar_accepting`)."""
        return {"grammar_next": self.next_state, "grammar_token_class": self.token_class,
                "grammar_accepting": self.accepting}

    def walk(self, token_ids: Sequence[int]) -> int:
        """The state after `token_ids` from the start (DEAD_STATE once a token is not allowed)."""
        state = START_STATE
        for token_id in token_ids:
            if state == DEAD_STATE:
                break
            token_id = int(token_id)
            klass = self.token_class[token_id] if 0 <= token_id < len(self.token_class) else 0
            state = int(self.next_state[state, klass])
        return state

    def matches(self, token_ids: Sequence[int]) -> bool:
        """Whether the text of `token_ids` (no eos among them) is a whole match."""
        return bool(self.accepting[self.walk(token_ids)])


def _padded_size(size: int, minimum: int) -> int:
    return max(minimum, 1 << (size - 1).bit_length())


_vocabularies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_automata: collections.OrderedDict[tuple, TokenAutomaton] = collections.OrderedDict()
_lock = threading.Lock()


def _outlines_vocabulary(tokenizer):
    """`(outlines_core.Vocabulary, fingerprint, placeholder eos id)` of `tokenizer`, built once per tokenizer."""
    with _lock:
        cached = _vocabularies.get(tokenizer)
    if cached is not None:
        return cached
    from outlines_core import Vocabulary  # lazy: only structured output needs it

    spelled = token_bytes(tokenizer)
    if not spelled:
        raise ValueError("tokenizer: no token of this tokenizer spells text, so no output can match a pattern.")
    ids_by_bytes = collections.defaultdict(list)
    for token_id, text in spelled.items():
        ids_by_bytes[text].append(token_id)
    # outlines-core wants an eos id outside the text tokens; tfgen handles eos itself (from the request's eos ids),
    # so an id past every token stands in for it and its transitions are dropped.
    placeholder_eos = max(spelled) + 1
    vocabulary = Vocabulary(placeholder_eos, dict(ids_by_bytes))
    fingerprint = hash(tuple(sorted(spelled.items())))
    with _lock:
        cached = _vocabularies.setdefault(tokenizer, (vocabulary, fingerprint, placeholder_eos))
    return cached


def build_automaton(tokenizer, vocab_size: int, pattern: str) -> TokenAutomaton:
    """The automaton of regex `pattern` over `tokenizer`'s tokens, for a model of `vocab_size` ids (cached by
    vocabulary, pattern and size). ValueError when the pattern is not a regex outlines-core supports, or when the
    tokens cannot spell any match."""
    vocabulary, fingerprint, placeholder_eos = _outlines_vocabulary(tokenizer)
    key = (fingerprint, pattern, int(vocab_size))
    with _lock:
        automaton = _automata.get(key)
        if automaton is not None:
            _automata.move_to_end(key)
            return automaton
    from outlines_core import Index

    began = time.perf_counter()
    try:
        index = Index(pattern, vocabulary)
    except ValueError as err:
        raise ValueError(f"regex: {pattern!r} cannot constrain this model's output: {err}") from None
    automaton = _tables(index, placeholder_eos, int(vocab_size), pattern, began)
    with _lock:
        automaton = _automata.setdefault(key, automaton)
        while len(_automata) > _CACHE_SIZE:
            _automata.popitem(last=False)
    return automaton


def _tables(index, placeholder_eos: int, vocab_size: int, pattern: str, began: float) -> TokenAutomaton:
    """The class-compressed tables of an outlines-core `Index` (see the module docstring)."""
    transitions = index.get_transitions()
    finals = set(index.get_final_states())
    initial = index.get_initial_state()
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
    next_state = np.zeros([_padded_size(states, _MIN_STATES), _padded_size(classes, _MIN_CLASSES)], np.int32)
    next_state[sources, token_class[tokens]] = targets
    allowed_per_class = np.bincount(token_class, minlength=classes)
    if (next_state[sources, token_class[tokens]] != targets).any() or int(
        ((next_state[:states, :classes] > 0) * allowed_per_class[None, :]).sum()
    ) != len(tokens):
        raise RuntimeError("token classes collided while compressing the automaton; please report this pattern")
    if (next_state[START_STATE] == 0).all() and initial not in finals:
        raise ValueError(f"regex: no token of the vocabulary can start a match of {pattern!r}.")
    accepting = np.zeros([next_state.shape[0]], np.bool_)
    accepting[[number[state] for state in finals]] = True
    return TokenAutomaton(
        pattern=pattern, next_state=next_state, token_class=token_class, accepting=accepting, states=states,
        classes=classes, build_seconds=time.perf_counter() - began,
    )


def structured_option(config) -> str | None:
    """`"regex"` or `"json_schema"`: the structured-output option `config` sets (None: neither)."""
    for name in ("regex", "json_schema"):
        if getattr(config, name, None) is not None:
            return name
    return None


def constraint_automaton(config, tokenizer, vocab_size: int) -> TokenAutomaton | None:
    """The automaton of `config.regex` or `config.json_schema` (None when neither is set). ValueError without a
    tokenizer, for a bad pattern or schema, or an unsupported schema feature."""
    name = structured_option(config)
    if name is None:
        return None
    if tokenizer is None:
        raise ValueError(f"{name}: constraining the output needs the model's tokenizer; pass tokenizer=.")
    pattern = config.regex if name == "regex" else schema_regex(config.json_schema)
    return build_automaton(tokenizer, vocab_size, pattern)
