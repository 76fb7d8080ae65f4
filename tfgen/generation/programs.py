"""The program cache: one compiled `tf.function` per `DecodeSpec` (and program kind) per model.

A first call of a new program compiles for seconds; it is announced through `logging` (logger
`tfgen.generation.programs`, INFO), which the `tfgen` command shows on stderr. Library users see it with
`logging.getLogger("tfgen").setLevel(logging.INFO)` and a handler.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfgen.decoding.loop import generate_all, generate_chunk, state_specs
from tfgen.decoding.strategies import make_loop
from tfgen.generation import compile_cache, tf_startup
from tfgen.request.prepare import Request

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ProgramCache:
    """One model's traced programs, by key; `traces` counts traces (each one is one XLA compilation)."""

    functions: dict = dataclasses.field(default_factory=dict)
    traces: int = 0
    #: Streaming state specs by `DecodeSpec` (finding them traces the loop's start).
    state_specs: dict = dataclasses.field(default_factory=dict)


_CACHES: weakref.WeakKeyDictionary[Any, ProgramCache] = weakref.WeakKeyDictionary()


def program_cache(model) -> ProgramCache:
    """The model's `ProgramCache` (created on first use; it goes away with the model)."""
    cache = _CACHES.get(model)
    if cache is None:
        cache = _CACHES[model] = ProgramCache()
    return cache


def specs_of(structure):
    """The TensorSpec nest of a nest of tensors (a fixed input signature: one trace per program)."""
    return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), structure)


def cached_program(model, key: tuple, function: Callable, input_signature: list, jit_compile: bool,
                   autograph: bool = False):
    """Returns `(program, is_new)`: `function` compiled once per `key` (XLA) or run as is (eager).

    Autograph is off unless asked for: tfgen's loops use `tf.while_loop` / `tf.cond` explicitly, and
    converting the traced code took about 1.5 of the 5 seconds of a 124M model's first call. Calls with
    user logits processors turn it on, since those may use Python control flow on tensors.
    """
    cache = program_cache(model)
    key = key + (jit_compile,)
    program = cache.functions.get(key)
    if program is not None:
        return program, False

    def traced(*args):
        cache.traces += 1
        return function(*args)

    if jit_compile:
        # Its first call compiles with XLA: the persistent cache's folders, thread and exit hook start now.
        compile_cache.start()
        program = HealingProgram(lambda: tf.function(
            traced, input_signature=input_signature, jit_compile=True, reduce_retracing=False, autograph=autograph
        ))
    else:
        program = function
    cache.functions[key] = program
    return program, True


class HealingProgram:
    """A `tf.function(jit_compile=True)` (made by `make`) whose first call may load its executable from the
    persistent compile cache: when that call fails with a TensorFlow error and the cache took entries from its
    store, the cache deletes them (`compile_cache.heal`, one warning) and the call runs once more on the function
    made anew — TensorFlow remembers a failed compile per traced function, so the same one would fail again. Calls
    inside another function's trace (a batch job's step) pass through; their caller heals."""

    def __init__(self, make: Callable):
        self.make = make
        self.function = make()
        self.proven = False

    def __call__(self, *args):
        if self.proven or not tf.executing_eagerly():
            return self.function(*args)
        try:
            result = self.function(*args)
        except tf.errors.OpError as error:
            if not compile_cache.heal(error):
                raise
            self.renew()
            result = self.function(*args)
        self.proven = True
        return result

    def renew(self) -> None:
        """Replaces the function by a new one (traced and compiled at its first call)."""
        self.function = self.make()


def generate_program(model, request: Request, jit_compile: bool = True):
    """Returns `(program, is_new)`: `program(inputs: DecodeInputs) -> dict`, the whole generation of
    `request.spec` (see `DecodingLoop.result` for the dict)."""
    spec = request.spec
    return cached_program(
        model, ("generate", spec), lambda inputs: generate_all(make_loop(model, spec), inputs),
        [specs_of(request.inputs)], jit_compile, autograph=bool(spec.user_processors),
    )


