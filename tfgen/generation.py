"""`TFGenerationMixin`: `generate()` compiled end to end with XLA, for any model that follows the protocol.

The call splits into a static part (strategy, which processors are active, output flags, shape buckets) that
selects one cached compiled program, and run-time tensors (prompt, seeds, temperature, top-k/top-p,
penalties, per-row budgets, eos ids) that are fed to it. So new knob values and new prompts of the same
bucket never recompile. See `docs/design.md`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
import warnings
import weakref
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfgen.config import GenerationConfig, GenerationMode
from tfgen.decoding.common import DecodeInputs
from tfgen.decoding.sampling import GreedyOrSampleLoop
from tfgen.decoding.strategies import STRATEGIES, Strategy
from tfgen.decoding.transition_scores import compute_transition_scores
from tfgen.outputs import GenerateBeamDecoderOnlyOutput, GenerateDecoderOnlyOutput
from tfgen.processors import processor_knobs_from_config, processor_spec_from_config
from tfgen.random import derive_seeds, random_seeds
from tfgen.streaming import BaseStreamer, TokenCallbackStreamer

#: Say on stderr when a call compiles a new program (it takes seconds), so nobody thinks it hung.
COMPILE_MESSAGES = True

# generate() keywords that are not GenerationConfig attributes.
_MODEL_INPUT_KWARGS = ("input_ids", "attention_mask")


@dataclasses.dataclass(frozen=True)
class BucketPolicy:
    """How request shapes are rounded up so that ragged traffic reuses a handful of compiled programs.

    Batch sizes round up to a power of two up to `batch_step`, then to a multiple of it; prompt lengths and
    new-token budgets round up to multiples of `length_step` / `new_tokens_step`. The padding is exact: extra
    prompt columns are left padding under the attention mask, extra rows are discarded, and the loop stops at
    the real budget (it is a tensor), not at the bucket.
    """

    batch_step: int = 8
    length_step: int = 16
    new_tokens_step: int = 16

    def batch(self, size: int) -> int:
        if size <= self.batch_step:
            return 1 << (size - 1).bit_length()
        return _round_up(size, self.batch_step)

    def prompt_length(self, length: int) -> int:
        return _round_up(length, self.length_step)

    def new_tokens(self, count: int) -> int:
        return _round_up(count, self.new_tokens_step)


EXACT_SHAPES = BucketPolicy(batch_step=1, length_step=1, new_tokens_step=1)
DEFAULT_BUCKETS = BucketPolicy()


def _round_up(value: int, step: int) -> int:
    return max(step, -(-value // step) * step)


@dataclasses.dataclass
class _CompiledPrograms:
    """Per-model cache of traced generate programs, keyed by their static signature."""

    functions: dict = dataclasses.field(default_factory=dict)
    traces: int = 0


_PROGRAMS: "weakref.WeakKeyDictionary[Any, _CompiledPrograms]" = weakref.WeakKeyDictionary()


def _programs_of(model) -> _CompiledPrograms:
    programs = _PROGRAMS.get(model)
    if programs is None:
        programs = _PROGRAMS[model] = _CompiledPrograms()
    return programs


class TFGenerationMixin:
    """Adds `generate()` to a model that implements `tfgen.models.protocol.CausalLMProtocol`."""

    #: Shape buckets for compiled programs; set `EXACT_SHAPES` on a model to compile per exact shape.
    generation_buckets: BucketPolicy = DEFAULT_BUCKETS

    @property
    def generate_trace_count(self) -> int:
        """How many generate programs were traced (each is one XLA compilation) for this model so far."""
        return _programs_of(self).traces

    def generate(
        self,
        inputs=None,
        generation_config: Optional[GenerationConfig] = None,
        logits_processor: Optional[Sequence[Callable]] = None,
        seed=None,
        jit_compile: bool = True,
        streamer=None,
        **kwargs,
    ):
        """Generates continuations of `inputs` (int token ids `[batch, prompt_len]`).

        Args:
            inputs / input_ids: int ids `[batch, prompt_len]` (numpy, nested lists or a tensor), left padded.
                May be omitted (or have length 0) when the model has a `bos_token_id`: generation starts from it.
            attention_mask (keyword): `[batch, prompt_len]` of 0/1; inferred from `pad_token_id` like HF when absent.
            generation_config: a `GenerationConfig`; defaults to the model's. Keyword arguments override its
                attributes (`max_new_tokens=`, `do_sample=`, `top_p=` ...); an unknown keyword is an error.
            logits_processor: callables `(input_ids [B, L], scores [B, V], cur_len) -> scores` run inside the
                compiled loop after the built-in processors (HF-TF convention: `input_ids` is the padded buffer,
                `cur_len` the buffer index of the token being chosen).
            seed: `[2]` ints for the whole batch (row `i` uses a key derived from it and `i`) or `[batch, 2]`, one
                per row. A row's tokens depend on its own key only. Without a seed, sampling draws fresh entropy.
            jit_compile: True (default) runs one cached XLA program; False runs the same loop eagerly (debugging).
            streamer: a `tfgen.streaming.BaseStreamer` (`TextStreamer`, `TextIteratorStreamer`, ...) or a callable
                `fn(token_ids [batch])` called once per generated step. The loop then runs in compiled chunks of
                `streamer.chunk_steps` steps, keeping the cache on the device, and hands each chunk's tokens over;
                the tokens are the same as without a streamer. Greedy search and sampling only.

        Returns:
            int32 tensor `[batch * num_return_sequences, prompt_len + max_new_tokens]`, padded with
            `pad_token_id` after a row finished; or with `return_dict_in_generate=True` a
            `GenerateDecoderOnlyOutput` with `sequences` and, when asked, `scores` / `logits` (one
            `[batch * num_return_sequences, vocab]` tensor per generated step).
        """
        request = _prepare_request(self, inputs, generation_config, logits_processor, seed, kwargs)
        if streamer is not None:
            return self._generate_streaming(request, _as_streamer(streamer, request), jit_compile)
        program, is_new = self._generate_program(request, jit_compile)
        with _announce_compile(request, is_new and jit_compile):
            result = program(request.decode_inputs)
        return _finish(request, result)

    def compute_transition_scores(
        self,
        sequences,
        scores,
        beam_indices=None,
        normalize_logits: bool = False,
        *,
        input_length=None,
    ) -> tf.Tensor:
        """The score each step gave to the chosen token, float32 `[rows, steps]`, as HF's method of that name.

        `sequences`, `scores` (or `logits`) and `beam_indices` come from a `return_dict_in_generate=True`
        output. tfgen pads `sequences` to `prompt_len + max_new_tokens`, so when generation stopped before the
        budget pass `input_length=prompt_len` (HF's default reads the generated tokens from the last columns).
        See `tfgen.decoding.transition_scores.compute_transition_scores`.
        """
        return compute_transition_scores(
            sequences, scores, beam_indices, normalize_logits, input_length=input_length
        )

    def _generate_streaming(self, request: "_Request", streamer: BaseStreamer, jit_compile: bool):
        """Runs the loop in compiled chunks and hands each chunk's new tokens to `streamer`."""
        loop = GreedyOrSampleLoop(
            model=self,
            buffer_new_tokens=request.buffer_new_tokens,
            processor_spec=request.processor_spec,
            user_processors=request.user_processors,
            output_scores=request.output_scores,
            output_logits=request.output_logits,
            **request.static_options,
        )
        inputs = request.decode_inputs
        state = loop.empty_state(inputs)
        chunk, is_new = self._cached_program(
            request.static_key + ("stream_chunk", streamer.chunk_steps),
            lambda inputs, state: loop.resume(inputs, state, max_steps=streamer.chunk_steps),
            [_specs_of(inputs), _specs_of(state)],
            jit_compile,
            autograph=bool(request.user_processors),
        )
        rows, prompt_width = request.batch_size, int(inputs.input_ids.shape[1])
        try:
            with _announce_compile(request, is_new and jit_compile):
                state = chunk(inputs, state)
            # The prompt goes out after the first (compiling) chunk, so the notice on stderr does not split it.
            streamer.put(inputs.input_ids.numpy()[:rows, request.start :])
            emitted = 0
            while True:
                steps = int(state.step)
                new_columns = state.sequences[:rows, prompt_width + emitted : prompt_width + steps].numpy()
                for column in new_columns.T:
                    streamer.put(column[:, None])
                emitted = steps
                if steps >= request.max_new_tokens or bool(tf.reduce_all(state.finished)):
                    break
                state = chunk(inputs, state)
        finally:
            # Always close the stream, so a consumer iterating in another thread is released on errors too.
            streamer.end()
        return _finish(request, loop.result(state))

    def _generate_program(self, request: "_Request", jit_compile: bool):
        """Returns `(program, is_new)`: the cached whole-generation program for the request's static key."""

        def run(decode_inputs: DecodeInputs):
            return request.strategy.decode(
                self,
                decode_inputs,
                buffer_new_tokens=request.buffer_new_tokens,
                processor_spec=request.processor_spec,
                user_processors=request.user_processors,
                output_scores=request.output_scores,
                output_logits=request.output_logits,
                **request.static_options,
            )

        return self._cached_program(
            request.static_key, run, [_specs_of(request.decode_inputs)], jit_compile,
            autograph=bool(request.user_processors),
        )

    def _cached_program(
        self, key: tuple, function, input_signature: list, jit_compile: bool, autograph: bool = False
    ):
        """Returns `(program, is_new)`: `function` compiled once per `key` (XLA) or run as is (eager).

        Autograph is off unless asked for: tfgen's loops use `tf.while_loop` / `tf.cond` explicitly, and
        converting the traced code took about 1.5 of the 5 seconds of a 124M model's first call. Calls with
        user logits processors turn it on, since those may use Python control flow on tensors.
        """
        programs = _programs_of(self)
        key = key + (jit_compile,)
        program = programs.functions.get(key)
        if program is not None:
            return program, False

        def traced(*args):
            programs.traces += 1
            return function(*args)

        if jit_compile:
            program = tf.function(
                traced, input_signature=input_signature, jit_compile=True, reduce_retracing=False, autograph=autograph
            )
        else:
            program = function
        programs.functions[key] = program
        return program, True


def _specs_of(structure):
    """The TensorSpec nest of a nest of tensors (a fixed input signature: one trace per program)."""
    return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), structure)


