"""Per-row generation options of a batch job: the keys an input row may carry besides its prompt, checked row by row
and kept as arrays beside the prompt table (numpy only, TensorFlow-free).

Honoured: `max_new_tokens` (the row's budget, at most the job's: the compiled program's buffer is the job's),
`temperature` and `top_p` (per-row knobs of every sampling program) and `seed` (the row's own sampling key, as
`generate(..., seed=[a, b])` gives a prompt alone). Every other generation option, and the OpenAI request names
that mean one, are refused by name: they shape the compiled program (top-k's candidate count, processors, beams)
and so are set for the whole job. No option a row carries is ignored.
"""

from __future__ import annotations

import numpy as np

from tfgen.config.generation_config import GenerationConfig
from tfgen.config.knobs import KNOBS
from tfgen.value_types import is_integer

#: The per-row options a job honours.
HONOURED = ("max_new_tokens", "temperature", "top_p", "seed")
# Those that only change sampling (a greedy job would ignore them).
_SAMPLING_ONLY = ("temperature", "top_p", "seed")
# OpenAI chat-completion names a row might carry, and what to use instead.
_OPENAI_NAMES = {
    "max_tokens": "use 'max_new_tokens'",
    "max_completion_tokens": "use 'max_new_tokens'",
    "stop": "stop strings are set for the whole job (--stop-string)",
    "n": "a job writes one answer per row; repeat the row under other ids",
    "response_format": "structured output is set for the whole job (--json-schema or --regex)",
    "frequency_penalty": "not supported; --repetition-penalty is the job's penalty",
    "presence_penalty": "not supported; --repetition-penalty is the job's penalty",
    "logit_bias": "not supported per row",
    "logprobs": "a job writes ids and text only",
    "top_logprobs": "a job writes ids and text only",
}
#: Row keys refused by name: every other generation option, and the OpenAI names above.
REFUSED = tuple(sorted(
    {name for name in vars(GenerationConfig()) if not name.startswith("_")} - set(HONOURED) | set(_OPENAI_NAMES)
))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def refused_key(record: dict) -> str | None:
    """Why a row's first refused key cannot be honoured, or None."""
    for name in REFUSED:
        if name in record:
            why = _OPENAI_NAMES.get(name) or f"a per-row {name} is not supported; set it for the whole job"
            if name not in _OPENAI_NAMES and name in vars(GenerationConfig()):
                why += f" ({_flag(name)} where the command has it, or {name}= in Python)"
            return f"{name!r}: {why}"
    return None


def check_row_options(record: dict, sampling: bool, job_budget: int | None) -> tuple[str | None, dict]:
    """(what is wrong or None, the honoured options the row gives) of one row. `sampling`: whether the job samples
    (else the sampling-only options would do nothing, and are refused); `job_budget`: the job's `max_new_tokens`
    when known (a row's may not exceed it), None when the job derives it from its prompts (checked later)."""
    options = {name: record[name] for name in HONOURED if name in record}
    for name, value in options.items():
        if name in _SAMPLING_ONLY and not sampling:
            return (f"{name!r}: the job decodes greedily, so a row's {name} would do nothing; sample with --do-sample "
                    "(do_sample=True in Python)"), {}
        problem = _value_problem(name, value, job_budget)
        if problem:
            return f"{name!r} {problem}", {}
    if "seed" in options:
        seed = options["seed"]
        pair = np.array([0, seed] if is_integer(seed) else seed, np.int64)
        options["seed"] = (pair & 0xFFFFFFFF).astype(np.uint32).view(np.int32).tolist()
    return None, options


def _value_problem(name: str, value, job_budget: int | None) -> str | None:
    """What is wrong with one honoured option's value, or None."""
    if name == "max_new_tokens":
        if not is_integer(value) or value < 1:
            return f"must be a positive integer, got {value!r}"
        if job_budget is not None and value > job_budget:
            return over_budget(value, job_budget)
        return None
    if name == "seed":
        values = [value] if is_integer(value) else value
        if not (is_integer(value) or (isinstance(value, list) and len(value) == 2 and all(map(is_integer, value)))):
            return f"must be an integer or two integers [a, b], got {value!r}"
        if any(not -(2**31) <= v < 2**32 for v in values):
            return f"values must fit in 32 bits, got {value!r}"
        return None
    knob = KNOBS[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not knob.is_valid(value):
        return f"must be a number {knob.requirement}, got {value!r}"
    return None


def over_budget(value: int, job_budget: int) -> str:
    """The reason of a row whose `max_new_tokens` exceeds the job's."""
    return (f"is {value}, over the job's max_new_tokens={job_budget} (the compiled program's room for new tokens); "
            "raise the job's (--max-new-tokens)")


def option_arrays(options: dict[int, dict], rows: int) -> dict[str, np.ndarray]:
    """The options of `rows` rows as arrays from `{row index: options}` (only rows that give some): `max_new_tokens`
    int32 `[rows]` (0: the job's), `temperature` / `top_p` float32 `[rows]` (NaN: the job's), `seed` int32
    `[rows, 2]` with `has_seed` bool `[rows]`. Empty when no row gives an option (the common case costs nothing)."""
    if not options:
        return {}
    arrays = {
        "max_new_tokens": np.zeros([rows], np.int32),
        "temperature": np.full([rows], np.nan, np.float32),
        "top_p": np.full([rows], np.nan, np.float32),
        "seed": np.zeros([rows, 2], np.int32),
        "has_seed": np.zeros([rows], bool),
    }
    for row, given in options.items():
        for name, value in given.items():
            arrays[name][row] = value
        arrays["has_seed"][row] = "seed" in given
    return arrays
