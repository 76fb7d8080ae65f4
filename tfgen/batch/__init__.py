"""Generation over many prompts: length-bucketed batches on every replica of a `tf.distribute` strategy, with a
crash-safe, resumable JSONL output. The design and the multi-device recipes are in `docs/batch.md`.

The work is cut into *windows* of consecutive input rows. Inside a window rows are sorted by prompt length and
cut into *groups* of `batch_size` rows padded to one length bucket; each group is one compiled generate call on
one replica, and a *step* runs one group per replica with `strategy.run`. A window's results are appended to the
output in input order, with flush and fsync, before the next window starts. Which rows form a group, and how
wide it is, depends only on the input, `batch_size` and `window` — never on the number of replicas or on where a
run was interrupted — and every row samples with its own key derived from the job seed and its id. So a resumed
run, or a run on 2 or 64 replicas, writes exactly the rows an uninterrupted single-device run writes.

Modules, one concern each: `options` (defaults and option choices, TensorFlow-free), `inputs` (reading JSONL,
TFRecord and in-memory prompts), `rows` (row checks, bad rows, the prompt table), `chatrows` (`messages` rows and
their chat-template rendering), `rowoptions` (per-row options, honoured or refused by name), `planning` (row
seeds, windows, groups, steps), `grouprunner` (what needs no model: windows run step by step, row budgets and keys,
output records), `runner` (groups on replicas through generate()'s compiled programs), `jobfiles`
(the resumable output and its manifest), `rowdigests` (the digests that vouch for the output's rows), `joblock` (the
lock that keeps a second run off an output), `distribute` (strategies by name, a lost worker as `WorkerLost`),
`job` (`batch_generate`, `run_batch_job`).

The names below load on first use, so importing a TensorFlow-free module (`tfgen.batch.options`, as
`tfgen batch --help` does) does not import TensorFlow.

May import `tfgen.generation`, `tfgen.request` and everything below them.
"""

from __future__ import annotations

from tfgen.lazy import lazy_exports

_EXPORTS = {
    "BadRow": "tfgen.batch.rows",
    "BatchJobResult": "tfgen.batch.job",
    "DEFAULT_BATCH_SIZE": "tfgen.batch.options",
    "DEFAULT_SEED": "tfgen.batch.options",
    "DISTRIBUTION_STRATEGIES": "tfgen.batch.options",
    "INPUT_FORMATS": "tfgen.batch.options",
    "JobInterrupted": "tfgen.batch.job",
    "ON_ERROR": "tfgen.batch.options",
    "WINDOW_GROUPS": "tfgen.batch.options",
    "WINDOW_SPLITS": "tfgen.batch.options",
    "WorkerLost": "tfgen.batch.distribute",
    "batch_generate": "tfgen.batch.job",
    "make_strategy": "tfgen.batch.distribute",
    "row_seeds": "tfgen.batch.planning",
    "run_batch_job": "tfgen.batch.job",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
