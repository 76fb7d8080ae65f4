"""The half of a batch job's runner that needs no model: a `PromptTable`'s windows, groups and steps
(`tfgen.batch.planning`), each row's budget and sampling key, and the output records of what a step generated.

`tfgen.batch.runner.BatchRunner` runs the steps on a model's compiled programs; `tfgen.beam.export_job` runs them
through an export's signatures. Both inherit this one reading of a row, so their outputs are the same row for row.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from tfgen.batch.distribute import peers_checked
from tfgen.batch.planning import Group, plan_window, row_seeds, steps, windows
from tfgen.batch.rows import PromptTable
from tfgen.decoding.random import derive_seeds


class GroupRunner:
    """Generates the planned groups of a `PromptTable` and shapes the results into output records.

    A subclass sets `strategy` (a `tf.distribute.Strategy`), `tokenizer` (or None: `text` is None), `batch_size`,
    `window`, `job_seed` (int32 `[2]`), `max_new_tokens` (the job's budget), `eos_ids`, `pad_id`, `buckets` and
    `replicas`, and defines `run_step`.
    """

    def run_step(self, table: PromptTable, step: list[Group | None]) -> list[list]:
        """Runs one group per replica (`None`: a filler group); returns per group its rows' `(new tokens int32
        [at least the row's budget], generated length)`."""
        raise NotImplementedError

    def windows(self, table: PromptTable, first_row: int = 0) -> Iterator[tuple[int, list[dict]]]:
        """Yields `(start, results)` per window from the one holding `first_row`; `results` are the output
        records of rows `[start, start + len(results))` in input order."""
        lengths = table.lengths
        for start, stop in windows(len(table), self.window, first_row):
            generated: list = [None] * (stop - start)
            for step in steps(plan_window(lengths, start, stop, self.batch_size, self.buckets), self.replicas):
                with peers_checked(self.strategy):
                    step_outputs = self.run_step(table, step)
                for group, outputs in zip(step, step_outputs):
                    for row, row_output in zip(group.rows if group is not None else (), outputs):
                        generated[row - start] = row_output
            yield start, self._records(table, start, generated)

    def padded_prompts(self, table: PromptTable, rows, width: int) -> tuple[np.ndarray, np.ndarray]:
        """int32 `[batch_size, width]` ids and attention mask of the prompts of `rows` (table indices, at most
        `batch_size`), left-padded with `pad_id`; the rows past them are filler rows."""
        ids = np.full((self.batch_size, width), self.pad_id, np.int32)
        mask = np.zeros((self.batch_size, width), np.int32)
        mask[:, -1] = 1  # filler rows need one visible token to pass the checks; their budget is 0
        for index, row in enumerate(rows):
            prompt = table.prompt(row)
            ids[index, width - len(prompt) :] = prompt
            mask[index, width - len(prompt) :] = 1
        return ids, mask

    def _records(self, table: PromptTable, start: int, generated: list) -> list[dict]:
        """Output records of rows `start, start + 1, ...` from `(new tokens int32 [max_new_tokens], generated
        length)` each."""
        budgets = self.row_budgets(table, np.arange(start, start + len(generated)))
        finished = [self._trim(tokens, length, budget) for (tokens, length), budget in zip(generated, budgets)]
        token_lists = [tokens for tokens, _ in finished]
        texts = (
            self.tokenizer.batch_decode(token_lists, skip_special_tokens=True)
            if self.tokenizer is not None
            else [None] * len(token_lists)
        )
        return [
            {"id": table.ids[start + offset], "text": text, "token_ids": tokens, "finish_reason": reason}
            for offset, (text, (tokens, reason)) in enumerate(zip(texts, finished))
        ]

    def _trim(self, tokens: np.ndarray, length: int, budget: int) -> tuple[list, str]:
        """The row's generated ids (the first `length`, its last token included) and why it stopped: "eos",
        "length" (its `budget`) or "stop" (a stop string)."""
        tokens = tokens[:length]
        if length and int(tokens[-1]) in self.eos_ids:
            return tokens.tolist(), "eos"
        return tokens.tolist(), "length" if length == budget else "stop"

    def row_budgets(self, table: PromptTable, rows) -> np.ndarray:
        """int32 `[len(rows)]`: each row's `max_new_tokens`, its own or the job's."""
        own = table.options.get("max_new_tokens")
        if own is None:
            return np.full([len(rows)], self.max_new_tokens, np.int32)
        return np.where(own[rows] > 0, own[rows], self.max_new_tokens).astype(np.int32)

    def row_keys(self, table: PromptTable, rows) -> np.ndarray:
        """int32 `[len(rows), 2]` sampling keys: from the job seed and each id (`row_seeds`), or from the row's own
        `seed` as `generate(prompt, seed=seed)` keys a prompt alone."""
        keys = row_seeds(self.job_seed, [table.ids[row] for row in rows])
        has_seed = table.options.get("has_seed")
        if has_seed is not None and has_seed[rows].any():
            own = has_seed[rows]
            keys[own] = derive_seeds(table.options["seed"][rows][own], np.zeros([int(own.sum())], np.int64)).numpy()
        return keys
