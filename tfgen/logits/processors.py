"""XLA-safe logits processors, numerically matching HF transformers 4.55.4's PyTorch ones, and the pipeline
that runs them with the user's processors and the sampling warpers (`tfgen.logits.warpers`).

Which processors run (and in what order) follows HF's `GenerationMixin._get_logits_processor`. That choice,
plus a few sizes, is static (`ProcessorSpec`, part of the compiled program's cache key); every value that can
be a tensor is one (`knobs`, per row), so new values never recompile; `tfgen.logits.from_config` reads both from
a `GenerationConfig`. Inside the graph there are no slices of run-time length, no Python branches on tensor
values and no host round trips: the token buffer is read through masks over its full width, with
`ProcessorContext` saying which columns HF's `input_ids` would hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import numpy as np
import tensorflow as tf

from tfgen.request.input_checks import check_callables
from tfgen.logits import grammar
from tfgen.logits.warpers import apply_warpers, drop_tokens, id_mask, per_row_knob, read_knob

_NEG_INF = float("-inf")


class ProcessorContext(NamedTuple):
    """Where HF's `input_ids` lives in the decode loop's token buffer at the current step.

    sequences: int32 [B, L]. HF's `input_ids` == `sequences[:, start:start + cur_len]`; columns before `start`
        are extra left padding HF never sees, columns from `start + cur_len` on are unwritten (arbitrary ids).
    start: int32 scalar.
    cur_len: int32 scalar, HF's `input_ids.shape[-1]` (the padded prompt plus the tokens generated so far); or
        int32 [B], one per row, where rows stand at different lengths (speculative decoding verifies several
        positions of each row at once). User processors take a scalar only.
    prompt_len: int32 scalar, HF's `input_ids_seq_length` (the caller's padded prompt length).
    max_length: int32 [B], per-row HF `max_length` (prompt_len + that row's max_new_tokens).
    encoder_ids: int32 [B, S], HF's `encoder_input_ids`: an encoder-decoder model's encoder input, a decoder-only
        model's prompt (the caller's columns, their padding included; bucket columns hold -1, which matches no token).
    grammar_state: int32 [B], each row's structured-output automaton state, or `()` (no automaton).
    """

    sequences: tf.Tensor
    start: tf.Tensor
    cur_len: tf.Tensor
    prompt_len: tf.Tensor
    max_length: tf.Tensor
    encoder_ids: tf.Tensor
    grammar_state: object = ()


@dataclass(frozen=True)
class ProcessorSpec:
    """Static part of the processor pipeline: which processors are active, plus the sizes that shape the graph.

    Boolean fields switch a processor on; its values come from the knobs (see
    `tfgen.logits.from_config.processor_knobs_from_config`). `sequence_bias` and `bad_words_ids` hold token-id
    sequences (the biases of `sequence_bias` are a knob; bad words always get -inf). `top_k_cap` is the static
    number of top-k candidates (0 = the whole vocabulary): a row asking for more keeps only `top_k_cap` tokens
    (plus ties with the last).
    """

    sequence_bias: tuple[tuple[int, ...], ...] = ()
    repetition_penalty: bool = False
    no_repeat_ngram_size: int = 0
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    min_length: bool = False
    min_new_tokens: bool = False
    forced_bos_token_id: bool = False
    forced_eos_token_id: bool = False
    remove_invalid_values: bool = False
    exponential_decay_length_penalty: bool = False
    suppress_tokens: bool = False
    begin_suppress_tokens: bool = False
    temperature: bool = False
    top_k: bool = False
    top_k_cap: int = 0
    top_p: bool = False
    min_p: bool = False
    typical_p: bool = False
    epsilon_cutoff: bool = False
    eta_cutoff: bool = False
    min_tokens_to_keep: int = 1
    renormalize_logits: bool = False
    #: Structured output: mask to the tokens a regex / JSON-schema automaton allows (its tables are knobs).
    grammar: bool = False
    #: Encoder-decoder models: HF's EncoderRepetitionPenalty (its value is a knob) and EncoderNoRepeatNGram.
    encoder_repetition_penalty: bool = False
    encoder_no_repeat_ngram_size: int = 0


class LogitsProcessor:
    """Base class for user processors run inside the compiled loop, after the built-in ones, before the warpers.

    `__call__(input_ids, scores, cur_len)` gets the whole token buffer `input_ids` int32 [B, L], `scores`
    float32 [B, V] and `cur_len`, an int32 scalar tensor: the buffer index of the token being chosen (columns
    from `cur_len` on are unwritten). It returns float32 [B, V] and must use TF ops only (it is traced).
    """

    def __call__(self, input_ids: tf.Tensor, scores: tf.Tensor, cur_len: tf.Tensor) -> tf.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(input_ids, scores, cur_len)")


# ----------------------------------------------------------------------------------------------------------
# In-graph processors


def _only(mask: tf.Tensor) -> tf.Tensor:
    """Scores forcing the tokens of `mask`: 0 there, -inf elsewhere."""
    return tf.where(mask, 0.0, _NEG_INF)


def _token_counts(token_ids: tf.Tensor, counted: tf.Tensor, vocab_size: int) -> tf.Tensor:
    """int32 [B, V]: per row, how many of `token_ids` int32 [B, N] with `counted` bool [B, N] hold each id."""
    batch_size, width = tf.shape(token_ids)[0], tf.shape(token_ids)[1]
    rows = tf.broadcast_to(tf.range(batch_size)[:, None], [batch_size, width])
    # Uncounted entries (unwritten buffer columns may hold anything) are redirected to id 0 with weight 0.
    columns = tf.where(counted, token_ids, 0)
    return tf.scatter_nd(tf.stack([rows, columns], axis=-1), tf.cast(counted, tf.int32), [batch_size, vocab_size])


def _current_length(ctx: ProcessorContext) -> tf.Tensor:
    """`ctx.cur_len` as a scalar, or as a column [B, 1] when it is per row: either broadcasts against [B, V]."""
    cur_len = tf.convert_to_tensor(ctx.cur_len)
    return tf.reshape(cur_len, [-1, 1]) if cur_len.shape.rank == 1 else cur_len


def _visible(ctx: ProcessorContext) -> tf.Tensor:
    """bool [L] (or [B, L] with a per-row `cur_len`): the buffer columns HF's `input_ids` holds."""
    positions = tf.range(tf.shape(ctx.sequences)[1])
    return (positions >= ctx.start) & (positions < ctx.start + _current_length(ctx))


