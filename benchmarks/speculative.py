"""Speculative decoding (assisted generation) on SmolLM2-135M-Instruct: plain greedy search against prompt lookup,
early exit and an assistant model, on prompts whose answer copies the input (rewrite a given function) and on ones
whose answer does not (a short story).

    python -m benchmarks.speculative                          # every group (~35 min here, compiles included)
    python -m benchmarks.speculative --quick                  # smoke run: batch 1, 16 new tokens, 1 run
    python -m benchmarks.speculative --groups b1-code --json run.json --docs   # one group, keep timings, render docs
    python -m benchmarks.speculative --groups "2:code:greedy,pl-k8-n2"         # an ad-hoc group
    python -m benchmarks.speculative --from-json a.json,b.json --docs          # re-render from saved runs, merged
    python -m benchmarks.speculative --step-timing --json steps.json          # the cost model: one call of T tokens

A group is `BATCH:PROMPTS:CONFIG,CONFIG,...` (or a name of `GROUPS`): the prompts (`code`, `story`; see
`benchmarks/speculative_prompts.py`) through SmolLM2's chat template, float32, `--new-tokens` per row, no eos (every
row generates them all). Configs: `greedy` / `sample` (plain: the group's first config is its baseline), `pl-kK-nN`
(prompt lookup: `prompt_lookup_num_tokens=K`, `max_matching_ngram_size=N`), `ee-lL-kK` (`assistant_early_exit=L`,
`num_assistant_tokens=K`), `as-lL-kK` (`assistant_model=` a copy of the model's first L layers, final norm and head,
`num_assistant_tokens=K`: SmolLM2 has no smaller sibling with its tokenizer here, so a truncated copy stands in for a
real small assistant); `sample-` before a speculative config samples (`do_sample=True`, top-k 50, top-p 0.9, seed 0);
`hf-greedy` / `hf-pl-kK-nN` run HF PyTorch's `generate` on the same GGUF and prompt ids (batch 1 only; its speedups
are against `hf-greedy`, its prefill timed alike).

Per config: a first call (compiles, unless tfgen's persistent compile cache has the program), `--warmup` calls, then
`--runs` timed rounds alternating the group's configs (rotating who goes first). A timed call is `generate()`'s own
path (`prepare_request`, the compiled program, `package_outputs`); tokens/s is `batch × new tokens / median
seconds`. From the program's `draft_accepted` / `draft_rounds` (per row): acceptance = accepted / (rounds × k), tokens
per round = generated / rounds (the first token comes from the prefill), and the loop's rounds (the slowest row's:
at batch > 1 every row waits for it). Token equality: each row's tokens against the baseline's on the same prompts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.peers import BENCH_REQUESTS, HfTorchRunner, hf_eos_token_id
from benchmarks.speculative_prompts import PROMPT_SETS

MODEL = "smollm2-135m-instruct"
BEGIN, END = "<!-- speculative-bench:begin -->", "<!-- speculative-bench:end -->"
SECTION = "## Speculative decoding (issue 16)"
DOCS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
SEED = [0, 0]
PREFILL = "prefill"  # the prefill-only call of a group: plain greedy, one new token

GROUPS = {
    "b1-code": "1:code:greedy,pl-k4-n2,pl-k8-n2,pl-k16-n2,pl-k8-n3,ee-l8-k3,ee-l15-k3,as-l8-k3",
    "b1-code-hf": "1:code:greedy,pl-k8-n2,hf-greedy,hf-pl-k8-n2",
    "b1-story": "1:story:greedy,pl-k4-n2,pl-k8-n2",
    "b1-copy": "1:copy:greedy,pl-k4-n2,pl-k8-n2,pl-k16-n2",
    "b1-sample": "1:code:sample,sample-pl-k8-n2",
    "b4-code": "4:code:greedy,pl-k4-n2,pl-k8-n2,ee-l15-k3,as-l8-k3",
    # Early exit and the assistant accept ~nothing at batch 1 and 4; at 16 each of their calls takes over a minute here.
    "b16-code": "16:code:greedy,pl-k4-n2,pl-k8-n2",
    "b16-story": "16:story:greedy,pl-k4-n2",
}
_CONFIG = re.compile(r"(hf-)?(sample-)?(?:(greedy|sample)|(pl|ee|as)-([a-z])(\d+)-([a-z])(\d+))")
HF = "hf-"  # the prefix of HF PyTorch's configs


def config_options(name: str) -> dict:
    """The `generate()` options of config `name` (see the module docstring); `assistant_layers` stands for the
    assistant model, built by the caller. HF PyTorch's configs (`hf-greedy`, `hf-pl-kK-nN`) run the same options
    through transformers' `generate` (batch 1: its assisted generation takes no batches)."""
    match = _CONFIG.fullmatch(name)
    if match is None or (match.group(1) and (match.group(2) or match.group(3) == "sample" or match.group(4) in (
            "ee", "as"))):
        raise ValueError(f"--groups: unknown config {name!r} (greedy, sample, pl-kK-nN, ee-lL-kK, as-lL-kK, "
                         "hf-greedy, hf-pl-kK-nN)")
    _, sampled, plain, kind, first_key, first, second_key, second = match.groups()
    options = dict(BENCH_REQUESTS["sample"]) if (sampled or plain == "sample") else {"do_sample": False}
    if plain:
        return options if not sampled else _bad(name)
    first, second = int(first), int(second)
    if kind == "pl" and (first_key, second_key) == ("k", "n"):
        return {**options, "prompt_lookup_num_tokens": first, "max_matching_ngram_size": second}
    if kind in ("ee", "as") and (first_key, second_key) == ("l", "k"):
        layer_option = "assistant_early_exit" if kind == "ee" else "assistant_layers"
        return {**options, layer_option: first, "num_assistant_tokens": second}
    return _bad(name)


