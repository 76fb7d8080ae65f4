"""Constrained beam search's constraints (HF transformers 4.55.4's `force_words_ids` / `constraints`), and the
static tables the compiled loop walks them with (`tfgen.decoding.constrained_beam`). TF-free.

`PhrasalConstraint(token_ids)`: the output must contain these tokens in a row. `DisjunctiveConstraint(nested)`:
it must contain one of these token sequences. HF's own constraint objects of these two classes are accepted too
(read through their `token_ids`). Each constraint becomes a trie of token ids (a phrase: one path); all tries live
in one table of nodes, so a beam's progress through every constraint is a few int32 per constraint (its node, done,
its place in HF's pending list), advanced by gathers. HF's `ConstraintListState` semantics are kept to the letter
(a token that breaks a phrase in progress does not start another; a broken constraint goes to the end of the
pending list), including the bank HF gives the "advance" candidates of a disjunctive constraint in progress
(its states share one token list, so later candidates move the earlier ones' progress: `advance_banks`).
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from typing import Any

__all__ = ["ConstraintTables", "DisjunctiveConstraint", "PhrasalConstraint", "check_constraint_vocabulary",
           "constraint_tables"]


def _is_token_id(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0


class PhrasalConstraint:
    """The output must contain `token_ids` (a non-empty list of token ids), in this order and in a row."""

    def __init__(self, token_ids: list[int]):
        if not isinstance(token_ids, (list, tuple)) or len(token_ids) == 0:
            raise ValueError(f"`token_ids` has to be a non-empty list, but is {token_ids}.")
        if any(not _is_token_id(token_id) for token_id in token_ids):
            raise ValueError(f"Each list in `token_ids` has to be a list of positive integers, but is {token_ids}.")
        self.token_ids = [int(token_id) for token_id in token_ids]

    def __repr__(self) -> str:
        return f"PhrasalConstraint({self.token_ids})"


class DisjunctiveConstraint:
    """The output must contain one of the token sequences of `nested_token_ids` (none may be a prefix of another)."""

    def __init__(self, nested_token_ids: list[list[int]]):
        if not isinstance(nested_token_ids, (list, tuple)) or len(nested_token_ids) == 0:
            raise ValueError(f"`nested_token_ids` has to be a non-empty list, but is {nested_token_ids}.")
        if any(not isinstance(token_ids, (list, tuple)) for token_ids in nested_token_ids):
            raise ValueError(f"`nested_token_ids` has to be a list of lists, but is {nested_token_ids}.")
        if any(not token_ids or any(not _is_token_id(token) for token in token_ids) for token_ids in nested_token_ids):
            raise ValueError(
                f"Each list in `nested_token_ids` has to be a list of positive integers, but is {nested_token_ids}."
            )
        words = tuple(tuple(int(token) for token in word) for word in nested_token_ids)
        if _leaf_count(_trie(words)) != len(words):
            raise ValueError(
                "Each list in `nested_token_ids` can't be a complete subset of another list, but is"
                f" {nested_token_ids}."
            )
        self.token_ids = [list(word) for word in words]

    def __repr__(self) -> str:
        return f"DisjunctiveConstraint({self.token_ids})"


def _trie(words) -> dict:
    root: dict = {}
    for word in words:
        level = root
        for token in word:
            level = level.setdefault(token, {})
    return root


def _leaf_count(node: dict) -> int:
    return 1 if not node else sum(_leaf_count(child) for child in node.values())


# ----------------------------------------------------------------------------------------------------------
# Options -> one tuple of words per constraint (HF's order: `constraints`, then `force_words_ids`)


def _force_words_error(force_words_ids) -> ValueError:
    return ValueError("`force_words_ids` has to either be a `list[list[list[int]]]` or `list[list[int]]` of positive "
                      f"integers, but is {force_words_ids}.")


def _words_of_force_words_ids(force_words_ids) -> list[tuple]:
    if not isinstance(force_words_ids, (list, tuple)) or len(force_words_ids) == 0:
        raise _force_words_error(force_words_ids)
    constraints = []
    for word_ids in force_words_ids:
        if not isinstance(word_ids, (list, tuple)) or len(word_ids) == 0:
            raise _force_words_error(force_words_ids)
        if isinstance(word_ids[0], (list, tuple)):  # one of several words
            if any(not isinstance(token_ids, (list, tuple)) or not all(map(_is_token_id, token_ids))
                   for token_ids in word_ids):
                raise _force_words_error(force_words_ids)
            constraints.append(_words_of(DisjunctiveConstraint(word_ids)))
        else:
            if not all(map(_is_token_id, word_ids)):
                raise _force_words_error(force_words_ids)
            constraints.append(_words_of(PhrasalConstraint(word_ids)))
    return constraints


def _words_of(constraint) -> tuple:
    """A constraint object (tfgen's or HF's Phrasal / Disjunctive) as a tuple of words (tuples of token ids)."""
    kind = type(constraint).__name__
    token_ids = getattr(constraint, "token_ids", None)
    if kind == "PhrasalConstraint" and isinstance(token_ids, (list, tuple)):
        checked = constraint if isinstance(constraint, PhrasalConstraint) else PhrasalConstraint(token_ids)
        return (tuple(checked.token_ids),)
    if kind == "DisjunctiveConstraint" and isinstance(token_ids, (list, tuple)):
        checked = constraint if isinstance(constraint, DisjunctiveConstraint) else DisjunctiveConstraint(token_ids)
        return tuple(tuple(word) for word in checked.token_ids)
    raise TypeError(f"`constraints` must hold PhrasalConstraint / DisjunctiveConstraint objects (tfgen's or HF's); "
                    f"tfgen cannot run {type(constraint).__name__} ({constraint!r}) in its compiled loop.")


def constraint_words(constraints=None, force_words_ids=None) -> tuple:
    """`constraints` and `force_words_ids` (as `GenerationConfig` holds them) as one tuple of constraints, each a
    tuple of words; the errors HF's generate raises for malformed values, naming the option."""
    words = []
    if constraints is not None:
        if not isinstance(constraints, (list, tuple)):
            raise TypeError(f"`constraints` must be a list of constraint objects, got {type(constraints).__name__}.")
        words += [_words_of(constraint) for constraint in constraints]
    if force_words_ids is not None:
        words += _words_of_force_words_ids(force_words_ids)
    if not words:
        raise ValueError("`constraints` / `force_words_ids` hold no constraint (use None for none).")
    return tuple(words)


