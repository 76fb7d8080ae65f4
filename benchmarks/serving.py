"""`tfgen serve`'s continuous batching under load: throughput for 1, 4, 16 and 64 concurrent clients against in-process
`generate()` at the same batch size, a lone request's latency, and when a streamed answer's first token arrives.

    python -m benchmarks.serving --model random-124m --out benchmarks/results/q-serving-gpt2.json
    python -m benchmarks.serving --model smollm2-135m-instruct --out benchmarks/results/q-serving-smollm2.json

Each model is exported once (XLA, `--slots` decode slots, greedy and sample signatures) under the cache folder and
served in this process over loopback HTTP, with continuous batching and, for the same clients, without it (every
request its own whole-call signature run on its own thread: what `tfgen serve --no-batching` does). Every request
is a `greedy` (or with `--traffic sample`, a `sample` with its own seed) `:predict` of one prompt with a budget of
`--new-tokens`; tokens/s counts the tokens
the answers hold. `generate()` runs the same prompts in-process at batch `min(clients, slots)`, compiled and warm, and
each client count's `vs_generate` is the server's tokens/s over it. With a tokenizer in the export (`--openai`, on
when the checkpoint has one), the same clients also send OpenAI streaming requests (`POST /v1/completions`,
`"stream": true`, the prompt as token ids, temperature 0): tokens/s from the answers' `usage`, and the median time to
the first chunk holding text. Streaming is also timed on the engine itself (a row with a listener): the first token's
arrival against the whole answer's.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import queue
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def export_once(model, checkpoint: str, cache_dir: str, slots: int, new_tokens: int, prompt_tokens: int,
                quantize: str | None = None, tokenizer=None, slot_logprobs: int | None = None) -> str:
    from tfgen.export import export_saved_model

    name = (f"serving-{Path(checkpoint).name}-s{slots}-n{new_tokens}-p{prompt_tokens}" + (f"-{quantize}" if quantize
                                                                                          else "")
            + ("-tok" if tokenizer is not None else "") + (f"-lp{slot_logprobs}" if slot_logprobs is not None else ""))
    folder = Path(cache_dir) / name
    if not (folder / "1" / "saved_model.pb").is_file():
        config = model.generation_config.copy()
        config.update(eos_token_id=None, do_sample=False)  # every request decodes its whole budget
        export_saved_model(model, folder, config, max_new_tokens=new_tokens, signatures=["greedy", "sample"],
                           slots=slots, slot_length=prompt_tokens + new_tokens, tokenizer=tokenizer,
                           **({} if slot_logprobs is None else {"slot_logprobs": slot_logprobs}))
    return str(folder)


def prompt(index: int, vocab_size: int, tokens: int) -> list[int]:
    return np.random.default_rng(index).integers(3, vocab_size, tokens).tolist()


#: The sampling knobs of `--traffic sample` requests (and of the in-process reference).
SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95}
TRAFFIC = "greedy"


def request_body(index: int, vocab_size: int, tokens: int, new_tokens: int) -> dict:
    inputs = {"input_ids": [prompt(index, vocab_size, tokens)], "attention_mask": [[1] * tokens],
              "max_new_tokens": [new_tokens]}
    if TRAFFIC == "greedy":
        return {"signature_name": "greedy", "inputs": inputs}
    return {"signature_name": "sample", "inputs": {**inputs, "seed": [[index, 1]],
                                                   **{name: [value] for name, value in SAMPLING.items()}}}


def post(address, body: dict) -> dict:
    connection = http.client.HTTPConnection(*address, timeout=3600)
    try:
        connection.request("POST", "/v1/models/bench:predict", json.dumps(body))
        response = connection.getresponse()
        answer = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {answer}")
        return answer
    finally:
        connection.close()


def post_openai_stream(address, index: int, vocab_size: int, tokens: int, new_tokens: int) -> tuple[int, float]:
    """(completion tokens, seconds to the first chunk holding text) of one streamed `/v1/completions` request."""
    body = {"model": "bench", "prompt": prompt(index, vocab_size, tokens), "max_tokens": new_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    connection = http.client.HTTPConnection(*address, timeout=3600)
    began, first, usage = time.perf_counter(), None, None
    try:
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {response.read()[:500]!r}")
        for line in response:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and any(choice.get("text") for choice in chunk.get("choices", ())):
                first = time.perf_counter() - began
            usage = chunk.get("usage") or usage
    finally:
        connection.close()
    return usage["completion_tokens"], first if first is not None else time.perf_counter() - began


def load(address, clients: int, requests_per_client: int, vocab_size: int, prompt_tokens: int, new_tokens: int,
         openai: bool = False):
    """(seconds, tokens, per-request latencies) of `clients` threads each sending `requests_per_client` requests."""
    latencies = []  # whole answers' (TF Serving :predict), or first chunks' (OpenAI streaming)

    def client(number):
        tokens = 0
        for round_ in range(requests_per_client):
            index = number * requests_per_client + round_
            began = time.perf_counter()
            if openai:
                count, first = post_openai_stream(address, index, vocab_size, prompt_tokens, new_tokens)
                latencies.append(first)
                tokens += count
                continue
            answer = post(address, request_body(index, vocab_size, prompt_tokens, new_tokens))
            latencies.append(time.perf_counter() - began)
            tokens += answer["outputs"]["sequence_lengths"][0] - prompt_tokens
        return tokens

    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(client, range(clients)))
    return time.perf_counter() - began, tokens, latencies


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random-124m", help="random-124m, smollm2-135m-instruct, or a checkpoint")
    parser.add_argument("--clients", default="1,4,16,64")
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--steps-per-call", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--unbatched-clients", default="1,16",
                        help="client counts of the whole-call comparison (empty: skip it)")
    parser.add_argument("--traffic", choices=["greedy", "sample"], default="greedy",
                        help=f"greedy requests, or sampling ones with {SAMPLING}")
    parser.add_argument("--quantize", choices=["int8"], help="serve the model with int8 weights (docs/performance.md)")
    parser.add_argument("--openai", choices=["auto", "on", "off"], default="auto",
                        help="also drive OpenAI streaming /v1/completions (auto: when the checkpoint has a tokenizer)")
    parser.add_argument("--slot-logprobs", type=int, help="top log-probabilities the slot state records (default: the "
                        "export's, 20; 0 records none)")
    parser.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/tfgen/bench"))
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    clients = [int(value) for value in args.clients.split(",")]
    global TRAFFIC
    TRAFFIC = args.traffic

    from benchmarks.checkpoints import resolve_checkpoint
    from tfgen import AutoModelForCausalLM
    from tfgen.engine.scheduler import Row
    from tfgen.serving import ModelServer, load_export, start_in_thread

    checkpoint = resolve_checkpoint(args.model, args.cache_dir)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, **({"quantize": args.quantize} if args.quantize else {}))
    vocab_size = int(model.config.vocab_size)
    tokenizer = None
    if args.openai != "off":
        from tfgen import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        except OSError:
            if args.openai == "on":
                raise
    export_dir = export_once(model, checkpoint, args.cache_dir, args.slots, args.new_tokens, args.prompt_tokens,
                             args.quantize, tokenizer, args.slot_logprobs)
    results = {"model": args.model, "quantize": args.quantize, "traffic": args.traffic, "slots": args.slots,
               "steps_per_call": args.steps_per_call,
               "new_tokens": args.new_tokens, "prompt_tokens": args.prompt_tokens, "runs": []}

    # generate() in-process, compiled and warm: the lone request's reference latency.
    ids = np.array([prompt(0, vocab_size, args.prompt_tokens)], np.int32)
    options = dict(max_new_tokens=args.new_tokens, eos_token_id=None, do_sample=args.traffic == "sample")
    if args.traffic == "sample":
        options.update(seed=[[0, 1]], **SAMPLING)
    model.generate(ids, **options)
    times = []
    for _ in range(3):
        began = time.perf_counter()
        model.generate(ids, **options)
        times.append(time.perf_counter() - began)
    results["generate_latency_s"] = min(times)
    # generate() at the batch each client count fills (the engine's slots at most), the same prompts' tokens/s.
    results["generate_tokens_per_s"] = {}
    for batch in sorted({min(count, args.slots) for count in clients}):
        rows = np.array([prompt(index, vocab_size, args.prompt_tokens) for index in range(batch)], np.int32)
        batch_options = dict(options, seed=[[index, 1] for index in range(batch)]) if "seed" in options else options
        model.generate(rows, **batch_options)
        seconds = min(_timed(lambda: model.generate(rows, **batch_options)) for _ in range(2))
        results["generate_tokens_per_s"][batch] = batch * args.new_tokens / seconds
        print(f"generate() batch {batch}: {batch * args.new_tokens / seconds:.1f} tokens/s", file=sys.stderr,
              flush=True)

    unbatched_clients = [int(value) for value in args.unbatched_clients.split(",") if value]
    for batching in ([True, False] if unbatched_clients else [True]):
        served = load_export(export_dir, "bench",
                             batching={"steps_per_call": args.steps_per_call} if batching else None)
        server = ModelServer(served, port=0, max_connections=256)
        start_in_thread(server)
        address = server.server_address[:2]
        post(address, request_body(0, vocab_size, args.prompt_tokens, args.new_tokens))  # compiles the whole call
        lone = []
        for _ in range(3):
            began = time.perf_counter()
            post(address, request_body(0, vocab_size, args.prompt_tokens, args.new_tokens))
            lone.append(time.perf_counter() - began)
        # An untimed round at each load: the insert programs compile once per (rows, prompt width) bucket, and a
        # server pays that once in its life, not per request.
        for count in clients if batching else unbatched_clients:
            load(address, count, 1, vocab_size, args.prompt_tokens, args.new_tokens)
        run = {"batching": batching, "lone_latency_s": min(lone),
               "lone_vs_generate": min(lone) / results["generate_latency_s"], "clients": {}}
        for count in clients if batching else unbatched_clients:
            seconds, tokens, latencies = load(address, count, args.requests_per_client, vocab_size,
                                              args.prompt_tokens, args.new_tokens)
            run["clients"][count] = {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
                                     "median_latency_s": statistics.median(latencies)}
            print(f"batching={batching} clients={count}: {tokens / seconds:.1f} tokens/s "
                  f"(median latency {statistics.median(latencies):.2f} s)", file=sys.stderr, flush=True)
        if batching and tokenizer is not None:
            run["openai_stream"] = {}
            for count in clients:
                load(address, count, 1, vocab_size, args.prompt_tokens, args.new_tokens, openai=True)
                seconds, tokens, firsts = load(address, count, args.requests_per_client, vocab_size,
                                               args.prompt_tokens, args.new_tokens, openai=True)
                run["openai_stream"][count] = {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
                                               "median_first_chunk_s": statistics.median(firsts)}
                print(f"openai stream clients={count}: {tokens / seconds:.1f} tokens/s (median first chunk "
                      f"{statistics.median(firsts):.2f} s)", file=sys.stderr, flush=True)
        for count, value in run["clients"].items():
            reference = results["generate_tokens_per_s"].get(min(count, args.slots))
            if reference:
                value["vs_generate"] = value["tokens_per_s"] / reference
        one = run["clients"].get(1, {}).get("tokens_per_s")
        if one:
            run["speedup_over_one_client"] = {count: value["tokens_per_s"] / one
                                              for count, value in run["clients"].items()}
        if batching:
            engine = served.engine
            listener = queue.SimpleQueue()
            row = Row(np.array(prompt(5, vocab_size, args.prompt_tokens), np.int32),
                      np.ones([args.prompt_tokens], np.int32), args.new_tokens, args.traffic == "sample", (5, 1),
                      **SAMPLING, listener=listener)
            began = time.perf_counter()
            engine.submit([row])
            listener.get()
            first = time.perf_counter() - began
            row.wait()
            whole = time.perf_counter() - began
            run["stream_first_token_s"], run["stream_whole_s"] = first, whole
            run["stream_first_over_whole"] = first / whole
        results["runs"].append(run)
        server.shutdown()
        server.server_close()
        served.close()

    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


def _timed(call) -> float:
    began = time.perf_counter()
    call()
    return time.perf_counter() - began


if __name__ == "__main__":
    sys.exit(main())
