"""`tfgen.export.compact.merge_constants`: the written SavedModel loads with fewer ops and computes the same."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from tfgen.export.compact import merge_constants


class _Repeats(tf.Module):
    """Slices, reshapes and a loop: tracing writes the same constants many times; `silu` saves a custom gradient,
    whose captured constants a saved object refers to by name."""

    @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.float32)])
    def run(self, x):
        y = x[:, 1:3] * 0.5 + x[:, 2:4] * 0.5 + tf.reshape(x[:, :2], [-1, 2])

        def body(step, y):
            return step + 1, tf.nn.silu(y[:, :2] * 0.5) + tf.reshape(y, [-1, 2])

        return tf.while_loop(lambda step, _: step < 3, body, (tf.constant(0), y))[1]


def _ops(path) -> int:
    with open(path / "saved_model.pb", "rb") as file:
        saved = saved_model_pb2.SavedModel.FromString(file.read())
    return sum(len(function.node_def) for function in saved.meta_graphs[0].graph_def.library.function)


def test_merged_constants_compute_the_same_with_fewer_ops(tmp_path):
    module = _Repeats()
    path = tmp_path / "saved"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.run})
    x = np.random.default_rng(0).normal(size=[3, 6]).astype(np.float32)
    expected = module.run(x).numpy()
    fingerprint = tf.saved_model.experimental.read_fingerprint(str(path)).saved_model_checksum
    written = _ops(path)
    before, after = merge_constants(path)
    assert before == written and after == _ops(path) < before
    # The fingerprint describes the rewritten file.
    assert tf.saved_model.experimental.read_fingerprint(str(path)).saved_model_checksum != fingerprint
    loaded = tf.saved_model.load(str(path))
    np.testing.assert_array_equal(loaded.run(x).numpy(), expected)
    np.testing.assert_array_equal(loaded.signatures["serving_default"](x=tf.constant(x))["output_0"].numpy(),
                                  expected)
    assert merge_constants(path)[1] == after  # a second pass finds nothing left to merge