# ----------------------------------------------------------------------------------------------------------
# The tables


@dataclasses.dataclass(frozen=True)
class ConstraintTables:
    """Every constraint's trie in one table of nodes (hashable, part of the program key). Shapes: C constraints,
    `nodes` nodes, D = the most children of a node, A = advance candidates per beam.

    roots: [C] each constraint's root node. node_leaf: [nodes] 1 where a word ends. node_bank: [nodes] what a
    constraint in progress at this node adds to HF's bank (`max_seqlen - remaining`). child_token / child_node:
    [nodes][D] the children in HF's order (-1 / 0 padding). advance_banks: [nodes][D] the bank (less
    `completed * max_seqlen`) HF gives the candidate advancing a constraint in progress at this node with each child.
    root_width: the most children of a root (a beam with no constraint in progress offers its pending constraints'
    root children, `C * root_width` slots). max_seqlen: HF's `max_seqlen`; largest_token: the largest id used.
    """

    words: tuple
    roots: tuple = dataclasses.field(repr=False)
    node_leaf: tuple = dataclasses.field(repr=False)
    node_bank: tuple = dataclasses.field(repr=False)
    child_token: tuple = dataclasses.field(repr=False)
    child_node: tuple = dataclasses.field(repr=False)
    advance_banks: tuple = dataclasses.field(repr=False)
    root_width: int = dataclasses.field(repr=False)
    max_seqlen: int = dataclasses.field(repr=False)
    largest_token: int = dataclasses.field(repr=False)

    @property
    def num_constraints(self) -> int:
        return len(self.roots)

    @property
    def advance_slots(self) -> int:
        """A: the advance candidates a beam may offer (its pending roots' children, or its node's children)."""
        return max(self.num_constraints * self.root_width, len(self.child_token[0]))