def _bad(name):
    raise ValueError(f"--groups: unknown config {name!r}")


def draft_tokens(options: dict) -> int | None:
    """k, the drafts per round of a config's options (None for plain decoding)."""
    return options.get("prompt_lookup_num_tokens", options.get("num_assistant_tokens"))


def parse_group(text: str) -> dict:
    """{"name", "batch", "prompts", "configs"} of a group name or `BATCH:PROMPTS:CONFIG,...`."""
    spec = GROUPS.get(text, text)
    try:
        batch, prompts, configs = spec.split(":")
        batch, configs = int(batch), configs.split(",")
    except ValueError:
        raise ValueError(f"--groups: {text!r} is neither a group ({', '.join(GROUPS)}) nor "
                         "BATCH:PROMPTS:CONFIGS") from None
    if prompts not in PROMPT_SETS or batch <= 0:
        raise ValueError(f"--groups: {text!r}: prompts must be one of {sorted(PROMPT_SETS)}, batch positive")
    for config in configs:
        config_options(config)
    return {"name": text, "batch": batch, "prompts": prompts, "configs": configs}


# ---------------------------------------------------------------------------------------------- the model


def load_model():
    """(float32 model, tokenizer, GGUF path) of SmolLM2-135M-Instruct, from tfgen's model cache."""
    from tfgen import AutoModelForCausalLM, AutoTokenizer
    from tfgen.hub.pull import pull

    path = str(pull(MODEL, progress=False))
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path), path


def truncated_copy(model, layers: int):
    """A separate `LlamaForCausalLM` of `model`'s first `layers` decoder layers, its final norm and its (tied) head,
    with copies of those weights: a stand-in assistant with the model's tokenizer (it computes what
    `assistant_early_exit=layers` computes, but with its own weights and cache)."""
    from tfgen.models.llama import LlamaForCausalLM

    config = dataclasses.replace(model.config, num_hidden_layers=layers)
    assistant = LlamaForCausalLM(config)
    kept = re.compile(r"model\.layers\.(\d+)\.")
    state = {name: value for name, value in model.hf_state_dict().items()
             if not (found := kept.match(name)) or int(found.group(1)) < layers}
    assistant.load_hf_state_dict(state)
    return assistant


def encode(tokenizer, prompts: str, batch: int):
    """(input_ids, attention_mask) int32 `[batch, P]`, left padded: the prompt set's conversations through the chat
    template, with the generation prompt."""
    rows = [tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            for messages in PROMPT_SETS[prompts](batch)]
    width = max(len(row) for row in rows)
    ids = np.full((batch, width), tokenizer.pad_token_id or 0, np.int32)
    mask = np.zeros((batch, width), np.int32)
    for index, row in enumerate(rows):
        ids[index, width - len(row):], mask[index, width - len(row):] = row, 1
    return ids, mask


