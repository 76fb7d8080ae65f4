"""The batch job's defaults and the choices of its options, free of TensorFlow so that `tfgen batch --help` can
build its argument parser without importing it."""

from __future__ import annotations

DEFAULT_BATCH_SIZE = 8
DEFAULT_SEED = (0, 0)
#: The default window is this many groups of `batch_size` rows.
WINDOW_GROUPS = 64
#: New tokens per row when neither the call nor the generation config sets `max_new_tokens` (HF's default).
DEFAULT_MAX_NEW_TOKENS = 20
#: Names accepted by `make_strategy`: which `tf.distribute` strategy spreads the job over devices.
DISTRIBUTION_STRATEGIES = ("auto", "default", "mirrored", "tpu", "multi-worker")
#: What a file job does with bad input rows: stop before generating anything, or skip them.
ON_ERROR = ("stop", "skip")
INPUT_FORMATS = ("auto", "jsonl", "tfrecord")