@functools.lru_cache(maxsize=64)
def tables_of_words(words: tuple) -> ConstraintTables:
    """The tables of constraints given as `constraint_words` returns them."""
    max_seqlen = max(max(len(word) for word in constraint) for constraint in words)
    roots, leaf, bank, children, paths, constraint_of = [], [], [], [], [], []

    def add_node(constraint: int, path: tuple, trie: dict, seqlen: int) -> int:
        node = len(leaf)
        leaf.append(int(not trie))
        bank.append(max_seqlen - seqlen + len(path))
        paths.append(path)
        constraint_of.append((constraint, seqlen))
        children.append([])
        for token, sub_trie in trie.items():
            children[node].append((token, add_node(constraint, path + (token,), sub_trie, seqlen)))
        return node

    tries = []
    for index, constraint in enumerate(words):
        tries.append(_trie(constraint))
        roots.append(add_node(index, (), tries[-1], max(len(word) for word in constraint)))
    width = max(1, max(len(kids) for kids in children))
    child_token = tuple(tuple([token for token, _ in kids] + [-1] * (width - len(kids))) for kids in children)
    child_node = tuple(tuple([node for _, node in kids] + [0] * (width - len(kids))) for kids in children)
    advance_banks = tuple(
        tuple(_aliased_banks(tries[constraint_of[node][0]], paths[node], constraint_of[node][1], max_seqlen)
              + [0] * (width - len(children[node])))
        for node in range(len(leaf))
    )
    return ConstraintTables(
        words=words, roots=tuple(roots), node_leaf=tuple(leaf), node_bank=tuple(bank), child_token=child_token,
        child_node=child_node, advance_banks=advance_banks,
        root_width=max(len(children[root]) for root in roots), max_seqlen=max_seqlen,
        largest_token=max(token for constraint in words for word in constraint for token in word),
    )


def _aliased_banks(trie: dict, path: tuple, seqlen: int, max_seqlen: int) -> list[int]:
    """HF's banks (less the completed constraints') of the advance candidates from a constraint in progress at
    `path`: its `copy(stateful=True)` shares the in-progress token list, so each candidate's `add` extends the list
    the others read (a phrase has one child: no difference)."""
    def node_at(tokens):
        level = trie
        for token in tokens:
            level = level[token]
        return level

    if not path:  # a root: its candidates are pending constraints' (not shared)
        return [0] * len(node_at(path))
    shared = list(path)
    outcomes = []
    for token in node_at(path):
        if token in node_at(shared):
            shared.append(token)
            outcomes.append("complete" if not node_at(shared) else "in progress")
        else:
            outcomes.append("reset")
    return [max_seqlen if outcome == "complete" else 0 if outcome == "reset"
            else max_seqlen - (seqlen - len(shared)) for outcome in outcomes]


def constraint_tables(constraints=None, force_words_ids=None) -> ConstraintTables:
    """The tables of a config's `constraints` and `force_words_ids` (checked as HF's generate checks them)."""
    return tables_of_words(constraint_words(constraints, force_words_ids))


def check_constraint_vocabulary(tables: ConstraintTables, vocab_size: int) -> None:
    """ValueError, naming the options and the constraint, when a token id of `tables` is not below `vocab_size` (the
    request layer's check, before anything compiles)."""
    if tables.largest_token < vocab_size:
        return
    index, words = next((index, words) for index, words in enumerate(tables.words)
                        if any(tables.largest_token in word for word in words))
    raise ValueError(f"force_words_ids / constraints: token id {tables.largest_token} (constraint {index}, "
                     f"{[list(word) for word in words]}) is outside the model's vocabulary [0, {vocab_size}).")
