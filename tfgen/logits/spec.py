"""How a logits processor is declared (`Processor`), the static part of a program's pipeline (`ProcessorSpec`, part
of the compiled program's key), and the readers that turn a config option into a processor's validated value.

A processor is declared once, as one `Processor`: the config option it reads and HF's rule for building it (`read`),
what it puts in the program key (`static`), its run-time values (`knobs`, named after the knob schema,
`tfgen.config.knobs`, which holds their dtypes, neutral values and ranges), whether it is in every program with
neutral values (`presence`), its place (`stage`, and its position in its module's tuple) and the function that
applies it. Config validation, the request layer, the slot programs and the export read these declarations
(`tfgen.logits.pipeline`); none of them lists processors by name.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from tfgen.config.knobs import KNOBS, WARPER_KNOBS
from tfgen.value_types import is_integer, is_real


class BuildEnv(NamedTuple):
    """What deciding and validating a processor needs besides the config: the vocabulary size, the config's eos ids
    (validated), whether the call samples, and its beam count."""

    vocab_size: int
    eos_ids: tuple[int, ...]
    do_sample: bool
    num_beams: int

    @property
    def min_tokens_to_keep(self) -> int:
        """HF's `min_tokens_to_keep` of the warpers: beam sampling keeps a non-eos continuation alive for every beam
        (eos ids + 1); else 1. Only the warpers read it, so it stays 1 (one program key) unless beam sampling."""
        if self.num_beams > 1 and self.do_sample:
            return len(self.eos_ids) + 1 if self.eos_ids else 2
        return 1


def _no_knobs(value, batch_size: int, env: BuildEnv) -> dict:
    return {}


def _switch(value, env: BuildEnv):
    return True


#: Stages, in pipeline order: HF's logits processors, then the caller's `logits_processor`s, then masks that must
#: hold whatever those did (structured output), then the sampling warpers, then the final renormalisation.
STAGES = ("processor", "mask", "warper", "final")
#: `Processor.presence` values.
PRESENCES = ("built", "always", "sampling")


@dataclasses.dataclass(frozen=True)
class Processor:
    """One built-in logits processor or sampling warper.

    name: its switch in `ProcessorSpec` (the config attribute it is built from, where there is one).
    read: `(config, env) -> value or None`: the option's validated value when HF 4.55.4's `_get_logits_processor`
        builds the processor, else None; ValueError (naming the option) for a value HF would refuse. `env.do_sample`
        False: a warper's value is read unvalidated, as HF does.
    apply: `(static, scores, ctx, knobs) -> scores` for float32 `[B, V]` scores (`static` as `static` gave it; ctx a
        `ProcessorContext`; knobs the program's knob tensors). A warper's is `(static, scores, knobs, pool, keep)`
        (`tfgen.logits.warpers`).
    static: `(value, env) -> the value in the program key` while it is on (default True: a plain switch).
    knobs: `(value, batch_size, env) -> {knob name: numpy array}`, its run-time values for `batch_size` rows from
        `read`'s value (None: the neutral values); every knob it names is declared in `tfgen.config.knobs`.
    presence: "built" (in the program only when `read` gives a value), "always" (in every program, neutral when
        off: a server switches it per request without a new program) or "sampling" (in every sampling program).
    stage: one of `STAGES`.
    """

    name: str
    read: Callable[[Any, BuildEnv], Any]
    apply: Callable[..., Any]
    static: Callable[[Any, BuildEnv], Any] = _switch
    knobs: Callable[[Any, int, BuildEnv], dict] = _no_knobs
    presence: str = "built"
    stage: str = "processor"

    def __post_init__(self):
        if self.presence not in PRESENCES or self.stage not in STAGES:
            raise ValueError(f"processor {self.name}: presence must be one of {PRESENCES}, stage one of {STAGES}")

    @property
    def warper(self) -> bool:
        """Whether HF runs it only when sampling (a sampling warper)."""
        return self.stage == "warper"


@dataclasses.dataclass(frozen=True)
class ProcessorSpec:
    """The static part of a program's processor pipeline (hashable: part of the program key).

    active: `(name, static value)` of every processor in the program, sorted by name; a processor that is absent
        does not run. min_tokens_to_keep: HF's warper option (see `BuildEnv.min_tokens_to_keep`).
    """

    active: tuple[tuple[str, Any], ...] = ()
    min_tokens_to_keep: int = 1

    def is_on(self, name: str) -> bool:
        return any(active == name for active, _ in self.active)

    def static(self, name: str, default: Any = None) -> Any:
        """The static value of processor `name` (`default` when it is off)."""
        return next((value for active, value in self.active if active == name), default)

    def forced(self, values: dict) -> ProcessorSpec:
        """This spec with the processors of `values` on with those static values (False: off). An export forces the
        processors whose knobs its requests carry."""
        active = {**dict(self.active), **values}
        return dataclasses.replace(self, active=tuple(sorted((k, v) for k, v in active.items() if v is not False)))

    @property
    def top_k_cap(self) -> int:
        """The static number of top-k candidates (0: the whole vocabulary, or no top-k): a row asking for more keeps
        only `top_k_cap` tokens (plus ties with the last)."""
        return self.static("top_k", 0)


# ----------------------------------------------------------------------------------------------------------
# Reading options (a config is any object with HF's attribute names)


def option(config, name: str) -> Any:
    """The config's attribute `name`, None when it has none."""
    return getattr(config, name, None)


def token_ids(value, name: str, vocab_size: int) -> tuple[int, ...]:
    """An int / list of ints / None as a tuple of ids, each checked to be in [0, vocab_size)."""
    if value is None:
        return ()
    ids = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if any(not is_integer(i) or not 0 <= i < vocab_size for i in ids):
        raise ValueError(f"{name} must hold token ids in [0, {vocab_size}), got {value!r}")
    return tuple(int(i) for i in ids)


def positive_int(value, name: str) -> int:
    if not is_integer(value) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def token_sequences(value, name: str, vocab_size: int) -> list[tuple[int, ...]]:
    """A list of non-empty token-id lists as a de-duplicated list of tuples (first occurrence order)."""
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{name} must be a non-empty list of lists of token ids, got {value!r}")
    sequences = []
    for sequence in value:
        if not isinstance(sequence, (list, tuple)) or not sequence:
            raise ValueError(f"{name} must be a non-empty list of non-empty lists of token ids, got {value!r}")
        sequences.append(token_ids(list(sequence), name, vocab_size))
    return list(dict.fromkeys(sequences))


def finite_number(value, name: str) -> float:
    if not is_real(value) or math.isnan(value):
        raise ValueError(f"{name} must be a number (not NaN), got {value!r}")
    return float(value)


def float_option(name: str, builds: Callable[[float], bool]) -> Callable:
    """A `read` for the float option `name`, which HF builds a processor for when `builds(value)`; the value is checked
    against the knob schema's range (a warper's only when sampling, as HF checks it)."""

    def read(config, env: BuildEnv):
        value = option(config, name)
        if value is None or not builds(value):
            return None
        if (env.do_sample or name not in WARPER_KNOBS) and not KNOBS[name].is_valid(value):
            raise ValueError(f"{name} must be {KNOBS[name].requirement}, got {value!r}")
        return float(value)

    return read


def int_option(name: str, builds: Callable[[int, BuildEnv], bool]) -> Callable:
    """A `read` for the integer option `name`, which HF builds a processor for when `builds(value, env)`: a positive
    integer (a warper's checked only when sampling)."""

    def read(config, env: BuildEnv):
        value = option(config, name)
        if value is None or not builds(value, env):
            return None
        return positive_int(value, name) if env.do_sample or name not in WARPER_KNOBS else int(value)

    return read


def per_row(name: str) -> Callable:
    """A `knobs` giving the knob `name` the option's value in every row (neutral when off)."""
    return lambda value, batch_size, env: {name: KNOBS[name].fill(batch_size, value)}


def token_ids_option(name: str) -> Callable:
    """A `read` for a token id or a list of ids (None: not built)."""
    return lambda config, env: None if option(config, name) is None else token_ids(option(config, name), name,
                                                                                     env.vocab_size)


def vocabulary_mask(name: str) -> Callable:
    """A `knobs` giving the knob `name` a bool `[V]` mask of the option's ids."""

    def knobs(value, batch_size, env: BuildEnv):
        mask = np.zeros([env.vocab_size], bool)
        mask[list(value or ())] = True
        return {name: mask}

    return knobs


def true_option(name: str) -> Callable:
    """A `read` for a flag: True when set to True, else None (not built)."""
    return lambda config, env: True if option(config, name) is True else None
