"""The type tests every argument check uses: an integer, or a real number — never a bool (True is an int to Python,
and `top_k=True` is a slip, not a request; numpy scalars count, numpy registers them with `numbers`) — and a list of
callables (the caller's logits processors and stopping criteria)."""

from __future__ import annotations

import numbers


def is_integer(value) -> bool:
    """Whether `value` is a Python or numpy integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
    """Whether `value` is a Python or numpy integer or float (NaN and inf included), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_callables(entries, argument: str, expected: str) -> tuple:
    """`entries` (None or an iterable) as a tuple; TypeError naming `argument` unless each entry is a callable
    instance (a class is a common slip: `[MyProcessor]` for `[MyProcessor()]`). `expected` describes one entry."""
    if callable(entries) and not isinstance(entries, (list, tuple)) and not hasattr(entries, "__iter__"):
        raise TypeError(f"{argument} must be a list of {expected}; wrap a single one in a list: [{entries!r}]")
    try:
        entries = tuple(entries or ())
    except TypeError:
        raise TypeError(f"{argument} must be a list of {expected}, got {entries!r}") from None
    for entry in entries:
        if isinstance(entry, type) or not callable(entry):
            raise TypeError(f"{argument} entries must be {expected}, got {entry!r}")
    return entries
