"""Streamers: receive new tokens while `generate(..., streamer=...)` runs its compiled loop in chunks.

The loop runs `chunk_steps` decode steps per compiled call, keeping the cache on the device between calls;
after each call the new tokens are handed to the streamer. A streamer gets the prompt first (`put` with the
prompt ids, unless it skips it) and then each step's tokens; `end()` closes the stream.
"""

from __future__ import annotations

import queue
import sys
from collections.abc import Callable
from typing import TextIO

import numpy as np

from tfgen.text.tokenizer_base import BaseTokenizer, IncrementalDecoder


class BaseStreamer:
    """Receives token ids as they are generated.

    put(token_ids): int32 numpy `[batch, n]`: first the prompt (n = prompt length), then one call per decode step
        with n = 1 (rows that already finished carry the pad id). end(): generation is over.
    chunk_steps: decode steps per compiled call; smaller is more responsive, larger has fewer host round trips.
    max_batch_size: the largest batch the streamer handles (None: any); generate() checks it before compiling.
    """

    chunk_steps: int = 4
    max_batch_size: int | None = None

    def put(self, token_ids: np.ndarray) -> None:
        raise NotImplementedError

    def end(self) -> None:
        """Called once after the last token."""


class TokenCallbackStreamer(BaseStreamer):
    """Calls `callback(token_ids)` with int32 `[batch]` once per generated step (a per-token hook)."""

    def __init__(self, callback: Callable[[np.ndarray], None], chunk_steps: int = 4):
        if not callable(callback):
            raise TypeError(f"streamer: callback must be callable, got {type(callback).__name__}")
        self.callback = callback
        self.chunk_steps = chunk_steps
        self._seen_prompt = False

    def put(self, token_ids: np.ndarray) -> None:
        if not self._seen_prompt:
            self._seen_prompt = True
            return
        self.callback(token_ids[:, 0])


class TextStreamer(BaseStreamer):
    """Prints decoded text to `stream` (stdout by default) as words complete. Batch size 1 only, like HF's.

    skip_prompt: do not print the prompt. skip_special_tokens: drop special tokens (eos, pad) from the text.
    """

    max_batch_size = 1

    def __init__(
        self,
        tokenizer: BaseTokenizer,
        skip_prompt: bool = False,
        skip_special_tokens: bool = True,
        stream: TextIO | None = None,
        chunk_steps: int = 4,
    ):
        self.decoder = IncrementalDecoder(tokenizer, skip_special_tokens=skip_special_tokens)
        self.skip_prompt = skip_prompt
        self.stream = stream
        self.chunk_steps = chunk_steps
        self._seen_prompt = False
        self._pending = ""
        self._finished = False
        self._eos_ids = {tokenizer.eos_token_id}

    def put(self, token_ids: np.ndarray) -> None:
        token_ids = np.asarray(token_ids)
        is_prompt = not self._seen_prompt
        self._seen_prompt = True
        if self._finished or (is_prompt and self.skip_prompt):
            return
        ids = token_ids[0].tolist()
        if not is_prompt and ids and ids[-1] in self._eos_ids:
            # After eos the loop only writes padding: the row is done.
            self._finished = True
        self._pending += self.decoder.push(ids)
        # Emit up to the last whitespace so words are never printed half-way.
        cut = max(self._pending.rfind(" "), self._pending.rfind("\n")) + 1
        if cut:
            self.on_text(self._pending[:cut], stream_end=False)
            self._pending = self._pending[cut:]

    def end(self) -> None:
        self._pending += self.decoder.flush()
        self.on_text(self._pending, stream_end=True)
        self._pending = ""

    def on_text(self, text: str, stream_end: bool = False) -> None:
        """Handles a piece of finished text; prints it (override to send it elsewhere)."""
        stream = self.stream or sys.stdout
        stream.write(text + ("\n" if stream_end else ""))
        stream.flush()


class TextIteratorStreamer(TextStreamer):
    """An iterator over text pieces, for a consumer thread or a web handler:

        streamer = TextIteratorStreamer(tokenizer)
        threading.Thread(target=model.generate, args=(ids,), kwargs={"streamer": streamer}).start()
        for piece in streamer: ...

    timeout: seconds to wait for the next piece before `queue.Empty` is raised (None: wait forever).
    """

    _END = object()

    def __init__(self, tokenizer: BaseTokenizer, skip_prompt: bool = False, timeout: float | None = None, **options):
        super().__init__(tokenizer, skip_prompt=skip_prompt, **options)
        self.timeout = timeout
        self._queue: queue.Queue = queue.Queue()

    def on_text(self, text: str, stream_end: bool = False) -> None:
        if text:
            self._queue.put(text)
        if stream_end:
            self._queue.put(self._END)

    def __iter__(self):
        return self

    def __next__(self) -> str:
        item = self._queue.get(timeout=self.timeout)
        if item is self._END:
            raise StopIteration
        return item
