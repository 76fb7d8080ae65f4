"""The continuous-batching scheduler: one thread that admits queued rows into free decode slots and advances every
running slot a few tokens per call, handing each row its tokens as they come.

    clients ──submit(rows)──▶ bounded queue ──admit (one slot_insert per round)──▶ slots [S]
                                   │ full: 503 + Retry-After                          │
                                   ▼                                                  ▼
                              EngineFull                    slot_steps(k tokens) ──▶ deliver new tokens
                                                            (rows join and leave between calls)

Rows are independent (per-row seeds, knobs and budgets inside the programs), so a row's tokens are the ones a lone
`generate()` call gives it, whoever shares the batch. A cancelled row (a client that hung up) frees its slot at the
next call.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections import deque

import numpy as np
import tensorflow as tf

from tfgen.config.knobs import KNOBS
from tfgen.engine.options import DEFAULT_QUEUE_PER_SLOT, DEFAULT_STEPS_PER_CALL
from tfgen.engine.slot_state import LOGPROBS_ENTRIES, REQUEST_KNOBS, SlotState

logger = logging.getLogger(__name__)
_MIN_PROMPT_BUCKET = 8


class EngineFull(Exception):
    """The queue holds as many rows as it may: the caller should answer 503 with Retry-After."""


class EngineStopped(Exception):
    """The engine was closed, or its programs failed, before the row finished."""


@dataclasses.dataclass(eq=False)
class Row:
    """One row to decode and, as it runs, its tokens.

    input_ids / attention_mask: int32 `[W]`, the row as sent (its own left padding included). The knobs are those
    of the `sample` signature; `do_sample` false decodes greedily. `tokens` grows as the row decodes; `listener`
    (a queue) receives each new run of tokens as a list, then None when the row ended. `done` is set at the end;
    `error` says why a row ended early (it then has no answer). With `logprobs` (the programs must record them,
    `top_logprobs` > 0), `token_logprobs` grows with `tokens`: per token, (its raw log-probability, the ids and
    log-probabilities of the programs' K most likely tokens, most likely first), as `SlotState.logprobs` holds them.
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    max_new_tokens: int
    do_sample: bool = False
    seed: tuple = (0, 0)
    temperature: float = KNOBS["temperature"].neutral
    top_k: int = KNOBS["top_k"].neutral
    top_p: float = KNOBS["top_p"].neutral
    listener: queue.SimpleQueue | None = None
    logprobs: bool = False
    tokens: list = dataclasses.field(default_factory=list)
    token_logprobs: list = dataclasses.field(default_factory=list)
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    error: BaseException | None = None
    cancelled: bool = False
    slot: int | None = None

    @property
    def width(self) -> int:
        return int(len(self.input_ids))

    def wait(self, timeout: float | None = None) -> list:
        """The row's new tokens once it ended; EngineStopped when it could not finish, TimeoutError after
        `timeout` seconds."""
        if not self.done.wait(timeout):
            raise TimeoutError("the row did not finish in time")
        if self.error is not None:
            raise self.error
        return self.tokens


class SlotEngine:
    """Drives slot programs (`programs`: `init()`, `insert(state, rows)`, `steps(state, max_steps, release, rows)`
    over slots `[0, rows)` for `rows` in `programs.row_buckets`, and the sizes `slots`, `length`, `budget_cap`,
    `top_logprobs`; the state a `SlotState`) from a scheduler thread, started on the first `submit`.

    steps_per_call: tokens each running row gets per `steps` call (a new row waits at most that long to join;
    more amortise the call's fixed costs). max_queue: rows that may wait for a slot; `submit` raises EngineFull
    beyond it.
    """

    def __init__(self, programs, *, steps_per_call: int = DEFAULT_STEPS_PER_CALL, max_queue: int | None = None):
        for name, value in (("steps_per_call", steps_per_call), ("max_queue", max_queue)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.programs = programs
        self.slots, self.length, self.budget_cap = programs.slots, programs.length, programs.budget_cap
        #: K of the log-probabilities the programs record per token (0: none; rows cannot ask for them).
        self.top_logprobs = int(getattr(programs, "top_logprobs", 0))
        self.steps_per_call = steps_per_call
        self.max_queue = max_queue or DEFAULT_QUEUE_PER_SLOT * self.slots
        self._waiting: deque[Row] = deque()
        self._owners: list[Row | None] = [None] * self.slots
        self._condition = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._state: SlotState | None = None
        #: Calls made so far (for tests and the benchmark): inserts, steps, rows admitted.
        self.counts = {"insert": 0, "steps": 0, "rows": 0}

    def fits(self, width: int, max_new_tokens: int) -> bool:
        """Whether a row of `width` columns and this budget fits a slot (else it must run as a whole call)."""
        return 1 <= width and width + min(max(max_new_tokens, 0), self.budget_cap) <= self.length

    def submit(self, rows: list[Row]) -> None:
        """Queues `rows` (all or none: EngineFull when they would overflow the queue)."""
        for row in rows:
            if not self.fits(row.width, row.max_new_tokens):
                raise ValueError(f"a row of {row.width} columns and {row.max_new_tokens} new tokens does not fit a "
                                 f"slot of {self.length} columns")
            if row.logprobs and not self.top_logprobs:
                raise ValueError("logprobs: these slot programs record no log-probabilities")
        with self._condition:
            if self._closed:
                raise EngineStopped("the engine is closed")
            if len(self._waiting) + len(rows) > self.max_queue:
                raise EngineFull(f"{len(self._waiting)} rows are waiting for a decode slot, the limit is "
                                 f"{self.max_queue}")
            self._waiting.extend(rows)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tfgen-slots", daemon=True)
                self._thread.start()
            self._condition.notify()

    def cancel(self, row: Row) -> None:
        """Ends `row` early (its client left): it leaves the queue, or its slot is freed at the next call."""
        with self._condition:
            row.cancelled = True
            if row in self._waiting:
                self._waiting.remove(row)
                self._end(row, EngineStopped("cancelled"))
            self._condition.notify()

    @property
    def busy_slots(self) -> int:
        with self._condition:
            return sum(owner is not None for owner in self._owners)

    @property
    def queued(self) -> int:
        with self._condition:
            return len(self._waiting)

    def close(self) -> None:
        """Stops the thread; rows not finished end with EngineStopped."""
        with self._condition:
            self._closed = True
            self._condition.notify()
        if self._thread is not None:
            self._thread.join(timeout=60)

    # ------------------------------------------------------------------------------------------------------
    # The scheduler thread

    def _run(self) -> None:
        try:
            self._state = self.programs.init()
            while True:
                with self._condition:
                    while not self._closed and not self._waiting and not any(self._owners):
                        self._condition.wait()
                    if self._closed:
                        break
                    admitted, spare = self._take_waiting()
                    released = self._release_cancelled()
                if admitted:
                    self._state = self.programs.insert(self._state, self._insert_rows(admitted, spare))
                    self.counts["insert"] += 1
                    self.counts["rows"] += len(admitted)
                    self._deliver()
                if any(self._owners) or released.any():
                    rows = self._rows_in_use(released)
                    # Which slots' rows want log-probabilities (programs recording none take no such argument).
                    wanted = ([np.array([row is not None and row.logprobs for row in self._owners])]
                              if self.top_logprobs else [])
                    self._state = self.programs.steps(self._state, self.steps_per_call, released, rows, *wanted)
                    self.counts["steps"] += 1
                    self._deliver()
        except BaseException as error:  # the programs failed: every row still here gets the error
            logger.exception("the continuous-batching engine stopped")
            failure = EngineStopped(f"the decode engine failed: {type(error).__name__}: {error}")
        else:
            failure = EngineStopped("the engine is closed")
        with self._condition:
            self._closed = True
            rows = [row for row in self._owners if row is not None] + list(self._waiting)
            self._owners = [None] * self.slots
            self._waiting.clear()
        for row in rows:
            self._end(row, failure)

    def _rows_in_use(self, released: np.ndarray) -> int:
        """The smallest row bucket of the programs covering every occupied or released slot (slots are taken
        lowest first, so a light load stays in a small bucket)."""
        used = [slot for slot, owner in enumerate(self._owners) if owner is not None] + list(np.flatnonzero(released))
        highest = max(used, default=0) + 1
        return next(rows for rows in self.programs.row_buckets if rows >= highest)

    def _take_waiting(self) -> tuple[list[Row], list[int]]:
        """(waiting rows given a free slot each, in arrival order; the slots still free), under the lock."""
        admitted = []
        free = [slot for slot, owner in enumerate(self._owners) if owner is None]
        while self._waiting and free:
            row = self._waiting.popleft()
            row.slot = free.pop(0)
            self._owners[row.slot] = row
            admitted.append(row)
        return admitted, free

    def _release_cancelled(self) -> np.ndarray:
        """bool `[S]`: slots of cancelled rows, freed now (under the lock)."""
        released = np.zeros([self.slots], bool)
        for slot, row in enumerate(self._owners):
            if row is not None and row.cancelled:
                released[slot] = True
                self._owners[slot] = None
                self._end(row, EngineStopped("cancelled"))
        return released

    def _insert_rows(self, rows: list[Row], spare: list[int]) -> dict:
        """The `insert` inputs for `rows`: right padded to a power-of-two width, and to a power-of-two count with
        empty rows (budget 0) aimed at `spare` free slots where there are enough — one program per bucket."""
        widest = max(row.width for row in rows)
        columns = min(max(_MIN_PROMPT_BUCKET, 1 << (widest - 1).bit_length()), self.length)
        padding = (1 << (len(rows) - 1).bit_length()) - len(rows)
        if 0 < padding <= len(spare):
            rows = rows + [Row(np.zeros([1], np.int32), np.ones([1], np.int32), 0, slot=slot)
                           for slot in spare[:padding]]
        count = len(rows)
        ids = np.zeros([count, columns], np.int32)
        mask = np.zeros([count, columns], np.int32)
        for index, row in enumerate(rows):
            ids[index, :row.width] = row.input_ids
            mask[index, :row.width] = row.attention_mask
        return {
            "input_ids": ids, "attention_mask": mask,
            "width": np.array([row.width for row in rows], np.int32),
            "slot": np.array([row.slot for row in rows], np.int32),
            "max_new_tokens": np.array([row.max_new_tokens for row in rows], np.int32),
            "seed": np.array([row.seed for row in rows], np.int32).reshape([count, 2]),
            "do_sample": np.array([row.do_sample for row in rows], bool),
            **{name: np.array([getattr(row, name) for row in rows], KNOBS[name].dtype) for name in REQUEST_KNOBS},
        }

    def _deliver(self) -> None:
        """Hands every slot's new tokens to its row; rows that finished leave their slot."""
        state = self._state
        generated = np.asarray(state.generated)
        finished = np.asarray(state.finished)
        tokens = np.asarray(state.tokens)
        # Read back only while a row asks for them ([S, L, K] each).
        logprobs = None
        if state.logprobs and any(row is not None and row.logprobs for row in self._owners):
            logprobs = [np.asarray(state.logprobs[name]) for name in LOGPROBS_ENTRIES]
        ended = []
        with self._condition:
            for slot, row in enumerate(self._owners):
                if row is None or row.cancelled:  # a cancelled row is released (and ended) at the next call
                    continue
                start, stop = row.width + len(row.tokens), row.width + int(generated[slot])
                if stop > start:
                    new = tokens[slot, start:stop].tolist()
                    if row.logprobs:  # before `tokens` grows: a reader of both never sees tokens without theirs
                        chosen, top_ids, top = (entry[slot, start:stop] for entry in logprobs)
                        row.token_logprobs.extend(zip(chosen.tolist(), top_ids.tolist(), top.tolist()))
                    row.tokens.extend(new)
                    if row.listener is not None:
                        row.listener.put(new)
                if finished[slot]:
                    self._owners[slot] = None
                    ended.append(row)
        for row in ended:
            self._end(row, None)

    @staticmethod
    def _end(row: Row, error: BaseException | None) -> None:
        if row.done.is_set():
            return
        row.error = error
        if row.listener is not None:
            row.listener.put(None)
        row.done.set()


class ExportedSlots:
    """The slot signatures of a loaded export (`slot_init`, `slot_insert`, `slot_steps`) as `SlotEngine` programs:
    the signatures take and return the state flat (`SlotState.to_flat`'s names), the engine holds it typed (its
    cache a tuple of leaves: only the programs look inside)."""

    def __init__(self, signatures: dict, info: dict):
        self._init, self._insert = signatures["slot_init"], signatures["slot_insert"]
        self.slots, self.length = int(info["slots"]), int(info["length"])
        self.row_buckets = [int(rows) for rows in info.get("row_buckets", [self.slots])]
        self._steps = {rows: signatures["slot_steps" if rows == self.slots else f"slot_steps_{rows}"]
                       for rows in self.row_buckets}
        self.budget_cap, self.pad_token_id = int(info["max_new_tokens"]), int(info["pad_token_id"])
        self.top_logprobs = int(info.get("top_logprobs", 0))  # 0 in exports made before the slot state had them
        # Exports made before `record_logprobs` record them in every step.
        self._records = "record_logprobs" in self._steps[self.slots].structured_input_signature[1]
        self.info = info

    def init(self) -> SlotState:
        return SlotState.from_flat(self._init())

    def insert(self, state: SlotState, rows: dict) -> SlotState:
        new = {f"new_{name}": tf.constant(value) for name, value in rows.items()}
        return SlotState.from_flat(self._insert(**state.to_flat(), **new))

    def steps(self, state: SlotState, max_steps: int, release: np.ndarray, rows: int,
              record: np.ndarray | None = None) -> SlotState:
        """`record`: bool `[S]`, the slots whose rows want log-probabilities (None: all of them)."""
        wanted = {}
        if self._records:
            wanted["record_logprobs"] = tf.constant(np.ones([self.slots], bool) if record is None else record)
        return SlotState.from_flat(self._steps[rows](**state.to_flat(), max_steps=tf.constant(max_steps, tf.int32),
                                                     release=tf.constant(release), **wanted))


def warm_up(engine: SlotEngine, timeout: float = 600.0) -> float:
    """Compiles `engine`'s programs now, not on a user's request: every row bucket of `steps` (on the empty state,
    which returns at once) and `insert` of one short row, decoded; returns the seconds it took."""
    began = time.perf_counter()
    programs = engine.programs
    empty = programs.init()
    for rows in programs.row_buckets:
        programs.steps(empty, 1, np.zeros([engine.slots], bool), rows)
    row = Row(np.ones([1], np.int32), np.ones([1], np.int32), max_new_tokens=2)
    engine.submit([row])
    row.wait(timeout)
    return time.perf_counter() - began


__all__ = ["EngineFull", "EngineStopped", "ExportedSlots", "Row", "SlotEngine", "warm_up"]
