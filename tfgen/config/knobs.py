"""The run-time knob schema: every value a compiled generate program takes as a tensor, declared once.

A knob is a value that must never recompile the program when it changes (temperature, top-k, penalties, eos
ids, budgets, seeds ...). Each is declared here with its dtype, whether it is per row or shared by the batch,
its neutral value (the one that leaves scores untouched) and its valid range. The readers:
- `GenerationConfig.validate` checks the config attribute of the same name against `valid`;
- the processors declared in `tfgen.logits` fill their knobs (`fill`), and the decoding loops read them;
- the beam and contrastive loops repeat the per-row knobs for their extra rows (`per_row`);
- `tfgen.export` builds each signature's per-row inputs and in-graph request checks from it (what
  `tfgen serve` and TF Serving answer 400 to).
`valid` works on Python numbers, numpy arrays and TF tensors alike (element-wise comparisons only).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

_INF = math.inf


@dataclasses.dataclass(frozen=True)
class Knob:
    """One run-time value of a generate program.

    dtype: numpy dtype of the program input. per_row: `[B, *row_shape]` (one value per row) when True, else
    `[*row_shape]` shared by every row. neutral: the value that switches the knob's effect off. valid /
    requirement: the condition every value meets, and how to say it in an error ("must be ..."). config_kind:
    `int` or `float` when a `GenerationConfig` attribute of the same name holds it (None: no such attribute).
    warper: see the field.
    """

    name: str
    dtype: Any
    per_row: bool = True
    neutral: Any = 0
    valid: Callable[[Any], Any] | None = None
    requirement: str = ""
    row_shape: tuple = ()
    config_kind: type | None = None
    #: The value of a sampling warper: HF reads (and validates) it only when sampling, and a greedy row of a mixed
    #: batch holds its neutral value.
    warper: bool = False

    def is_valid(self, value) -> bool:
        """Whether a Python number (or every element of an array) is representable in the knob's dtype (ints in
        range; floats rounded to it: 1e-50 is 0 in float32, 1e39 is inf) and `accepts` it."""
        array = np.asarray(value)
        if np.issubdtype(self.dtype, np.integer):
            limits = np.iinfo(self.dtype)
            if array.dtype == object or not np.all((array >= limits.min) & (array <= limits.max)):
                return False
        with np.errstate(over="ignore", under="ignore"):
            array = array.astype(self.dtype)
        return bool(np.all(self.accepts(array)))

    def accepts(self, values):
        """Element-wise bool: the knob's condition on numpy values or tensors of its dtype (an exported signature's
        request check runs it in the graph). Floats must also be finite and not subnormal: XLA flushes subnormals
        to zero, so a temperature of 1e-45 would divide by 0."""
        inside = values == values if self.valid is None else self.valid(values)
        if np.issubdtype(self.dtype, np.floating):
            inside = inside & (abs(values) < _INF) & ((values == 0) | (abs(values) >= np.finfo(self.dtype).tiny))
        return inside

    def fill(self, batch_size: int, value=None) -> np.ndarray:
        """The knob's input for `batch_size` rows (per-row knobs) holding `value` (None: neutral)."""
        value = self.neutral if value is None else value
        shape = ([batch_size] if self.per_row else []) + list(self.row_shape)
        return np.full(shape, value, self.dtype)


def _between(low=None, high=None, *, low_open=False, high_open=False) -> Callable[[Any], Any]:
    """An element-wise range check; None leaves that side open (no comparison, so int tensors never meet inf)."""

    def check(value):
        inside = value == value  # False for NaN, the right shape and type for every input
        if low is not None:
            inside = inside & (value > low if low_open else value >= low)
        if high is not None:
            inside = inside & (value < high if high_open else value <= high)
        return inside

    return check


_POSITIVE = _between(0, low_open=True)
_NON_NEGATIVE = _between(0)
_PROBABILITY = _between(0, 1)
# Float knobs must be finite and normal once rounded to float32 (XLA flushes subnormals to zero).
_POSITIVE_FLOAT32 = "> 0, finite and at least 1.2e-38 (float32's smallest normal number)"

