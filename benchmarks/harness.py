"""The measurement: steady-state rounds of every library, the bandwidth probe, and the options that drive them.

Steady-state runs of all libraries alternate in one process (round-robin, rotating who goes first), so a busy
machine slows them alike and the ratios stay fair even when absolute numbers are noisy. First-call time and
peak memory come from a fresh subprocess per library (`first_call.py`). At batch 1 the results add the
roofline: the bytes of weights one decode step must read, divided by the matrix-vector bandwidth measured in
the same rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks.checkpoints import DEFAULT_TRAINED_MODEL, RANDOM_124M, checkpoint_info, resolve_checkpoint
from benchmarks.first_call import first_call_in_subprocess
from benchmarks.peers import (
    BENCH_REQUESTS,
    DEFAULT_LIBRARIES,
    DEFAULT_STRATEGIES,
    DETERMINISTIC,
    LIBRARIES,
    Unavailable,
    bench_prompt,
    load_runner,
    short_error,
)

# 512 MB of float32: far larger than any cache, like the weights of a decode step.
_PROBE_SHAPE = (8192, 16384)


class BandwidthProbe:
    """Matrix-vector bandwidth (GB/s): the faster of numpy's and XLA's product with a 512 MB float32 matrix."""

    def __init__(self):
        import tensorflow as tf

        self.matrix = np.random.default_rng(0).standard_normal(_PROBE_SHAPE, dtype=np.float32)
        self.vector = np.ones((1, _PROBE_SHAPE[0]), np.float32)
        variable = tf.Variable(self.matrix)
        self.xla = tf.function(lambda x: tf.matmul(x, variable), jit_compile=True)
        self.xla(self.vector).numpy()

    def measure(self) -> float:
        """One measurement: the matrix's bytes over the faster product's seconds, in GB/s."""
        seconds = []
        for product in (lambda: self.vector @ self.matrix, lambda: self.xla(self.vector).numpy()):
            start = time.perf_counter()
            product()
            seconds.append(time.perf_counter() - start)
        return self.matrix.nbytes / min(seconds) / 1e9


def prefix_agreement(tokens: np.ndarray, reference: np.ndarray) -> float:
    """Mean over rows of the fraction of new tokens before the first difference; both int `[B, N]`."""
    differs = tokens != reference
    first = np.where(differs.any(axis=1), differs.argmax(axis=1), tokens.shape[1])
    return float(np.mean(first / tokens.shape[1]))


def measure_cell(runners: dict, strategy: str, batch: int, options, info: dict, probe=None) -> dict:
    """Times every runner on one (strategy, batch): a first (compiling) call each, then `options.runs` rounds
    in rotating order. Returns {"strategy", "batch", "results": {library: {...}}, "bandwidth_gbs": [...]}."""
    input_ids = bench_prompt(batch, options.prompt_len, info["vocab_size"])
    results, outputs, active = {}, {}, []
    for library, runner in runners.items():
        if isinstance(runner, Unavailable):
            results[library] = {"error": str(runner)}
            continue
        try:
            start = time.perf_counter()
            outputs[library] = runner.generate(strategy, input_ids)
            compile_s = time.perf_counter() - start
            for _ in range(options.warmup):
                runner.generate(strategy, input_ids)
        except Exception as error:  # noqa: BLE001 - one library failing must not stop the others
            results[library] = {"error": short_error(error)}
            continue
        if outputs[library].shape != (batch, options.new_tokens):
            results[library] = {"error": f"returned {outputs[library].shape[1]} new tokens, not {options.new_tokens}"}
            continue
        results[library] = {"compile_s": compile_s, "seconds": []}
        active.append(library)
    bandwidth = []
    for round_index in range(options.runs):
        order = active[round_index % max(len(active), 1) :] + active[: round_index % max(len(active), 1)]
        for library in order:
            start = time.perf_counter()
            runners[library].generate(strategy, input_ids)
            results[library]["seconds"].append(time.perf_counter() - start)
        if probe is not None:
            bandwidth.append(probe.measure())
    for library in active:
        seconds = results[library]["seconds"]
        results[library]["tokens_per_s"] = batch * options.new_tokens / statistics.median(seconds)
        if strategy in DETERMINISTIC and "tfgen" in outputs and library != "tfgen":
            results[library]["agreement_with_tfgen"] = prefix_agreement(outputs[library], outputs["tfgen"])
    return {"strategy": strategy, "batch": batch, "results": results, "bandwidth_gbs": bandwidth}


def library_versions() -> dict:
    from importlib import metadata

    versions = {}
    for package in ("tensorflow", "keras", "tf-keras", "keras-hub", "transformers", "torch", "numpy"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    return versions


def run_benchmark(options, log=print) -> dict:
    """Runs the whole benchmark `options` describe (see `add_arguments`); returns the results as a dict (the
    format of the `--json` files in `benchmarks/results/`)."""
    results = {
        "settings": {
            name: getattr(options, name)
            for name in ("libraries", "strategies", "batches", "runs", "warmup", "prompt_len", "new_tokens")
        },
        "machine": {
            "cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "load_average_at_start": os.getloadavg(), "versions": library_versions(),
        },
        "models": [],
    }
    for model in options.models:
        checkpoint = resolve_checkpoint(model, options.cache_dir)
        info = checkpoint_info(checkpoint)
        log(f"== {model}: {info['parameters'] / 1e6:.1f}M parameters ({checkpoint})")
        entry = {"model": model, "checkpoint": checkpoint, **info, "first_call": {}, "cells": []}
        results["models"].append(entry)
        if options.first_call:
            for library in options.libraries:
                log(f"   first call, fresh process: {library} ...")
                entry["first_call"][library] = first_call_in_subprocess(library, checkpoint, options)
        if options.first_call_only:
            continue
        runners = {}
        for library in options.libraries:
            try:
                runners[library] = load_runner(library, checkpoint, options.new_tokens)
            except Unavailable as error:
                runners[library] = error
                log(f"   {library} unavailable: {error}")
        probe = BandwidthProbe() if 1 in options.batches else None
        for batch in options.batches:
            for strategy in options.strategies:
                log(f"   {strategy}, batch {batch} ...")
                cell = measure_cell(runners, strategy, batch, options, info, probe if batch == 1 else None)
                entry["cells"].append(cell)
                log(cell_line(cell))
        add_roofline(entry)
        del runners, probe
    results["machine"]["load_average_at_end"] = os.getloadavg()
    return results


def add_roofline(entry: dict) -> None:
    """Sets one model's `bandwidth_gbs` (the median of its cells' probes) and `roofline_tokens_per_s`, when any
    cell probed the bandwidth."""
    bandwidth = [value for cell in entry["cells"] for value in cell["bandwidth_gbs"]]
    if bandwidth:
        entry["bandwidth_gbs"] = statistics.median(bandwidth)
        entry["roofline_tokens_per_s"] = entry["bandwidth_gbs"] * 1e9 / entry["weight_bytes_per_step"]


def cell_line(cell) -> str:
    parts = []
    for library, result in cell["results"].items():
        parts.append(f"{library} {result['tokens_per_s']:.1f}" if "tokens_per_s" in result else f"{library} n/a")
    return "      tokens/s: " + ", ".join(parts)


# ---------------------------------------------------------------------------------------------- options


def _csv(kind, choices=None):
    def parse(text):
        values = [kind(item) for item in text.split(",") if item]
        bad = [value for value in values if choices is not None and value not in choices]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list from {choices}, got {text!r}")
        return values

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The measurement's options: models, libraries, requests, sizes, first-call subprocesses, `--json`."""
    default_models = [RANDOM_124M] + ([DEFAULT_TRAINED_MODEL] if Path(DEFAULT_TRAINED_MODEL).is_dir() else [])
    parser.add_argument(
        "--models", type=_csv(str), default=default_models,
        help=f"comma-separated: {RANDOM_124M} (GPT-2 small shape, random weights) and/or HF-layout directories "
        f"(default: {','.join(default_models)})",
    )
    parser.add_argument("--libraries", type=_csv(str, LIBRARIES), default=list(DEFAULT_LIBRARIES),
                        help=f"comma-separated subset of {','.join(LIBRARIES)} "
                              f"(default: {','.join(DEFAULT_LIBRARIES)})")
    parser.add_argument("--strategies", type=_csv(str, tuple(BENCH_REQUESTS)), default=list(DEFAULT_STRATEGIES),
                        help=f"comma-separated subset of {','.join(BENCH_REQUESTS)} "
                        f"(default: {','.join(DEFAULT_STRATEGIES)})")
    parser.add_argument("--batches", type=_csv(int), default=[1, 16, 32], help="comma-separated batch sizes")
    parser.add_argument("--runs", type=int, default=5, help="timed rounds per (strategy, batch); median reported")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls after the compiling one")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--no-first-call", dest="first_call", action="store_false",
                        help="skip the fresh-process first-call / peak-memory measurement")
    parser.add_argument("--first-call-only", action="store_true",
                        help="only the fresh-process first-call / peak-memory measurement, no steady runs")
    parser.add_argument("--worker-timeout", type=int, default=1800, help="seconds per first-call subprocess")
    parser.add_argument("--cache-dir", default=os.path.join(Path.home(), ".cache", "tfgen", "bench"),
                        help="where the random checkpoint is built once")
    parser.add_argument("--json", help="also write the raw results (every timing) to this JSON file")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: greedy only, batch 1, 2 runs, 8 new tokens, no first-call subprocess")


def apply_quick(options) -> None:
    """`--quick` overrides the sizes so the whole pipeline runs in seconds to minutes."""
    if options.quick:
        options.strategies, options.batches, options.runs, options.warmup = ["greedy"], [1], 2, 0
        options.new_tokens, options.first_call = 8, False


def check_options(options) -> None:
    """Raises `ValueError` (one line naming the flag) for sizes or flags that cannot be measured."""
    for name in ("runs", "prompt_len", "new_tokens"):
        if getattr(options, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(options, name)}")
    if options.warmup < 0 or any(batch <= 0 for batch in options.batches):
        raise ValueError("--warmup must be >= 0 and --batches positive")
    if options.first_call_only and not options.first_call:
        raise ValueError("--first-call-only and --no-first-call contradict each other")
