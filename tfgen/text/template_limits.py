"""The Jinja sandbox that renders chat templates, a file's untrusted code, under limits.

A chat template comes from a downloaded file (GGUF metadata, `tokenizer_config.json`, `chat_template.jinja`) and
`tfgen serve` renders it per request, so a render must end fast whatever the template does. Jinja's immutable sandbox
(what HF uses) stops escapes but not resource bombs; this one adds, per rendered conversation:

- a step budget (`MAX_RENDER_STEPS`): each loop iteration (recursive loops included) and each call (function, macro,
  method, filter) is a step, so nested loops end after a bounded amount of work;
- a size bound (`render_limit`): every string, list or number a template builds is checked *before* it is
  allocated (`*`, `**`, `+`, `%`, `~`, the amplifying filters, methods and globals: `center`, `indent`, `batch`,
  `slice`, `replace`, `join`, `format`, `tojson`, `sum`, `lipsum`, `ljust`, `str.format` widths, ...), values
  printed are sized before `str()` runs, and all text a render produces (nested blocks and macros included) adds
  up to at most `WORK_FACTOR` times the bound;
- a time backstop (`MAX_RENDER_SECONDS`) for steps that each scan a large input;
- recursion: a recursive macro or deeply nested blocks end in Python's RecursionError, which the caller
  (`tfgen.text.chat_template`) turns into a ValueError like every limit here.

Templates within the limits render exactly as in the plain sandbox: the hooks only count and check.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import re
import time
import types
from collections.abc import Mapping
from typing import Any

import jinja2
import jinja2.utils
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, optimizeconst
from jinja2.filters import make_attrgetter
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter
from jinja2.utils import generate_lorem_ipsum
from markupsafe import Markup

# Loop iterations and calls one rendered conversation may take. Published templates take 1 to 3 per message (2,503
# for 1,001 messages); a step costs up to ~7 us (a `tojson` of a short conversation), so a refusal takes < 2 s.
MAX_RENDER_STEPS = 250_000
# A backstop for steps that each scan a large input (`'x' in content` per iteration): seconds one render may take,
# checked at every step. Published templates render a 1,001-message conversation in ~0.01 s.
MAX_RENDER_SECONDS = 5.0
# The size bound: max(MIN_RENDER_BYTES, context tokens x RENDER_BYTES_PER_TOKEN) characters (a text longer than that
# cannot fit the model's context whatever the tokenizer), ASSUMED_CONTEXT_TOKENS when the context is unknown.
RENDER_BYTES_PER_TOKEN = 64
MIN_RENDER_BYTES = 1 << 20
ASSUMED_CONTEXT_TOKENS = 131_072
# All text produced during one render (intermediate strings, captured blocks, macro output) up to this many bounds.
WORK_FACTOR = 16
# A list or tuple item counts as this many characters against the bound (what an item costs in memory and in the
# filters' work, such as `sort`), so a list stays under bound / ITEM_CHARACTERS items.
ITEM_CHARACTERS = 16
# Integers a template computes stay under this many bits (`10**10**8` would take minutes).
MAX_INT_BITS = 1 << 16


class RenderLimitError(Exception):
    """A template went past a render limit (`sized`: the size bound). Not a subclass of the errors Jinja catches, so
    nothing swallows it."""

    def __init__(self, message: str, sized: bool = False):
        super().__init__(message)
        self.sized = sized


class _Budget:
    def __init__(self, max_bytes: int):
        self.max_bytes, self.steps, self.produced = max_bytes, MAX_RENDER_STEPS, 0
        self.deadline = time.monotonic() + MAX_RENDER_SECONDS


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("tfgen_render_budget", default=None)


def render_limit(context_tokens: int | None) -> int:
    """The size bound, in characters, of a template render for a model of `context_tokens` (None: unknown)."""
    return max(MIN_RENDER_BYTES, (context_tokens or ASSUMED_CONTEXT_TOKENS) * RENDER_BYTES_PER_TOKEN)


@contextlib.contextmanager
def render_budget(max_bytes: int):
    """Gives the renders inside the block a fresh step budget and the size bound `max_bytes`."""
    token = _BUDGET.set(_Budget(max_bytes))
    try:
        yield
    finally:
        _BUDGET.reset(token)


def _limit() -> int:
    budget = _BUDGET.get()
    # No budget: a compile-time constant fold; a refusal there is retried, and refused, at render time.
    return budget.max_bytes if budget is not None else render_limit(None)


def _step() -> None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.steps -= 1
        if budget.steps < 0:
            raise RenderLimitError(f"it took more than {MAX_RENDER_STEPS} steps (loop iterations and calls)")
        if time.monotonic() > budget.deadline:
            raise RenderLimitError(f"it ran for more than {MAX_RENDER_SECONDS} seconds")


def check_size(size: int, what: str) -> None:
    """Raises RenderLimitError when `size` (of `what`, about to be built) is over the bound of the render."""
    if size > _limit():
        raise RenderLimitError(f"{what} would be {size} characters long", sized=True)


def _size_of(value: Any) -> int:
    """What a string, list or tuple counts against the bound (0 for other values)."""
    if isinstance(value, str):
        return len(value)
    return len(value) * ITEM_CHARACTERS if isinstance(value, (list, tuple)) else 0


def _produced(value: Any) -> Any:
    budget = _BUDGET.get()
    if budget is not None:
        budget.produced += _size_of(value)
        if budget.produced > WORK_FACTOR * budget.max_bytes:
            raise RenderLimitError(f"it produced more than {WORK_FACTOR} times the size bound in text", sized=True)
    return value


def text_size(value: Any, indent: int = 0, depth: int = 1) -> int:
    """An estimate (at least the true size, within small factors) of `str(value)` or its JSON, without building it;
    stops counting past the bound. `indent`: JSON indentation (each item adds `indent * depth` spaces)."""
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, int):
        return value.bit_length() // 3 + 2
    if isinstance(value, jinja2.utils.Namespace):
        value = object.__getattribute__(value, "_Namespace__attrs")  # its repr shows them
    if isinstance(value, Mapping):
        value = [item for pair in value.items() for item in pair]
    elif not isinstance(value, (list, tuple, set, frozenset)):
        return 32 if isinstance(value, (float, type(None), jinja2.Undefined)) else len(str(value))
    total, limit = 2, _limit()
    for item in value:
        total += text_size(item, indent, depth + 1) + 2 + indent * depth
        if total > limit:
            break
    return total


def _percent_size(template: str, values: Any) -> int:
    """The size of `template % values` (printf-style), estimated before formatting: widths included."""
    values = values if isinstance(values, tuple) else (values,)
    numbers = [int(width) for width in re.findall(r"%[-#0 +(\w)]*?(\d+)", template)]
    if "*" in template:  # widths taken from the arguments
        numbers += [value for value in values if isinstance(value, int)]
    return len(template) + sum(text_size(value) for value in values) + sum(numbers)


def _check_binop(operator: str, left: Any, right: Any) -> None:
    if operator == "*":
        for sequence, count in ((left, right), (right, left)):
            if isinstance(count, int) and isinstance(sequence, (str, list, tuple)):
                check_size(_size_of(sequence) * max(count, 0), "a repeated sequence")
        if isinstance(left, int) and isinstance(right, int):
            _check_bits(left.bit_length() + right.bit_length())
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
        _check_bits(left.bit_length() * min(right, MAX_INT_BITS + 1))
    elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
        check_size(_size_of(left) + _size_of(right), "a concatenation")
    elif operator == "%" and isinstance(left, str):
        check_size(_percent_size(left, right), "a formatted string")


def _check_bits(bits: int) -> None:
    if bits > MAX_INT_BITS:
        raise RenderLimitError(f"a number would have about {bits} bits, over the bound of {MAX_INT_BITS}")


def _counted(iterable: Any):
    """A loop's items, one step each."""
    for item in iterable:
        _step()
        yield item


