"""Output structures of `generate`, with HF's field names (attribute and item access both work)."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import tensorflow as tf


class _Output:
    """Dataclass mixin: `out["sequences"]` and `out.keys()` like HF's ModelOutput; unset (None) fields hidden."""

    def keys(self):
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None]

    def __getitem__(self, key):
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key):
        return key in self.keys()


@dataclasses.dataclass
class GenerateDecoderOnlyOutput(_Output):
    """Result of greedy search / sampling with `return_dict_in_generate=True`.

    sequences: int32 `[batch * num_return_sequences, prompt_len + max_new_tokens]`.
    scores: processed scores, one float32 `[batch * num_return_sequences, vocab]` per generated step.
    logits: raw logits, same layout as `scores`.
    structured_complete: bool `[rows]` with `regex` / `json_schema` (tfgen's own field): whether each row's text is
        a whole match (False: it ran out of budget, or a stopping criterion ended it, partway through).
    """

    sequences: tf.Tensor
    scores: tuple | None = None
    logits: tuple | None = None
    structured_complete: tf.Tensor | None = None


@dataclasses.dataclass
class GenerateBeamDecoderOnlyOutput(_Output):
    """Result of beam search / beam sampling / group beam search with `return_dict_in_generate=True`.

    sequences: int32 `[batch * num_return_sequences, prompt_len + max_new_tokens]`.
    sequences_scores: float32 `[batch * num_return_sequences]`, the length-penalised log-probability.
    scores / logits: one float32 `[batch * num_beams, vocab]` per step.
    beam_indices: int32 `[batch * num_return_sequences, generated_steps]`, the beam each token came from.
    structured_complete: as `GenerateDecoderOnlyOutput`'s.
    """

    sequences: tf.Tensor
    sequences_scores: tf.Tensor | None = None
    scores: tuple | None = None
    logits: tuple | None = None
    beam_indices: tf.Tensor | None = None
    structured_complete: tf.Tensor | None = None


@dataclasses.dataclass
class GenerateEncoderDecoderOutput(GenerateDecoderOnlyOutput):
    """`GenerateDecoderOnlyOutput` of an encoder-decoder model (HF's name): `sequences` are the decoder's tokens,
    from its start token on. encoder_hidden_states: with `output_hidden_states`, HF's tuple of `num_layers + 1`
    float32 `[batch, S, d_model]` (one row per prompt: the embeddings, each block's input, the final output)."""

    encoder_hidden_states: tuple | None = None


@dataclasses.dataclass
class GenerateBeamEncoderDecoderOutput(GenerateBeamDecoderOnlyOutput):
    """`GenerateBeamDecoderOnlyOutput` of an encoder-decoder model (HF's name), with `encoder_hidden_states` as
    `GenerateEncoderDecoderOutput`'s."""

    encoder_hidden_states: tuple | None = None


def package_outputs(request, result: dict):
    """Cuts the bucket padding off a program's outputs (`DecodingLoop.result`'s dict) and packs them like HF:
    the `sequences` tensor `[rows, prompt_len + max_new_tokens]`, or an output object when the request asked
    for `return_dict_in_generate`. `request` is the `tfgen.request.prepare.Request` that ran.

    Every per-row output holds `k` rows per prompt (k = 1, num_beams or num_return_sequences), grouped by
    prompt, so the caller's rows are the first `batch_size * k`.
    """
    end = request.start + request.prompt_len + request.max_new_tokens

    def real_rows(tensor, axis=0):
        rows_per_prompt = tensor.shape[axis] // request.spec.batch_size
        return tf.gather(tensor, tf.range(request.batch_size * rows_per_prompt), axis=axis)

    sequences = real_rows(tf.convert_to_tensor(result["sequences"]))[:, request.start : end]
    complete = None
    if request.automaton is not None:
        complete = structured_completeness(request, sequences.numpy(), real_rows(result["generated_lengths"]).numpy())
    if not request.return_dict:
        return sequences
    steps = int(result["steps"])

    def per_step(name):
        if name not in result:
            return None
        buffer = real_rows(result[name], axis=1)
        return tuple(buffer[step] for step in range(steps))

    fields = dict(sequences=sequences, scores=per_step("scores"), logits=per_step("logits"),
                  structured_complete=None if complete is None else tf.constant(complete))
    if request.inputs.encoder:
        fields["encoder_hidden_states"] = request.encoder_hidden_states
    if "sequences_scores" not in result:
        return (GenerateEncoderDecoderOutput if request.inputs.encoder else GenerateDecoderOnlyOutput)(**fields)
    beam_indices = result.get("beam_indices")
    return (GenerateBeamEncoderDecoderOutput if request.inputs.encoder else GenerateBeamDecoderOnlyOutput)(
        **fields,
        sequences_scores=real_rows(result["sequences_scores"]),
        beam_indices=None if beam_indices is None else real_rows(beam_indices)[:, :steps],
    )


def structured_completeness(request, sequences: np.ndarray, generated_lengths: np.ndarray) -> np.ndarray:
    """bool `[rows]`: whether each row's new tokens (`generated_lengths`, a final eos left out) are a whole match of
    the request's automaton. Warns once, naming the rows, when some are not (HF-like truncation: a budget or a
    stopping criterion ended them partway; their text is then the start of a match)."""
    eos_ids = set(int(token) for token in request.inputs.knobs["eos_token_ids"].numpy() if token >= 0)
    complete = []
    for row, length in zip(sequences[:, request.prompt_len:], generated_lengths):
        tokens = list(row[:length])
        if tokens and tokens[-1] in eos_ids:
            tokens.pop()
        complete.append(request.automaton.matches(tokens))
    complete = np.array(complete, bool)
    if not complete.all():
        rows = np.flatnonzero(~complete).tolist()
        warnings.warn(
            f"regex / json_schema: row(s) {rows} ended before their text was a whole match (out of max_new_tokens, or "
            "a stopping criterion): their text is the start of a match. Raise max_new_tokens; with "
            "return_dict_in_generate the output's `structured_complete` says which rows are whole.",
            UserWarning, stacklevel=4,
        )
    return complete
