"""Shape buckets: how request shapes are rounded up so that ragged traffic reuses a handful of compiled programs."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class BucketPolicy:
    """How request shapes are rounded up so that ragged traffic reuses a handful of compiled programs.

    Batch sizes round up to a power of two up to `batch_step`, then to a multiple of it; prompt lengths and
    new-token budgets round up to multiples of `length_step` / `new_tokens_step`. The padding is exact: extra
    prompt columns are left padding under the attention mask, extra rows are discarded, and the loop stops at
    the real budget (it is a tensor), not at the bucket.
    """

    batch_step: int = 8
    length_step: int = 16
    new_tokens_step: int = 16

    def batch(self, size: int) -> int:
        if size <= self.batch_step:
            return 1 << (size - 1).bit_length()
        return _round_up(size, self.batch_step)

    def prompt_length(self, length: int) -> int:
        return _round_up(length, self.length_step)

    def new_tokens(self, count: int) -> int:
        return _round_up(count, self.new_tokens_step)


EXACT_SHAPES = BucketPolicy(batch_step=1, length_step=1, new_tokens_step=1)
DEFAULT_BUCKETS = BucketPolicy()


def _round_up(value: int, step: int) -> int:
    return max(step, -(-value // step) * step)