def _joined(parts: tuple) -> str:
    """The `~` operator (Jinja's `str_join`), sized first."""
    check_size(sum(text_size(part) for part in parts), "a `~` concatenation")
    return _produced("".join(map(str, parts)))


def _finalize(value: Any) -> Any:
    """Sizes each printed value before Jinja turns it into text."""
    if not isinstance(value, str):
        check_size(text_size(value), "a printed value")
    return value


# Checks of the filters, string methods and globals that can build a value much larger than their input, run before
# them on their bound arguments: each returns the size of what would be built.
def _replace_size(s, old, new, count=-1) -> int:
    if not isinstance(s, str) or not isinstance(old, str) or not isinstance(new, str):
        return 0
    times = s.count(old) if old else len(s) + 1
    return len(s) + (times if count is None or count < 0 else min(times, count)) * len(new)


def _join_size(value, d="", attribute=None) -> int:
    items = value if isinstance(value, (list, tuple, str)) else []
    return sum(text_size(item) + len(d) for item in items)


def _lines(s: Any) -> int:
    return str(s).count("\n") + 1 if isinstance(s, str) else 1


def _lipsum_size(n=5, html=True, min=20, max=100) -> int:  # noqa: A002 (Jinja's names: templates pass min=, max=)
    return n * max * 16  # words of at most 15 letters and a space


