"""The contract between a language model and `TFGenerationMixin`.

A model that mixes in `TFGenerationMixin` provides the methods below, in TF ops only (so they trace into
one XLA program). The mixin never looks at class names: anything that satisfies this protocol generates,
whether it is a Keras 3 model (TF backend), a tf-keras model or a plain `tf.Module`.

Cache layout: the cache is any nest (tuple/list/dict) of fixed-shape tensors whose **leading axis is the
batch**. The mixin relies on that to expand the cache for beams and to reorder it with `tf.gather`
along axis 0; it never looks inside otherwise.

Optional parts, each read through `capabilities(model)` (one `ModelCapabilities`; nothing else probes a model):

- head apart (`logits_from_hidden`): a `logits_from_hidden(hidden_states) -> logits` method (the LM head alone)
  together with a `compute_logits=False` keyword of `call_with_cache` (then `logits` is None). Contrastive search runs
  `top_k` candidates per prompt but needs the logits of the chosen one only; with these it skips the LM head for the
  others (on GPT-2 small the head is a quarter of a step's weights and FLOPs), and the slot programs' prefill runs
  the head on each row's last real token only.
- `decoding_view(rows) -> model`, called inside the program before each decode loop with the number of rows its
  steps run (None when unknown): the model may return a stand-in that prepared something once per run (GPT-2
  transposes its LM head for multi-row steps, where XLA's CPU dot reads the `[vocab, D]` layout at about half speed).
- `row_cache_index = True` (a class attribute) declares that `call_with_cache` takes `cache_index` as int32 `[batch]`
  too, one first slot per row; assisted generation (speculative decoding) and continuous batching need it.
- early exit (`early_exit_layers`): a `layers=L` keyword of `call_with_cache` that runs only the first `L` decoder
  layers, the final norm and the head, passing the other layers' caches through (`assistant_early_exit`,
  speculative decoding's self-drafting).
- encoder-decoder (`encoder_decoder`): `is_encoder_decoder = True` and an `encode(input_ids, attention_mask)` method
  (see docs/design.md, "The model protocol").

Buffer coordinates: the cache has `max_length` slots. Slot `i` holds the keys/values of the token at
buffer index `i`. A call writes the `T` tokens it is given into slots `[cache_index, cache_index + T)` (per row when
`cache_index` is a vector).
A query at buffer index `q` attends to slot `k` iff `k <= q` and `attention_mask[:, k] == 1`.
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple, Protocol, runtime_checkable

import tensorflow as tf


class CacheStepOutput(NamedTuple):
    """What `call_with_cache` returns.

    logits: float `[batch, T, vocab]`, or `[batch, 1, vocab]` (last position only) when the call asked
        for `last_logits_only=True`.
    hidden_states: float `[batch, T, hidden]`, the last layer's output after the final norm (what
        contrastive search compares).
    cache: the updated cache nest, same structure, shapes and dtypes as the one passed in.
    """

    logits: tf.Tensor
    hidden_states: tf.Tensor
    cache: Any


@runtime_checkable
class CausalLMProtocol(Protocol):
    """What a causal LM provides so that `generate` can run it inside one compiled loop.

    Attributes:
        config: an object with `vocab_size`, `max_position_embeddings`, `bos_token_id`, `eos_token_id`
            (int, list of ints or None) and `pad_token_id` (int or None).
        generation_config: the model's default `tfgen.GenerationConfig`.
    """

    config: Any

    def init_cache(self, batch_size: int, max_length: int, dtype: tf.DType | None = None) -> Any:
        """Returns a zero-filled cache nest for `batch_size` rows and `max_length` slots; every leaf has
        the batch as its leading axis."""
        ...

    def call_with_cache(
        self,
        input_ids: tf.Tensor,
        cache: Any,
        cache_index: tf.Tensor,
        attention_mask: tf.Tensor,
        position_ids: tf.Tensor,
        last_logits_only: bool = False,
    ) -> CacheStepOutput:
        """Runs `input_ids` int32 `[batch, T]` at buffer indices `[cache_index, cache_index + T)`.

        attention_mask: int32 `[batch, max_length]` over the whole cache buffer (1 = a real token whose
            slot may be attended to). position_ids: int32 `[batch, T]` position of each new token.
        cache_index: int32 scalar tensor, or int32 `[batch]` (each row's own first slot; speculative decoding moves
            rows unevenly). Returns `CacheStepOutput`.
        """
        ...


class ModelCapabilities(NamedTuple):
    """The optional parts of the protocol a model offers (see the module docstring), as `capabilities` reads them.

    logits_from_hidden: the LM head apart: a `logits_from_hidden` method and a `compute_logits` keyword of
        `call_with_cache`.
    row_cache_index: `call_with_cache` takes a per-row `cache_index` int32 `[batch]` (`row_cache_index = True`).
    early_exit_layers: `call_with_cache` takes `layers=L` (the first L layers only).
    encoder_decoder: `is_encoder_decoder = True` and an `encode` method.
    decoding_view: a `decoding_view(rows)` method.
    """

    logits_from_hidden: bool
    row_cache_index: bool
    early_exit_layers: bool
    encoder_decoder: bool
    decoding_view: bool


def capabilities(model) -> ModelCapabilities:
    """What optional parts of the protocol `model` offers: the one place they are probed.

    Read from the instance each time, not cached per class: stand-ins (a decoding view, the export's
    `WithoutStaticTokenCount`, a test's wrapper) forward attributes of whatever model they hold, and tests switch a
    declaration on a class. Probing is a few attribute reads and one `inspect.signature`, done once per loop, export
    or check (never per decode step)."""
    keywords = _call_keywords(model)
    return ModelCapabilities(
        logits_from_hidden=callable(getattr(model, "logits_from_hidden", None)) and _takes(keywords, "compute_logits"),
        row_cache_index=bool(getattr(model, "row_cache_index", False)),
        early_exit_layers=_takes(keywords, "layers"),
        encoder_decoder=(getattr(model, "is_encoder_decoder", False) is True
                         and callable(getattr(model, "encode", None))),
        decoding_view=callable(getattr(model, "decoding_view", None)),
    )


def _call_keywords(model) -> dict:
    """{name: inspect.Parameter} of `model.call_with_cache` ({} when it has none)."""
    call = getattr(model, "call_with_cache", None)
    if not callable(call):
        return {}
    try:
        return dict(inspect.signature(call).parameters)
    except (TypeError, ValueError):  # a callable without a signature Python can read (a C extension's)
        return {}


def _takes(parameters: dict, name: str) -> bool:
    """Whether a call with these parameters takes keyword `name`: by name, or through `**kwargs` — a stand-in that
    forwards its calls (a decoding view, the export's `WithoutStaticTokenCount`) takes what the model behind it
    takes. (A `**kwargs` model that ignored the keyword would still decode right: the head would run anyway, or every
    layer would draft.)"""
    return name in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