def _buffer_columns(ctx: ProcessorContext, positions: tf.Tensor) -> tf.Tensor:
    """sequences[:, positions] (positions [N], or [B, N] per row), with positions before the buffer clamped to column
    0 (callers mask those)."""
    return tf.gather(ctx.sequences, tf.maximum(positions, 0), axis=1, batch_dims=positions.shape.rank - 1)


def _sequence_bias(ctx, sequences: tuple[tuple[int, ...], ...], biases: tf.Tensor, vocab_size: int) -> tf.Tensor:
    """HF's SequenceBiasLogitsProcessor bias, float32 [B, V]: sequence s adds `biases[:, s]` to its last token in
    the rows whose visible tail equals its other tokens (length-1 sequences always; sequences longer than
    cur_len never)."""
    prefix_width = max(len(sequence) for sequence in sequences) - 1
    # Prefixes right-aligned in a [S, prefix_width] pattern; -1 marks "no token here, anything matches".
    pattern = np.full([len(sequences), prefix_width], -1, np.int32)
    for index, sequence in enumerate(sequences):
        pattern[index, prefix_width - len(sequence) + 1 :] = sequence[:-1]
    cur_len = _current_length(ctx)
    end = ctx.start + cur_len
    tail = _buffer_columns(ctx, end - prefix_width + tf.range(prefix_width))  # [B, prefix_width]
    matches = tf.reduce_all((tail[:, None, :] == pattern[None]) | (pattern < 0)[None], axis=-1)
    fits = tf.constant([[len(sequence) for sequence in sequences]], tf.int32) <= cur_len
    applied = tf.where(matches & fits, biases, 0.0)  # [B, S]
    batch_size = tf.shape(applied)[0]
    rows = tf.broadcast_to(tf.range(batch_size)[:, None], tf.shape(applied))
    last_tokens = tf.broadcast_to(np.array([s[-1] for s in sequences], np.int32)[None, :], tf.shape(applied))
    # scatter_nd sums duplicates, as HF's `bias[:, last_token] +=` does for sequences sharing a last token.
    return tf.scatter_nd(tf.stack([rows, last_tokens], axis=-1), applied, [batch_size, vocab_size])


