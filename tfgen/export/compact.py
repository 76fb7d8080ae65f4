"""One constant per value in each function of a written SavedModel (`merge_constants`).

`tf.saved_model.load` rebuilds every op of every saved function as a Python object, at ~0.1 ms an op: that is
what loading an export costs (SmolLM2-135M's full export: 168k ops, ~26 s here). About half of those ops are
`Const` nodes that tracing made one per use — the begin / end / strides of each slice, each reshape's shape, the
same `[1]` or `0.5` a thousand times in one decode step. Merging the identical ones in each function, in the
written `saved_model.pb`, changes no computation and removes ~44% of the ops (and as much of the graph each
signature's first call lowers to XLA).

A constant is merged into the first one with the same value, dtype, device and control inputs, in the same
function; references to it (`name:output:0`, control inputs `^name`, the function's returns) are renamed. Kept
as they are: constants a saved object names (`captured_tensor`: the loader looks them up by name) and control
returns.
"""

from __future__ import annotations

import os
from collections import defaultdict

from tensorflow.core.framework import function_pb2
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.saved_model import fingerprinting_utils

SAVED_MODEL_FILE = "saved_model.pb"


def merge_constants(directory: str | os.PathLike) -> tuple[int, int]:
    """Merges identical constants in each function of `directory/saved_model.pb`, rewriting the file (and the
    `fingerprint.pb` that describes it); returns the (before, after) counts of the functions' ops."""
    path = os.path.join(os.fspath(directory), SAVED_MODEL_FILE)
    with open(path, "rb") as file:
        saved_model = saved_model_pb2.SavedModel.FromString(file.read())
    before = after = 0
    for meta_graph in saved_model.meta_graphs:
        named = defaultdict(set)  # function -> names of its ops a saved object refers to
        for node in meta_graph.object_graph_def.nodes:
            if node.WhichOneof("kind") == "captured_tensor":
                named[node.captured_tensor.concrete_function].add(node.captured_tensor.name.split(":")[0])
        for function in meta_graph.graph_def.library.function:
            before += len(function.node_def)
            _merge_in_function(function, named[function.signature.name] | set(function.control_ret.values()))
            after += len(function.node_def)
    with open(path, "wb") as file:
        file.write(saved_model.SerializeToString())
    fingerprinting_utils.write_fingerprint(os.fspath(directory))
    return before, after


def _merge_in_function(function: function_pb2.FunctionDef, keep: set[str]) -> None:
    """Merges `function`'s identical `Const` nodes in place, except those named in `keep`."""
    first, renamed = {}, {}
    for node in function.node_def:
        if node.op != "Const" or node.name in keep:
            continue
        key = (tuple(node.input), node.device,
               tuple(sorted((name, value.SerializeToString(deterministic=True)) for name, value in node.attr.items())))
        if key in first:
            renamed[node.name] = first[key]
        else:
            first[key] = node.name
    if not renamed:
        return
    kept = [node for node in function.node_def if node.name not in renamed]
    for node in kept:
        inputs, controls = [], set()
        for reference in node.input:
            reference = _renamed(reference, renamed)
            if reference.startswith("^"):
                if reference in controls:  # two merged constants: one control input is enough
                    continue
                controls.add(reference)
            inputs.append(reference)
        node.ClearField("input")
        node.input.extend(inputs)
    function.ClearField("node_def")
    function.node_def.extend(kept)
    for name in list(function.ret):
        function.ret[name] = _renamed(function.ret[name], renamed)


def _renamed(reference: str, renamed: dict[str, str]) -> str:
    """An input reference (`op:output:index`, `^op` or a function argument) with its op renamed."""
    control = reference.startswith("^")
    op, colon, rest = reference[control:].partition(":")
    return ("^" if control else "") + renamed.get(op, op) + colon + rest