@contextlib.contextmanager
def _announce_compile(request: "_Request", compiling: bool, what: str = "generate"):
    """Tells stderr that a first call is compiling, and how long it took."""
    if not (compiling and COMPILE_MESSAGES):
        yield
        return
    inputs = request.decode_inputs
    batch, length = inputs.input_ids.shape
    sys.stderr.write(
        f"tfgen: compiling {what} for batch {batch}, prompt length {length}, "
        f"{request.buffer_new_tokens} new tokens ... "
    )
    sys.stderr.flush()
    began = time.perf_counter()
    yield
    sys.stderr.write(f"done in {time.perf_counter() - began:.1f} s\n")
    sys.stderr.flush()


def _as_streamer(streamer, request: "_Request") -> BaseStreamer:
    if request.strategy.decode is not STRATEGIES[GenerationMode.GREEDY_SEARCH].decode:
        raise ValueError("streamer: streaming works with greedy search and sampling only (not beam/contrastive).")
    if isinstance(streamer, BaseStreamer):
        chunk_steps = streamer.chunk_steps
        if not isinstance(chunk_steps, int) or chunk_steps < 1:
            raise ValueError(f"streamer.chunk_steps must be a positive int, got {chunk_steps!r}")
        if streamer.max_batch_size is not None and request.batch_size > streamer.max_batch_size:
            raise ValueError(
                f"streamer: {type(streamer).__name__} supports batch size {streamer.max_batch_size} only, "
                f"got {request.batch_size} rows."
            )
        return streamer
    if callable(streamer):
        return TokenCallbackStreamer(streamer)
    raise TypeError(f"streamer must be a tfgen.streaming.BaseStreamer or a callable, got {type(streamer).__name__}")