def _repeated_ngram_bans(ctx: ProcessorContext, ngram_size: int, vocab_size: int) -> tf.Tensor:
    """bool [B, V]: HF's NoRepeatNGram bans — the last token of every visible n-gram whose first n-1 tokens
    equal the last n-1 visible tokens."""
    window_starts = tf.range(tf.maximum(tf.shape(ctx.sequences)[1] - ngram_size + 1, 0))
    windows = tf.gather(ctx.sequences, window_starts[:, None] + tf.range(ngram_size)[None, :], axis=1)  # [B, W, n]
    end = ctx.start + _current_length(ctx)
    inside = (window_starts >= ctx.start) & (window_starts + ngram_size <= end)  # [W] or [B, W]
    last_tokens = _buffer_columns(ctx, end - (ngram_size - 1) + tf.range(ngram_size - 1))  # [B, n-1]
    repeats = tf.reduce_all(windows[:, :, :-1] == last_tokens[:, None, :], axis=-1) & inside
    return _token_counts(windows[:, :, -1], repeats, vocab_size) > 0


def _encoder_ngram_bans(ctx: ProcessorContext, ngram_size: int, vocab_size: int) -> tf.Tensor:
    """bool [B, V]: HF's EncoderNoRepeatNGram bans — the last token of every n-gram of the row's encoder input whose
    first n-1 tokens equal the last n-1 visible decoder tokens (none while fewer than n-1 are visible)."""
    encoder_ids = ctx.encoder_ids
    window_starts = tf.range(tf.maximum(tf.shape(encoder_ids)[1] - ngram_size + 1, 0))
    windows = tf.gather(encoder_ids, window_starts[:, None] + tf.range(ngram_size)[None, :], axis=1)  # [B, W, n]
    cur_len = _current_length(ctx)
    end = ctx.start + cur_len
    last_tokens = _buffer_columns(ctx, end - (ngram_size - 1) + tf.range(ngram_size - 1))  # [B, n-1]
    # Bucket columns hold -1, so a window reaching into them never matches decoder tokens.
    repeats = tf.reduce_all(windows[:, :, :-1] == last_tokens[:, None, :], axis=-1) & (cur_len >= ngram_size - 1)
    return _token_counts(windows[:, :, -1], repeats & (windows[:, :, -1] >= 0), vocab_size) > 0


def check_user_processors(user_processors) -> tuple:
    """`user_processors` as a tuple; TypeError unless each entry is a callable instance."""
    return check_callables(
        user_processors, "logits_processor",
        "LogitsProcessor instances or callables (input_ids, scores, cur_len) -> scores",
    )


def _user_processed(index: int, processor, sequences: tf.Tensor, scores: tf.Tensor, cur_len) -> tf.Tensor:
    """`processor(sequences, scores, cur_len)` as float32 scores of `scores`' shape; an exception while tracing it,
    or a result of another shape or a non-float dtype, is an error naming `logits_processor[index]` (a wrong
    shape would otherwise broadcast into garbage)."""
    where = f"logits_processor[{index}] ({getattr(processor, '__name__', type(processor).__name__)})"
    try:
        result = processor(sequences, scores, cur_len)
    except Exception as error:  # noqa: BLE001 (any failure of user code is reported as that code's)
        raise TypeError(f"{where} raised {type(error).__name__} while generate traced it: {error}") from error
    try:
        result = tf.convert_to_tensor(result)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{where} must return scores as a float tensor, got {type(result).__name__}") from error
    if not result.dtype.is_floating:
        raise TypeError(f"{where} must return float scores, got dtype {result.dtype.name}")
    if result.shape.rank != 2 or not result.shape.is_compatible_with(scores.shape):
        raise ValueError(f"{where} must return scores of shape {scores.shape} [batch, vocab] like its input, "
                         f"got {result.shape}")
    return tf.cast(result, tf.float32)


