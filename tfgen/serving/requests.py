"""What `tfgen serve` does with a request once it has its body: TF Serving's REST formats, and the checks that turn
every malformed request into a `RequestError` (a 4xx answer naming the field) before any signature runs. The HTTP side
(routes, methods, timeouts, the connection cap) is `tfgen/serving/http.py`.

The request's knob inputs (temperature, top_p, ...) are checked against `tfgen.config.knobs`, the rule set that
`generate()` and the export's in-graph checks read, so the server refuses exactly what they refuse and says it
in their words.
"""

from __future__ import annotations

import base64
import json
import math

import numpy as np
import tensorflow as tf

from tfgen.config.knobs import KNOBS, REQUEST_VALUES
from tfgen.serving.batching import engine_text
from tfgen.serving.errors import bad_request
from tfgen.serving.served_model import ServedModel
from tfgen.value_types import is_real

TEXT_SIGNATURE = "generate_text"
# Requests nest a few levels (body, instances, row, a rank-3 input at most); anything deeper is refused before it
# reaches code that recurses.
MAX_JSON_DEPTH = 32

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def parse_json_body(raw: bytes):
    """The request body as JSON; malformed, non-UTF-8 or too deeply nested bodies are a 400 RequestError.

    NaN and Infinity literals parse (TF Serving accepts them in float inputs); the knob checks decide.
    """
    try:
        body = json.loads(raw)
    except RecursionError:
        raise bad_request(f"malformed JSON: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise bad_request(f"malformed JSON: {error}") from None
    # Iterative, so the check itself cannot overflow the stack.
    level, depth = [body], 0
    while level:
        depth += 1
        if depth > MAX_JSON_DEPTH:
            raise bad_request(f"malformed JSON: nested deeper than {MAX_JSON_DEPTH} levels")
        level = [child for value in level if isinstance(value, (list, dict))
                 for child in (value.values() if isinstance(value, dict) else value)]
    return body


# ----------------------------------------------------------------------------------------------------------
# TF Serving's REST formats


def parse_predict_request(body, model: ServedModel) -> tuple[str, dict[str, np.ndarray], bool]:
    """Returns (signature name, inputs as numpy arrays, whether the request used the row format), every input
    checked (dtype, shape, batch size, knob ranges) so that a bad request fails here, before the graph runs."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {_json_type(body)}")
    unknown = set(body) - {"signature_name", "instances", "inputs"}
    if unknown:
        raise bad_request(f"unknown request fields: {sorted(unknown)}")
    signature_name = body.get("signature_name", "")
    if not isinstance(signature_name, str):
        raise bad_request(f"signature_name must be a string, got {_json_type(signature_name)}")
    signature_name = signature_for(model, signature_name)
    specs = model.input_specs[signature_name]
    if ("instances" in body) == ("inputs" in body):
        raise bad_request("send exactly one of 'instances' (row format) or 'inputs' (columnar format)")
    row_format = "instances" in body
    if row_format:
        columns = _columns_from_instances(body["instances"], specs)
    else:
        columns = _named(body["inputs"], specs, "inputs")
    arrays = {name: _to_array(columns[name], spec, name) for name, spec in specs.items()}
    check_arrays(signature_name, arrays, specs)
    return signature_name, arrays, row_format


def signature_for(model: ServedModel, signature_name: str) -> str:
    """The signature a request names: "" is `serving_default` (TF Serving's reading); one the model lacks is a
    400 RequestError listing those it has."""
    signature_name = signature_name or "serving_default"
    if signature_name not in model.signatures:
        raise bad_request(f"signature_name {signature_name!r} not found; the model has {sorted(model.signatures)}")
    return signature_name


def check_arrays(signature_name: str, arrays: dict[str, np.ndarray], specs: dict) -> None:
    """Checks typed numpy inputs (parsed from JSON, or TensorProtos over gRPC) against the signature's input
    `specs` before it runs: exactly its input names, each input's dtype and shape, one batch size, at least one
    row, then `check_inputs` (knob ranges, empty texts). Raises a 400 RequestError naming the input at fault."""
    missing, unknown = set(specs) - set(arrays), set(arrays) - set(specs)
    if missing or unknown:
        raise bad_request(
            f"inputs: the signature takes {sorted(specs)}; missing {sorted(missing)}, unknown {sorted(unknown)}"
        )
    for name, spec in specs.items():
        array = arrays[name]
        if array.dtype != spec.dtype.as_numpy_dtype:
            dtype = "string" if array.dtype == object else array.dtype.name
            raise bad_request(f"input {name!r} has dtype {dtype}, the signature wants {spec.dtype.name}")
        if array.ndim != spec.shape.rank or not spec.shape.is_compatible_with(array.shape):
            raise bad_request(
                f"input {name!r} has shape {list(array.shape)}, the signature wants {_shape_text(spec.shape)}"
            )
    # Shared knobs (a `structured` signature's automaton tables) have no batch axis.
    batch_sizes = {name: array.shape[0] for name, array in arrays.items()
                   if array.ndim and (name not in KNOBS or KNOBS[name].per_row)}
    if len(set(batch_sizes.values())) > 1:
        raise bad_request(f"inputs disagree on the batch size: {batch_sizes}")
    if 0 in batch_sizes.values():
        raise bad_request("the batch is empty: send at least one row")
    check_inputs(signature_name, arrays)


def check_inputs(signature_name: str, arrays: dict[str, np.ndarray]) -> None:
    """Refuses values the export would refuse, with the same words, before the signature runs: knob inputs out
    of their `tfgen.config.knobs` range, and empty texts (`generate_text` has no bos token to start from)."""
    for name, array in arrays.items():
        knob = KNOBS.get(name) or REQUEST_VALUES.get(name)
        if knob is not None and not knob.is_valid(array):
            row = next(row for row in range(len(array)) if not knob.is_valid(array[row]))
            raise bad_request(f"{name} must be {knob.requirement}; row {row} has {_json_text(array[row].tolist())}")
    if signature_name == TEXT_SIGNATURE:
        empty = [index for index, text in enumerate(arrays["text"].tolist()) if not text]
        if empty:
            raise bad_request(f"text[{empty[0]}] is empty: generate_text needs at least one character to continue "
                              "(it adds no bos token)")


def format_predict_response(outputs: dict[str, np.ndarray], row_format: bool) -> dict:
    """TF Serving's response: `predictions` (one entry per row) or `outputs` (one entry per output), each entry a
    bare value when the signature has a single output."""
    values = {name: json_value(array) for name, array in outputs.items()}
    if not row_format:
        return {"outputs": next(iter(values.values())) if len(values) == 1 else values}
    rows = len(next(iter(values.values())))
    if len(values) == 1:
        return {"predictions": next(iter(values.values()))}
    return {"predictions": [{name: column[row] for name, column in values.items()} for row in range(rows)]}


def generate_text(model: ServedModel, body) -> dict:
    """`{"text": str | [str]}` -> `{"text": ...}` of the same shape, through the `generate_text` signature."""
    if TEXT_SIGNATURE not in model.signatures:
        raise bad_request(
            f"this export has no {TEXT_SIGNATURE} signature (export with a byte-level BPE tokenizer and tfgen[text])"
        )
    if not isinstance(body, dict) or set(body) != {"text"}:
        raise bad_request('the body must be {"text": "..."} or {"text": ["...", ...]}')
    text = body["text"]
    single = isinstance(text, str)
    texts = [text] if single else text
    if not isinstance(texts, list) or not texts or not all(isinstance(item, str) for item in texts):
        raise bad_request("text must be a string or a non-empty list of strings")
    inputs = {"text": np.array([_utf8(item, f"text[{index}]") for index, item in enumerate(texts)], dtype=object)}
    check_inputs(TEXT_SIGNATURE, inputs)
    generated = None
    if model.engine is not None:
        generated = engine_text(model, list(inputs["text"]))
    if generated is None:
        generated = json_value(model.predict(TEXT_SIGNATURE, inputs)["text"])
    return {"text": generated[0] if single else generated}


def json_value(array: np.ndarray):
    """A signature output as JSON-ready lists (strings decoded as UTF-8, invalid bytes replaced)."""
    if array.dtype == object:
        return np.vectorize(lambda item: item.decode("utf-8", errors="replace"), otypes=[object])(array).tolist()
    return array.tolist()


def _named(value, specs: dict, where: str) -> dict:
    """`value` as {input name: value}; a bare value is accepted when the signature has a single input."""
    if not isinstance(value, dict) or (len(specs) == 1 and set(value) != set(specs)):
        if len(specs) != 1:
            raise bad_request(f"{where} must be an object with the inputs {sorted(specs)}, got {_json_type(value)}")
        return {next(iter(specs)): value}
    missing, unknown = set(specs) - set(value), set(value) - set(specs)
    if missing or unknown:
        raise bad_request(
            f"{where}: the signature takes {sorted(specs)}; missing {sorted(missing)}, unknown {sorted(unknown)}"
        )
    return value


def _columns_from_instances(instances, specs: dict) -> dict:
    if not isinstance(instances, list) or not instances:
        raise bad_request(f"instances must be a non-empty list (one entry per row), got {_json_type(instances)}")
    rows = [_named(instance, specs, f"instances[{index}]") for index, instance in enumerate(instances)]
    return {name: [row[name] for row in rows] for name in specs}


def _to_array(value, spec: tf.TensorSpec, name: str) -> np.ndarray:
    """The JSON value as a numpy array of the input's dtype (TF Serving's dtype rules), every element checked: no
    booleans or strings for numbers, integers within the dtype's range, floats within float32's, true / false (or
    0 / 1) for bools."""
    shape, leaves = _rectangular(value, name)
    if spec.dtype == tf.string:
        array = np.empty(len(leaves), dtype=object)
        array[:] = [_string(leaf, name) for leaf in leaves]
    else:
        dtype = spec.dtype.as_numpy_dtype
        for leaf in leaves:
            _check_number(leaf, spec.dtype, name)
        array = np.array(leaves, dtype=dtype)
    return array.reshape(shape)  # check_arrays checks the shape


def _rectangular(value, name: str) -> tuple[list[int], list]:
    """(shape, leaves in row-major order) of nested JSON lists; ragged nesting is a RequestError."""
    shape, level = [], [value]
    while level and all(isinstance(item, list) for item in level):
        lengths = {len(item) for item in level}
        if len(lengths) > 1:
            raise bad_request(f"input {name!r} must be a rectangular array: its rows have lengths {sorted(lengths)}")
        shape.append(lengths.pop())
        level = [child for item in level for child in item]
    if any(isinstance(item, list) for item in level):
        raise bad_request(f"input {name!r} must be a rectangular array: it mixes lists and values at one depth")
    return shape, level


def _check_number(leaf, dtype: tf.DType, name: str) -> None:
    if dtype == tf.bool:
        # TF Serving takes JSON booleans; 0 and 1 are read as false and true, any other number is refused (numpy
        # would read 7 as true).
        if type(leaf) is not bool and not (type(leaf) is int and leaf in (0, 1)):
            raise bad_request(f"input {name!r} must hold bool values (true or false), found {_json_text(leaf)}")
    elif dtype.is_integer:
        if type(leaf) is not int:
            raise bad_request(f"input {name!r} must hold {dtype.name} values (integers), found {_json_text(leaf)}")
        limits = np.iinfo(dtype.as_numpy_dtype)
        if not limits.min <= leaf <= limits.max:
            raise bad_request(f"input {name!r}: {_json_text(leaf)} is outside the {dtype.name} range "
                              f"[{limits.min}, {limits.max}]")
    elif not is_real(leaf):
        raise bad_request(f"input {name!r} must hold {dtype.name} values (numbers), found {_json_text(leaf)}")
    elif math.isfinite(leaf) and abs(leaf) > _FLOAT32_MAX:
        # Rounding it to float32 would make it infinite: a value the client did not send.
        raise bad_request(f"input {name!r}: {_json_text(leaf)} is outside the float32 range")


def _string(leaf, name: str) -> bytes:
    """A str or TF Serving's {"b64": ...} encoding of binary strings, as bytes."""
    if isinstance(leaf, str):
        return _utf8(leaf, f"input {name!r}")
    if isinstance(leaf, dict) and set(leaf) == {"b64"} and isinstance(leaf["b64"], str):
        try:
            return base64.b64decode(leaf["b64"], validate=True)
        except ValueError:
            raise bad_request(f"input {name!r}: invalid base64") from None
    raise bad_request(f"input {name!r} must hold strings, found {_json_text(leaf)}")


def _utf8(text: str, where: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:
        # JSON's "\ud800" escapes decode to lone surrogates, which no UTF-8 text can hold.
        raise bad_request(f"{where} is not valid Unicode: {error.reason} at character {error.start}") from None


def _json_type(value) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _json_text(value, limit: int = 40) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _shape_text(shape: tf.TensorShape) -> str:
    return "[" + ", ".join("B" if index == 0 else ("*" if dim is None else str(dim))
                           for index, dim in enumerate(shape.as_list())) + "]"
