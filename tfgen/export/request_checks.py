"""The in-graph checks of an exported signature's request: what `tfgen serve` and TF Serving answer 400 to.

The same rules as `generate()`'s up-front checks: the prompt's shape and ids, and every per-row knob against the
knob schema (`tfgen.config.knobs`), plus the beam length-penalty bound (`tfgen.decoding.beam`).
"""

from __future__ import annotations

import tensorflow as tf

from tfgen.config.knobs import declared
from tfgen.decoding.beam import LENGTH_PENALTY_EXPONENT_LIMIT, length_penalty_fits


def request_checks(input_ids, attention_mask, inputs: dict, row_inputs, *, vocab_size: int, max_positions,
                   buffer_new_tokens: int) -> list:
    """Assert ops rejecting a bad request with InvalidArgumentError (TF Serving answers 400): the prompt
    `input_ids` / `attention_mask` int32 `[B, T]` and each per-row input of `row_inputs` (in `inputs`), against the
    knob schema's ranges. max_positions: the model's (None: unlimited); buffer_new_tokens: the export's budget."""
    batch_size = tf.shape(input_ids)[0]
    real_tokens = tf.reduce_sum(attention_mask, axis=1)
    conditions = [
        (tf.reduce_all(tf.equal(tf.shape(input_ids), tf.shape(attention_mask))),
         "attention_mask must have the shape of input_ids"),
        (tf.shape(input_ids)[1] > 0, "input_ids: the prompt must hold at least one token"),
        (tf.reduce_all((input_ids >= 0) & (input_ids < vocab_size)),
         f"input_ids: token ids must be in [0, {vocab_size})"),
        (tf.reduce_all((attention_mask == 0) | (attention_mask == 1)), "attention_mask must hold only 0 and 1"),
        (tf.reduce_all(real_tokens > 0), "attention_mask: every row needs at least one token"),
    ]
    if max_positions is not None:
        conditions.append((tf.reduce_all(real_tokens <= max_positions),
                           f"input_ids: a prompt has more tokens than the model's {max_positions} positions"))
    for name in row_inputs:
        knob, values = declared(name), inputs[name]
        conditions.append((tf.equal(tf.shape(values)[0], batch_size), f"{name} must have one row per prompt"))
        conditions.append((tf.reduce_all(knob.accepts(values)), f"{name} must be {knob.requirement or 'finite'}"))
    if "length_penalty" in row_inputs:
        budgets = inputs["max_new_tokens"] if "max_new_tokens" in row_inputs else buffer_new_tokens
        conditions.append((
            tf.reduce_all(length_penalty_fits(inputs["length_penalty"], budgets)),
            f"length_penalty: |length_penalty| * ln(max_new_tokens) must be <= {LENGTH_PENALTY_EXPONENT_LIMIT:g} "
            "(beyond, length ** length_penalty leaves float32 and every beam scores alike)",
        ))
    return [tf.debugging.Assert(condition, [message]) for condition, message in conditions]
