"""The three programs of continuous batching (JetStream's prefill / insert / generate split), over a decode state
held in explicit tensors, so that they run in-process and export as SavedModel signatures alike.

A *slot* is one row of a fixed-size decode batch (`slots` rows, `length` buffer columns). A request's row occupies a
slot from its insertion until it finishes; requests join and leave between calls, and every slot carries its own
budget, seed, knobs and stopping state. Layout of a slot: the request's row as sent (its own left padding
included, attention mask 0 there) at columns `[0, W)`, then its new tokens; the cache slot of column `c` holds the
keys/values of the token at `c` (models with a per-row `cache_index`, `row_cache_index = True`).

    init_state()                         -> state    every slot empty (finished); the state is a `SlotState`
    insert(state, rows)                  -> state    prefill `rows` into their slots and choose each one's first token
    steps(state, max_steps, release)     -> state    up to `max_steps` tokens for every running slot (after ending
                                                     the slots of `release`); stops early once every slot finished

Tokens are chosen exactly as `generate()` chooses them for the same row alone (the `greedy` / `sample` signatures):
the same processors over the same `input_ids` (HF's: the row as sent plus its new tokens), the same per-row
sampling key folded with the row's token index. So a row's tokens never depend on who shares the batch.

The export's slot signatures take and return the state flat (`SlotState.to_flat`, `state_from_flat`); the
programs hold it typed.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from tfgen.config.knobs import KNOBS, WARPER_KNOBS
from tfgen.decoding.model_protocol import capabilities
from tfgen.decoding.rows import RowTokens, commit_per_row
from tfgen.decoding.state import PromptBuffers, prompt_buffers, sample_from_scores
from tfgen.engine.slot_state import REQUEST_KNOBS, SlotState
from tfgen.logits.context import ProcessorContext
from tfgen.logits.pipeline import apply_processors


class SlotPrograms:
    """The slot programs of one model and one decoding setup (a `DecodeSpec` whose processors are those of the
    export's `sample` signature, and one row's knob values from the generation config).

    slots / length: the decode batch (rows) and buffer columns, static. budget_cap: the most new tokens a row may
    take (the export's `max_new_tokens`). max_positions: the model's positions (budgets are capped so that a row
    fits), or None. top_logprobs: K, the most likely tokens whose raw log-probabilities the state records per new
    token beside the chosen token's (`SlotState.logprobs`); 0 records none (a static choice: a step then pays no
    log-softmax and no top-K over the vocabulary).
    """

    def __init__(self, model, spec, knobs: dict, *, pad_token_id: int, slots: int, length: int, budget_cap: int,
                 max_positions: int | None = None, top_logprobs: int = 0):
        offers = capabilities(model)
        if not offers.row_cache_index:
            raise ValueError(f"model: {type(model).__name__} does not declare `row_cache_index = True` (a "
                             "call_with_cache taking one cache slot per row), which continuous batching needs.")
        for name, value in (("slots", slots), ("length", length)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        vocab_size = int(model.config.vocab_size)
        if not isinstance(top_logprobs, int) or not 0 <= top_logprobs <= vocab_size:
            raise ValueError(f"top_logprobs must be an integer in [0, {vocab_size}] (0: no log-probabilities), got "
                             f"{top_logprobs!r}")
        self.top_logprobs = top_logprobs
        self.model = model
        self.spec = spec
        self.slots, self.length = slots, length
        self.budget_cap = int(budget_cap)
        self.max_positions = max_positions
        self.pad_token_id = int(pad_token_id)
        self.vocab_size = int(model.config.vocab_size)
        self.row_knobs = {name: np.asarray(value)[0] for name, value in knobs.items() if KNOBS[name].per_row}
        self.shared_knobs = {name: np.asarray(value) for name, value in knobs.items() if not KNOBS[name].per_row}
        # A greedy row runs no warper (HF's greedy search): its warper knobs are neutral.
        self._greedy_spec = spec.processor_spec.forced({name: False for name in WARPER_KNOBS})
        self._head_apart = offers.logits_from_hidden

    # ------------------------------------------------------------------------------------------------------
    # The state

    def state_specs(self) -> dict:
        """{name: tf.TensorSpec} of the state's flat form (`SlotState.to_flat`: the signatures' inputs and outputs)."""
        return {name: tf.TensorSpec(tensor.shape, tensor.dtype, name=name)
                for name, tensor in self.init_state().to_flat().items()}

    def state_from_flat(self, flat: Mapping) -> SlotState:
        """The state of its flat form (a signature's inputs), the cache packed as the model's nest."""
        return SlotState.from_flat(flat, self.model.init_cache(1, 1))

    def init_state(self) -> SlotState:
        """The empty state (S slots, L columns; see `SlotState`): every slot finished, pad tokens, zero mask and
        counts, the config's knob values, the model's empty cache."""
        slots, length = self.slots, self.length
        zeros = tf.zeros([slots], tf.int32)
        return SlotState(
            tokens=tf.fill([slots, length], self.pad_token_id), mask=tf.zeros([slots, length], tf.int32),
            width=zeros, length=zeros, position=zeros, generated=zeros, budget=zeros,
            finished=tf.ones([slots], tf.bool), seed=tf.zeros([slots, 2], tf.int32),
            do_sample=tf.zeros([slots], tf.bool),
            knobs={name: tf.constant(np.repeat(value[np.newaxis], slots, axis=0))
                   for name, value in self.row_knobs.items()},
            logprobs=self._empty_logprobs(slots), cache=self.model.init_cache(slots, length),
        )

    def _empty_logprobs(self, rows) -> dict:
        """`SlotState.logprobs` of `rows` slots before any token: zeros ({} when the programs record none)."""
        if not self.top_logprobs:
            return {}
        columns, top = [rows, self.length], [rows, self.length, self.top_logprobs]
        return {"chosen": tf.zeros(columns, tf.float32), "top_ids": tf.zeros(top, tf.int32),
                "top": tf.zeros(top, tf.float32)}

    def _knobs(self, state: SlotState) -> dict:
        knobs = {name: tf.constant(value) for name, value in self.shared_knobs.items()}
        knobs.update({name: state.knobs[name] for name in self.row_knobs})
        return knobs

    # ------------------------------------------------------------------------------------------------------
    # insert

    def insert(self, state: SlotState, rows: dict) -> SlotState:
        """Prefills `rows` into their slots and chooses each one's first token.

        rows: input_ids / attention_mask int32 `[n, P]` (each row as sent, then right padding: mask 0 and any id),
        width int32 `[n]` (the row's own columns as sent, <= P), slot int32 `[n]` (distinct), max_new_tokens int32
        `[n]`, seed int32 `[n, 2]`, do_sample bool `[n]`, and temperature float32 / top_k int32 / top_p float32 `[n]`
        (used where do_sample). Returns the state.
        """
        ids, mask, width = rows["input_ids"], rows["attention_mask"], rows["width"]
        count, prompt_columns = tf.unstack(tf.shape(ids))
        length = self.length
        # The new rows alone: their own buffer, cache and first token, then scattered into their slots.
        buffers = prompt_buffers(ids, mask, length - prompt_columns, self.pad_token_id)
        cache, logits = self._prefill(ids, buffers, width)
        budget = tf.clip_by_value(rows["max_new_tokens"], 0, self.budget_cap)
        if self.max_positions is not None:
            budget = tf.minimum(budget, self.max_positions - tf.reduce_sum(mask, axis=1))
        budget = tf.minimum(budget, length - width)  # never past the buffer (the server routes longer rows elsewhere)
        sampling = rows["do_sample"]
        knobs = {}
        for name, value in self.row_knobs.items():
            default = tf.repeat(tf.constant(value)[tf.newaxis], count, axis=0)
            chosen = tf.cast(rows[name], default.dtype) if name in REQUEST_KNOBS else default
            if name in WARPER_KNOBS:
                chosen = tf.where(sampling, chosen, tf.constant(KNOBS[name].neutral, default.dtype))
            knobs[name] = chosen
        new = SlotState(
            tokens=buffers.sequences, mask=buffers.buffer_mask, width=width, length=width,
            position=tf.reduce_sum(mask, axis=1), generated=tf.zeros([count], tf.int32), budget=budget,
            finished=budget <= 0, seed=rows["seed"], do_sample=sampling, knobs=knobs,
            logprobs=self._empty_logprobs(count), cache=cache,
        )
        new = self._choose(new, logits)
        where = rows["slot"][:, tf.newaxis]

        def scatter(value, row_value):  # an entry without elements (a knob of no values) has nothing to write
            if value.shape.num_elements() == 0:
                return value
            return tf.tensor_scatter_nd_update(value, where, tf.cast(row_value, value.dtype))

        return tf.nest.map_structure(scatter, state, new)

    def _prefill(self, ids, buffers: PromptBuffers, width):
        """Runs new rows' prompts (`ids` int32 `[n, P]`, each row as sent then right padding; `buffers` their
        `prompt_buffers` over the slot's L columns; `width` int32 `[n]`) into a fresh cache: (the cache `[n, ...]`,
        float32 `[n, V]` logits of each row's last column as sent, `width - 1`)."""
        # Right padding puts each row's last token at its own column, so `last_logits_only` (the last column) would
        # miss it; with the head apart only those n columns go through the LM head.
        cache = self.model.init_cache(tf.shape(ids)[0], self.length)
        last = tf.maximum(width - 1, 0)[:, tf.newaxis]
        start, mask, positions = tf.constant(0, tf.int32), buffers.buffer_mask, buffers.position_ids
        if self._head_apart:
            out = self.model.call_with_cache(ids, cache, start, mask, positions, compute_logits=False)
            logits = self.model.logits_from_hidden(tf.gather(out.hidden_states, last, axis=1, batch_dims=1))[:, 0]
        else:
            out = self.model.call_with_cache(ids, cache, start, mask, positions)
            logits = tf.gather(out.logits, last, axis=1, batch_dims=1)[:, 0]
        return out.cache, tf.cast(logits, tf.float32)

    # ------------------------------------------------------------------------------------------------------
    # steps

    def steps(self, state: SlotState, max_steps, release, rows: int | None = None, record=None) -> SlotState:
        """Ends the slots where `release` (bool `[S]`) is true, then runs up to `max_steps` (int32 scalar) tokens
        of every running slot, stopping early once every slot finished. Returns the state.

        rows: a static count: only slots `[0, rows)` run (the others must be empty or finished), so a lightly
        loaded engine pays for the rows it uses, not for all S (None: every slot).
        record: bool `[S]`, the slots whose requests want log-probabilities (programs with `top_logprobs`; None:
        every slot). A step in which no running slot wants them skips their top-K, a sort of every row's logits.
        """
        state = state._replace(finished=state.finished | release)
        if rows is not None and rows < self.slots:
            head = self.steps(tf.nest.map_structure(lambda value: value[:rows], state), max_steps,
                              tf.zeros([rows], tf.bool), record=None if record is None else record[:rows])
            return tf.nest.map_structure(lambda ran, value: tf.concat([ran, value[rows:]], axis=0), head, state)

        def keep_going(count, state):
            return (count < max_steps) & ~tf.reduce_all(state.finished)

        def step(count, state):
            return count + 1, self._step(state, record)

        return tf.while_loop(keep_going, step, (tf.constant(0, tf.int32), state))[1]

    def row_buckets(self) -> list[int]:
        """The `rows` values a driver uses: powers of two below S, then S."""
        buckets, rows = [], 1
        while rows < self.slots:
            buckets.append(rows)
            rows *= 2
        return buckets + [self.slots]

    def _step(self, state: SlotState, record=None) -> SlotState:
        """Runs every slot's last written token through the model and chooses the next one (`record`: `steps`')."""
        pending = tf.maximum(state.length - 1, 0)
        tokens = tf.gather(state.tokens, pending[:, tf.newaxis], axis=1, batch_dims=1)
        out = self.model.call_with_cache(tokens, state.cache, pending, state.mask, state.position[:, tf.newaxis])
        running = ~state.finished
        state = state._replace(cache=out.cache, position=state.position + tf.cast(running, tf.int32))
        return self._choose(state, tf.cast(out.logits[:, -1, :], tf.float32), record)

    def _choose(self, state: SlotState, logits, record=None) -> SlotState:
        """Chooses each running row's token at column `length` from `logits` float32 `[R, V]` and commits it
        (`commit_per_row`: the mask, eos / budget / stop strings, `finished`, `generated`), advancing `length`;
        records the log-probabilities where `record` (bool `[R]`, None: every row) allows."""
        column, width = state.length, state.width
        # A row's prompt, as sent, is its columns [0, width): HF's `encoder_input_ids` of a decoder-only model.
        prompt_columns = tf.range(tf.shape(state.tokens)[1])[tf.newaxis, :] < width[:, tf.newaxis]
        context = ProcessorContext(sequences=state.tokens, start=tf.constant(0, tf.int32), cur_len=column,
                                   prompt_len=width[:, tf.newaxis], max_length=width + state.budget,
                                   encoder_ids=tf.where(prompt_columns, state.tokens, -1))
        knobs, running = self._knobs(state), ~state.finished

        def greedy():  # no row samples: the warpers (neutral in greedy rows) and the draw are skipped
            scores = apply_processors(self._greedy_spec, logits, context, knobs)
            return tf.argmax(scores, axis=-1, output_type=tf.int32), scores

        def mixed():
            scores = apply_processors(self.spec.processor_spec, logits, context, knobs)
            sampled = sample_from_scores(scores, state.seed, state.generated)
            return tf.where(state.do_sample, sampled, tf.argmax(scores, axis=-1, output_type=tf.int32)), scores

        chosen, scores = tf.cond(tf.reduce_any(state.do_sample & running), mixed, greedy)
        committed = commit_per_row(
            RowTokens(state.tokens, state.mask, state.finished, state.generated), chosen, column, running, scores,
            eos_token_ids=tf.constant(self.shared_knobs["eos_token_ids"]), budget=state.budget,
            stop_strings=self.spec.stop_strings, stopping_criteria=(), start=tf.constant(0, tf.int32),
            pad_token_id=self.pad_token_id,
        )
        return state._replace(tokens=committed.sequences, mask=committed.mask, finished=committed.finished,
                              generated=committed.generated, length=column + tf.cast(running, tf.int32),
                              logprobs=self._record(state.logprobs, logits, chosen, column, running, record))

    def _record(self, logprobs: dict, logits, chosen, column, running, record=None) -> dict:
        """`logprobs` (`SlotState.logprobs`) with each running row's entries at its `column` (int32 `[R]`) written:
        the raw log-probabilities of `logits` float32 `[R, V]` (before any processor, as vLLM reports them by
        default) of `chosen` int32 `[R]` and of the K most likely tokens; unchanged when no running row is in
        `record` (bool `[R]`; None: every row is)."""
        if not logprobs:
            return logprobs
        if record is not None:
            return tf.cond(tf.reduce_any(record & running),
                           lambda: self._record(logprobs, logits, chosen, column, running), lambda: dict(logprobs))
        # log_softmax(x)_i = x_i - logsumexp(x): the top K of the logits are those of the log-probabilities.
        total = tf.reduce_logsumexp(logits, axis=-1, keepdims=True)
        top, top_ids = tf.math.top_k(logits, k=self.top_logprobs)
        new = {"chosen": tf.gather(logits, chosen[:, tf.newaxis], batch_dims=1)[:, 0] - total[:, 0],
               "top_ids": top_ids, "top": top - total}
        # A finished row's `column` may be L (its buffer full): clamped, and its old entry written back.
        where = tf.stack([tf.range(tf.shape(chosen)[0]), tf.minimum(column, self.length - 1)], axis=1)

        def put(buffer, value):
            keep = tf.reshape(running, [-1] + [1] * (value.shape.rank - 1))
            return tf.tensor_scatter_nd_update(buffer, where, tf.where(keep, value, tf.gather_nd(buffer, where)))

        return {name: put(logprobs[name], new[name]) for name in logprobs}


__all__ = ["SlotPrograms"]
