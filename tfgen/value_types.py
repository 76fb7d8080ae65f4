"""The two type tests every argument check uses: an integer, or a real number — never a bool (True is an int to
Python, and `top_k=True` is a slip, not a request). numpy scalars count (numpy registers them with `numbers`)."""

from __future__ import annotations

import numbers


def is_integer(value) -> bool:
    """Whether `value` is a Python or numpy integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
    """Whether `value` is a Python or numpy integer or float (NaN and inf included), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
