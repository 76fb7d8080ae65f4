"""What keeps a `jit_compile=False` export runnable without XLA, and the variables an export tracks (helpers of
`tfgen.export.saved_model`)."""

from __future__ import annotations

import tensorflow as tf


def xla_only_ops(functions) -> set[str]:
    """Op types (TF's `Xla*` ops) in the functions' graphs that TF runs only by compiling them with XLA."""
    found = set()
    for function in functions:
        graph_def = function.graph.as_graph_def()
        nodes = list(graph_def.node) + [node for f in graph_def.library.function for node in f.node_def]
        found.update(node.op for node in nodes if node.op.startswith("Xla"))
    return found


class WithoutStaticTokenCount:
    """The model, with the token count of each cached call hidden from static shape inference.

    GPT-2 writes a static number of new tokens into its cache with `dynamic_update_slice` — an XLA op that TF
    runs only by compiling it, which TF Serving refuses unless started with XLA enabled — and an unknown number
    with plain TF ops. A `jit_compile=False` export wraps the model in this so that it stays XLA-free.
    """

    def __init__(self, model):
        self._model = model

    def __getattr__(self, name):
        return getattr(self._model, name)

    def decoding_view(self, rows):
        # The model's view would call the unwrapped model; this wrapper must stay in between.
        return self

    def call_with_cache(self, input_ids, *args, **kwargs):
        unknown_length = tf.compat.v1.placeholder_with_default(input_ids, [None, None])
        return self._model.call_with_cache(unknown_length, *args, **kwargs)


def model_variables(model) -> list:
    """The `tf.Variable`s behind `model.variables`.

    The export tracks these rather than the model: Keras 3 wraps each in a KerasVariable that SavedModel saves
    as a separate copy, which the TF1 loader (TF Serving's) restores while the functions read the original.
    """
    found = []
    for variable in model.variables:
        inner = variable if isinstance(variable, tf.Variable) else getattr(variable, "value", None)
        if not isinstance(inner, tf.Variable):
            raise TypeError(f"model: cannot find the tf.Variable behind {variable!r}")
        found.append(inner)
    return found
