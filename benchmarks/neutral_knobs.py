"""What carrying the neutral sampling knobs costs: today's programs against the old minimal ones (issue 12).

Every sampling program carries temperature, top-k (a static 64-candidate cap when off), top-p, min-p,
typical-p and the repetition penalty (the processors declared with presence "sampling" / "always",
`tfgen.logits`), fed
neutral values when a request leaves them off, so that switching them per request never compiles a new
program; greedy programs carry the repetition penalty. This script measures what that costs:

    A  "carried": today's program, every knob neutral (`do_sample=True, top_k=0`, the rest at their neutral
       values, so the model's own generation config cannot switch a warper on).
    B  "minimal": the same call with both always-on sets emptied (the old program, only what the request
       turns on); its `ProcessorSpec` differs, so it is a program of its own.
    C  the same comparison for greedy search (the carried repetition penalty alone).

Per model and batch, the programs of a cell alternate in one process (rotating who goes first each round), so
a busy machine slows them alike; each compiles exactly once (checked with `model.generate_trace_count`) and
nothing retraces while timed. Every round uses a fresh seed, the same for all programs, and the programs must
return identical tokens (the neutral knobs may not change a single one). A timed sample repeats the call until
it lasts `--min-sample-s` (the 2.6M model's calls take milliseconds).

Which processor costs it: the processors alone (no model) are timed per program, the minimal one plus one
carried processor at a time, each an XLA loop of the same steps over fixed logits that runs the program's
`ProcessorSpec` on the same neutral knobs (fed as inputs, as `generate` feeds them) and draws (or takes the
argmax). Their calls are short, so the fastest of many rounds is kept, which a busy machine disturbs far less
than the end-to-end medians; their extra time is set against B's whole generate call. `--ablate` also times
generate itself with one carried processor at a time (slow, and noisy on a shared machine).

    python -m benchmarks.neutral_knobs                       # both models, batch 1 and 16 (5-13 minutes on 2
                                                             # busy CPUs, most of it the 124M model at batch 16)
    python -m benchmarks.neutral_knobs --models saved_models/stdlib-gpt2 --ablate always --json run.json

Run it from the root of a checkout, like `python -m benchmarks`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.checkpoints import DEFAULT_TRAINED_MODEL, RANDOM_124M, checkpoint_info, resolve_checkpoint
from benchmarks.harness import _csv
from benchmarks.peers import bench_prompt

# The requests, every warper knob at its neutral value: the model's generation config (the shipped model's
# asks for temperature 0.8 and top-p 0.95) must not switch one on, in A or in B.
REQUESTS = {
    "sample": {
        "do_sample": True, "top_k": 0, "temperature": 1.0, "top_p": 1.0, "typical_p": 1.0, "min_p": None,
        "repetition_penalty": 1.0,
    },
    "greedy": {"do_sample": False, "temperature": 1.0, "top_p": 1.0, "repetition_penalty": 1.0},
}


@dataclasses.dataclass(frozen=True)
class Variant:
    """A program to time: which processors are always on (None: the library's own sets)."""

    name: str
    always_on: tuple | None = None
    always_on_when_sampling: tuple | None = None


CARRIED = Variant("carried (A)")
MINIMAL = Variant("minimal (B)", (), ())


def _carried(presence: str) -> tuple:
    """The library's processors of `presence` ("always": every program; "sampling": every sampling program)."""
    from tfgen.logits import pipeline

    return tuple(processor.name for processor in pipeline.PIPELINE if processor.presence == presence)


@contextlib.contextmanager
def carrying(variant: Variant):
    """Within the block, the processor pipeline carries only `variant`'s always-on sets (the others are present only
    when a request turns them on, as before issue 12)."""
    from tfgen.logits import pipeline

    kept = {"always": variant.always_on, "sampling": variant.always_on_when_sampling}
    saved = pipeline.PIPELINE
    pipeline.PIPELINE = tuple(
        processor if kept.get(processor.presence) is None or processor.name in kept[processor.presence]
        else dataclasses.replace(processor, presence="built")
        for processor in saved
    )
    try:
        yield
    finally:
        pipeline.PIPELINE = saved


def _only(names: tuple, name: str) -> tuple:
    return tuple(n for n in names if n == name)


def ablation_variants(request: str) -> list[Variant]:
    """The minimal program plus one of the processors the library carries for `request`, for each of them."""
    always_on = _carried("always")
    when_sampling = _carried("sampling") if REQUESTS[request]["do_sample"] else ()
    variants = [
        Variant(f"+ {name} only", _only(always_on, name), _only(when_sampling, name))
        for name in dict.fromkeys(when_sampling + always_on)
    ]
    # With a single carried processor, "it alone" is the carried program itself: nothing to split.
    return variants if len(variants) > 1 else []


def _enabled(processor_spec) -> str:
    """The processors a `ProcessorSpec` switches on, as one short string."""
    on = [field.name for field in dataclasses.fields(processor_spec) if getattr(processor_spec, field.name) is True]
    if processor_spec.top_k_cap:
        on.append(f"top_k_cap={processor_spec.top_k_cap}")
    return ", ".join(on) or "(none)"


class Cell:
    """One (model, request, batch): its programs, compiled once each, then timed in interleaved rounds."""

    def __init__(self, model, request: str, batch: int, variants: list[Variant], options):
        self.model, self.request, self.batch, self.options = model, request, batch, options
        self.variants = variants
        self.input_ids = bench_prompt(batch, options.prompt_len, int(model.config.vocab_size))
        self.results = {variant.name: {"seconds": []} for variant in variants}
        self.mismatches: list[str] = []
        # Calls per timed sample: enough for `options.min_sample_s` (small models take milliseconds a call).
        self.repeats = 1

    def generate(self, variant: Variant, seed: int) -> np.ndarray:
        """The new tokens of one call with `variant`'s program, int `[batch, new_tokens]`."""
        ids = self.input_ids
        with carrying(variant):
            out = self.model.generate(
                ids, attention_mask=np.ones_like(ids), max_new_tokens=self.options.new_tokens, eos_token_id=None,
                pad_token_id=0, seed=[seed, self.batch] if REQUESTS[self.request]["do_sample"] else None,
                **REQUESTS[self.request],
            )
        return np.asarray(out)[:, ids.shape[1] :]

    def compile(self, log, programs: dict) -> None:
        """The compiling call and the warm-up of every program; checks that each program is traced exactly once
        (`programs`: the processors of the programs compiled before, by (request, batch, variant name); they
        must not trace again) and that all return the same tokens."""
        from tfgen.generation.programs import program_cache

        cache = program_cache(self.model)
        reference = None
        for variant in self.variants:
            known = (self.request, self.batch, variant.name)
            keys, traces = set(cache.functions), self.model.generate_trace_count
            start = time.perf_counter()
            tokens = self.generate(variant, 0)
            result = self.results[variant.name]
            result["compile_s"] = time.perf_counter() - start
            result["traces"] = self.model.generate_trace_count - traces
            new_keys = [key for key in cache.functions if key not in keys]
            wanted = 0 if known in programs else 1
            if result["traces"] != wanted or len(new_keys) != wanted:
                raise AssertionError(
                    f"{variant.name}: {result['traces']} traces, {len(new_keys)} new programs (want {wanted})"
                )
            if new_keys:
                programs[known] = _enabled(new_keys[0][1].processor_spec)
            result["processors"] = programs[known]
            for _ in range(max(self.options.warmup, 1)):
                start = time.perf_counter()
                self.generate(variant, 0)
                warm_s = time.perf_counter() - start
            self.repeats = max(self.repeats, math.ceil(self.options.min_sample_s / warm_s))
            if self.model.generate_trace_count != traces + wanted:
                raise AssertionError(f"{variant.name} retraced during its warm-up")
            if wanted:
                log(f"      {variant.name}: compiled in {result['compile_s']:.1f} s; "
                    f"processors: {result['processors']}")
            reference = self._check(reference, tokens, variant, "compiling call")

    def _check(self, reference, tokens, variant, when):
        if tokens.shape != (self.batch, self.options.new_tokens):
            raise AssertionError(f"{variant.name} returned {tokens.shape}, not {(self.batch, self.options.new_tokens)}")
        if reference is not None and not np.array_equal(tokens, reference):
            rows = int(np.sum(np.any(tokens != reference, axis=1)))
            self.mismatches.append(f"{variant.name}, {when}: {rows} of {self.batch} rows differ")
        return tokens if reference is None else reference

    def time_rounds(self, rounds: int) -> None:
        """`rounds` rounds, rotating which program goes first; every round has its own seed."""
        traces = self.model.generate_trace_count
        count = len(self.variants)
        for round_index in range(rounds):
            order = self.variants[round_index % count :] + self.variants[: round_index % count]
            outputs = {}
            for variant in order:
                start = time.perf_counter()
                for _ in range(self.repeats):
                    outputs[variant.name] = self.generate(variant, round_index + 1)
                self.results[variant.name]["seconds"].append((time.perf_counter() - start) / self.repeats)
            reference = None
            for variant in self.variants:
                reference = self._check(reference, outputs[variant.name], variant, f"round {round_index + 1}")
        if self.model.generate_trace_count != traces:
            raise AssertionError(f"{self.model.generate_trace_count - traces} retraces while timing")

    def summary(self, baseline: str) -> dict:
        """Per program: median tokens/s and, against `baseline` (all as tokens/s ratios, < 1 = slower): the ratio
        of the medians, the median / min / max of the per-round ratios, and the ratio of the best rounds."""
        new_tokens = self.batch * self.options.new_tokens
        base = self.results[baseline]["seconds"]
        for result in self.results.values():
            seconds = result["seconds"]
            result["tokens_per_s"] = new_tokens / statistics.median(seconds)
            per_round = [b / s for b, s in zip(base, seconds)]
            result["ratio"] = statistics.median(base) / statistics.median(seconds)
            result["ratio_per_round"] = statistics.median(per_round)
            result["ratio_min"], result["ratio_max"] = min(per_round), max(per_round)
            result["ratio_best"] = min(base) / min(seconds)
        return {
            "request": self.request, "batch": self.batch, "repeats": self.repeats, "results": self.results,
            "mismatches": self.mismatches,
        }


def processor_spec(request: str, variant: Variant, vocab_size: int):
    """The `ProcessorSpec` that `variant`'s program of `request` runs (as `generate` builds it)."""
    from tfgen.config.generation_config import GenerationConfig
    from tfgen.logits.pipeline import resolve_processors

    with carrying(variant):
        return resolve_processors(GenerationConfig(**REQUESTS[request], eos_token_id=None), vocab_size).spec


def isolated_pipeline(request: str, batch: int, vocab_size: int, variants: list[Variant], options) -> dict:
    """The processors alone, without the model: per variant, an XLA program of `new_tokens` steps that runs its
    `ProcessorSpec` (fed the neutral knobs as inputs, as `generate` feeds them) on fixed random logits plus a
    step-dependent shift, draws (or takes the argmax) and writes the token into the buffer the repetition
    penalty reads. Rounds interleave like the end-to-end ones; short calls, so the fastest round is kept.
    Returns {variant name: {"processors", "seconds": [...], "best_s"}}."""
    import tensorflow as tf

    from tfgen.config.generation_config import GenerationConfig
    from tfgen.decoding.state import sample_from_scores
    from tfgen.logits.context import ProcessorContext
    from tfgen.logits.pipeline import apply_processors, resolve_processors

    steps, prompt_len = options.new_tokens, options.prompt_len
    width = prompt_len + steps
    config = GenerationConfig(**REQUESTS[request], eos_token_id=None)
    knobs = {name: tf.constant(value) for name, value in resolve_processors(config, vocab_size).knobs(batch).items()}
    logits = tf.constant(np.random.default_rng(0).standard_normal((batch, vocab_size), dtype=np.float32) * 3)
    prompt = tf.constant(bench_prompt(batch, prompt_len, vocab_size))
    seeds = tf.constant(np.stack([np.arange(batch), np.full(batch, 7)], -1).astype(np.int32))
    do_sample = REQUESTS[request]["do_sample"]

    def program(spec):
        def run(logits, prompt, seeds, knobs):
            def body(step, sequences):
                ctx = ProcessorContext(sequences, tf.constant(0), prompt_len + step, tf.constant(prompt_len),
                                       tf.fill([batch], width))
                scores = apply_processors(spec, logits + tf.cast(step, tf.float32) * 1e-3, ctx, knobs)
                if do_sample:
                    tokens = sample_from_scores(scores, seeds, step)
                else:
                    tokens = tf.argmax(scores, axis=-1, output_type=tf.int32)
                column = tf.range(width) == prompt_len + step
                return step + 1, tf.where(column[None, :], tokens[:, None], sequences)

            sequences = tf.concat([prompt, tf.zeros([batch, steps], tf.int32)], axis=1)
            return tf.while_loop(lambda step, _: step < steps, body, (tf.constant(0), sequences))[1]

        return tf.function(run, jit_compile=True, autograph=False)

    results, programs = {}, {}
    for variant in variants:
        spec = processor_spec(request, variant, vocab_size)
        programs[variant.name] = program(spec)
        programs[variant.name](logits, prompt, seeds, knobs).numpy()  # compiles
        results[variant.name] = {"processors": _enabled(spec), "seconds": []}
    for round_index in range(options.isolated_rounds):
        order = variants[round_index % len(variants) :] + variants[: round_index % len(variants)]
        for variant in order:
            start = time.perf_counter()
            programs[variant.name](logits, prompt, seeds, knobs).numpy()
            results[variant.name]["seconds"].append(time.perf_counter() - start)
    for result in results.values():
        result["best_s"] = min(result["seconds"])
    return results


def measure_model(model_name: str, options, log) -> dict:
    """Every (request, batch) cell of one model; ablations where asked for."""
    from tfgen.auto.models import AutoModelForCausalLM

    checkpoint = resolve_checkpoint(model_name, options.cache_dir)
    info = checkpoint_info(checkpoint)
    log(f"== {model_name}: {info['parameters'] / 1e6:.1f}M parameters, vocabulary {info['vocab_size']}")
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    rounds = options.rounds_124m if model_name == RANDOM_124M else options.rounds
    entry = {"model": model_name, "checkpoint": checkpoint, **info, "rounds": rounds, "cells": []}
    programs: dict = {}
    for request in options.requests:
        for batch in options.batches:
            log(f"   {request}, batch {batch}: compiling A and B ...")
            cell = Cell(model, request, batch, [CARRIED, MINIMAL], options)
            cell.compile(log, programs)
            cell.time_rounds(rounds)
            summary = cell.summary(MINIMAL.name)
            entry["cells"].append(summary)
            ratio = summary["results"][CARRIED.name]["ratio"]
            log(f"      A/B = {ratio:.3f} ({_tokens_line(summary)})")
            extra = ablation_variants(request)
            if extra and (options.ablate == "always" or (options.ablate == "auto" and ratio < 1 - options.target)):
                log(f"   {request}, batch {batch}: ablation, one carried processor at a time ...")
                ablation = Cell(model, request, batch, [MINIMAL, CARRIED, *extra], options)
                ablation.compile(log, programs)
                ablation.time_rounds(rounds)
                summary["ablation"] = ablation.summary(MINIMAL.name)
                log(f"      {_tokens_line(summary['ablation'])}")
            for variant in (CARRIED, MINIMAL):  # the specs the isolated programs use are the generate programs'
                spec = processor_spec(request, variant, info["vocab_size"])
                if _enabled(spec) != programs[(request, batch, variant.name)]:
                    raise AssertionError(f"{variant.name}: processor_spec() is not the spec generate compiled")
            if options.isolated:
                log(f"   {request}, batch {batch}: the processors alone, one carried processor at a time ...")
                summary["isolated"] = isolated_pipeline(
                    request, batch, info["vocab_size"], [MINIMAL, CARRIED, *extra], options
                )
    del model
    return entry


def _tokens_line(summary) -> str:
    return ", ".join(f"{name} {result['tokens_per_s']:.1f} tok/s" for name, result in summary["results"].items())


def _isolated_cost(cell, name: str) -> str:
    """The extra time of program `name`'s processors over B's, as a share of B's median generate call."""
    if "isolated" not in cell:
        return "–"
    extra = cell["isolated"][name]["best_s"] - cell["isolated"][MINIMAL.name]["best_s"]
    return f"{extra / statistics.median(cell['results'][MINIMAL.name]['seconds']) * 100:+.1f}%"


def _per_round(result) -> str:
    return f"{result['ratio_per_round']:.3f} [{result['ratio_min']:.3f}–{result['ratio_max']:.3f}]"


def report(results: dict) -> str:
    """The markdown tables: A against B per cell, then the ablations."""
    lines = [
        "| model | request | batch | rounds × calls | A carried tok/s | B minimal tok/s | A/B (medians) "
        "| A/B per round: median [min–max] | A/B best rounds | cost (medians) | cost, processors alone "
        "| tokens identical |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    ablations, isolated = [], []
    for entry in results["models"]:
        for cell in entry["cells"]:
            a, b = cell["results"][CARRIED.name], cell["results"][MINIMAL.name]
            lines.append(
                f"| {entry['model']} | {cell['request']} | {cell['batch']} | {entry['rounds']} × {cell['repeats']} "
                f"| {a['tokens_per_s']:.1f} "
                f"| {b['tokens_per_s']:.1f} | {a['ratio']:.3f} | {_per_round(a)} | {a['ratio_best']:.3f} "
                f"| {(1 - a['ratio']) * 100:+.1f}% | {_isolated_cost(cell, CARRIED.name)} "
                f"| {'yes' if not cell['mismatches'] else 'NO'} |"
            )
            if "ablation" in cell:
                ablations.append((entry, cell))
            if "isolated" in cell:
                isolated.append((entry, cell))
    if ablations:
        lines += [
            "",
            "Ablation (same rounds; ratios against the minimal program B):",
            "",
            "| model | request | batch | program | processors | tok/s | vs B (medians) | vs B per round: median "
            "[min–max] | vs B best rounds |",
            "|---|---|---:|---|---|---:|---:|---:|---:|",
        ]
        for entry, cell in ablations:
            for name, result in cell["ablation"]["results"].items():
                lines.append(
                    f"| {entry['model']} | {cell['request']} | {cell['batch']} | {name} | {result['processors']} "
                    f"| {result['tokens_per_s']:.1f} | {result['ratio']:.3f} | {_per_round(result)} "
                    f"| {result['ratio_best']:.3f} |"
                )
    if isolated:
        lines += [
            "",
            "The processors alone (no model: each program's processors and draw for the same steps on fixed logits, "
            "fastest round); 'extra' is over B's, and its share is of B's whole generate call above:",
            "",
            "| model | request | batch | program | processors | ms per call | extra ms per call | extra / B's call |",
            "|---|---|---:|---|---|---:|---:|---:|",
        ]
        for entry, cell in isolated:
            base = cell["isolated"][MINIMAL.name]["best_s"]
            for name, result in cell["isolated"].items():
                lines.append(
                    f"| {entry['model']} | {cell['request']} | {cell['batch']} | {name} | {result['processors']} "
                    f"| {result['best_s'] * 1e3:.2f} | {(result['best_s'] - base) * 1e3:+.2f} "
                    f"| {_isolated_cost(cell, name)} |"
                )
    mismatches = [
        f"{entry['model']} {cell['request']} b{cell['batch']}: {text}"
        for entry in results["models"] for cell in entry["cells"]
        for text in cell["mismatches"] + cell.get("ablation", {}).get("mismatches", [])
    ]
    lines += ["", "Identical tokens in every call of every program: " + ("yes" if not mismatches else "NO")]
    lines += [f"- {text}" for text in mismatches]
    lines += [f"Load average: {results['load_average_at_start']} at start, {results['load_average_at_end']} at end; "
              f"{results['seconds']:.0f} s in all."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    default_models = [RANDOM_124M] + ([DEFAULT_TRAINED_MODEL] if Path(DEFAULT_TRAINED_MODEL).is_dir() else [])
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.neutral_knobs", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--models", type=_csv(str), default=default_models,
                        help=f"comma-separated: {RANDOM_124M} and/or HF-layout directories (default: "
                        f"{','.join(default_models)})")
    parser.add_argument("--requests", type=_csv(str, tuple(REQUESTS)), default=list(REQUESTS))
    parser.add_argument("--batches", type=_csv(int), default=[1, 16])
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds per cell (default 15)")
    parser.add_argument("--rounds-124m", type=int, default=4,
                        help=f"timed rounds per cell of {RANDOM_124M} (default 4)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls per program after the compiling one "
                        "(at least 1: it sets the calls per sample)")
    parser.add_argument("--min-sample-s", type=float, default=0.3,
                        help="a timed sample repeats the call (same seed) until it lasts about this long (default 0.3)")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--target", type=float, default=0.03, help="the cost (fraction) above which --ablate auto runs")
    parser.add_argument("--ablate", choices=("auto", "always", "never"), default="never",
                        help="also time generate with the minimal program plus one carried processor at a time: for "
                        "the cells that cost more than --target (auto), for every sampling cell (always), or not "
                        "(never, the default: slow, and on a busy machine too noisy to split a few percent; the "
                        "processors-alone programs split it instead)")
    parser.add_argument("--no-isolated", dest="isolated", action="store_false",
                        help="skip timing the processors alone (no model), one carried processor at a time")
    parser.add_argument("--isolated-rounds", type=int, default=15,
                        help="rounds of the processors-alone programs (default 15; the fastest counts)")
    parser.add_argument("--cache-dir", default=os.path.join(Path.home(), ".cache", "tfgen", "bench"),
                        help="where the random checkpoint is built once")
    parser.add_argument("--json", help="also write every timing to this JSON file")
    options = parser.parse_args(argv)
    if min(options.rounds, options.rounds_124m, options.new_tokens, options.prompt_len, *options.batches) <= 0:
        parser.error("--rounds, --rounds-124m, --new-tokens, --prompt-len and --batches must be positive")

    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    began = time.perf_counter()
    results = {"settings": {k: v for k, v in vars(options).items() if k != "json"},
               "load_average_at_start": os.getloadavg(), "models": []}
    for model_name in options.models:
        results["models"].append(measure_model(model_name, options, log))
    results["load_average_at_end"] = os.getloadavg()
    results["seconds"] = time.perf_counter() - began
    if options.json:
        Path(options.json).write_text(json.dumps(results, indent=1))
    print(report(results))
    mismatched = any(cell["mismatches"] or cell.get("ablation", {}).get("mismatches")
                     for entry in results["models"] for cell in entry["cells"])
    if mismatched:
        raise AssertionError("the carried neutral knobs changed tokens (see the table)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