@dataclasses.dataclass
class _Request:
    """A validated generate call: the tensors to feed and the static choices that select the program."""

    decode_inputs: DecodeInputs
    static_key: tuple
    strategy: Strategy
    static_options: dict
    buffer_new_tokens: int
    processor_spec: Any
    user_processors: tuple
    output_scores: bool
    output_logits: bool
    return_dict: bool
    batch_size: int  # prompts in the call (after host-side expansion for num_return_sequences)
    padded_batch_size: int  # prompts in the program (bucket rows included)
    start: int  # bucket columns before the caller's prompt
    prompt_len: int
    max_new_tokens: int


def _prepare_request(model, inputs, generation_config, logits_processor, seed, kwargs) -> _Request:
    """Resolves the config, checks every input and builds the program inputs — all before compiling."""
    model_config = model.config
    vocab_size = int(model_config.vocab_size)
    input_ids = _pop_input_ids(inputs, kwargs)
    attention_mask = kwargs.pop("attention_mask", None)
    config, explicit_max_length = _resolve_config(model, generation_config, kwargs)

    mode = config.get_generation_mode()
    strategy = STRATEGIES.get(mode)
    if strategy is None:
        raise ValueError(
            f"generation mode {mode.value!r} (num_beams={config.num_beams}, penalty_alpha={config.penalty_alpha}) "
            f"is not available; these are: {', '.join(m.value for m in STRATEGIES)}."
        )
    eos_ids = config.eos_token_ids()
    pad_token_id = config.pad_token_id
    if pad_token_id is None:
        # HF's convention for models without a pad token: pad finished rows with the (first) eos id.
        pad_token_id = eos_ids[0] if eos_ids else 0

    input_ids = _check_input_ids(input_ids, config, vocab_size)
    attention_mask = _check_attention_mask(attention_mask, input_ids, pad_token_id, eos_ids)
    batch_size, prompt_len = input_ids.shape
    max_new_tokens = _resolve_lengths(config, prompt_len, model_config, explicit_max_length)
    longest_row = int(attention_mask.sum(axis=1).max())
    max_positions = getattr(model_config, "max_position_embeddings", None)
    if max_positions is not None and longest_row + max_new_tokens > max_positions:
        raise ValueError(
            f"max_new_tokens: the longest prompt has {longest_row} tokens and {max_new_tokens} new tokens were asked "
            f"for, but the model has only {max_positions} positions."
        )

    row_seeds = _check_seed(seed, batch_size, bool(config.do_sample))
    num_return = int(config.num_return_sequences or 1)
    if num_return > 1 and strategy.host_expands_return_sequences:
        input_ids = np.repeat(input_ids, num_return, axis=0)
        attention_mask = np.repeat(attention_mask, num_return, axis=0)
        copies = np.tile(np.arange(num_return), batch_size)
        row_seeds = derive_seeds(np.repeat(row_seeds, num_return, axis=0), copies).numpy()
        batch_size *= num_return

    user_processors = tuple(logits_processor or ())
    processor_spec = processor_spec_from_config(config, vocab_size, num_beams=int(config.num_beams))

    buckets = getattr(model, "generation_buckets", DEFAULT_BUCKETS)
    padded_batch = buckets.batch(batch_size)
    padded_len = buckets.prompt_length(prompt_len)
    buffer_new_tokens = buckets.new_tokens(max_new_tokens)
    start = padded_len - prompt_len
    extra_rows = padded_batch - batch_size

    ids = np.full((padded_batch, padded_len), pad_token_id, np.int32)
    ids[:batch_size, start:] = input_ids
    mask = np.zeros((padded_batch, padded_len), np.int32)
    mask[:batch_size, start:] = attention_mask
    budgets = np.zeros([padded_batch], np.int32)
    budgets[:batch_size] = max_new_tokens
    seeds = np.concatenate([row_seeds, np.zeros([extra_rows, 2], np.int32)]).astype(np.int32)
    knobs = processor_knobs_from_config(config, padded_batch, vocab_size)
    knobs.update(strategy.runtime_knobs(config, padded_batch))
    # A fixed-size eos vector (-1 never matches a token) keeps one program for any number of eos ids up to 4.
    eos_vector = np.full([_round_up(max(len(eos_ids), 1), 4)], -1, np.int32)
    eos_vector[: len(eos_ids)] = eos_ids

    decode_inputs = DecodeInputs(
        input_ids=tf.constant(ids),
        attention_mask=tf.constant(mask),
        start=tf.constant(start, tf.int32),
        prompt_len=tf.constant(prompt_len, tf.int32),
        max_new_tokens=tf.constant(budgets),
        row_seeds=tf.constant(seeds),
        pad_token_id=tf.constant(pad_token_id, tf.int32),
        eos_token_ids=tf.constant(eos_vector),
        knobs={name: tf.constant(value) for name, value in knobs.items()},
    )
    output_scores = bool(config.output_scores) and bool(config.return_dict_in_generate)
    output_logits = bool(config.output_logits) and bool(config.return_dict_in_generate)
    knob_layout = tuple(sorted((name, value.shape, str(value.dtype)) for name, value in knobs.items()))
    static_options = strategy.static_options(config)
    static_key = (
        mode,
        tuple(sorted(static_options.items())),
        padded_batch,
        padded_len,
        buffer_new_tokens,
        eos_vector.shape[0],
        processor_spec,
        tuple(id(p) for p in user_processors),
        output_scores,
        output_logits,
        knob_layout,
    )
    return _Request(
        decode_inputs=decode_inputs,
        static_key=static_key,
        strategy=strategy,
        static_options=static_options,
        buffer_new_tokens=buffer_new_tokens,
        processor_spec=processor_spec,
        user_processors=user_processors,
        output_scores=output_scores,
        output_logits=output_logits,
        return_dict=bool(config.return_dict_in_generate),
        batch_size=batch_size,
        padded_batch_size=padded_batch,
        start=start,
        prompt_len=prompt_len,
        max_new_tokens=max_new_tokens,
    )


