"""`TFGenerationMixin`: `generate()` compiled end to end with XLA, for any model that follows the protocol.

A call goes config → request (`tfgen.request.prepare`: checks, buckets, the static `DecodeSpec` and the run-time
`DecodeInputs`) → program (`tfgen.generation.programs`: one cached compiled program per spec) → outputs
(`tfgen.generation.outputs`). New knob values and new prompts of the same bucket never recompile. See `docs/design.md`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import tensorflow as tf

from tfgen.config.generation_config import GenerationConfig
from tfgen.decoding.strategies import strategy_for
from tfgen.decoding.transition_scores import compute_transition_scores
from tfgen.generation.outputs import package_outputs
from tfgen.generation.programs import ChunkedProgram, announce_compile, encode_ahead, generate_program, program_cache
from tfgen.generation.streaming import BaseStreamer, TokenCallbackStreamer
from tfgen.request.buckets import DEFAULT_BUCKETS, BucketPolicy
from tfgen.request.prepare import Request, prepare_request

#: Decode steps per compiled chunk when `max_time` is set without a streamer: the clock is read between chunks.
MAX_TIME_CHUNK_STEPS = 8


class TFGenerationMixin:
    """Adds `generate()` to a model that implements `tfgen.decoding.model_protocol.CausalLMProtocol`."""

    #: Shape buckets for compiled programs; set `tfgen.EXACT_SHAPES` on a model to compile per exact shape.
    generation_buckets: BucketPolicy = DEFAULT_BUCKETS

    @property
    def generate_trace_count(self) -> int:
        """How many generate programs were traced (each is one XLA compilation) for this model so far."""
        return program_cache(self).traces

    def generate(
        self,
        inputs=None,
        generation_config: GenerationConfig | None = None,
        logits_processor: Sequence[Callable] | None = None,
        seed=None,
        jit_compile: bool = True,
        streamer=None,
        stopping_criteria: Sequence[Callable] | None = None,
        tokenizer=None,
        **kwargs,
    ):
        """Generates continuations of `inputs` (int token ids `[batch, prompt_len]`).

        Args:
            inputs / input_ids: int ids `[batch, prompt_len]` (numpy, nested lists or a tensor), left padded.
                May be omitted (or have length 0) when the model has a `bos_token_id`: generation starts from it.
            attention_mask (keyword): `[batch, prompt_len]` of 0/1; inferred from `pad_token_id` like HF when absent.
                An encoder-decoder model (T5) takes `inputs` / `attention_mask` as its encoder input (padded on either
                side) and starts its decoder from `decoder_input_ids=` `[batch, W]` (keyword; default one
                `decoder_start_token_id` per row, prepended when no row starts with it) under
                `decoder_attention_mask=` (left padded; default all ones); the returned tokens are the decoder's.
                `encoder_outputs=` (keyword; HF's `BaseModelOutput`, or its `last_hidden_state` `[batch, S, d_model]`)
                replaces running the encoder; `inputs` may then be left out (the encoder-side processors need it).
            generation_config: a `GenerationConfig`; defaults to the model's. Keyword arguments override its
                attributes (`max_new_tokens=`, `do_sample=`, `top_p=` ...); an unknown keyword is an error.
            logits_processor: callables `(input_ids [B, L], scores [B, V], cur_len) -> scores` run inside the
                compiled loop after the built-in processors (HF-TF convention: `input_ids` is the padded buffer,
                `cur_len` the buffer index of the token being chosen).
            seed: `[2]` ints for the whole batch (row `i` uses a key derived from it and `i`) or `[batch, 2]`, one
                per row. A row's tokens depend on its own key only. Without a seed, sampling draws fresh entropy.
            jit_compile: True (default) runs one cached XLA program; False runs the same loop eagerly (debugging).
            streamer: a `tfgen.generation.streaming.BaseStreamer` (`TextStreamer`, `TextIteratorStreamer`, ...) or a
            callable
                `fn(token_ids [batch])` called once per generated step. The loop then runs in compiled chunks of
                `streamer.chunk_steps` steps, keeping the cache on the device, and hands each chunk's tokens over;
                the tokens are the same as without a streamer. Greedy search, sampling and contrastive search
                (beam strategies keep several hypotheses per prompt and cannot stream, as in HF).
            stopping_criteria: `tfgen.StoppingCriteria` instances or callables `(input_ids, scores) -> bool [rows]`
                traced into the loop (see `tfgen.stopping.criteria`); tfgen's `MaxTimeCriteria` / `StopStringCriteria` /
                `EosTokenCriteria` stand for the options `max_time` / `stop_strings` / `eos_token_id`.
            tokenizer: the model's `tfgen.Tokenizer`, needed for `stop_strings` (a row stops once its text ends
                with one of them, HF's rules). `max_time` (seconds for the whole call, compiling included) is
                checked between compiled chunks; rows still running then end after one more step.

        Returns:
            int32 tensor `[batch * num_return_sequences, prompt_len + max_new_tokens]`, padded with
            `pad_token_id` after a row finished; or with `return_dict_in_generate=True` a
            `GenerateDecoderOnlyOutput` with `sequences` and, when asked, `scores` / `logits` (one
            `[batch * num_return_sequences, vocab]` tensor per generated step); for an encoder-decoder model HF's
            `GenerateEncoderDecoderOutput` / `GenerateBeamEncoderDecoderOutput` names, with `encoder_hidden_states`
            (`num_layers + 1` `[batch, S, d_model]`) under `output_hidden_states=True` (the decoder's are not
            returned: warned).
        """
        began = time.monotonic()
        request = prepare_request(
            self, inputs, generation_config=generation_config, logits_processor=logits_processor, seed=seed,
            tokenizer=tokenizer, stopping_criteria=stopping_criteria, stacklevel=3, **kwargs,
        )
        if request.encode_ahead:
            request = encode_ahead(self, request, jit_compile)
        if streamer is not None or request.max_time is not None:
            streamer = None if streamer is None else _as_streamer(streamer, request)
            return self._generate_in_chunks(request, streamer, jit_compile, deadline=began + (request.max_time or 0))
        program, is_new = generate_program(self, request, jit_compile)
        with announce_compile(request, is_new and jit_compile):
            result = program(request.inputs)
        return package_outputs(request, result)

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

    def _generate_in_chunks(self, request: Request, streamer: BaseStreamer | None, jit_compile: bool,
                            deadline: float):
        """Runs the loop in compiled chunks: hands each chunk's new tokens to `streamer` (when given) and, with
        `max_time`, once the monotonic clock passes `deadline` gives every running row one last step."""
        if streamer is not None and not strategy_for(request.spec.mode).streamable:
            raise ValueError(
                f"streamer: {request.spec.mode.value} does not produce one token per row per step, so it cannot "
                "stream (as in HF); use greedy search, sampling or contrastive search."
            )
        chunk_steps = streamer.chunk_steps if streamer is not None else MAX_TIME_CHUNK_STEPS
        program = ChunkedProgram(self, request, chunk_steps, jit_compile)
        inputs = request.inputs
        rows, prompt_width = request.batch_size, int(inputs.input_ids.shape[1])
        out_of_time = False
        try:
            with announce_compile(request, program.is_new and jit_compile):
                state, finished = program.run(inputs, program.initial_state(), tf.constant(True))
            if streamer is not None:
                # The prompt goes out after the first (compiling) chunk, so the compile notice does not split it.
                streamer.put(inputs.input_ids.numpy()[:rows, request.start :])
            emitted = 0
            while True:
                steps, sequences = program.tokens(state)
                if streamer is not None:
                    for column in sequences[:rows, prompt_width + emitted : prompt_width + steps].numpy().T:
                        streamer.put(column[:, None])
                emitted = steps
                if bool(finished):
                    break
                if request.max_time is not None and not out_of_time and time.monotonic() > deadline:
                    # HF's MaxTimeCriteria stops every row after the step it fires on: a budget of one more step
                    # ends each loop its own way (beam search then closes its hypotheses).
                    out_of_time = True
                    inputs = inputs._replace(max_new_tokens=tf.minimum(inputs.max_new_tokens, steps + 1))
                state, finished = program.run(inputs, state, tf.constant(False))
        finally:
            # Always close the stream, so a consumer iterating in another thread is released on errors too.
            if streamer is not None:
                streamer.end()
        return package_outputs(request, program.result(inputs, state))


def _as_streamer(streamer, request: Request) -> BaseStreamer:
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
    raise TypeError(f"streamer must be a tfgen.generation.streaming.BaseStreamer or a callable, got "
                    f"{type(streamer).__name__}")