def encode_ahead(model, request: Request, jit_compile: bool = True) -> Request:
    """Runs an encoder-decoder request's encoder before its generate program (`request.encode_ahead`: the call asked
    for `output_hidden_states`): one cached program per encoder shape returns every layer's states. Returns the request
    with the encoder's output in `inputs.encoder.hidden_states` (the program then does not encode again) and HF's
    `encoder_hidden_states` (`num_layers + 1` float32 `[prompts, S, D]`, bucket rows and columns cut)."""
    encoder = request.inputs.encoder
    program, is_new = cached_program(
        model, ("encode", tuple(encoder.input_ids.shape)),
        lambda ids, mask: model.encode(ids, mask, output_hidden_states=True),
        [specs_of(encoder.input_ids), specs_of(encoder.attention_mask)], jit_compile,
    )
    with announce_compile(request, is_new and jit_compile, what="the encoder"):
        output, layers = program(encoder.input_ids, encoder.attention_mask)
    # One row per prompt: sampling's num_return_sequences copies (made on the host) share their encoder input.
    prompt_rows = tf.range(0, request.batch_size, request.host_copies)
    start = int(encoder.start)
    states = tuple(tf.cast(tf.gather(layer, prompt_rows)[:, start:], tf.float32) for layer in layers)
    encoder = encoder._replace(hidden_states=tf.cast(output, tf.float32))
    return dataclasses.replace(request, inputs=request.inputs._replace(encoder=encoder),
                               encoder_hidden_states=states, encode_ahead=False)


class ChunkedProgram:
    """The chunked form of a request's loop (streaming, `max_time`): `run(inputs, state, first)` ->
    `(state, finished)` runs up to `chunk_steps` steps (starting the loop when `first`), and
    `result(inputs, state)` packs the outputs.

    Two programs: the loop's start (the prefill) and a chunk of steps. The start's traced outputs give the state's
    specs that the chunk's signature needs, so the prefill is traced once (one program holding both, the start
    under a `tf.cond`, needed the specs before its trace: a second trace of the prefill, 1.5 of the ~9 s a cached
    SmolLM2 program took to start here).
    """

    def __init__(self, model, request: Request, chunk_steps: int, jit_compile: bool):
        spec = request.spec
        self.loop = loop = make_loop(model, spec)
        cache = program_cache(model)
        autograph = bool(spec.user_processors)
        inputs_spec = specs_of(request.inputs)
        self.start, start_is_new = cached_program(model, ("start", spec), loop.start, [inputs_spec], jit_compile,
                                                  autograph=autograph)
        if spec not in cache.state_specs:
            if jit_compile:  # the start program's own trace (its first call reuses it)
                traced = self.start.function.get_concrete_function(inputs_spec).structured_outputs
                cache.state_specs[spec] = specs_of(traced)
            else:
                cache.state_specs[spec] = state_specs(loop, request.inputs)
        self.state_specs = cache.state_specs[spec]
        self.steps, steps_are_new = cached_program(
            model, ("chunk", spec, chunk_steps),
            lambda inputs, state: generate_chunk(loop, inputs, state, chunk_steps),
            [inputs_spec, self.state_specs], jit_compile, autograph=autograph,
        )
        self.is_new = start_is_new or steps_are_new

    def run(self, inputs, state, first) -> tuple:
        """`(state, finished)` after up to `chunk_steps` steps from `state`, or (`first`: a bool or bool scalar) from
        the loop's start (`state` is then ignored)."""
        if bool(first):
            state = self.start(inputs)
        return self.steps(inputs, state)

    def initial_state(self):
        """Zeros in the shape of the loop's state: what the first chunk (`first=True`) is given."""
        return tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), self.state_specs)

    def result(self, inputs, state) -> dict:
        return self.loop.result(inputs, state)

    def tokens(self, state) -> tuple[int, Any]:
        """`(steps, sequences)` of a chunk's state: tokens chosen so far and the int32 `[B, T + N]` buffer."""
        decode = self.loop.decode_state(state)
        return int(decode.step), decode.sequences


@contextlib.contextmanager
def announce_compile(request: Request, compiling: bool, what: str = "generate"):
    """Logs that a first call is compiling (it takes seconds, so nobody thinks it hung), and how long it took. The
    figures are the ones the caller asked for, each with the bucket the program is compiled for when it differs
    ("prompt length 45 (bucket 48), 20 new tokens (bucket 32)")."""
    if not compiling:
        yield
        return
    batch, width = request.inputs.input_ids.shape
    logger.info(
        "compiling %s for %s, %s, %s ...", what, _with_bucket("batch {}", request.batch_size, batch),
        _with_bucket("prompt length {}", request.prompt_len, width),
        _with_bucket("{} new tokens", request.max_new_tokens, request.spec.buffer_new_tokens),
    )
    began = time.perf_counter()
    with tf_startup.first_compile_quiet(tf.__version__):
        yield
    logger.info("compiled %s in %.1f s", what, time.perf_counter() - began)


def _with_bucket(words: str, asked: int, bucket: int) -> str:
    """`words` with the figure `asked`, and the compiled `bucket` beside it when the two differ."""
    text = words.format(asked)
    return text if asked == bucket else f"{text} (bucket {bucket})"