def _pop_input_ids(inputs, kwargs):
    keyword_ids = kwargs.pop("input_ids", None)
    if inputs is not None and keyword_ids is not None:
        raise ValueError("input_ids: pass the prompt either as `inputs` or as `input_ids=`, not both.")
    return keyword_ids if keyword_ids is not None else inputs


def _resolve_config(model, generation_config, kwargs) -> tuple[GenerationConfig, bool]:
    """Returns the effective config (a copy) and whether the call set `max_length` explicitly."""
    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise TypeError(
            f"generation_config must be a tfgen.GenerationConfig, got {type(generation_config).__name__}."
        )
    base = generation_config or getattr(model, "generation_config", None)
    if base is None:
        base = GenerationConfig.from_model_config(model.config)
    config = base.copy()
    explicit_max_length = "max_length" in kwargs
    unused = sorted(set(kwargs) - set(vars(config)))
    if unused:
        raise ValueError(
            f"unknown generation option(s): {', '.join(unused)}. They are neither GenerationConfig "
            f"attributes nor generate() arguments ({', '.join(_MODEL_INPUT_KWARGS)}, seed, logits_processor, "
            "jit_compile)."
        )
    # `config` is a copy, so it can be changed first and validated once (not `update`, which validates too):
    # one warning for options without effect, pointing at the caller of generate().
    vars(config).update(kwargs)
    config.validate(stacklevel=5)
    return config, explicit_max_length


