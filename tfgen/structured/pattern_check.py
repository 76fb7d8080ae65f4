"""Checking a structured-output pattern before anything slow: a `--regex` (or a `--json-schema`'s regex) that
outlines-core cannot compile is refused before the model loads, in words a person reads.

outlines-core compiles a pattern only together with a vocabulary (`Index`), and its regex engine (Rust's
regex-automata) is not Python's `re`: it has `\\p{L}` and no look-around or backreferences. So the verdict is
outlines-core's own, on a one-token vocabulary: the regex is parsed and its automaton built, then the vocabulary
cannot spell it, which is ignored here (the model's vocabulary is checked when the real automaton is built). That
runs in a child process stopped after `CHECK_SECONDS` (outlines-core's determinisation is exponential for some
counted repetitions and cannot be interrupted); a check that runs out of time decides nothing, and the real build
keeps its own limit (`tfgen.structured.automaton.MAX_BUILD_SECONDS`). Python's `re` only words the refusal: when it
also rejects the pattern, its message says where the mistake is.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import warnings

from tfgen.structured.automaton import check_pattern_size
from tfgen.structured.json_schema import schema_regex

#: The longest the up-front check of a pattern may run before it is left to the real build.
CHECK_SECONDS = 2.0
# The beginnings of outlines-core's errors when the regex itself cannot be compiled (not when the vocabulary cannot
# spell it); any other failure is left to the real build, so a new wording never refuses a valid pattern.
_NOT_A_REGEX = "Failed to build DFA"
_ANCHORED = "Index failed since anchored"
_NOT_COMPILED = 3
# The child: outlines-core only (no tfgen, no numpy), so it starts in tens of milliseconds. It prints outlines-core's
# message and exits with _NOT_COMPILED when the pattern cannot be compiled.
_CHILD = f"""
import sys
from outlines_core import Index, Vocabulary
pattern = sys.stdin.buffer.read().decode("utf-8", "surrogatepass")
try:
    Index(pattern, Vocabulary(1, {{b"a": [0]}}))
except ValueError as error:
    if str(error).startswith(({_NOT_A_REGEX!r}, {_ANCHORED!r})):
        print(error)
        sys.exit({_NOT_COMPILED})
"""


def compile_failure(pattern: str, message: str, shown: str | None = None) -> str | None:
    """"PATTERN is not a regular expression outlines-core can compile: WHY" when outlines-core's error `message`
    says it cannot compile `pattern` (None when the message is about something else, such as the vocabulary);
    `shown` replaces the pattern's repr (a JSON schema's regex is long)."""
    words = _mistake(pattern, message)
    if words is None:
        return None
    return f"{shown or repr(pattern)} is not a regular expression outlines-core can compile: {words}"


def _mistake(pattern: str, message: str) -> str | None:
    """Why outlines-core cannot compile `pattern`, in words: an anchor it cannot take, Python's `re` diagnosis when
    `re` rejects the pattern too (what, and where), else outlines-core's own detail, else the features its engine
    lacks. None when `message` is not about compiling the regex."""
    if message.startswith(_ANCHORED):
        return ("it starts with an anchor (^ or \\A), which outlines-core cannot compile; leave it out: the whole "
                "output matches the pattern anyway")
    if not message.startswith(_NOT_A_REGEX):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # FutureWarning about nested sets: not the question here
            re.compile(pattern)
    except re.error as error:
        return str(error)
    except (RecursionError, OverflowError):
        return "it nests or repeats beyond what can be parsed"
    detail = message.removeprefix(_NOT_A_REGEX).strip()
    if detail and detail != "error building NFA":
        return detail
    return ("it uses a feature outlines-core's regex engine does not have (look-around such as (?=...) or "
            "backreferences such as \\1): structured output needs a regular language")


def check_pattern(pattern: str, flag: str, shown: str | None = None) -> None:
    """ValueError naming `flag` (the option the pattern comes from; `shown` instead of the pattern) when `pattern`
    unrolls to more than `MAX_AUTOMATON_STATES` positions or outlines-core cannot compile it; nothing when it can,
    or when the check runs out of time (see the module docstring)."""
    check_pattern_size(pattern, flag)
    message = _outlines_error(pattern)
    if message is not None:
        raise ValueError(f"{flag}: {compile_failure(pattern, message, shown)}")


@functools.lru_cache(maxsize=32)
def _outlines_error(pattern: str) -> str | None:
    """outlines-core's message when it cannot compile `pattern`, from the child; None when it can or the check ran
    out of time (cached: the command line checks its flags once before importing TensorFlow and again as it runs)."""
    try:
        child = subprocess.run([sys.executable, "-c", _CHILD], input=pattern.encode("utf-8", "surrogatepass"),
                               capture_output=True, timeout=CHECK_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        return None  # undecided: the real build has its own limit
    if child.returncode != _NOT_COMPILED:
        return None
    return child.stdout.decode(errors="replace").strip()


def check_schema(schema: dict, flag: str) -> None:
    """ValueError naming `flag` when the JSON schema cannot be turned into a regex, or its regex (a `pattern`
    keyword in it, say) cannot be compiled (`check_pattern`). The warning about keywords the regex does not
    enforce is left to the generate call, which warns once."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            pattern = schema_regex(schema)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{flag}: {str(error).removeprefix('json_schema: ')}") from None
    check_pattern(pattern, flag, "the schema's regex (see its `pattern` keywords)")