_DECLARED = [
    # Sampling warpers (HF order) and the processors' per-row values.
    Knob("temperature", np.float32, neutral=1.0, valid=_POSITIVE, requirement=_POSITIVE_FLOAT32, config_kind=float,
         warper=True),
    Knob("top_k", np.int32, neutral=0, valid=_NON_NEGATIVE, requirement=">= 0 (0 = no top-k; < 2**31)",
         config_kind=int, warper=True),
    Knob("top_p", np.float32, neutral=1.0, valid=_between(0, 1, low_open=True), requirement="in (0, 1]",
         config_kind=float, warper=True),
    Knob("min_p", np.float32, neutral=0.0, valid=_PROBABILITY, requirement="in [0, 1]", config_kind=float,
         warper=True),
    Knob("typical_p", np.float32, neutral=1.0, valid=_between(0, 1, low_open=True), requirement="in (0, 1]",
         config_kind=float, warper=True),
    Knob("epsilon_cutoff", np.float32, neutral=0.0, valid=_between(0, 1, high_open=True), requirement="in [0, 1)",
         config_kind=float, warper=True),
    Knob("eta_cutoff", np.float32, neutral=0.0, valid=_between(0, 1, high_open=True), requirement="in [0, 1)",
         config_kind=float, warper=True),
    Knob("repetition_penalty", np.float32, neutral=1.0, valid=_POSITIVE, requirement=_POSITIVE_FLOAT32,
         config_kind=float),
    # float64 because HF multiplies by `1 / penalty` formed in double precision.
    Knob("encoder_repetition_penalty", np.float64, neutral=1.0, valid=_POSITIVE, requirement="> 0 and finite",
         config_kind=float),
    Knob("min_length", np.int32, neutral=0, valid=_NON_NEGATIVE, requirement=">= 0 (and < 2**31)", config_kind=int),
    Knob("min_new_tokens", np.int32, neutral=0, valid=_NON_NEGATIVE, requirement=">= 0 (and < 2**31)", config_kind=int),
    Knob("exponential_decay_start", np.int32, neutral=0),
    Knob("exponential_decay_factor", np.float32, neutral=1.0),
    # One bias per biased sequence (`ProcessorSpec.sequence_bias` order); the row shape is set per request.
    Knob("sequence_bias", np.float32, neutral=0.0),
    # Token ids and vocabulary masks shared by every row (-1 / False = none).
    Knob("eos_token_ids", np.int32, per_row=False, neutral=-1),
    Knob("forced_bos_token_id", np.int32, per_row=False, neutral=-1),
    Knob("forced_eos_token_ids", np.int32, per_row=False, neutral=-1),
    Knob("suppress_tokens", np.bool_, per_row=False, neutral=False),
    Knob("begin_suppress_tokens", np.bool_, per_row=False, neutral=False),
    # Structured output: a token-level automaton's tables, shared by every row (`tfgen.structured.automaton`).
    Knob("grammar_next", np.int32, per_row=False, neutral=0),
    Knob("grammar_token_class", np.int32, per_row=False, neutral=0),
    Knob("grammar_accepting", np.bool_, per_row=False, neutral=False),
    # Beam search: float64 because HF raises lengths to it in double precision; early_stopping 0 = False,
    # 1 = True, 2 = "never" (so the three modes share one program).
    Knob("length_penalty", np.float64, neutral=1.0, valid=_between(-_INF, _INF, low_open=True, high_open=True),
         requirement="a finite number", config_kind=float),
    Knob("early_stopping", np.int32, neutral=0, valid=_between(0, 2), requirement="0, 1 or 2"),
    Knob("diversity_penalty", np.float32, neutral=0.0, valid=_NON_NEGATIVE, requirement=">= 0 and finite",
         config_kind=float),
    # Contrastive search: float64 because HF forms `1 - alpha` in double precision.
    Knob("penalty_alpha", np.float64, neutral=0.0, valid=_NON_NEGATIVE, requirement=">= 0 and finite",
         config_kind=float),
]

#: Every knob of `DecodeInputs.knobs`, by name.
KNOBS: dict[str, Knob] = {knob.name: knob for knob in _DECLARED}
#: The sampling warpers' knobs, in HF's warper order (the one list of them).
WARPER_KNOBS: tuple[str, ...] = tuple(knob.name for knob in _DECLARED if knob.warper)

#: The per-row request values that are `DecodeInputs` fields rather than knobs: each row's budget of new tokens
#: and its sampling key.
REQUEST_VALUES: dict[str, Knob] = {
    "max_new_tokens": Knob("max_new_tokens", np.int32, neutral=0, valid=_NON_NEGATIVE, requirement=">= 0"),
    "seed": Knob("seed", np.int32, neutral=0, row_shape=(2,)),
}


def declared(name: str) -> Knob:
    """The declaration of a knob or request value; KeyError names the unknown value."""
    knob = KNOBS.get(name) or REQUEST_VALUES.get(name)
    if knob is None:
        raise KeyError(f"{name!r} is not a declared knob or request value")
    return knob


def padded_token_ids(values, slots: int = 4) -> np.ndarray:
    """int32 `[E]`: `values` then -1 (never a token), E the smallest positive multiple of `slots` that holds them,
    so that 1 to 4 eos ids (say) share one input shape and one program."""
    values = list(values or ())
    padded = np.full([max(slots, -(-len(values) // slots) * slots)], -1, np.int32)
    padded[: len(values)] = values
    return padded


def repeat_per_row(knobs: dict, copies: int, repeat: Callable) -> dict:
    """The knobs for `copies` consecutive rows per row: per-row knobs repeated along axis 0 with
    `repeat(value, copies)` (e.g. `lambda v, n: tf.repeat(v, n, axis=0)`), shared ones unchanged."""
    return {name: repeat(value, copies) if KNOBS[name].per_row else value for name, value in knobs.items()}
