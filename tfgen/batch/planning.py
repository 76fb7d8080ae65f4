"""The plan of a batch job: per-row sampling keys, and which rows are generated together.

Rows are cut into *windows* of consecutive rows; inside a window they are sorted by prompt length and cut into
*groups* of `batch_size` rows padded to one length bucket; a *step* runs one group per replica. Keys and
groups depend only on the input, the job seed, `batch_size`, `window` and the bucket policy — never on the
number of replicas or on where a run was interrupted — which is what makes runs resumable and reproducible.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

from tfgen.batch.options import WINDOW_GROUPS, WINDOW_SPLITS
from tfgen.batch.rows import id_key
from tfgen.decoding.random import derive_seeds


def check_job_seed(seed) -> np.ndarray:
    """The job seed as int32 `[2]` (two integers that fit in 32 bits, signed or not); raises ValueError."""
    array = np.asarray(seed)
    if array.shape != (2,) or array.dtype == object or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"seed must be two integers, got {seed!r}")
    if array.min() < -(2**31) or array.max() >= 2**32:
        raise ValueError(f"seed values must fit in 32 bits, got {seed!r}")
    return (array.astype(np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


def row_seeds(seed, row_ids: Sequence) -> np.ndarray:
    """int32 `[n, 2]` sampling keys, one per row id, from the job seed `[2]`.

    Each key derives from the job seed and a 64-bit hash (sha256) of the id's JSON text, through two
    `derive_seeds` steps (the high, then the low 32 bits), so a row samples the same tokens whatever batch,
    position or replica it lands in, and two ids share a key only with probability ~2**-64.
    """
    job_seed = check_job_seed(seed)
    if not len(row_ids):
        return np.zeros([0, 2], np.int32)
    hashes = np.array(
        [int.from_bytes(hashlib.sha256(id_key(row_id).encode()).digest()[:8], "big") for row_id in row_ids],
        np.uint64,
    )
    keys = np.tile(job_seed, [len(row_ids), 1])
    for half in (hashes >> np.uint64(32), hashes & np.uint64(0xFFFFFFFF)):
        keys = derive_seeds(keys, half.astype(np.int64)).numpy()
    return keys


def default_window(rows: int, batch_size: int) -> int:
    """The window of a job of `rows` valid rows when the caller sets none: `rows / WINDOW_SPLITS` rounded up to whole
    groups of `batch_size`, between one group and `WINDOW_GROUPS` groups. So a small job is cut into about
    `WINDOW_SPLITS` windows (an interrupted 20-row job has saved what it finished) and a large one sorts
    `WINDOW_GROUPS` groups together; like the window itself it depends on the input and `batch_size` only."""
    groups = -(-rows // WINDOW_SPLITS // batch_size) if rows else 1
    return batch_size * min(WINDOW_GROUPS, max(1, groups))


def windows(total: int, window: int, first_row: int = 0) -> Iterator[tuple[int, int]]:
    """`(start, stop)` of the windows of `total` rows, from the one holding `first_row` (a resumed job redoes
    that window's rows, which come out the same since the window is the same); none when all are done."""
    if first_row >= total:
        return
    for start in range(first_row - first_row % window, total, window):
        yield start, min(start + window, total)


class Group(NamedTuple):
    """Rows (table indices) generated together in one compiled call, left-padded to `width` columns."""

    rows: np.ndarray
    width: int


def plan_window(lengths: np.ndarray, start: int, stop: int, batch_size: int, buckets) -> list[Group]:
    """Groups of rows `[start, stop)` given all prompt lengths int64 `[n]`: sorted by length (ties in input
    order), cut every `batch_size` rows, each as wide as `buckets.prompt_length` of its longest prompt."""
    order = start + np.argsort(lengths[start:stop], kind="stable")
    return [
        Group(rows, buckets.prompt_length(int(lengths[rows].max())))
        for rows in np.split(order, np.arange(batch_size, len(order), batch_size))
    ]


def steps(groups: list[Group], replicas: int) -> Iterator[list[Group | None]]:
    """Lists of `replicas` groups of one width (one compiled program); `None` fills a short last step."""
    by_width: dict[int, list[Group]] = {}
    for group in groups:
        by_width.setdefault(group.width, []).append(group)
    for same_width in by_width.values():
        for first in range(0, len(same_width), replicas):
            step = same_width[first : first + replicas]
            yield step + [None] * (replicas - len(step))
