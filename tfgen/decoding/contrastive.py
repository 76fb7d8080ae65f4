"""Contrastive search (Su et al., 2022) as HF transformers 4.55.4's `_contrastive_search`.

Each step takes the `top_k` most likely next tokens, runs all of them through the model at once (the cache holds
`top_k` identical copies of every prompt's rows, so the candidates need no re-padding), and keeps the candidate
maximising `(1 - alpha) * p(token) - alpha * max cosine(candidate hidden state, context hidden states)`. The
context's last hidden states live in a static buffer `[B, L, D]`, normalised once when written.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfgen.config.knobs import KNOBS
from tfgen.decoding.loop import DecodingLoop
from tfgen.decoding.model_protocol import capabilities
from tfgen.decoding.state import (
    DecodeInputs,
    DecodeState,
    commit_tokens,
    gather_rows,
    prefill,
    processor_context,
    reorder_cache,
    size_of,
    softmax_limit,
    write_at,
)
from tfgen.logits.pipeline import apply_processors
from tfgen.value_types import is_integer


def contrastive_options(config) -> dict:
    """Static options: `top_k`, the number of candidates (it sets the shape of the candidate batch)."""
    top_k = config.top_k
    if not is_integer(top_k) or top_k < 2:
        raise ValueError(f"top_k must be an integer >= 2 for contrastive search, got {top_k!r}")
    return {"top_k": int(top_k)}


def contrastive_knobs(config, batch_size: int) -> dict[str, np.ndarray]:
    """`penalty_alpha` `[batch_size]` (see `tfgen.config.knobs`)."""
    return {"penalty_alpha": KNOBS["penalty_alpha"].fill(batch_size, float(config.penalty_alpha or 0.0))}


class ContrastiveState(NamedTuple):
    """decode: the `DecodeState` of the B prompts, except `cache`, which holds `top_k` copies of each prompt's
    rows (`B * top_k`). context: float32 `[B, L, D]` unit-length last hidden states of the tokens so far (0
    elsewhere)."""

    decode: DecodeState
    context: tf.Tensor


def _unit(vectors: tf.Tensor) -> tf.Tensor:
    vectors = tf.cast(vectors, tf.float32)
    return tf.math.divide_no_nan(vectors, tf.norm(vectors, axis=-1, keepdims=True))


class ContrastiveSearchLoop(DecodingLoop):
    """Contrastive search with the static option `top_k` (candidates) and the per-prompt knob `penalty_alpha`.

    As in HF, a finished row keeps following its best candidate (that is what its later scores describe) while
    pad is written to its tokens. Only the chosen candidate's logits are used, so models that can apply their
    LM head separately (`capabilities(model).logits_from_hidden`) skip it for the other `top_k - 1` candidates.
    """

    def __init__(self, model, spec):
        super().__init__(model, spec)
        self.top_k = int(spec.option("top_k"))
        self.head_on_chosen_only = capabilities(model).logits_from_hidden
        self.rows_per_prompt = 1 if self.head_on_chosen_only else self.top_k

    def decode_state(self, state: ContrastiveState) -> DecodeState:
        return state.decode

    def start(self, inputs: DecodeInputs) -> ContrastiveState:
        """Prefills the prompt, copies its cache `top_k` times and normalises its hidden states into the
        context. No token is chosen yet: choosing needs the candidates' forward pass, which is the step."""
        spec = self.spec
        prefilled = prefill(
            self.model, inputs, spec.buffer_new_tokens, output_scores=spec.output_scores,
            output_logits=spec.output_logits,
        )
        batch_size = size_of(inputs.input_ids, 0)
        vocab_size = prefilled.state.logits.shape[-1]
        if not 2 <= self.top_k <= vocab_size:
            raise ValueError(f"top_k must be in [2, vocab_size={vocab_size}] for contrastive search, got {self.top_k}")
        hidden_size = prefilled.hidden.shape[-1]
        copies = tf.repeat(tf.range(batch_size), self.top_k)
        future = tf.zeros(tf.stack([batch_size, spec.buffer_new_tokens, hidden_size]))
        return ContrastiveState(
            decode=prefilled.state._replace(cache=gather_rows(prefilled.state.cache, copies)),
            context=tf.concat([_unit(prefilled.hidden), future], axis=1),
        )

    def step(self, inputs: DecodeInputs, state: ContrastiveState) -> ContrastiveState:
        """Scores the `top_k` candidates of every prompt and commits the best one."""
        spec, top_k, model = self.spec, self.top_k, self.step_model
        decode = state.decode
        batch_size, prompt_width = size_of(inputs.input_ids, 0), size_of(inputs.input_ids, 1)
        alpha = tf.convert_to_tensor(inputs.knobs["penalty_alpha"], tf.float64)
        probability_weight = tf.cast(1.0 - alpha, tf.float32)[:, None]
        alpha = tf.cast(alpha, tf.float32)[:, None]

        context = processor_context(inputs, decode.sequences, decode.step, grammar_state=decode.grammar_state)
        processed = apply_processors(spec.processor_spec, decode.logits, context, inputs.knobs, spec.user_processors)
        top_probs, top_ids = tf.math.top_k(tf.nn.softmax(softmax_limit(processed)), top_k)

        index = prompt_width + decode.step
        buffer_mask = write_at(decode.buffer_mask, tf.ones_like(decode.next_position), index)
        copies = tf.repeat(tf.range(batch_size), top_k)
        out = model.call_with_cache(
            tf.reshape(top_ids, [-1, 1]),
            decode.cache,
            index,
            tf.gather(buffer_mask, copies),
            tf.gather(decode.next_position, copies)[:, None],
            **({"compute_logits": False} if self.head_on_chosen_only else {}),
        )
        candidates = _unit(out.hidden_states[:, -1, :])  # [B*k, D]
        cosine = tf.einsum("bkd,bld->bkl", tf.reshape(candidates, [batch_size, top_k, -1]), state.context)
        # The context is the tokens before this one: the prompt under its mask, then every generated token.
        cosine = tf.where(decode.buffer_mask[:, None, :] == 1, cosine, float("-inf"))
        degeneration = tf.reduce_max(cosine, axis=-1)
        selection = probability_weight * top_probs - alpha * degeneration
        if spec.processor_spec.is_on("grammar"):
            # A candidate the automaton forbids has probability 0, but a low enough degeneration penalty could still
            # pick it (HF's rule): with fewer allowed tokens than candidates, only allowed ones may win.
            selection = tf.where(top_probs > 0, selection, float("-inf"))
        selected = tf.argmax(selection, axis=-1, output_type=tf.int32)
        chosen_rows = tf.range(batch_size) * top_k + selected

        decode = commit_tokens(decode, inputs, tf.gather(top_ids, selected, batch_dims=1), processed, spec)
        return ContrastiveState(
            decode=decode._replace(
                cache=reorder_cache(out.cache, tf.repeat(chosen_rows, top_k)),
                logits=self._chosen_logits(model, out, chosen_rows),
                next_position=decode.next_position + 1,
            ),
            context=write_at(state.context, tf.gather(candidates, chosen_rows), index, axis=1),
        )

    def _chosen_logits(self, model, out, chosen_rows: tf.Tensor) -> tf.Tensor:
        """float32 `[B, V]`: the next-token logits of each prompt's chosen candidate (rows `chosen_rows`)."""
        if self.head_on_chosen_only:
            return tf.cast(model.logits_from_hidden(tf.gather(out.hidden_states[:, -1, :], chosen_rows)), tf.float32)
        return tf.gather(tf.cast(out.logits[:, -1, :], tf.float32), chosen_rows)