class ConfigRunner:
    """One config of a group: `call()` runs `generate()`'s path once and returns (new tokens int `[B, N]`, the
    program's result dict)."""

    def __init__(self, model, name, ids, mask, new_tokens, assistants):
        self.model, self.name, self.ids, self.mask, self.new_tokens = model, name, ids, mask, new_tokens
        options = config_options(name)
        self.k = draft_tokens(options)
        if "assistant_layers" in options:
            layers = options.pop("assistant_layers")
            if layers not in assistants:
                assistants[layers] = truncated_copy(model, layers)
            options["assistant_model"] = assistants[layers]
        self.options = options

    def call(self):
        from tfgen.generation.outputs import package_outputs
        from tfgen.generation.programs import generate_program
        from tfgen.request.prepare import prepare_request

        seed = SEED if self.options["do_sample"] else None
        request = prepare_request(self.model, self.ids, attention_mask=self.mask, max_new_tokens=self.new_tokens,
                                  eos_token_id=None, seed=seed, **self.options)
        program, _ = generate_program(self.model, request)
        result = program(request.inputs)
        sequences = np.asarray(package_outputs(request, result))
        rows = self.ids.shape[0]
        stats = {name: np.asarray(result[name])[:rows]
                 for name in ("generated_lengths", "draft_accepted", "draft_rounds") if name in result}
        return sequences[:, self.ids.shape[1]:], stats


class HfRunner:
    """An HF PyTorch config of a group: transformers' `generate` on the same GGUF (dequantized to float32, as tfgen
    does), the same prompt ids and options. `call()` returns (new tokens int `[B, N]`, {"generated_lengths"})."""

    def __init__(self, name, ids, mask, new_tokens, peers: dict, checkpoint: str):
        self.name, self.ids, self.mask, self.new_tokens = name, ids, mask, new_tokens
        self.options, self.k = config_options(name), None
        if "hf-torch" not in peers:

            peers["hf-torch"] = HfTorchRunner(checkpoint, new_tokens)
        self.runner = peers["hf-torch"]

    def call(self):
        torch = self.runner.torch
        ids, mask = torch.tensor(self.ids, dtype=torch.long), torch.tensor(self.mask, dtype=torch.long)
        model = self.runner.model
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=self.new_tokens, pad_token_id=0,
                                 eos_token_id=hf_eos_token_id(model, self.options), **self.options)
        tokens = out.numpy()[:, self.ids.shape[1]:]
        # Assisted generation may return a few tokens past max_new_tokens (its last round's); they are cut off.
        return tokens[:, :self.new_tokens], {"generated_lengths": np.full([len(tokens)], self.new_tokens),
                                             "returned_tokens": np.full([len(tokens)], tokens.shape[1])}


