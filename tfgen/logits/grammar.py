"""A token-level automaton inside the compiled loop: which tokens each row may choose (`GRAMMAR`, the structured-output
mask, declared as a processor of the "mask" stage: after every other processor and the caller's, before the
warpers), and the state a chosen token leads to. The tables are knobs (`grammar_next` int32 `[S, C]`,
`grammar_token_class` int32 `[V]`, `grammar_accepting` bool `[S]`, see `tfgen.structured.automaton`); each row carries
its state, int32 `[R]`."""

from __future__ import annotations

import tensorflow as tf

from tfgen.logits.context import NEG_INF, id_mask, read_knob
from tfgen.logits.spec import Processor
from tfgen.structured.automaton import DEAD_STATE, START_STATE, structured_option


def uses_grammar(knobs: dict) -> bool:
    """Whether the program's knobs hold an automaton (its rows then carry automaton states)."""
    return "grammar_next" in knobs


def start_states(knobs: dict, rows) -> tf.Tensor | tuple:
    """int32 `[rows]` start states, or `()` (no state carried) without an automaton."""
    return tf.fill(tf.reshape(rows, [1]), START_STATE) if uses_grammar(knobs) else ()


def mask_scores(knobs: dict, states: tf.Tensor, scores: tf.Tensor, eos_token_ids: tf.Tensor) -> tf.Tensor:
    """`scores` float32 `[R, V]` with every token the automaton forbids in each row's state at -inf; eos ids
    stay only in accepting states. A row left with no finite score (its budget's processors forbade every token the
    automaton allows) gets eos alone: it ends there rather than choose a forbidden token."""
    vocab_size = scores.shape[-1]
    targets = tf.gather(knobs["grammar_next"], states)  # [R, C]
    allowed = tf.gather(targets, knobs["grammar_token_class"][:vocab_size], axis=1) != DEAD_STATE  # [R, V]
    eos = id_mask(eos_token_ids, vocab_size)[None, :]
    accepting = tf.gather(knobs["grammar_accepting"], states)[:, None]
    allowed = tf.where(eos, accepting, allowed)
    masked = tf.where(allowed, scores, NEG_INF)
    stuck = ~tf.reduce_any(masked > NEG_INF, axis=-1, keepdims=True)
    return tf.where(stuck, tf.where(eos, 0.0, NEG_INF), masked)


def advance(knobs: dict, states, tokens: tf.Tensor, keep: tf.Tensor):
    """int32 `[R]`: each row's state after its `tokens` int32 `[R]`, unchanged where `keep` bool `[R]` (finished
    rows, eos). `()` stays `()`."""
    if isinstance(states, tuple):
        return states
    token_class = tf.gather(knobs["grammar_token_class"], tokens)
    moved = tf.gather_nd(knobs["grammar_next"], tf.stack([states, token_class], axis=-1))
    return tf.where(keep, states, moved)


def _mask(static, scores, ctx, knobs):
    # After every other processor, so the output keeps to the automaton whatever they do (a token they forbid stays
    # forbidden), and before the warpers, so sampling draws among allowed tokens only.
    return mask_scores(knobs, ctx.grammar_state, scores, read_knob(knobs, "eos_token_ids", tf.int32))


#: The structured-output mask: on when the config has a `regex` or `json_schema` (its tables come from the automaton
#: the request layer builds, `TokenAutomaton.knobs`).
GRAMMAR = Processor("grammar", lambda config, env: True if structured_option(config) is not None else None, _mask,
                    stage="mask")
