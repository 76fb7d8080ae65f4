"""Encoder-decoder decoding (issue 19): what one decode step of a t5-small-shaped model (random weights, 60M
parameters) costs at encoder lengths 64 and 512, tfgen's compiled greedy loop next to HF PyTorch's `generate`, in one
process, calls alternated.

A step's cost is `(time(1 + N new tokens) - time(1 new token)) / N`, so the encoder pass and the prefill cancel out;
every row is forced to the full budget (`min_new_tokens`, no eos). The encoder's own time is reported apart. The
figures are in `docs/performance.md` ("Encoder-decoder").

    python -m benchmarks.encoder_decoder            # about 3 minutes on 2 CPUs
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time

ENCODER_LENGTHS = (64, 512)
NEW_TOKENS = 32
REPEATS = 5


def _t5_small(directory: str):
    import torch
    import transformers

    config = transformers.T5Config(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
                                   feed_forward_proj="relu", tie_word_embeddings=True, decoder_start_token_id=0)
    torch.manual_seed(0)
    hf_model = transformers.T5ForConditionalGeneration(config).eval()
    hf_model.save_pretrained(directory, safe_serialization=True)
    return hf_model


def main() -> int:
    import numpy as np
    import torch

    import tfgen

    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as directory:
        hf_model = _t5_small(directory)
        model = tfgen.AutoModelForSeq2SeqLM.from_pretrained(directory)
    rng = np.random.default_rng(0)
    results = {}
    for length in ENCODER_LENGTHS:
        ids = rng.integers(2, 32000, size=(1, length)).astype(np.int32)

        def ours(new):
            return lambda: model.generate(ids, max_new_tokens=new, min_new_tokens=new, eos_token_id=None).numpy()

        def theirs(new):
            source = torch.tensor(ids, dtype=torch.long)

            def run():
                with torch.no_grad():
                    return hf_model.generate(source, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                             eos_token_id=None, num_beams=1).numpy()
            return run

        began = time.perf_counter()
        for new in (1, 1 + NEW_TOKENS):
            ours(new)()  # compile (one program per budget bucket)
        compile_seconds = time.perf_counter() - began
        timings = {name: {1: [], 1 + NEW_TOKENS: []} for name in ("tfgen", "hf")}
        for _ in range(REPEATS):
            for new in (1, 1 + NEW_TOKENS):
                for name, make in (("tfgen", ours), ("hf", theirs)):
                    call = make(new)
                    began = time.perf_counter()
                    call()
                    timings[name][new].append(time.perf_counter() - began)
        row = {"compile_s": round(compile_seconds, 1)}
        for name, runs in timings.items():
            first, whole = statistics.median(runs[1]), statistics.median(runs[1 + NEW_TOKENS])
            row[name] = {"encoder_and_first_token_ms": round(first * 1e3, 1),
                         "ms_per_step": round((whole - first) / NEW_TOKENS * 1e3, 2)}
        row["hf_over_tfgen_per_step"] = round(row["hf"]["ms_per_step"] / row["tfgen"]["ms_per_step"], 2)
        results[length] = row
        print(json.dumps({"encoder_length": length, **row}), flush=True)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