def measure_group(model, tokenizer, group: dict, options, assistants: dict, log=print) -> dict:
    """Times every config of `group` (first call, warm-ups, then alternating rounds) and compares its tokens with the
    group's first config. A prefill-only call (plain greedy, one new token) joins the rounds: a config's decode phase
    is its call less that. Returns {"name", "batch", "prompts", "prompt_tokens", "prefill": {...}, "results":
    {config: {...}}}."""
    ids, mask = encode(tokenizer, group["prompts"], group["batch"])
    runners, results, outputs = {}, {}, {}
    hf_prefill = [HF + PREFILL] if any(name.startswith(HF) for name in group["configs"]) else []
    for name in [PREFILL, *hf_prefill, *group["configs"]]:
        new_tokens = 1 if name.endswith(PREFILL) else options.new_tokens
        if name.startswith(HF):
            runner = HfRunner(name.replace(PREFILL, "greedy"), ids, mask, new_tokens, assistants, options.checkpoint)
        else:
            runner = ConfigRunner(model, name.replace(PREFILL, "greedy"), ids, mask, new_tokens, assistants)
        start = time.perf_counter()
        tokens, stats = runner.call()
        compile_s = time.perf_counter() - start
        for _ in range(options.warmup):
            runner.call()
        runners[name], outputs[name] = runner, tokens
        results[name] = {"compile_s": compile_s, "seconds": [], "k": runner.k,
                         **{key: value.tolist() for key, value in stats.items()}}
        log(f"      {name}: first call {compile_s:.1f} s")
    names = list(runners)
    for round_index in range(options.runs):
        for name in names[round_index % len(names):] + names[:round_index % len(names)]:
            start = time.perf_counter()
            tokens, _ = runners[name].call()
            results[name]["seconds"].append(time.perf_counter() - start)
            if not np.array_equal(tokens, outputs[name]):
                results[name]["tokens_changed_between_calls"] = True
    prefills = {}
    for name in [PREFILL, *hf_prefill]:
        prefills[name] = results.pop(name)
        prefills[name]["median_s"] = statistics.median(prefills[name]["seconds"])
        names.remove(name)
    prefill, baseline = prefills[PREFILL], names[0]
    for name in names:
        result = results[name]
        own_prefill = prefills[HF + PREFILL if name.startswith(HF) else PREFILL]["median_s"]
        seconds = statistics.median(result["seconds"])
        result["tokens_per_s"] = group["batch"] * options.new_tokens / seconds
        result["decode_tokens_per_s"] = group["batch"] * (options.new_tokens - 1) / max(seconds - own_prefill, 1e-9)
        # Speed against plain decoding in the same library (tfgen's baseline, or HF PyTorch's greedy search).
        result["speed_baseline"] = HF + "greedy" if name.startswith(HF) and HF + "greedy" in results else baseline
        seconds_of = {key: statistics.median(results[key]["seconds"]) for key in (name, result["speed_baseline"])}
        result["speedup"] = seconds_of[result["speed_baseline"]] / seconds_of[name]
        result["decode_speedup"] = (seconds_of[result["speed_baseline"]] - own_prefill) / max(
            seconds_of[name] - own_prefill, 1e-9)
        equal = (outputs[name] == outputs[baseline]).all(axis=1)
        result["rows_equal_to_baseline"] = int(equal.sum())
        result["agreement_with_baseline"] = harness.prefix_agreement(outputs[name], outputs[baseline])
        # The loop's own time per round (per step for plain decoding): the call less its prefill.
        if result["k"] or draft_tokens(config_options(name)) is None:  # HF's assisted rounds are not counted
            result["ms_per_round"] = 1000 * (seconds - own_prefill) / (
                max(result["draft_rounds"]) if result["k"] else options.new_tokens - 1)
        if result["k"]:
            rounds, accepted = np.array(result["draft_rounds"]), np.array(result["draft_accepted"])
            result["acceptance"] = float(accepted.sum() / max(rounds.sum() * result["k"], 1))
            result["tokens_per_round"] = float(np.sum(result["generated_lengths"]) / max(rounds.sum(), 1))
            result["loop_rounds"] = int(rounds.max())
        log(line(name, result))
    entry = {**{key: group[key] for key in ("name", "batch", "prompts")}, "prompt_tokens": mask.sum(axis=1).tolist(),
             "prefill": prefill, **({"hf_prefill": prefills[HF + PREFILL]} if hf_prefill else {}), "results": results,
             "first_row_text": {name: tokenizer.decode(outputs[name][0].tolist()) for name in names[:1]}}
    if options.exit_agreement and group["batch"] == 1 and not config_options(baseline)["do_sample"]:
        entry["exit_agreement"] = exit_agreement(model, ids, mask, outputs[baseline], options.exit_agreement)
        log("      argmax of the first L layers = the model's: " + ", ".join(
            f"L={layers} {share:.0%}" for layers, share in entry["exit_agreement"].items()))
    return entry


def exit_agreement(model, ids, mask, new_tokens, layer_counts) -> dict:
    """{L: the share of the generated positions where the argmax of the first L layers (+ final norm and head, what
    `assistant_early_exit=L` drafts with) equals the full model's}, over the baseline's greedy tokens of row 0."""
    import tensorflow as tf

    sequence = np.concatenate([ids[:1], new_tokens[:1]], axis=1).astype(np.int32)
    full_mask = np.concatenate([mask[:1], np.ones_like(new_tokens[:1])], axis=1).astype(np.int32)
    positions = np.maximum(np.cumsum(full_mask, axis=1) - 1, 0).astype(np.int32)
    first = ids.shape[1] - 1  # the position whose logits choose the first new token

    def argmax(layers):
        cache = model.init_cache(1, sequence.shape[1])
        out = model.call_with_cache(tf.constant(sequence), cache, 0, tf.constant(full_mask), tf.constant(positions),
                                    layers=layers)
        return np.asarray(out.logits)[0, first:-1].argmax(-1)

    reference = argmax(None)
    return {str(layers): float(np.mean(argmax(layers) == reference)) for layers in layer_counts}


def line(name, result) -> str:
    text = (f"      {name}: {result['tokens_per_s']:.1f} tokens/s, {result['speedup']:.2f}x (decode "
            f"{result['decode_tokens_per_s']:.1f} tokens/s, {result['decode_speedup']:.2f}x)")
    if result.get("k"):
        text += f", acceptance {result['acceptance']:.0%}, {result['tokens_per_round']:.2f} tokens/round"
    return text + f", rows equal {result['rows_equal_to_baseline']}/{len(result['generated_lengths'])}"


# ---------------------------------------------------------------------------------------------- the cost model


