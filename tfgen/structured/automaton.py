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

A build is bounded: a pattern whose unrolled size (`pattern_positions`: each counted repetition `{m,n}` copies what
it repeats) is over `MAX_AUTOMATON_STATES` is refused at once; the build itself runs in a child process
(`tfgen.structured.index_build`) stopped after `MAX_BUILD_SECONDS`, and an automaton of more states is refused.
"""

from __future__ import annotations

import collections
import dataclasses
import pickle
import re
import subprocess
import sys
import threading
import weakref
from collections.abc import Sequence

import numpy as np

from tfgen.structured.json_schema import schema_regex
from tfgen.text.token_text import token_bytes

DEAD_STATE = 0
START_STATE = 1
# Smallest padded table sizes: tiny automata share one program.
MIN_STATES = 16
MIN_CLASSES = 16
_CACHE_SIZE = 32
#: The most states a structured-output automaton may have (its `next_state` table has a row per state); a pattern
#: whose unrolled size is larger is refused before anything is built.
MAX_AUTOMATON_STATES = 65_536
#: The longest an automaton build may run (outlines-core's build is exponential in some counted repetitions).
MAX_BUILD_SECONDS = 30.0
_QUANTIFIER = re.compile(r"\{(\d+)(,(\d*))?\}")


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


def padded_size(size: int, minimum: int) -> int:
    """`size` rounded up to a power of two, at least `minimum`."""
    return max(minimum, 1 << (size - 1).bit_length())


def pattern_positions(pattern: str) -> int:
    """The size of `pattern` with its counted repetitions unrolled: one per character, class or escape, times the
    upper bound (or lower bound + 1) of every `{m,n}` around it. Each position is at least one automaton state for
    the patterns structured output builds (a JSON string's `maxLength: n` is `n` copies of one character's regex)."""
    sizes, last, index = [0], 0, 0
    while index < len(pattern):
        character = pattern[index]
        quantifier = _QUANTIFIER.match(pattern, index) if character == "{" else None
        if quantifier:
            low, comma, high = quantifier.groups()
            bound = int(high) if high else int(low) + (1 if comma else 0)
            sizes[-1] += last * (bound - 1)
            last *= bound
            index = quantifier.end()
            continue
        if character == "(":
            sizes.append(0)
        elif character == ")" and len(sizes) > 1:
            last = sizes.pop()
            sizes[-1] += last
        elif character not in "|*+?":
            if character == "\\":
                index += 1
            elif character == "[":
                index = _class_end(pattern, index)
            last = 1
            sizes[-1] += 1
        index += 1
    return sum(sizes)


def check_pattern_size(pattern: str, option: str) -> None:
    """ValueError naming `option` when `pattern` unrolls to more than `MAX_AUTOMATON_STATES` positions."""
    positions = pattern_positions(pattern)
    if positions > MAX_AUTOMATON_STATES:
        raise ValueError(
            f"{option}: its regex unrolls to {positions} positions (each counted repetition copies what it repeats), "
            f"over the limit of {MAX_AUTOMATON_STATES} automaton states "
            "(tfgen.structured.automaton.MAX_AUTOMATON_STATES); lower the repetition bounds (maxLength, maxItems).")


def _class_end(pattern: str, start: int) -> int:
    """Index of the `]` closing the character class opened at `start` (the last index when it is never closed)."""
    index = start + 1
    if index < len(pattern) and pattern[index] == "^":
        index += 1
    if index < len(pattern) and pattern[index] == "]":
        index += 1
    while index < len(pattern) and pattern[index] != "]":
        index += 2 if pattern[index] == "\\" else 1
    return min(index, len(pattern) - 1)


_vocabularies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_automata: collections.OrderedDict[tuple, TokenAutomaton] = collections.OrderedDict()
_lock = threading.Lock()


def _spelled_vocabulary(tokenizer):
    """`(spelled tokens {id: bytes}, fingerprint, placeholder eos id)` of `tokenizer`, built once per tokenizer."""
    with _lock:
        cached = _vocabularies.get(tokenizer)
    if cached is not None:
        return cached
    spelled = token_bytes(tokenizer)
    if not spelled:
        raise ValueError("tokenizer: no token of this tokenizer spells text, so no output can match a pattern.")
    # outlines-core wants an eos id outside the text tokens; tfgen handles eos itself (from the request's eos ids),
    # so an id past every token stands in for it and its transitions are dropped.
    placeholder_eos = max(spelled) + 1
    fingerprint = hash(tuple(sorted(spelled.items())))
    with _lock:
        cached = _vocabularies.setdefault(tokenizer, (spelled, fingerprint, placeholder_eos))
    return cached


def build_automaton(tokenizer, vocab_size: int, pattern: str, option: str = "regex") -> TokenAutomaton:
    """The automaton of regex `pattern` over `tokenizer`'s tokens, for a model of `vocab_size` ids (cached by
    vocabulary, pattern and size). ValueError naming `option` (the option the pattern comes from) when the pattern
    is not a regex outlines-core supports, when the tokens cannot spell any match, or when the automaton would be
    over `MAX_AUTOMATON_STATES` states or its build over `MAX_BUILD_SECONDS`."""
    check_pattern_size(pattern, option)
    spelled, fingerprint, placeholder_eos = _spelled_vocabulary(tokenizer)
    key = (fingerprint, pattern, int(vocab_size))
    with _lock:
        automaton = _automata.get(key)
        if automaton is not None:
            _automata.move_to_end(key)
            return automaton
    automaton = _built_in_child(option, (spelled, placeholder_eos, int(vocab_size), pattern, MAX_AUTOMATON_STATES))
    with _lock:
        automaton = _automata.setdefault(key, automaton)
        while len(_automata) > _CACHE_SIZE:
            _automata.popitem(last=False)
    return automaton


def _built_in_child(option: str, request: tuple) -> TokenAutomaton:
    """Runs `tfgen.structured.index_build` on `request`, killed after `MAX_BUILD_SECONDS`."""
    child = subprocess.Popen([sys.executable, "-m", "tfgen.structured.index_build"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        output, errors = child.communicate(pickle.dumps(request), timeout=MAX_BUILD_SECONDS)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise ValueError(
            f"{option}: building its automaton took over {MAX_BUILD_SECONDS:g} s, the limit "
            "(tfgen.structured.automaton.MAX_BUILD_SECONDS); outlines-core's build grows exponentially with some "
            "counted repetitions (a string's maxLength over ~16): lower them or use a simpler pattern.") from None
    if child.returncode != 0 or not output:
        last_line = (errors.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{option}: the automaton build failed (exit {child.returncode}): {last_line}")
    status, value = pickle.loads(output)
    if status != "ok":
        raise ValueError(f"{option}: {value}")
    return value


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
    return build_automaton(tokenizer, vocab_size, pattern, name)
