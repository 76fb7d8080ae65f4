"""The batch job's defaults and the choices of its options, free of TensorFlow so that `tfgen batch --help` can
build its argument parser without importing it."""

from __future__ import annotations

DEFAULT_BATCH_SIZE = 8
DEFAULT_SEED = (0, 0)
#: The default window is at most this many groups of `batch_size` rows ...
WINDOW_GROUPS = 64
#: ... and small enough to cut the job into at least this many windows (a whole number of groups, at least one), so
#: that an interrupted small job has saved what it finished (`tfgen.batch.planning.default_window`).
WINDOW_SPLITS = 8
#: Names accepted by `make_strategy`: which `tf.distribute` strategy spreads the job over devices.
DISTRIBUTION_STRATEGIES = ("auto", "default", "mirrored", "tpu", "multi-worker")
#: What a file job does with bad input rows: stop before generating anything, or skip them.
ON_ERROR = ("stop", "skip")
INPUT_FORMATS = ("auto", "jsonl", "tfrecord")
