"""Contrastive search (Su et al., 2022) as HF transformers 4.55.4's `_contrastive_search`, in one `tf.while_loop`.

Each step takes the `top_k` most likely next tokens, runs all of them through the model at once (the cache holds
`top_k` identical copies of every prompt's rows, so the candidates need no re-padding), and keeps the candidate
maximising `(1 - alpha) * p(token) - alpha * max cosine(candidate hidden state, context hidden states)`. The
context's last hidden states live in a static buffer `[B, L, D]`, normalised once when written.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfgen.decoding.beam import gather_rows, record_step, size_of, step_buffer
from tfgen.decoding.common import DecodeInputs, decoding_model, is_eos, prefill, write_column
from tfgen.processors import ProcessorContext, apply_processors


def contrastive_options(config) -> dict:
    """Static options: `top_k`, the number of candidates (it sets the shape of the candidate batch)."""
    top_k = config.top_k
    if not isinstance(top_k, (int, np.integer)) or isinstance(top_k, bool) or top_k < 2:
        raise ValueError(f"top_k must be an integer >= 2 for contrastive search, got {top_k!r}")
    return {"top_k": int(top_k)}


def contrastive_knobs(config, batch_size: int) -> dict[str, np.ndarray]:
    """`penalty_alpha` float64 `[batch_size]` (HF forms `1 - alpha` in double precision)."""
    return {"penalty_alpha": np.full([batch_size], float(config.penalty_alpha or 0.0), np.float64)}


class _State(NamedTuple):
    step: tf.Tensor  # int32 scalar: tokens chosen so far
    sequences: tf.Tensor  # int32 [B, L]
    buffer_mask: tf.Tensor  # int32 [B, L]
    cache: object  # B * top_k rows: top_k copies of each prompt's cache
    logits: tf.Tensor  # float32 [B, V] raw logits for the token at `step`
    context: tf.Tensor  # float32 [B, L, D] unit-length last hidden states of the tokens so far (0 elsewhere)
    next_position: tf.Tensor  # int32 [B]
    finished: tf.Tensor  # bool [B]
    scores: tf.Tensor  # float32 [N, B, V], or a [0] placeholder
    raw_logits: tf.Tensor  # float32 [N, B, V], or a [0] placeholder


def _unit(vectors: tf.Tensor) -> tf.Tensor:
    vectors = tf.cast(vectors, tf.float32)
    return tf.math.divide_no_nan(vectors, tf.norm(vectors, axis=-1, keepdims=True))


def decode_contrastive_search(
    model,
    inputs: DecodeInputs,
    *,
    buffer_new_tokens: int,
    processor_spec,
    user_processors=(),
    output_scores: bool = False,
    output_logits: bool = False,
    top_k: int,
) -> dict:
    """Contrastive search with `top_k` candidates and the per-prompt knob `penalty_alpha`.

    Returns a dict: `sequences` int32 `[B, T + buffer_new_tokens]` (pad after a row finished), `steps` int32, and
    when asked `scores` / `logits` float32 `[buffer_new_tokens, B, V]` (processed / raw logits). As in HF, a
    finished row keeps following its best candidate (that is what its later scores describe) while pad is
    written to its tokens.
    """
    state0 = prefill(model, inputs, buffer_new_tokens)
    batch_size, prompt_width = size_of(inputs.input_ids, 0), size_of(inputs.input_ids, 1)
    vocab_size = state0.logits.shape[-1]
    if not 2 <= top_k <= vocab_size:
        raise ValueError(f"top_k must be in [2, vocab_size={vocab_size}] for contrastive search, got {top_k}")
    copies = tf.repeat(tf.range(batch_size), top_k)
    max_length = inputs.prompt_len + inputs.max_new_tokens
    alpha = tf.convert_to_tensor(inputs.knobs["penalty_alpha"], tf.float64)
    probability_weight = tf.cast(1.0 - alpha, tf.float32)[:, None]
    alpha = tf.cast(alpha, tf.float32)[:, None]
    budget = tf.reduce_max(inputs.max_new_tokens)
    # Only the chosen candidate's logits are used: models that can apply their LM head separately skip it for
    # the other top_k - 1 candidates.
    head_on_chosen_only = callable(getattr(model, "logits_from_hidden", None))
    # The LM head then runs on one row per prompt, else on every candidate.
    static_batch = inputs.input_ids.shape[0]
    head_rows = None if static_batch is None else static_batch * (1 if head_on_chosen_only else top_k)
    model = decoding_model(model, head_rows)

    def choose(state: _State) -> _State:
        context = ProcessorContext(
            sequences=state.sequences,
            start=inputs.start,
            cur_len=inputs.prompt_len + state.step,
            prompt_len=inputs.prompt_len,
            max_length=max_length,
        )
        processed = apply_processors(processor_spec, state.logits, context, inputs.knobs, user_processors)
        top_probs, top_ids = tf.math.top_k(tf.nn.softmax(processed), top_k)

        index = prompt_width + state.step
        buffer_mask = write_column(state.buffer_mask, tf.ones_like(state.next_position), index)
        out = model.call_with_cache(
            tf.reshape(top_ids, [-1, 1]),
            state.cache,
            index,
            tf.gather(buffer_mask, copies),
            tf.gather(state.next_position, copies)[:, None],
            **({"compute_logits": False} if head_on_chosen_only else {}),
        )
        candidates = _unit(out.hidden_states[:, -1, :])  # [B*k, D]
        cosine = tf.einsum("bkd,bld->bkl", tf.reshape(candidates, [batch_size, top_k, -1]), state.context)
        # The context is the tokens before this one: the prompt under its mask, then every generated token.
        cosine = tf.where(state.buffer_mask[:, None, :] == 1, cosine, float("-inf"))
        degeneration = tf.reduce_max(cosine, axis=-1)
        selected = tf.argmax(probability_weight * top_probs - alpha * degeneration, axis=-1, output_type=tf.int32)
        chosen_rows = tf.range(batch_size) * top_k + selected

        tokens = tf.where(state.finished, inputs.pad_token_id, tf.gather(top_ids, selected, batch_dims=1))
        finished = (
            state.finished | is_eos(tokens, inputs.eos_token_ids) | (state.step + 1 >= inputs.max_new_tokens)
        )
        return state._replace(
            step=state.step + 1,
            sequences=write_column(state.sequences, tokens, index),
            buffer_mask=buffer_mask,
            cache=gather_rows(out.cache, tf.repeat(chosen_rows, top_k)),
            logits=_chosen_logits(model, out, chosen_rows, head_on_chosen_only),
            context=_write_hidden(state.context, tf.gather(candidates, chosen_rows), index),
            next_position=state.next_position + 1,
            finished=finished,
            scores=record_step(state.scores, processed, state.step, output_scores),
            raw_logits=record_step(state.raw_logits, state.logits, state.step, output_logits),
        )

    hidden_size = state0.hidden.shape[-1]
    state = _State(
        step=tf.constant(0, tf.int32),
        sequences=state0.sequences,
        buffer_mask=state0.buffer_mask,
        cache=gather_rows(state0.cache, copies),
        logits=state0.logits,
        context=tf.concat(
            [_unit(state0.hidden), tf.zeros(tf.stack([batch_size, buffer_new_tokens, hidden_size]))], axis=1
        ),
        next_position=state0.next_position,
        finished=inputs.max_new_tokens <= 0,
        scores=step_buffer(output_scores, buffer_new_tokens, batch_size, vocab_size),
        raw_logits=step_buffer(output_logits, buffer_new_tokens, batch_size, vocab_size),
    )
    state = tf.while_loop(
        lambda s: (s.step < budget) & ~tf.reduce_all(s.finished),
        lambda s: (choose(s),),
        (state,),
        maximum_iterations=buffer_new_tokens,
    )[0]
    result = {"sequences": state.sequences, "steps": state.step}
    if output_scores:
        result["scores"] = state.scores
    if output_logits:
        result["logits"] = state.raw_logits
    return result


def _chosen_logits(model, out, chosen_rows: tf.Tensor, head_on_chosen_only: bool) -> tf.Tensor:
    """float32 `[B, V]`: the next-token logits of each prompt's chosen candidate (rows `chosen_rows`)."""
    if head_on_chosen_only:
        return tf.cast(model.logits_from_hidden(tf.gather(out.hidden_states[:, -1, :], chosen_rows)), tf.float32)
    return tf.gather(tf.cast(out.logits[:, -1, :], tf.float32), chosen_rows)


def _write_hidden(context: tf.Tensor, vectors: tf.Tensor, index) -> tf.Tensor:
    """`context` `[B, L, D]` with `vectors` `[B, D]` written at position `index`."""
    at_index = tf.range(tf.shape(context)[1]) == tf.cast(index, tf.int32)
    return tf.where(at_index[None, :, None], vectors[:, None, :], context)