def _check_input_ids(input_ids, config: GenerationConfig, vocab_size: int) -> np.ndarray:
    if input_ids is None:
        input_ids = np.zeros([1, 0], np.int32)
    if isinstance(input_ids, (tf.Tensor, tf.Variable)):
        input_ids = input_ids.numpy()
    try:
        array = np.asarray(input_ids)
    except ValueError as error:  # ragged nested lists
        raise ValueError(f"input_ids: rows must all have the same length (left-pad them): {error}") from None
    if array.dtype == object:
        raise ValueError("input_ids: rows must all have the same length (left-pad them).")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"input_ids must hold integer token ids, got dtype {array.dtype}.")
    if array.ndim != 2:
        raise ValueError(f"input_ids must be 2-D [batch, prompt_len], got shape {array.shape}.")
    if array.shape[0] == 0:
        raise ValueError("input_ids: the batch is empty.")
    if array.shape[1] == 0:
        if config.bos_token_id is None:
            raise ValueError("input_ids: the prompt is empty and the model has no bos_token_id to start from.")
        array = np.full([array.shape[0], 1], config.bos_token_id)
    if array.min() < 0 or array.max() >= vocab_size:
        bad = array[(array < 0) | (array >= vocab_size)][0]
        raise ValueError(f"input_ids: token id {bad} is outside the vocabulary [0, {vocab_size}).")
    return array.astype(np.int32)


