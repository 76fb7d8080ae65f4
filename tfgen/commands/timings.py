"""`--verbose`: where a command's seconds went, as one stderr line at the end, like llama.cpp's timings.

`Timings` times the load (tokenizer and model) and each `generate()` call; with a streamer it also sees when the
first compiled chunk ended (the prompt goes out then) and when each later token arrived. The first chunk holds the
compile (tracing, then XLA's compile or its program loaded from the persistent cache) when there is one, the prompt's
prefill and up to `chunk_steps` more tokens; the later chunks give the generation rate, from which the first chunk's
extra tokens are subtracted. `tfgen generate` uses it; `tfgen chat` can keep one per turn (`load` once).
"""

from __future__ import annotations

import contextlib
import sys
import time

from tfgen.generation import compile_cache
from tfgen.generation.streaming import BaseStreamer
from tfgen.gguf import load_cache


class Timings:
    """Seconds and token counts of one command (see the module docstring); `summary()` is the line."""

    def __init__(self):
        self.began = time.perf_counter()
        self.load_s: float | None = None
        self.load_cached = False  # the tokenizer and weights came from the GGUF load cache
        self.first_call_s: float | None = None  # generate() start to the end of its first compiled chunk
        self.compiled: bool | None = None  # None: nothing was compiled in the call; else whether XLA ran itself
        self.prompt_tokens = 0
        self.new_tokens = 0
        self.first_chunk_tokens = 0
        self.decode_s: float | None = None  # from the end of the first chunk to the last token
        self.call_began = self.began
        self._hits_before = _cache_hits()

    @contextlib.contextmanager
    def loading(self):
        """Adds the block's time to the load (a command may load its tokenizer and model apart); notes whether the
        GGUF load cache served both."""
        began = time.perf_counter()
        yield
        self.load_s = (self.load_s or 0.0) + time.perf_counter() - began
        self.load_cached = _cache_hits() - self._hits_before >= 2

    @contextlib.contextmanager
    def generating(self, model, prompt_tokens: int):
        """Times the `generate()` call in the block (`prompt_tokens`: the prompt's length)."""
        self.prompt_tokens, self.first_call_s, self.decode_s = prompt_tokens, None, None
        traces, compiled = getattr(model, "generate_trace_count", 0), compile_cache.compiled_here()
        self.call_began = time.perf_counter()
        yield
        ended = time.perf_counter()
        if self.first_call_s is None:  # no streamer: one compiled call did everything
            self.first_call_s = ended - self.call_began
        if getattr(model, "generate_trace_count", 0) > traces:
            # Without the persistent cache (or before its first program) every compile is XLA's own.
            now = compile_cache.compiled_here()
            self.compiled = now is None or now > (compiled or 0)
        else:
            self.compiled = None

    def restart(self) -> None:
        """Starts the next command-like span (a chat's next answer): the total counts from now, without a load."""
        self.began, self.load_s, self.load_cached = time.perf_counter(), None, False

    def count_answer(self, new_ids, eos_token_ids) -> None:
        """Without a streamer: the new tokens are `new_ids` (int array) up to the first of `eos_token_ids`, included."""
        eos = set(eos_token_ids or ())
        stops = [index for index, token in enumerate(new_ids.tolist()) if token in eos]
        self.new_tokens = stops[0] + 1 if stops else len(new_ids)

    def streamer(self, streamer: BaseStreamer | None) -> BaseStreamer | None:
        """`streamer` wrapped so that its tokens are timed (None stays None: the call is timed as a whole)."""
        return None if streamer is None else _TimedStreamer(streamer, self)

    def summary(self) -> str:
        """The line: load, compile (or not), prompt, generation rate, total."""
        parts = []
        if self.load_s is not None:
            parts.append(f"load {self.load_s:.2f} s" + (" (GGUF cache)" if self.load_cached else ""))
        first = self.first_call_s or 0.0
        later = max(self.new_tokens - self.first_chunk_tokens, 0)
        per_token = self.decode_s / later if self.decode_s and later else None
        # The first chunk's tokens after the first one, at the later chunks' rate, are not the compile's.
        first_chunk = first - (per_token or 0.0) * max(self.first_chunk_tokens - 1, 0)
        if self.compiled is not None:
            source = "compiled" if self.compiled else "program from the XLA cache"
            parts.append(f"compile + prompt {first_chunk:.2f} s ({source}, tracing included)")
            parts.append(f"prompt {self.prompt_tokens} tokens")
        else:
            parts.append(f"prompt {self.prompt_tokens} tokens in {first_chunk:.2f} s")
        if per_token is not None:
            parts.append(f"generated {self.new_tokens} tokens in {per_token * self.new_tokens:.2f} s, "
                         f"{1 / per_token:.1f} tokens/s")
        else:
            parts.append(f"generated {self.new_tokens} tokens")
        parts.append(f"total {time.perf_counter() - self.began:.2f} s")
        return "tfgen: " + " | ".join(parts)

    def report(self, file=None) -> None:
        """Prints `summary()` on stderr (or `file`)."""
        print(self.summary(), file=file or sys.stderr, flush=True)


class _TimedStreamer(BaseStreamer):
    """Passes everything to `inner`, noting when the prompt (the end of the first chunk) and each token came."""

    def __init__(self, inner: BaseStreamer, timings: Timings):
        self.inner, self.timings = inner, timings
        self.chunk_steps, self.max_batch_size = inner.chunk_steps, inner.max_batch_size
        self.prompt_at: float | None = None

    def put(self, token_ids) -> None:
        now, timings = time.perf_counter(), self.timings
        if self.prompt_at is None:
            self.prompt_at = now
            timings.first_call_s = now - timings.call_began
            timings.new_tokens = timings.first_chunk_tokens = 0
        else:
            timings.new_tokens += 1
            # The first chunk makes its first token and up to chunk_steps more; the rest come in later chunks.
            timings.first_chunk_tokens = min(timings.new_tokens, self.chunk_steps + 1)
            timings.decode_s = now - self.prompt_at
        self.inner.put(token_ids)

    def end(self) -> None:
        self.inner.end()


def _cache_hits() -> int:
    return sum(count for (_, event), count in load_cache.counters.items() if event == "hit")