def step_timing(model, options, log=print) -> list[dict]:
    """Milliseconds of one `call_with_cache` of T tokens per row, timed inside a compiled loop of `--step-iterations`
    calls that carries the cache (written in place, as in the decode loops), over a buffer of `--step-buffer` slots.
    Heads: `stored` (the model's `[D, vocab]` head: plain one-row steps), `view` (the transposed copy a decoding
    view makes for multi-row calls, which the verification call and the early-exit drafter use), `none` (no head:
    the decoder layers alone); `layers` < all: the early-exit drafter's call."""
    import tensorflow as tf

    width, iterations, rows = options.step_buffer, options.step_iterations, []
    transposed = tf.Variable(tf.transpose(model.lm_head))
    layer_count = model.config.num_hidden_layers
    for batch, length, head, layers, per_row in options.step_cases:
        cache = model.init_cache(batch, width)
        mask = tf.ones([batch, width], tf.int32)
        tokens = tf.fill([batch, length], 1000)
        positions = tf.fill([batch, length], width // 2) + tf.range(length)[tf.newaxis]
        extra = {"head_transposed": transposed} if head == "view" else {}

        def body(index, cache, total):
            slot = width // 2 + index % 4
            out = model.call_with_cache(tokens, cache, tf.fill([batch], slot) if per_row else slot, mask, positions,
                                        compute_logits=head != "none", layers=layers or None, **extra)
            value = out.hidden_states if out.logits is None else out.logits
            return index + 1, out.cache, total + tf.reduce_sum(value[:, -1, :8])

        loop = tf.function(lambda cache: tf.while_loop(lambda i, c, t: i < iterations, body,
                                                       (tf.constant(0), cache, tf.constant(0.0)))[2],
                           jit_compile=True)
        loop(cache).numpy()
        seconds = []
        for _ in range(options.step_repeats):
            start = time.perf_counter()
            loop(cache).numpy()
            seconds.append(time.perf_counter() - start)
        row = {"batch": batch, "tokens": length, "head": head, "layers": layers or layer_count,
               "index": "row" if per_row else "scalar", "ms": 1000 * statistics.median(seconds) / iterations}
        rows.append(row)
        log(f"      batch {batch}, {length} token(s), head {head}, {row['layers']} layers, {row['index']} cache "
            f"index: {row['ms']:.1f} ms")
    return rows


def matmul_timing(options, log=print) -> list[dict]:
    """Milliseconds of `x [T, 576] @ W` over 128 float32 matrices `W [576, 1536]` (SmolLM2's width and MLP size; 453
    MB, about the model's weight bytes), T = 1 ... 17 rows: under XLA (what tfgen runs), numpy's BLAS and torch (what
    HF PyTorch runs), each the median of `--step-repeats` passes. Tells how a product's cost grows with its rows."""
    import tensorflow as tf

    width, inner, count = 576, 1536, 128
    weights = np.random.default_rng(0).standard_normal((count, width, inner), dtype=np.float32)
    variables = [tf.Variable(matrix) for matrix in weights]
    xla = tf.function(lambda x: tf.add_n([tf.reduce_sum(tf.matmul(x, variable)[:, :8]) for variable in variables]),
                      jit_compile=True)
    engines = {"xla": lambda x: xla(x).numpy(), "numpy": lambda x: sum(float((x @ w)[:, :8].sum()) for w in weights)}
    try:
        import torch

        matrices = [torch.from_numpy(matrix) for matrix in weights]
        engines["torch"] = lambda x: sum(float((torch.from_numpy(x) @ w)[:, :8].sum()) for w in matrices)
    except ImportError:
        pass
    rows = []
    for tokens in options.matmul_rows:
        x = np.ones((tokens, width), np.float32)
        for engine, product in engines.items():
            product(x)
            seconds = []
            for _ in range(options.step_repeats):
                start = time.perf_counter()
                product(x)
                seconds.append(time.perf_counter() - start)
            rows.append({"engine": engine, "tokens": tokens, "ms": 1000 * statistics.median(seconds),
                         "weight_bytes": weights.nbytes})
            log(f"      x [{tokens}, {width}] @ {count} W [{width}, {inner}] ({weights.nbytes >> 20} MB), {engine}: "
                f"{rows[-1]['ms']:.1f} ms")
    return rows


def split_groups(text: str) -> list[str]:
    """`--groups`: names separated by commas, ad-hoc groups (`BATCH:PROMPTS:CONFIG,...`) by semicolons."""
    if text == "none":  # e.g. only the step timing
        return []
    pieces = [piece for piece in text.split(";") if piece]
    return [name for piece in pieces for name in ([piece] if ":" in piece else piece.split(",")) if name]


def _step_case(text: str) -> tuple:
    """`BATCH:TOKENS:HEAD[:LAYERS[:row]]` (LAYERS 0 or absent: all; `row`: a per-row cache index `[B]`, as the
    speculative loop passes it, instead of a scalar)."""
    batch, length, head, *rest = text.split(":")
    if head not in ("stored", "view", "none") or rest[1:] not in ([], ["row"]) or len(rest) > 2:
        raise argparse.ArgumentTypeError(f"--step-cases: expected BATCH:TOKENS:stored|view|none[:LAYERS[:row]], "
                                         f"got {text!r}")
    return int(batch), int(length), head, int(rest[0]) if rest else 0, rest[1:] == ["row"]


# The plain step (one token, scalar index, each head), the verification call (k + 1 tokens, per-row index, the
# transposed head the loop's view uses for them; the stored head for comparison), the early-exit drafter's call.
DEFAULT_STEP_CASES = [
    "1:1:stored", "1:1:view", "1:1:none", "1:1:stored:0:row", "1:2:view:0:row", "1:3:view:0:row", "1:5:view:0:row",
    "1:5:stored:0:row", "1:9:view:0:row",
    "1:9:stored:0:row", "1:9:view", "1:17:view:0:row", "1:1:view:15:row", "1:1:view:8:row", "1:1:stored:8:row",
    "4:1:view", "4:5:view:0:row", "4:9:view:0:row", "16:1:view", "16:5:view:0:row", "16:9:view:0:row",
]


# ---------------------------------------------------------------------------------------------- the run


def run_benchmark(options, log=print, save=lambda results: None) -> dict:
    """Measures `options.groups` (and the step timing when asked); `save(results)` runs after each part, so a run cut
    short keeps what it measured."""
    results = {
        "benchmark": "speculative",
        "settings": {name: getattr(options, name) for name in ("groups", "runs", "warmup", "new_tokens",
                                                                "exit_agreement")},
        "machine": {
            "cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "load_average_at_start": os.getloadavg(), "versions": harness.library_versions(),
            "tfgen_compile_cache": os.environ.get("TFGEN_COMPILE_CACHE", "on (default)"),
        },
        "model": MODEL, "groups": [],
    }
    start = time.perf_counter()
    model, tokenizer, path = load_model()
    results["checkpoint"], results["load_s"] = path, time.perf_counter() - start
    options.checkpoint = path
    log(f"== {MODEL}: loaded in {results['load_s']:.1f} s")
    assistants = {}
    for text in options.groups:
        group = parse_group(text)
        log(f"   {group['name']}: batch {group['batch']}, {group['prompts']} prompts ...")
        results["groups"].append(measure_group(model, tokenizer, group, options, assistants, log))
        results["machine"]["load_average_at_end"] = os.getloadavg()
        save(results)
    if options.step_timing:
        log("   one call of T tokens (the cost model) ...")
        results["step_timing"] = step_timing(model, options, log)
        results["matmul_timing"] = matmul_timing(options, log)
        results["settings"]["step_buffer"] = options.step_buffer
    results["machine"]["load_average_at_end"] = os.getloadavg()
    save(results)
    return results


def merge(runs: list[dict]) -> dict:
    """One results dict from several runs: groups by name, a config measured again takes the later run's figures
    (and is marked); step timings by case, the later run's winning."""
    merged = json.loads(json.dumps(runs[0]))
    merged["runs"] = [run["machine"] for run in runs]
    for run in runs[1:]:
        merged["machine"]["load_average_at_end"] = run["machine"]["load_average_at_end"]
        by_name = {group["name"]: group for group in merged["groups"]}
        for group in run["groups"]:
            known = by_name.get(group["name"])
            if known is None:
                merged["groups"].append(group)
                continue
            for name, result in group["results"].items():
                result["remeasured"] = name in known["results"]
                known["results"][name] = result
        if run.get("matmul_timing"):
            merged["matmul_timing"] = run["matmul_timing"]
        if run.get("step_timing"):
            cases = {(row["batch"], row["tokens"], row["head"], row["layers"], row["index"]): row
                     for row in merged.get("step_timing", []) + run["step_timing"]}
            merged["step_timing"] = list(cases.values())
            merged["settings"]["step_buffer"] = run["settings"].get("step_buffer")
    return merged


# ---------------------------------------------------------------------------------------------- the report


def label(name: str) -> str:
    """A config's name in words."""
    options = config_options(name)
    if name.startswith(HF):
        return "HF PyTorch " + label(name[len(HF):])
    sampled = "sampling + " if options["do_sample"] and draft_tokens(options) else ""
    if "prompt_lookup_num_tokens" in options:
        return f"{sampled}prompt lookup k={options['prompt_lookup_num_tokens']}, n={options['max_matching_ngram_size']}"
    if "assistant_early_exit" in options:
        return f"{sampled}early exit L={options['assistant_early_exit']}, K={options['num_assistant_tokens']}"
    if "assistant_layers" in options:
        return f"{sampled}assistant ({options['assistant_layers']}-layer copy), K={options['num_assistant_tokens']}"
    return "sampling (top-k 50, top-p 0.9)" if options["do_sample"] else "greedy"


def _fmt(value, digits=1, suffix="") -> str:
    return "" if value is None else f"{value:.{digits}f}{suffix}"


def report_table(results: dict) -> str:
    """The groups as markdown (one row per config), then the step timings when measured. Speedups are against plain
    decoding in the same library; token equality against the group's first config (tfgen's plain decoding)."""
    header = ["prompts", "batch", "config", "tokens/s", "speedup", "decode tokens/s", "decode speedup", "acceptance",
              "tokens / round", "loop rounds", "ms / round", "= baseline tokens", "first call s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    remeasured, agreements = False, []
    for group in results["groups"]:
        baseline = next(iter(group["results"].values()))
        low, high = min(group["prompt_tokens"]), max(group["prompt_tokens"])
        prompts = (f"{group['prompts']} ({low}{'' if low == high else f'–{high}'} tokens, prefill "
                   f"{group['prefill']['median_s']:.2f} s)")
        if group.get("exit_agreement"):
            agreements.append(f"{group['name']}: " + ", ".join(f"L={layers} {100 * share:.0f}%" for layers, share
                                                                in group["exit_agreement"].items()))
        for name, result in group["results"].items():
            remeasured |= bool(result.get("remeasured"))
            rows = len(result["generated_lengths"])
            equal = f"{result['rows_equal_to_baseline']}/{rows} rows"
            if result["rows_equal_to_baseline"] < rows:
                equal += f" (**{100 * result['agreement_with_baseline']:.0f}% prefix**)"
            if result.get("tokens_changed_between_calls"):
                equal += " (**changed between calls**)"
            row = [prompts, str(group["batch"]), label(name) + (" \\*" if result.get("remeasured") else ""),
                   _fmt(result["tokens_per_s"]), f"{result['speedup']:.2f}×", _fmt(result["decode_tokens_per_s"]),
                   f"{result['decode_speedup']:.2f}×",
                   _fmt(100 * result["acceptance"], 0, "%") if result.get("k") else "",
                   _fmt(result.get("tokens_per_round"), 2), str(result.get("loop_rounds", "")),
                   _fmt(result.get("ms_per_round")),
                   equal if result is not baseline else "(baseline)", _fmt(result["compile_s"])]
            lines.append("| " + " | ".join(row) + " |")
    if agreements:
        lines += ["", "Argmax of the first L layers (+ final norm and head: the early-exit draft) = the full model's, "
                  "over the baseline's generated positions: " + "; ".join(agreements) + "."]
    if remeasured:
        lines += ["", "\\* measured again in a later run (`--from-json` merges runs; the later run's figures win)."]
    if results.get("step_timing"):
        lines += ["", f"One `call_with_cache` of T tokens per row (buffer of {results['settings'].get('step_buffer')} "
                  "slots; median per call inside a compiled loop that carries the cache; × plain step: against the "
                  "batch's "
                  "one-token call through every layer and the faster head):", "",
                  "| batch | tokens T | head | layers | cache index | ms per call | × plain step |",
                  "|---|---|---|---|---|---|---|"]
        # Per batch, the plain decode step: one token through every layer, the faster head.
        full, ones = max(row["layers"] for row in results["step_timing"]), {}
        for row in results["step_timing"]:
            if row["tokens"] == 1 and row["head"] != "none" and row["layers"] == full and row["index"] == "scalar":
                ones[row["batch"]] = min(ones.get(row["batch"], row["ms"]), row["ms"])
        for row in sorted(results["step_timing"], key=lambda r: (r["batch"], -r["layers"], r["tokens"], r["index"],
                                                                  r["head"])):
            ratio = f"{row['ms'] / ones[row['batch']]:.2f}×" if row["batch"] in ones else ""
            lines.append(f"| {row['batch']} | {row['tokens']} | {row['head']} | {row['layers']} | {row['index']} | "
                         f"{row['ms']:.1f} | {ratio} |")
    if results.get("matmul_timing"):
        timing = {(row["engine"], row["tokens"]): row["ms"] for row in results["matmul_timing"]}
        engines = list(dict.fromkeys(row["engine"] for row in results["matmul_timing"]))
        counts = sorted({row["tokens"] for row in results["matmul_timing"]})
        megabytes = results["matmul_timing"][0]["weight_bytes"] >> 20
        lines += ["", f"Matrix products `x [T, 576] @ W [576, 1536]` over 128 such float32 matrices ({megabytes} MB; "
                  "ms per pass, in brackets × the same engine's one-row pass):", "",
                  "| engine | " + " | ".join(f"T = {count}" for count in counts) + " |",
                  "|---|" + "---|" * len(counts)]
        for engine in engines:
            one = timing.get((engine, 1))
            cells = [f"{timing[(engine, count)]:.1f}" + (f" ({timing[(engine, count)] / one:.2f}×)" if one else "")
                     if (engine, count) in timing else "" for count in counts]
            lines.append(f"| {engine} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render(results: dict, page: Path) -> None:
    """Writes the table between this benchmark's markers of `page`; a page without them gets the section (heading
    and markers) appended. The prose around the markers is left alone."""
    settings, machine = results["settings"], results["machine"]
    loads = [run["load_average_at_start"][0] for run in results.get("runs", [machine])]
    block = "\n".join([
        BEGIN, "",
        f"_Generated by `python -m benchmarks.speculative`: {results['model']}, float32, {settings['new_tokens']} new "
        f"tokens per row (no eos), median of {settings['runs']} interleaved runs after {settings['warmup']} warm-up "
        f"call(s); {machine['cpus']} CPUs, load average at the start of each run "
        + ", ".join(f"{load:.1f}" for load in loads) + "; "
        + ", ".join(f"{name} {version}" for name, version in machine["versions"].items()) + "._",
        "", report_table(results), END,
    ])
    text = page.read_text() if page.exists() else "# Performance\n"
    if BEGIN not in text or END not in text:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    page.write_text(head + block + rest.split(END, 1)[1])


# ---------------------------------------------------------------------------------------------- the command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--groups", type=split_groups, default=list(GROUPS),
                        help=f"comma-separated group names ({', '.join(GROUPS)}; default: all) or one ad-hoc group "
                        "BATCH:PROMPTS:CONFIG,CONFIG (separate several with ';'); none: no group")
    parser.add_argument("--runs", type=int, default=3, help="timed rounds per group; median reported")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls after the first one")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--exit-agreement", type=harness._csv(int), default=[4, 8, 15, 20, 25, 28, 29],
                        help="layer counts L whose argmax agreement with the full model is measured on batch-1 greedy "
                        "groups (what early exit at L can hope to accept)")
    parser.add_argument("--step-timing", action="store_true", help="also time one call of T tokens (cost model)")
    parser.add_argument("--step-cases", type=harness._csv(_step_case), default=None,
                        help="BATCH:TOKENS:HEAD[:LAYERS],... (head: stored, view, none)")
    parser.add_argument("--step-buffer", type=int, default=640, help="cache slots of the step timing")
    parser.add_argument("--step-iterations", type=int, default=16)
    parser.add_argument("--matmul-rows", type=harness._csv(int), default=[1, 2, 3, 5, 9, 17],
                        help="rows T of the matrix product timing (with --step-timing)")
    parser.add_argument("--step-repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the raw results (every timing) to this JSON file")
    parser.add_argument("--from-json", help="render saved runs (comma-separated --json files) instead of measuring")
    parser.add_argument("--docs", nargs="?", const=str(DOCS_PAGE), metavar="PAGE",
                        help=f"also write the table into PAGE's speculative section (default {DOCS_PAGE})")
    parser.add_argument("--quick", action="store_true", help="smoke run: b1-code's first configs, 16 new tokens, "
                        "1 run, no warm-up")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.speculative", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    options = parser.parse_args(argv)
    if options.from_json:
        results = merge([json.loads(Path(path).read_text()) for path in options.from_json.split(",")])
    else:
        if options.quick:
            options.groups, options.runs, options.warmup, options.new_tokens = (
                ["1:code:greedy,pl-k8-n2,ee-l15-k3"], 1, 0, 16)
        options.step_cases = options.step_cases or [_step_case(case) for case in DEFAULT_STEP_CASES]
        if options.runs <= 0 or options.warmup < 0 or options.new_tokens <= 0:
            raise ValueError("--runs and --new-tokens must be positive, --warmup >= 0")
        for group in options.groups:
            parse_group(group)
        json_path = Path(options.json) if options.json else None
        results = run_benchmark(options, log=lambda text: print(time.strftime("%H:%M:%S ") + text, file=sys.stderr,
                                                                 flush=True),
                                save=lambda results: json_path and json_path.write_text(json.dumps(results, indent=1)))
    print(report_table(results))
    if options.docs:
        render(results, Path(options.docs))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as error:
        sys.exit(f"python -m benchmarks.speculative: error: {error}")