_SIZE_CHECKS = {
    "center": lambda value, width=80: text_size(value) + width,
    "indent": lambda s, width=4, first=False, blank=False: text_size(s) + _lines(s) * (
        width if isinstance(width, int) else len(str(width))),
    "batch": lambda value, linecount, fill_with=None: 0 if fill_with is None else linecount * ITEM_CHARACTERS,
    "slice": lambda value, slices, fill_with=None: slices * ITEM_CHARACTERS,
    "replace": _replace_size,
    "join": _join_size,
    "format": lambda value, *args, **kwargs: _percent_size(value, args or kwargs) if isinstance(value, str) else 0,
    "string": lambda value: text_size(value),
    "pprint": lambda value: 2 * text_size(value),
    "lipsum": _lipsum_size,
}
# str methods: the same checks, with the string as first argument.
_STR_METHOD_CHECKS = {
    "center": lambda s, width, fillchar=" ": len(s) + width,
    "ljust": lambda s, width, fillchar=" ": len(s) + width,
    "rjust": lambda s, width, fillchar=" ": len(s) + width,
    "zfill": lambda s, width: len(s) + width,
    "expandtabs": lambda s, tabsize=8: len(s) + s.count("\t") * tabsize,
    "replace": _replace_size,
    "join": lambda s, iterable: _join_size(iterable, s),
}


def _size_checked(name: str, function, check):
    """`function` (a filter or global), one step per call, refused when `check` says its result would be too big."""
    signature = inspect.signature(check) if check is not None else None
    skip = 1 if getattr(function, "jinja_pass_arg", None) is not None else 0  # context / environment argument

    @functools.wraps(function)
    def checked(*args, **kwargs):
        _step()
        if check is not None:
            try:
                bound = signature.bind(*args[skip:], **kwargs)
            except TypeError:
                pass  # the call itself raises the right TypeError
            else:
                check_size(check(*bound.args, **bound.kwargs), f"the result of {name}")
        return _produced(function(*args, **kwargs))

    return checked


