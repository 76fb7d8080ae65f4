"""Greedy search and multinomial sampling: one token per row per step."""

from __future__ import annotations

import tensorflow as tf

from tfgen.decoding.loop import DecodingLoop
from tfgen.decoding.state import (
    DecodeInputs,
    DecodeState,
    commit_tokens,
    forward_last_tokens,
    prefill,
    processor_context,
    sample_from_scores,
)
from tfgen.logits.pipeline import apply_processors


class GreedyOrSampleLoop(DecodingLoop):
    """Greedy search, or with the static option `do_sample` multinomial sampling; the state is a `DecodeState`
    with one row per prompt (`[B, ...]`).

    The first token comes from the prefill's logits, so a step is (forward the last token, choose the next)
    and no forward pass is wasted after the last choice.
    """

    def start(self, inputs: DecodeInputs) -> DecodeState:
        """Prefills the prompt and chooses the first token (rows with no budget write pad)."""
        spec = self.spec
        state = prefill(
            self.model, inputs, spec.buffer_new_tokens, output_scores=spec.output_scores,
            output_logits=spec.output_logits,
        ).state
        return self._choose(inputs, state)

    def step(self, inputs: DecodeInputs, state: DecodeState) -> DecodeState:
        return self._choose(inputs, forward_last_tokens(self.step_model, state, tf.shape(inputs.input_ids)[1]))

    def _choose(self, inputs: DecodeInputs, state: DecodeState) -> DecodeState:
        """Picks the token at `state.step` from `state.logits` and writes it into the buffers."""
        spec = self.spec
        context = processor_context(inputs, state.sequences, state.step, grammar_state=state.grammar_state)
        scores = apply_processors(spec.processor_spec, state.logits, context, inputs.knobs, spec.user_processors)
        if spec.option("do_sample"):
            tokens = sample_from_scores(scores, inputs.row_seeds, state.step)
        else:
            tokens = tf.argmax(scores, axis=-1, output_type=tf.int32)
        return commit_tokens(state, inputs, tokens, scores, spec)
