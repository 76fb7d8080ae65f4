"""The loop contract every decoding strategy follows, the static spec it is built from, and the one driver
that runs it — as a whole generation or in chunks (streaming).

A strategy is a `DecodingLoop` subclass:
    start(inputs) -> state          prefill the prompt into the static cache (and, where it is cheap, choose
                                    the first token from the prefill's logits)
    step(inputs, state) -> state    advance every row by one token
    done(inputs, state) -> bool     every row finished (eos, budget, or its search is over)
    result(inputs, state) -> dict   the program's outputs (see `DecodingLoop.result`)
over a typed state (a NamedTuple nest whose docstring gives each field's shape) that holds a `DecodeState`
(`decode_state(state)`). Everything is traced TF code: no host round trips, no Python branches on tensor values.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import tensorflow as tf

from tfgen.config.generation_config import GenerationMode
from tfgen.decoding.state import DecodeInputs, DecodeState, decoding_model
from tfgen.logits.spec import ProcessorSpec


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
    """The static part of a generate request: everything that selects and shapes one compiled program.

    Hashable and compared by value, so it is the program cache's key. `batch_size` / `prompt_width` are the
    program's row count and prompt columns (bucketed), or None in an exported signature, which takes any.
    `options` are the strategy's static options as sorted `(name, value)` pairs (e.g. `num_beams`).
    `knob_layout` is `(name, shape, dtype)` of each knob with the batch axis left out (the eos-id vector's
    length among them), so that inputs of another layout never reach a program traced for this one.
    User logits processors and stopping criteria take part by identity (`*_ids`).
    """

    mode: GenerationMode
    options: tuple
    buffer_new_tokens: int
    processor_spec: ProcessorSpec
    knob_layout: tuple
    batch_size: int | None = None
    prompt_width: int | None = None
    output_scores: bool = False
    output_logits: bool = False
    user_processors: tuple = dataclasses.field(default=(), compare=False, repr=False)
    user_processor_ids: tuple = ()
    #: `tfgen.stopping.stop_strings.StopStringTables` (compared by identity: the builder caches one per vocabulary and
    #: strings), or None.
    stop_strings: Any = None
    stopping_criteria: tuple = dataclasses.field(default=(), compare=False, repr=False)
    stopping_criteria_ids: tuple = ()
    #: The assistant model of assisted generation (compared by identity, `assistant_id`), or None.
    assistant: Any = dataclasses.field(default=None, compare=False, repr=False)
    assistant_id: int | None = None
    #: An encoder-decoder model's encoder input columns (`DecodeInputs.encoder`; None: decoder-only, or any width in
    #: an export).
    encoder_width: int | None = None
    #: Whether the encoder's output comes with the inputs (`EncoderInputs.hidden_states`) rather than being computed
    #: in the program.
    encoder_states_given: bool = False

    def option(self, name: str, default: Any = None) -> Any:
        """The strategy option `name` (see `options`)."""
        return dict(self.options).get(name, default)


class DecodingLoop:
    """Base of every strategy's loop: built from a model and a `DecodeSpec`, traced into a program.

    `self.model` runs the prefill; `self.step_model` runs the steps (the model's decoding view in a whole
    run, see `with_decoding_view`).
    """

    #: Rows each prompt occupies in a step's model call whose logits are computed (beams, candidates).
    rows_per_prompt: int = 1

    def __init__(self, model, spec: DecodeSpec):
        self.model = model
        self.step_model = model
        self.spec = spec

    def head_rows(self, batch_rows: int | None) -> int | None:
        """How many rows each step's LM head computes for `batch_rows` prompts (None: unknown)."""
        return None if batch_rows is None else batch_rows * self.rows_per_prompt

    def with_decoding_view(self, batch_rows: int | None) -> DecodingLoop:
        """A copy whose steps use `model.decoding_view` (see `tfgen.decoding.model_protocol`); computed in the program,
        once per run."""
        loop = copy.copy(self)
        loop.step_model = decoding_model(self.model, self.head_rows(batch_rows))
        return loop

    def start(self, inputs: DecodeInputs):
        raise NotImplementedError

    def step(self, inputs: DecodeInputs, state):
        raise NotImplementedError

    def decode_state(self, state) -> DecodeState:
        """The `DecodeState` inside `state` (the state itself for one-token-per-row loops)."""
        return state

    def done(self, inputs: DecodeInputs, state) -> tf.Tensor:
        """bool scalar: no row will change any more."""
        return tf.reduce_all(self.decode_state(state).finished)

    def result(self, inputs: DecodeInputs, state) -> dict:
        """The program's outputs: `sequences` int32 `[B * k, T + N]` (k rows per prompt, grouped by prompt),
        `generated_lengths` int32 `[B * k]` (new tokens of each row, its last one included), `steps` int32
        scalar (tokens chosen before every row finished), and when asked `scores` / `logits` float32
        `[N, rows, V]` (rows `>= steps` are zeros). Beam strategies add `sequences_scores` float32 `[B * k]` and
        `beam_indices` int32 `[B * k, N]`."""
        return self.token_result(self.decode_state(state))

    def token_result(self, decode: DecodeState, **extra) -> dict:
        """`result`'s dict from a `DecodeState` (its sequences and lengths unless `extra` replaces them)."""
        result = {"sequences": decode.sequences, "generated_lengths": decode.generated, "steps": decode.step}
        if self.spec.output_scores:
            result["scores"] = decode.scores
        if self.spec.output_logits:
            result["logits"] = decode.raw_logits
        result.update(extra)
        return result


def run_steps(loop: DecodingLoop, inputs: DecodeInputs, state, max_steps: int):
    """Runs up to `max_steps` steps of `loop` in one `tf.while_loop`, stopping early once every row finished
    or the longest budget is spent."""
    budget = tf.reduce_max(inputs.max_new_tokens)
    stop_at = loop.decode_state(state).step + max_steps

    def keep_going(state):
        step = loop.decode_state(state).step
        return (step < budget) & (step < stop_at) & ~loop.done(inputs, state)

    return tf.while_loop(
        keep_going, lambda state: (loop.step(inputs, state),), (state,), maximum_iterations=max_steps
    )[0]


def generate_all(loop: DecodingLoop, inputs: DecodeInputs) -> dict:
    """The whole generation: start, steps until done, result (the whole-run program's body)."""
    loop = loop.with_decoding_view(inputs.input_ids.shape[0])
    state = run_steps(loop, inputs, loop.start(inputs), loop.spec.buffer_new_tokens)
    return loop.result(inputs, state)


def generate_chunk(loop: DecodingLoop, inputs: DecodeInputs, state, max_steps: int):
    """One streaming chunk: up to `max_steps` steps from `state` (the first chunk's comes from `loop.start`, a
    program of its own). Returns `(state, finished)`, finished a bool scalar: nothing is left to do.

    Chunks use the model itself, not its decoding view: what a view prepares per run would be redone on every chunk
    of a few steps.
    """
    state = run_steps(loop, inputs, state, max_steps)
    budget_spent = loop.decode_state(state).step >= tf.reduce_max(inputs.max_new_tokens)
    return state, budget_spent | loop.done(inputs, state)


def state_specs(loop: DecodingLoop, inputs: DecodeInputs):
    """The TensorSpec nest of `loop.start(inputs)`'s state (the first streaming chunk is given zeros of it),
    found by tracing `start` without running or compiling it."""
    specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), inputs)
    traced = tf.function(loop.start, autograph=False).get_concrete_function(specs).structured_outputs
    return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), traced)