class SamplingCandidates(NamedTuple):
    """The tokens a draw from processed scores can pick, when top-k filtering narrows them down.

    ids: int32 [B, top_k_cap], per row the ids of its `top_k_cap` best scores, in ascending id order (so a
        cumulative sum over them runs in vocabulary order).
    complete: bool scalar, whether `ids` hold every finite score of every row (false when some row keeps more,
        e.g. no top-k for that row or ties at the cut). Only then may a sampler ignore the other columns.
    """

    ids: tf.Tensor
    complete: tf.Tensor


def apply_processors(
    spec: ProcessorSpec,
    scores: tf.Tensor,
    ctx: ProcessorContext,
    knobs,
    user_processors: Sequence[Callable] = (),
    *,
    return_candidates: bool = False,
):
    """Runs the pipeline `spec` describes on next-token `scores` float32 [B, V] (V static), in HF's order:
    built-in processors, then `user_processors` (called as `(ctx.sequences, scores, ctx.start + ctx.cur_len)`),
    then the warpers, then `renormalize_logits`. `knobs` maps knob names (see `tfgen.logits.from_config`) to
    tensors or arrays; only the enabled processors' knobs are read. Returns float32 [B, V]; with
    `return_candidates`, `(scores, SamplingCandidates or None)` — None unless top-k ran over part of the
    vocabulary — so that sampling can draw from `top_k_cap` columns instead of all V."""
    user_processors = check_user_processors(user_processors)
    scores = tf.convert_to_tensor(scores, tf.float32)
    vocab_size = scores.shape[-1]
    if vocab_size is None:
        raise ValueError("scores must have a static vocabulary dimension")
    cur_len = _current_length(ctx)
    eos_mask = lambda: id_mask(read_knob(knobs, "eos_token_ids", tf.int32), vocab_size)[None, :]  # noqa: E731

    if spec.sequence_bias:
        biases = read_knob(knobs, "sequence_bias", tf.float32)
        scores = scores + _sequence_bias(ctx, spec.sequence_bias, biases, vocab_size)
    if spec.encoder_repetition_penalty:
        # HF divides by the inverse penalty: a token of the encoder input becomes more likely (penalty > 1).
        inverse = tf.cast(1.0 / per_row_knob(knobs, "encoder_repetition_penalty", tf.float64), tf.float32)
        present = _token_counts(ctx.encoder_ids, ctx.encoder_ids >= 0, vocab_size) > 0
        scores = tf.where(present, tf.where(scores < 0, scores * inverse, scores / inverse), scores)
    if spec.repetition_penalty:
        penalty = per_row_knob(knobs, "repetition_penalty")

        def penalised(scores):
            seen = _token_counts(ctx.sequences, tf.broadcast_to(_visible(ctx), tf.shape(ctx.sequences)), vocab_size)
            return tf.where(seen > 0, tf.where(scores < 0, scores * penalty, scores / penalty), scores)

        # In every program (a server switches it per request): skip the [B, V] count when no row asks for it.
        scores = tf.cond(tf.reduce_any(penalty != 1.0), lambda: penalised(scores), lambda: scores)
    if spec.no_repeat_ngram_size:
        scores = drop_tokens(scores, _repeated_ngram_bans(ctx, spec.no_repeat_ngram_size, vocab_size))
    if spec.encoder_no_repeat_ngram_size:
        scores = drop_tokens(scores, _encoder_ngram_bans(ctx, spec.encoder_no_repeat_ngram_size, vocab_size))
    if spec.bad_words_ids:
        always_banned = tf.fill([tf.shape(scores)[0], len(spec.bad_words_ids)], _NEG_INF)
        scores = scores + _sequence_bias(ctx, spec.bad_words_ids, always_banned, vocab_size)
    if spec.min_length:
        scores = drop_tokens(scores, (cur_len < per_row_knob(knobs, "min_length", tf.int32)) & eos_mask())
    if spec.min_new_tokens:
        too_short = cur_len - ctx.prompt_len < per_row_knob(knobs, "min_new_tokens", tf.int32)
        scores = drop_tokens(scores, too_short & eos_mask())
    if spec.forced_bos_token_id:
        bos = tf.range(vocab_size) == read_knob(knobs, "forced_bos_token_id", tf.int32)
        scores = tf.where(tf.equal(cur_len, 1), _only(bos)[None, :], scores)
    if spec.forced_eos_token_id:
        last_step = tf.reshape(ctx.max_length, [-1, 1]) - 1 == cur_len
        forced = id_mask(read_knob(knobs, "forced_eos_token_ids", tf.int32), vocab_size)
        scores = tf.where(last_step, _only(forced)[None, :], scores)
    if spec.remove_invalid_values:
        finfo = np.finfo(np.float32)
        scores = tf.where(tf.math.is_nan(scores), 0.0, scores)
        scores = tf.clip_by_value(scores, finfo.min, finfo.max)
    if spec.exponential_decay_length_penalty:
        factor = per_row_knob(knobs, "exponential_decay_factor")
        steps_past = cur_len - ctx.prompt_len - per_row_knob(knobs, "exponential_decay_start", tf.int32)
        boost = tf.abs(scores) * (tf.pow(factor, tf.cast(steps_past, tf.float32)) - 1.0)
        # factor == 1 rows stay untouched (HF would turn an eos score of -inf into nan via inf * 0).
        scores = tf.where((steps_past > 0) & (factor != 1.0) & eos_mask(), scores + boost, scores)
    if spec.suppress_tokens:
        scores = drop_tokens(scores, read_knob(knobs, "suppress_tokens", tf.bool)[None, :])
    if spec.begin_suppress_tokens:
        begin_index = ctx.prompt_len
        if spec.forced_bos_token_id:  # HF: the forced BOS token comes first when the prompt is a lone start token
            begin_index += tf.cast(ctx.prompt_len <= 1, tf.int32)
        suppressed = read_knob(knobs, "begin_suppress_tokens", tf.bool)[None, :]
        scores = drop_tokens(scores, tf.equal(cur_len, begin_index) & suppressed)

    for index, processor in enumerate(user_processors):
        scores = _user_processed(index, processor, ctx.sequences, scores, ctx.start + ctx.cur_len)
    if spec.grammar:
        # After every other processor, so the output keeps to the automaton whatever they do (a token they forbid
        # stays forbidden), and before the warpers, so sampling draws among allowed tokens only.
        scores = grammar.mask_scores(knobs, ctx.grammar_state, scores, read_knob(knobs, "eos_token_ids", tf.int32))

    scores, candidates = apply_warpers(spec, scores, knobs)
    if spec.renormalize_logits:
        scores = tf.nn.log_softmax(scores)
    if not return_candidates:
        return scores
    if candidates is None:
        return scores, None
    # Every finite score ranks among the top `cap` exactly when a row has at most `cap` of them.
    finite_counts = tf.reduce_sum(tf.cast(scores > _NEG_INF, tf.int32), axis=-1)
    # Without any top-k row the warpers skip the ranking, and the ids are placeholders.
    some_top_k = tf.reduce_any(read_knob(knobs, "top_k", tf.int32) > 0)
    complete = tf.reduce_all(finite_counts <= candidates.shape[-1]) & some_top_k
    return scores, SamplingCandidates(tf.sort(candidates, axis=-1), complete)
