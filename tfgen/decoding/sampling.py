"""Greedy search and multinomial sampling: one token per row per step, in one `tf.while_loop`.

The loop is split into `start` (prefill + first token), `run` (up to N more steps) and `result`, so the same
code serves one whole-generation program and the chunked programs that streaming runs between host reads.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import tensorflow as tf

from tfgen.decoding.common import (
    DecodeInputs,
    decoding_model,
    is_eos,
    prefill,
    sample_from_scores,
    write_column,
)
from tfgen.processors import ProcessorContext, apply_processors


class LoopState(NamedTuple):
    """Everything the loop carries between steps (and between streaming chunks)."""

    step: tf.Tensor  # int32 scalar: tokens chosen so far
    sequences: tf.Tensor  # int32 [B, L]
    buffer_mask: tf.Tensor  # int32 [B, L]
    cache: object
    logits: tf.Tensor  # float32 [B, V]: raw logits for the token at `step`
    next_position: tf.Tensor  # int32 [B]
    finished: tf.Tensor  # bool [B]
    scores: tf.Tensor  # float32 [N, B, V] processed scores, or a [0] placeholder when not collected
    raw_logits: tf.Tensor  # float32 [N, B, V] raw logits, or a [0] placeholder


@dataclasses.dataclass(frozen=True)
class GreedyOrSampleLoop:
    """The static description of one greedy / sampling loop; its methods trace into a program."""

    model: object
    buffer_new_tokens: int
    processor_spec: object
    user_processors: tuple = ()
    output_scores: bool = False
    output_logits: bool = False
    do_sample: bool = False

    def start(self, inputs: DecodeInputs) -> LoopState:
        """Prefills the prompt and chooses the first token (rows with no budget write pad)."""
        state0 = prefill(self.model, inputs, self.buffer_new_tokens)
        batch_size = tf.shape(inputs.input_ids)[0]
        vocab_size = state0.logits.shape[-1]

        def buffer(collecting):
            shape = tf.stack([self.buffer_new_tokens, batch_size, vocab_size]) if collecting else [0]
            return tf.zeros(shape, tf.float32)

        state = LoopState(
            step=tf.constant(0, tf.int32),
            sequences=state0.sequences,
            buffer_mask=state0.buffer_mask,
            cache=state0.cache,
            logits=state0.logits,
            next_position=state0.next_position,
            finished=inputs.max_new_tokens <= 0,
            scores=buffer(self.output_scores),
            raw_logits=buffer(self.output_logits),
        )
        # The first token comes from the prefill's logits, so the loop body is (forward one token, choose) and
        # no forward pass is wasted after the last choice.
        return self._choose(inputs, state)

    def empty_state(self, inputs: DecodeInputs) -> LoopState:
        """A zero state shaped like `start`'s result, with `step == 0` meaning "not started" (for `resume`)."""
        batch_size, prompt_width = tf.unstack(tf.shape(inputs.input_ids))
        total = prompt_width + self.buffer_new_tokens
        vocab_size = int(self.model.config.vocab_size)

        def buffer(collecting):
            shape = tf.stack([self.buffer_new_tokens, batch_size, vocab_size]) if collecting else [0]
            return tf.zeros(shape, tf.float32)

        return LoopState(
            step=tf.constant(0, tf.int32),
            sequences=tf.zeros(tf.stack([batch_size, total]), tf.int32),
            buffer_mask=tf.zeros(tf.stack([batch_size, total]), tf.int32),
            cache=self.model.init_cache(batch_size, total),
            logits=tf.zeros(tf.stack([batch_size, vocab_size]), tf.float32),
            next_position=tf.zeros([batch_size], tf.int32),
            finished=tf.zeros([batch_size], tf.bool),
            scores=buffer(self.output_scores),
            raw_logits=buffer(self.output_logits),
        )

    def resume(self, inputs: DecodeInputs, state: LoopState, max_steps: int) -> LoopState:
        """One streaming chunk: starts the loop if `state` is `empty_state` (step 0), then runs up to
        `max_steps` steps. One program serves the first and every later chunk, so streaming compiles once."""
        state = tf.cond(state.step > 0, lambda: state, lambda: self.start(inputs))
        # What the model's decoding view prepares per run would be redone on every chunk of a few steps (GPT-2:
        # a 154 MB head copy at 124M for a few ms saved per multi-row step), so chunks use the model itself.
        return self.run(inputs, state, max_steps, use_decoding_view=False)

    def run(
        self, inputs: DecodeInputs, state: LoopState, max_steps: int, use_decoding_view: bool = True
    ) -> LoopState:
        """Runs up to `max_steps` more steps; stops early once every row finished or spent its budget.
        `use_decoding_view`: run the steps through `model.decoding_view` (see `tfgen.models.protocol`)."""
        budget = tf.reduce_max(inputs.max_new_tokens)
        stop_at = state.step + max_steps
        loop = self
        if use_decoding_view:
            loop = dataclasses.replace(self, model=decoding_model(self.model, inputs.input_ids.shape[0]))
        return tf.while_loop(
            lambda s: (s.step < budget) & (s.step < stop_at) & ~tf.reduce_all(s.finished),
            lambda s: (loop._advance(inputs, s),),
            (state,),
            maximum_iterations=max_steps,
        )[0]

    def result(self, state: LoopState) -> dict:
        """`sequences` int32 `[B, T + buffer_new_tokens]`, `steps`, and `scores` / `logits` when collected."""
        result = {"sequences": state.sequences, "steps": state.step}
        if self.output_scores:
            result["scores"] = state.scores
        if self.output_logits:
            result["logits"] = state.raw_logits
        return result

    def _choose(self, inputs: DecodeInputs, state: LoopState) -> LoopState:
        """Picks the token at `state.step` from `state.logits` and writes it into the buffers."""
        context = ProcessorContext(
            sequences=state.sequences,
            start=inputs.start,
            cur_len=inputs.prompt_len + state.step,
            prompt_len=inputs.prompt_len,
            max_length=inputs.prompt_len + inputs.max_new_tokens,
        )
        scores = apply_processors(self.processor_spec, state.logits, context, inputs.knobs, self.user_processors)
        if self.do_sample:
            tokens = sample_from_scores(scores, inputs.row_seeds, state.step)
        else:
            tokens = tf.argmax(scores, axis=-1, output_type=tf.int32)
        tokens = tf.where(state.finished, inputs.pad_token_id, tokens)
        index = tf.shape(inputs.input_ids)[1] + state.step
        finished = (
            state.finished
            | is_eos(tokens, inputs.eos_token_ids)
            | (state.step + 1 >= inputs.max_new_tokens)
        )

        def collect(buffer, values, collecting):
            if not collecting:
                return buffer
            return tf.tensor_scatter_nd_update(buffer, state.step[None, None], values[None])

        return state._replace(
            step=state.step + 1,
            sequences=write_column(state.sequences, tokens, index),
            buffer_mask=write_column(state.buffer_mask, tf.ones_like(tokens), index),
            finished=finished,
            scores=collect(state.scores, scores, self.output_scores),
            raw_logits=collect(state.raw_logits, state.logits, self.output_logits),
        )

    def _advance(self, inputs: DecodeInputs, state: LoopState) -> LoopState:
        """Runs the last chosen token through the model, then chooses the next one."""
        index = tf.shape(inputs.input_ids)[1] + state.step - 1
        tokens = tf.gather(state.sequences, index[None], axis=1)
        out = self.model.call_with_cache(tokens, state.cache, index, state.buffer_mask, state.next_position[:, None])
        state = state._replace(
            cache=out.cache,
            logits=tf.cast(out.logits[:, -1, :], tf.float32),
            next_position=state.next_position + 1,
        )
        return self._choose(inputs, state)


def decode_greedy_or_sample(model, inputs: DecodeInputs, *, buffer_new_tokens: int, **options) -> dict:
    """Generates up to `max(inputs.max_new_tokens)` tokens per row in one loop.

    options: the remaining `GreedyOrSampleLoop` fields (processor_spec, user_processors, output_scores,
    output_logits, do_sample). Returns `GreedyOrSampleLoop.result`: `sequences` int32 `[B, T + buffer_new_tokens]`
    (prompt, new tokens, then pad after a row finished), `steps` int32 scalar (tokens chosen before every row
    finished), and when asked `scores` / `logits` float32 `[buffer_new_tokens, B, V]` (rows `>= steps` are zeros).
    """
    loop = GreedyOrSampleLoop(model=model, buffer_new_tokens=buffer_new_tokens, **options)
    return loop.result(loop.run(inputs, loop.start(inputs), max_steps=buffer_new_tokens))