@jinja2.pass_environment
def _sum(environment, iterable, attribute=None, start=0):
    """Jinja's `sum` filter, refused when it would build a list or tuple over the bound."""
    items = list(iterable if attribute is None else map(make_attrgetter(environment, attribute), iterable))
    if isinstance(start, (list, tuple)):
        total = _size_of(start) + sum(_size_of(item) for item in items)
        # Each addition copies the sum so far: the work grows with the count times the total.
        check_size(total * max(len(items), 1) // WORK_FACTOR, "the result of sum")
    return sum(items, start)




class _SizedFields:
    """A `str.format` formatter that refuses a field width or precision over the bound before it pads."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        check_size(text_size(value) + sum(int(number) for number in re.findall(r"\d+", format_spec)),
               "a str.format field")
        return super().format_field(value, format_spec)


class _Formatter(_SizedFields, SandboxedFormatter):
    pass


class _EscapeFormatter(_SizedFields, SandboxedEscapeFormatter):
    pass


class _CodeGenerator(CodeGenerator):
    """Jinja's code generator with the counting hooks: loop iterables go through `_counted`, `~` through `_joined`,
    every piece of output through `_produced`."""

    def visit_Template(self, node: nodes.Template, frame=None) -> None:
        for loop in node.find_all(nodes.For):
            loop.iter = nodes.Filter(loop.iter, COUNTED_FILTER, [], [], None, None, lineno=loop.iter.lineno)
        super().visit_Template(node, frame)

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame) -> None:
        if frame.eval_ctx.volatile or frame.eval_ctx.autoescape:
            return super().visit_Concat(node, frame)
        self.write("environment.joined((")
        for part in node.nodes:
            self.visit(part, frame)
            self.write(", ")
        self.write("))")

    def _output_const_repr(self, group) -> str:
        return f"environment.produced({super()._output_const_repr(group)})"

    def _output_child_pre(self, node, frame, finalize) -> None:
        self.write("environment.produced(")
        super()._output_child_pre(node, frame, finalize)

    def _output_child_post(self, node, frame, finalize) -> None:
        super()._output_child_post(node, frame, finalize)
        self.write(")")


# The filter name the loops' iterables are wrapped in (not a valid identifier in a template's own filter syntax).
COUNTED_FILTER = "tfgen counted loop"


class LimitedSandbox(ImmutableSandboxedEnvironment):
    """HF's immutable sandbox with the limits of this module (see its docstring)."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _CodeGenerator

    def __init__(self, **options: Any):
        super().__init__(finalize=_finalize, **options)
        self.joined, self.produced = _joined, _produced
        self.filters["sum"] = _sum
        for name, function in list(self.filters.items()):
            self.filters[name] = _size_checked(name, function, _SIZE_CHECKS.get(name))
        self.filters[COUNTED_FILTER] = _counted
        self.globals["lipsum"] = _size_checked("lipsum", generate_lorem_ipsum, _SIZE_CHECKS["lipsum"])

    def add_filter(self, name: str, function) -> None:
        """Adds `function` as the filter `name`: one step per call, its text counted (it checks its own size)."""
        self.filters[name] = _size_checked(name, function, None)

    def add_global(self, name: str, function, check=None) -> None:
        """Adds `function` as the global `name`: one step per call, its text counted, refused when `check` (called
        with its arguments) says its result would be over the bound."""
        self.globals[name] = _size_checked(name, function, check)

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        _check_binop(operator, left, right)
        return _produced(super().call_binop(context, operator, left, right))

    def call(__self, __context, __obj, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (Jinja's signature)
        _step()
        if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level
            args = (_counted(args[0]), *args[1:])
        is_method = isinstance(__obj, types.BuiltinMethodType)
        owner = __obj.__self__ if is_method else None
        check = _STR_METHOD_CHECKS.get(__obj.__name__) if is_method else None
        if isinstance(owner, str) and check is not None:
            try:
                size = check(owner, *args, **kwargs)
            except TypeError:
                size = 0  # wrong arguments: the call itself raises the right error
            check_size(size, f"the result of str.{__obj.__name__}")
        return _produced(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value: Any):
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        string, is_map = value.__self__, value.__name__ == "format_map"
        formatter = _EscapeFormatter(self, escape=string.escape) if isinstance(string, Markup) else _Formatter(self)

        @functools.wraps(value)
        def sized_format(*args: Any, **kwargs: Any) -> str:
            if is_map:
                if kwargs or len(args) != 1:
                    return wrapper(*args, **kwargs)  # its TypeError
                args, kwargs = (), args[0]
            return _produced(type(string)(formatter.vformat(string, args, kwargs)))

        return sized_format

