"""llama.cpp as a benchmark peer (`llama-cpp`): the CPU engine most users of a GGUF model run.

It is driven through llama-cpp-python's low-level API, the way llama.cpp's own `batched` example decodes several
sequences at once: one context with a sequence per row, the prompts prefilled in one `llama_decode`, then one
`llama_decode` per step with each row's new token. Tokens are chosen by llama.cpp's own samplers in C (greedy, or
a top-k 50 → top-p 0.9 → seeded distribution chain per row), so no Python sampling is timed against it.

llama-cpp-python compiles llama.cpp at install time (minutes) and is never a tfgen dependency; install it in the
benchmark's environment only: `pip install llama-cpp-python` (docs/performance.md).
"""

from __future__ import annotations

import os

import numpy as np

from benchmarks.peers import BENCH_REQUESTS, Runner, Unavailable, import_peer, is_gguf

# Every context holds this many slots per row (prompt + new tokens must fit).
_SLOTS_PER_ROW = 256


class LlamaCppRunner(Runner):
    """llama.cpp (llama-cpp-python's C API) on a `.gguf` checkpoint, `os.cpu_count()` threads."""

    def __init__(self, checkpoint, new_tokens):
        super().__init__(checkpoint, new_tokens)
        if not is_gguf(checkpoint):
            raise Unavailable("llama.cpp reads GGUF files only")
        # Never a tfgen dependency, nor in the bench extra: it compiles llama.cpp at install time.
        self.lib = import_peer("llama_cpp", "llama-cpp-python", install="pip install llama-cpp-python")
        self.lib.llama_backend_init()
        # llama.cpp logs every load and context to stderr; the benchmark's output is its tables.
        self._quiet_log = self.lib.llama_log_callback(lambda level, text, user_data: None)
        self.lib.llama_log_set(self._quiet_log, None)
        model_params = self.lib.llama_model_default_params()
        self.model = self.lib.llama_model_load_from_file(str(checkpoint).encode(), model_params)
        if not self.model:
            raise Unavailable(f"llama.cpp could not load {checkpoint}")
        self.contexts = {}  # batch size -> context with one sequence per row

    def _context(self, batch: int, prompt_len: int):
        if batch not in self.contexts:
            params = self.lib.llama_context_default_params()
            params.n_ctx = batch * _SLOTS_PER_ROW
            params.n_batch = params.n_ubatch = max(512, batch * prompt_len)
            params.n_seq_max = batch
            params.n_threads = params.n_threads_batch = os.cpu_count() or 1
            # Rows share no prefix: llama.cpp's advice is a KV buffer per sequence then.
            params.kv_unified = False
            params.no_perf = True
            context = self.lib.llama_init_from_model(self.model, params)
            if not context:
                raise Unavailable(f"llama.cpp could not create a context for batch {batch}")
            self.contexts[batch] = context
        return self.contexts[batch]

    def _samplers(self, strategy: str, batch: int) -> list:
        """One sampler chain per row (a sampling chain carries its own random state, like tfgen's per-row seeds)."""
        lib = self.lib
        if strategy == "greedy":
            return [lib.llama_sampler_init_greedy() for _ in range(batch)]
        if strategy != "sample":
            raise Unavailable(f"{strategy} is not a llama.cpp sampler (greedy and sampling only)")
        options = BENCH_REQUESTS["sample"]
        chains = []
        for row in range(batch):
            chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_k(options["top_k"]))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_p(options["top_p"], 1))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_dist(row))
            chains.append(chain)
        return chains

    def generate(self, strategy, input_ids):
        lib = self.lib
        batch, prompt_len = input_ids.shape
        if prompt_len + self.new_tokens > _SLOTS_PER_ROW:
            raise Unavailable(f"prompt + new tokens exceed the {_SLOTS_PER_ROW} slots per row")
        context = self._context(batch, prompt_len)
        lib.llama_memory_clear(lib.llama_get_memory(context), True)
        samplers = self._samplers(strategy, batch)
        tokens = np.zeros((batch, self.new_tokens), np.int32)
        llama_batch = lib.llama_batch_init(max(batch * prompt_len, batch), 0, 1)
        try:
            # Prefill: every row's prompt in one call; logits only at each row's last prompt token.
            entries = [(int(input_ids[row, p]), p, row, p == prompt_len - 1) for row in range(batch)
                       for p in range(prompt_len)]
            self._decode(context, llama_batch, entries)
            output_index = [row * prompt_len + prompt_len - 1 for row in range(batch)]
            for step in range(self.new_tokens):
                for row in range(batch):
                    tokens[row, step] = lib.llama_sampler_sample(samplers[row], context, output_index[row])
                if step + 1 == self.new_tokens:
                    break
                self._decode(context, llama_batch,
                             [(int(tokens[row, step]), prompt_len + step, row, True) for row in range(batch)])
                output_index = list(range(batch))
        finally:
            lib.llama_batch_free(llama_batch)
            for sampler in samplers:
                lib.llama_sampler_free(sampler)
        return tokens

    def _decode(self, context, llama_batch, entries) -> None:
        """Fills `llama_batch` with (token, position, sequence, wants_logits) entries and decodes it."""
        llama_batch.n_tokens = len(entries)
        for index, (token, position, sequence, wants_logits) in enumerate(entries):
            llama_batch.token[index] = token
            llama_batch.pos[index] = position
            llama_batch.n_seq_id[index] = 1
            llama_batch.seq_id[index][0] = sequence
            llama_batch.logits[index] = wants_logits
        status = self.lib.llama_decode(context, llama_batch)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")

    def __del__(self):
        lib = getattr(self, "lib", None)
        if lib is None:
            return
        for context in getattr(self, "contexts", {}).values():
            lib.llama_free(context)
        if getattr(self, "model", None):
            lib.llama_model_free(self.model)

