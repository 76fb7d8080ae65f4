"""A JSON schema as the regex of its JSON texts (outlines-core's translation), and the schema keywords that the
regex cannot enforce.

outlines-core turns objects (properties in the schema's order, `required`), strings (`minLength`, `maxLength`,
`pattern`, `format`), integers, numbers, booleans, null, `enum`, `const`, arrays (`items`, `minItems`,
`maxItems`), `anyOf` / `oneOf` / `allOf` and `$ref` into one regex; whitespace between tokens is at most one
space. Properties come in the schema's order. Some keywords it reads but does not enforce (`minimum` on an
integer, say): rather than let a schema promise what the output does not keep, each keyword is checked by building
the regex without it — a keyword whose removal changes nothing is reported in a warning.

Before outlines-core sees a schema, it is checked here so that errors say what is wrong: at most
`MAX_SCHEMA_DEPTH` schemas nested in one another (outlines-core's regex doubles or quadruples with each nested
array, and its JSON reader stops at 128 levels with "Expected a valid JSON string"), and none of the keywords it
cannot translate (`_UNSUPPORTED`, which it reports as an "Unsupported JSON Schema structure").
"""

from __future__ import annotations

import copy
import functools
import json
import warnings
from collections.abc import Iterator
from typing import Any

# Keywords that describe rather than constrain: never reported.
_ANNOTATIONS = frozenset({
    "title", "description", "$schema", "$id", "$comment", "default", "examples", "deprecated", "readOnly",
    "writeOnly", "$defs", "definitions", "properties", "items", "type", "$ref", "anyOf", "oneOf", "allOf",
})
# Schemas with more keyword occurrences than this skip the per-keyword check (a warning says so).
_MAX_CHECKED_KEYWORDS = 200
#: The most schemas nested in one another (the root is level 1; `properties` and `$defs` maps add no level). Each
#: nested array multiplies the regex by four; OpenAI's structured outputs allow 10 levels too.
MAX_SCHEMA_DEPTH = 10
# Any JSON nesting (lists, maps, `enum` / `const` values) deeper than this is refused: outlines-core reads at most 128.
_MAX_DOCUMENT_DEPTH = 4 * MAX_SCHEMA_DEPTH
# Keywords outlines-core cannot translate (it then fails with generic words).
_UNSUPPORTED = frozenset({"not", "if", "then", "else"})
# Keys whose value maps names to schemas: the map itself is no schema level.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
# Keys whose value is data, not schemas: its keys are never keywords.
_DATA_KEYS = frozenset({"enum", "const", "default", "examples", "required"})


def schema_regex(schema: Any) -> str:
    """The regex of the JSON texts `schema` (a dict, or its JSON text) allows. ValueError for invalid JSON or a
    schema outlines-core cannot translate; a UserWarning lists keywords the regex does not enforce."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as err:
            raise ValueError(f"json_schema: not valid JSON ({err})") from None
        except RecursionError:
            raise ValueError(f"json_schema: nested deeper than {_MAX_DOCUMENT_DEPTH} levels, the limit") from None
    if not isinstance(schema, dict):
        raise TypeError(f"json_schema must be a JSON object (a dict), got {type(schema).__name__}")
    _check_shape(schema)
    pattern, unenforced = _analysed(json.dumps(schema))
    if unenforced:
        warnings.warn(
            "json_schema: these keywords are not enforced on the output (outlines-core's translation ignores "
            f"them): {', '.join(unenforced)}", UserWarning, stacklevel=4,
        )
    return pattern


def _check_shape(schema: dict) -> None:
    """ValueError naming the path when `schema` nests too deep or uses a keyword outlines-core cannot translate
    (walked without recursion, so any depth is safe to check)."""
    pending = [(schema, (), 1, 1, False)]  # (node, path, schema level, document level, node is data)
    while pending:
        node, path, level, document_level, is_data = pending.pop()
        where = "/" + "/".join(str(step) for step in path)
        if document_level > _MAX_DOCUMENT_DEPTH:
            raise ValueError(f"json_schema: nested more than {_MAX_DOCUMENT_DEPTH} levels deep at {where[:200]}, "
                             "over the limit")
        if isinstance(node, list):
            pending.extend((value, path + (position,), level, document_level + 1, is_data)
                           for position, value in enumerate(node))
        elif isinstance(node, dict):
            is_map = bool(path) and path[-1] in _SCHEMA_MAPS and not is_data
            if not is_data and not is_map:
                if level > MAX_SCHEMA_DEPTH:
                    raise ValueError(f"json_schema: schemas nested {level} levels deep at {where[:200]}, over the "
                                     f"limit of {MAX_SCHEMA_DEPTH} (tfgen.structured.json_schema.MAX_SCHEMA_DEPTH)")
                unsupported = sorted(_UNSUPPORTED.intersection(node))
                if unsupported:
                    raise ValueError(f"json_schema: unsupported keyword {unsupported[0]!r} at {where[:200]} "
                                     "(outlines-core cannot translate it to a regex)")
            for key, value in node.items():
                child_level = level if is_data or is_map else level + 1
                pending.append((value, path + (key,), child_level, document_level + 1,
                                is_data or (not is_map and key in _DATA_KEYS)))


@functools.lru_cache(maxsize=64)
def _analysed(schema_text: str) -> tuple[str, tuple[str, ...]]:
    """The regex of a schema's JSON text and its unenforced keywords (cached: a generate call with a schema runs
    this, and the keyword check translates the schema once per keyword)."""
    pattern = _translated(schema_text)
    return pattern, tuple(_unenforced_keywords(json.loads(schema_text), pattern))


@functools.lru_cache(maxsize=256)
def _translated(schema_text: str) -> str:
    from outlines_core.json_schema import build_regex_from_schema  # lazy: only structured output needs it

    try:
        return build_regex_from_schema(schema_text)
    except (ValueError, TypeError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"json_schema: unsupported or invalid schema: {first_line}") from None


def _keyword_paths(node: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every `(path to a schema object, keyword)` below `node` (paths index into dicts and lists)."""
    if isinstance(node, dict):
        for key, value in node.items():
            # Objects are closed unless a schema opens them, so `additionalProperties: false` restates the default.
            restates_default = key == "additionalProperties" and value is False
            if (key not in _ANNOTATIONS and not restates_default
                    and not (path and path[-1] in ("properties", "$defs", "definitions"))):
                yield path, key
            yield from _keyword_paths(value, path + (key,))
    elif isinstance(node, list):
        for position, value in enumerate(node):
            yield from _keyword_paths(value, path + (position,))


def _unenforced_keywords(schema: dict, pattern: str) -> list[str]:
    """`/path/keyword` of each keyword whose removal leaves the regex unchanged."""
    occurrences = list(_keyword_paths(schema))
    if len(occurrences) > _MAX_CHECKED_KEYWORDS:
        return [f"(not checked: more than {_MAX_CHECKED_KEYWORDS} keywords)"]
    unenforced = []
    for path, keyword in occurrences:
        trimmed = copy.deepcopy(schema)
        node = trimmed
        for step in path:
            node = node[step]
        del node[keyword]
        try:
            same = _translated(json.dumps(trimmed)) == pattern
        except ValueError:
            same = False  # the keyword was needed to translate the schema at all
        if same:
            unenforced.append("/" + "/".join(str(step) for step in (*path, keyword)))
    return unenforced