def _check_attention_mask(attention_mask, input_ids: np.ndarray, pad_token_id: int, eos_ids) -> np.ndarray:
    if attention_mask is None:
        # HF's rule: infer the mask from pad ids only when pad ids occur and pad is not also eos.
        if pad_token_id in input_ids and pad_token_id not in eos_ids:
            return (input_ids != pad_token_id).astype(np.int32)
        return np.ones_like(input_ids, np.int32)
    if isinstance(attention_mask, (tf.Tensor, tf.Variable)):
        attention_mask = attention_mask.numpy()
    mask = np.asarray(attention_mask)
    if mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask has shape {mask.shape}, but input_ids has shape {input_ids.shape}.")
    if not (np.issubdtype(mask.dtype, np.integer) or mask.dtype == bool):
        raise TypeError(f"attention_mask must hold integers 0/1, got dtype {mask.dtype}.")
    if not np.isin(mask, (0, 1)).all():
        raise ValueError("attention_mask must hold only 0 and 1.")
    if (mask.sum(axis=1) == 0).any():
        raise ValueError(f"attention_mask: row {int(np.argmin(mask.sum(axis=1)))} has no tokens.")
    if (mask[:, -1] == 0).any():
        warnings.warn(
            "attention_mask: some rows are right-padded; decoder-only generation continues from the last column, "
            "so pad on the left.",
            UserWarning,
            stacklevel=4,
        )
    return mask.astype(np.int32)


def _resolve_lengths(config: GenerationConfig, prompt_len: int, model_config, explicit_max_length: bool) -> int:
    """HF's length rules: returns max_new_tokens and sets `config.max_length`/`min_length` to totals."""
    if config.max_new_tokens is not None:
        config.max_length = prompt_len + config.max_new_tokens
    elif not explicit_max_length and config.max_length == GenerationConfig().max_length:
        # HF's default: 20 new tokens, capped by the model's positions.
        config.max_length = config.max_length + prompt_len
        max_positions = getattr(model_config, "max_position_embeddings", None)
        if max_positions is not None:
            config.max_length = min(config.max_length, max_positions)
    if config.max_length <= prompt_len:
        raise ValueError(
            f"max_length ({config.max_length}) must exceed the prompt length ({prompt_len}); "
            "set max_new_tokens instead."
        )
    if config.min_new_tokens is not None:
        config.min_length = config.min_new_tokens + prompt_len
    return config.max_length - prompt_len


def _check_seed(seed, batch_size: int, do_sample: bool) -> np.ndarray:
    """Returns int32 row keys `[batch_size, 2]` from `seed` (`None`, `[2]` or `[batch_size, 2]`)."""
    if seed is None:
        return random_seeds(batch_size)
    if not do_sample:
        warnings.warn("seed has no effect: do_sample is False (greedy search).", UserWarning, stacklevel=4)
    if isinstance(seed, (tf.Tensor, tf.Variable)):
        seed = seed.numpy()
    array = np.asarray(seed)
    if array.dtype == object or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise TypeError(f"seed must hold integers, got {seed!r}.")
    if array.shape not in ((2,), (batch_size, 2)):
        raise ValueError(f"seed must have shape [2] or [batch_size, 2] = [{batch_size}, 2], got {array.shape}.")
    if array.min() < -(2**31) or array.max() >= 2**32:
        raise ValueError("seed values must fit in 32 bits.")
    keys = (array.astype(np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
    if keys.ndim == 1:
        keys = derive_seeds(np.tile(keys[None], [batch_size, 1]), np.arange(batch_size)).numpy()
    return keys.astype(np.int32)


def _finish(request: _Request, result: dict):
    """Cuts the bucket padding off the program's outputs and packs them like HF does.

    Every per-row output holds `k` rows per prompt (k = 1, num_beams or num_return_sequences), grouped by
    prompt, so the caller's rows are the first `batch_size * k`.
    """
    end = request.start + request.prompt_len + request.max_new_tokens

    def real_rows(tensor, axis=0):
        rows_per_prompt = tensor.shape[axis] // request.padded_batch_size
        return tf.gather(tensor, tf.range(request.batch_size * rows_per_prompt), axis=axis)

    sequences = real_rows(tf.convert_to_tensor(result["sequences"]))[:, request.start : end]
    if not request.return_dict:
        return sequences
    steps = int(result["steps"])

    def per_step(name):
        if name not in result:
            return None
        buffer = real_rows(result[name], axis=1)
        return tuple(buffer[step] for step in range(steps))

    fields = dict(sequences=sequences, scores=per_step("scores"), logits=per_step("logits"))
    if "sequences_scores" not in result:
        return GenerateDecoderOnlyOutput(**fields)
    beam_indices = result.get("beam_indices")
    return GenerateBeamDecoderOnlyOutput(
        **fields,
        sequences_scores=real_rows(result["sequences_scores"]),
        beam_indices=None if beam_indices is None else real_rows(beam_indices)[:, :steps],
    )
