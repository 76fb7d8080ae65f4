"""`tfgen bench`: tokens/s of tfgen's `generate()` next to its peers, on the same weights.

The peers are HF transformers' TF `generate` under `tf.function(jit_compile=True)` (`hf-tf`), keras-hub's
`GPT2CausalLM.generate` (`keras-hub`) and HF transformers' PyTorch `generate` (`hf-torch`); install them with
`pip install -e ".[bench]"`. Every library loads the same HF-layout checkpoint. Steady-state runs of all
libraries alternate in one process (round-robin, rotating who goes first), so a busy machine slows them alike
and the ratios stay fair even when absolute numbers are noisy. First-call time and peak memory come from a
fresh subprocess per library. At batch 1 the report adds the roofline: the bytes of weights one decode step
must read, divided by the matrix-vector bandwidth measured in the same rounds.

`tools/bench.py` runs the same harness and renders `docs/performance.md` and its plots.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

RANDOM_124M = "random-124m"
DEFAULT_TRAINED_MODEL = "saved_models/stdlib-gpt2"
LIBRARIES = ("tfgen", "tfgen-bf16", "hf-tf", "keras-hub", "hf-torch")
DEFAULT_LIBRARIES = ("tfgen", "hf-tf", "keras-hub", "hf-torch")
PEERS = ("hf-tf", "keras-hub", "hf-torch")

# The same request in every library: HF generate keywords, and the keras-hub sampler that decodes alike.
STRATEGIES: dict[str, dict] = {
    "greedy": {"do_sample": False},
    "sample": {"do_sample": True, "top_k": 50, "top_p": 0.9},
    "beam": {"do_sample": False, "num_beams": 4},
    "contrastive": {"do_sample": False, "penalty_alpha": 0.6, "top_k": 4},
}
DETERMINISTIC = ("greedy", "beam", "contrastive")
# 512 MB of float32: far larger than any cache, like the weights of a decode step.
_PROBE_SHAPE = (8192, 16384)


# ---------------------------------------------------------------------------------------------- libraries


class Unavailable(Exception):
    """A library (or one of its strategies) cannot run here; the message says why."""


class _Runner:
    """One library holding one model. `generate(strategy, input_ids)` returns the new tokens int `[B, N]`."""

    def __init__(self, checkpoint: str, new_tokens: int):
        self.checkpoint, self.new_tokens = checkpoint, new_tokens

    def generate(self, strategy: str, input_ids: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class _TfgenRunner(_Runner):
    dtype = None

    def __init__(self, checkpoint, new_tokens):
        super().__init__(checkpoint, new_tokens)
        from tfgen.models.auto import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=self.dtype)

    def generate(self, strategy, input_ids):
        seed = [0, 0] if STRATEGIES[strategy]["do_sample"] else None
        try:
            out = self.model.generate(
                input_ids,
                attention_mask=np.ones_like(input_ids),
                max_new_tokens=self.new_tokens,
                eos_token_id=None,
                pad_token_id=0,
                seed=seed,
                **STRATEGIES[strategy],
            )
        except ValueError as error:
            if "not available" in str(error):
                raise Unavailable(str(error)) from None
            raise
        return np.asarray(out)[:, input_ids.shape[1] :]


class _TfgenBf16Runner(_TfgenRunner):
    dtype = "bfloat16"


class _HfTfRunner(_Runner):
    def __init__(self, checkpoint, new_tokens):
        super().__init__(checkpoint, new_tokens)
        import tensorflow as tf

        transformers = _quiet_transformers()
        try:
            self.model = transformers.TFGPT2LMHeadModel.from_pretrained(checkpoint, from_pt=True)
        except Exception as error:  # noqa: BLE001 - any failure of the TF path is reported, not fatal
            raise Unavailable(f"TFGPT2LMHeadModel.from_pretrained failed: {type(error).__name__}: {error}") from None
        self.tf = tf
        # HF's documented XLA recipe: one traced program per input shape and generation options.
        self.xla_generate = tf.function(self.model.generate, jit_compile=True)

    def generate(self, strategy, input_ids):
        options = dict(STRATEGIES[strategy])
        if options["do_sample"]:
            options["seed"] = [0, 0]  # stateless sampling, the XLA-compatible path
        ids = self.tf.constant(input_ids)
        out = self.xla_generate(
            ids,
            attention_mask=self.tf.ones_like(ids),
            max_new_tokens=self.new_tokens,
            eos_token_id=None,
            pad_token_id=0,
            **options,
        )
        return out.numpy()[:, input_ids.shape[1] :]


class _KerasHubRunner(_Runner):
    def __init__(self, checkpoint, new_tokens):
        super().__init__(checkpoint, new_tokens)
        try:
            import keras_hub
        except ImportError:
            raise Unavailable('keras-hub is not installed (pip install -e ".[bench]")') from None
        self.keras_hub = keras_hub
        # keras-hub converts HF-layout GPT-2 checkpoints itself when given their directory.
        self.backbone = keras_hub.models.GPT2Backbone.from_preset(checkpoint)
        self.models = {}  # one CausalLM per strategy: compile(sampler=) would drop the compiled function

    def _model(self, strategy):
        if strategy not in self.models:
            samplers = self.keras_hub.samplers
            sampler = {
                "greedy": lambda: samplers.GreedySampler(),
                "sample": lambda: samplers.TopPSampler(p=0.9, k=50, seed=0),
                "beam": lambda: samplers.BeamSampler(num_beams=4),
                "contrastive": lambda: samplers.ContrastiveSampler(k=4, alpha=0.6),
            }[strategy]()
            model = self.keras_hub.models.GPT2CausalLM(backbone=self.backbone, preprocessor=None)
            model.compile(sampler=sampler)
            self.models[strategy] = model
        return self.models[strategy]

    def generate(self, strategy, input_ids):
        batch, prompt_len = input_ids.shape
        # keras-hub generates into the unmasked slots of a fixed-length buffer.
        token_ids = np.zeros((batch, prompt_len + self.new_tokens), np.int32)
        token_ids[:, :prompt_len] = input_ids
        padding_mask = np.zeros(token_ids.shape, bool)
        padding_mask[:, :prompt_len] = True
        out = self._model(strategy).generate({"token_ids": token_ids, "padding_mask": padding_mask}, stop_token_ids=None)
        return np.asarray(out["token_ids"])[:, prompt_len:]


class _HfTorchRunner(_Runner):
    def __init__(self, checkpoint, new_tokens):
        super().__init__(checkpoint, new_tokens)
        try:
            import torch
        except ImportError:
            raise Unavailable('torch is not installed (pip install -e ".[bench]")') from None
        transformers = _quiet_transformers()
        self.torch = torch
        self.model = transformers.GPT2LMHeadModel.from_pretrained(checkpoint).eval()

    def generate(self, strategy, input_ids):
        torch = self.torch
        torch.manual_seed(0)
        ids = torch.tensor(input_ids, dtype=torch.long)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # contrastive search's "moving to the Hub" notice
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=self.new_tokens,
                eos_token_id=None,
                pad_token_id=0,
                **STRATEGIES[strategy],
            )
        return out.numpy()[:, input_ids.shape[1] :]


_RUNNERS = {
    "tfgen": _TfgenRunner,
    "tfgen-bf16": _TfgenBf16Runner,
    "hf-tf": _HfTfRunner,
    "keras-hub": _KerasHubRunner,
    "hf-torch": _HfTorchRunner,
}


def _quiet_transformers():
    try:
        import transformers
    except ImportError:
        raise Unavailable('transformers is not installed (pip install -e ".[bench]")') from None
    transformers.logging.set_verbosity_error()
    return transformers


def _load_runner(library: str, checkpoint: str, new_tokens: int) -> _Runner:
    try:
        return _RUNNERS[library](checkpoint, new_tokens)
    except ImportError as error:
        raise Unavailable(f"{library}: {error}") from None


# ------------------------------------------------------------------------------------------- checkpoints


def resolve_checkpoint(model: str, cache_dir: str) -> str:
    """A directory in HF layout for `model`: `random-124m` (built once under `cache_dir`) or a path."""
    if model != RANDOM_124M:
        if not (Path(model) / "config.json").is_file():
            raise ValueError(f"--models: {model!r} is neither {RANDOM_124M!r} nor a directory with config.json")
        return model
    directory = Path(cache_dir) / "random-gpt2-124m"
    if not (directory / "model.safetensors").is_file():
        import keras

        from tfgen.models.gpt2 import GPT2Config, GPT2LMHeadModel

        keras.utils.set_random_seed(0)
        # GPT-2 small's shape with HF's initialisation; every library loads this same file.
        GPT2LMHeadModel(GPT2Config()).save_pretrained(directory)
    return str(directory)


def checkpoint_info(checkpoint: str) -> dict:
    """Parameter count and the float32 bytes one batch-1 decode step reads (every weight once, except the
    position and, when the head is untied, token embeddings, of which it reads one row)."""
    from safetensors import safe_open

    config = json.loads((Path(checkpoint) / "config.json").read_text())
    sizes = {}
    for path in sorted(Path(checkpoint).glob("*.safetensors")):
        with safe_open(str(path), "np") as tensors:
            for name in tensors.keys():
                sizes[name.removeprefix("transformer.")] = int(np.prod(tensors.get_slice(name).get_shape()))
    read_once = {"wpe.weight"} | ({"wte.weight"} if "lm_head.weight" in sizes else set())
    return {
        "parameters": sum(sizes.values()),
        "weight_bytes_per_step": 4 * sum(size for name, size in sizes.items() if name not in read_once),
        "vocab_size": int(config["vocab_size"]),
        "n_layer": config.get("n_layer"),
        "n_embd": config.get("n_embd"),
    }


# ------------------------------------------------------------------------------------------ measurement


class _BandwidthProbe:
    """Matrix-vector bandwidth (GB/s): the faster of numpy's and XLA's product with a 512 MB float32 matrix."""

    def __init__(self):
        import tensorflow as tf

        rows, columns = _PROBE_SHAPE
        self.matrix = np.random.default_rng(0).standard_normal(_PROBE_SHAPE, dtype=np.float32)
        self.vector = np.ones((1, rows), np.float32)
        variable = tf.Variable(self.matrix)
        self.xla = tf.function(lambda x: tf.matmul(x, variable), jit_compile=True)
        self.xla(self.vector).numpy()

    def measure(self) -> float:
        seconds = []
        for product in (lambda: self.vector @ self.matrix, lambda: self.xla(self.vector).numpy()):
            start = time.perf_counter()
            product()
            seconds.append(time.perf_counter() - start)
        return self.matrix.nbytes / min(seconds) / 1e9


def _prompt(batch: int, prompt_len: int, vocab_size: int) -> np.ndarray:
    return np.random.default_rng(batch).integers(1, vocab_size, (batch, prompt_len)).astype(np.int32)


def _prefix_agreement(tokens: np.ndarray, reference: np.ndarray) -> float:
    """Mean over rows of the fraction of new tokens before the first difference."""
    differs = tokens != reference
    first = np.where(differs.any(axis=1), differs.argmax(axis=1), tokens.shape[1])
    return float(np.mean(first / tokens.shape[1]))


def _short(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}" if not isinstance(error, Unavailable) else str(error)
    return " ".join(text.split())[:300]


def measure_cell(runners: dict, strategy: str, batch: int, options, info: dict, probe=None) -> dict:
    """Times every runner on one (strategy, batch): a first (compiling) call each, then `options.runs` rounds
    in rotating order. Returns {"strategy", "batch", "results": {library: {...}}, "bandwidth_gbs": [...]}."""
    input_ids = _prompt(batch, options.prompt_len, info["vocab_size"])
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
            results[library] = {"error": _short(error)}
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
            results[library]["agreement_with_tfgen"] = _prefix_agreement(outputs[library], outputs["tfgen"])
    return {"strategy": strategy, "batch": batch, "results": results, "bandwidth_gbs": bandwidth}


def first_call_in_subprocess(library: str, checkpoint: str, options) -> dict:
    """Runs `_worker` in a fresh interpreter: load time, first-call time per strategy (batch 1), peak RSS."""
    command = [
        sys.executable, "-m", "tfgen.commands.bench", "--worker", library, checkpoint,
        ",".join(options.strategies), str(options.prompt_len), str(options.new_tokens),
    ]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "HF_HUB_OFFLINE": "1"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=options.worker_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {options.worker_timeout} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"error": _short(RuntimeError((done.stderr or done.stdout).strip().splitlines()[-1:] or "no output"))}
    return json.loads(lines[-1])


def _worker(library: str, checkpoint: str, strategies: str, prompt_len: str, new_tokens: str) -> None:
    start = time.perf_counter()
    report: dict = {"first_call_s": {}, "errors": {}}
    try:
        runner = _load_runner(library, checkpoint, int(new_tokens))
    except Exception as error:  # noqa: BLE001
        print(json.dumps({"error": _short(error)}))
        return
    report["load_s"] = time.perf_counter() - start
    input_ids = _prompt(1, int(prompt_len), checkpoint_info(checkpoint)["vocab_size"])
    for strategy in strategies.split(","):
        start = time.perf_counter()
        try:
            runner.generate(strategy, input_ids)
            report["first_call_s"][strategy] = time.perf_counter() - start
        except Exception as error:  # noqa: BLE001
            report["errors"][strategy] = _short(error)
    report["peak_rss_mb"] = _peak_rss_mb()
    print(json.dumps(report))


def _peak_rss_mb() -> float:
    """This process's peak resident memory in MB. Linux carries `ru_maxrss` over from the parent through fork
    and exec, so a worker started by a big benchmark process would report the parent's peak; the address
    space's own high-water mark (`VmHWM`) starts fresh at exec."""
    with contextlib.suppress(OSError):
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux, bytes on macOS


def _versions() -> dict:
    from importlib import metadata

    versions = {}
    for package in ("tensorflow", "keras", "tf-keras", "keras-hub", "transformers", "torch", "numpy"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    return versions


def run_benchmark(options, log=print) -> dict:
    """Runs the whole benchmark `options` describe (see `add_arguments`); returns the results as a dict."""
    results = {
        "settings": {
            name: getattr(options, name)
            for name in ("libraries", "strategies", "batches", "runs", "warmup", "prompt_len", "new_tokens")
        },
        "machine": {
            "cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "load_average_at_start": os.getloadavg(), "versions": _versions(),
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
                runners[library] = _load_runner(library, checkpoint, options.new_tokens)
            except Unavailable as error:
                runners[library] = error
                log(f"   {library} unavailable: {error}")
        probe = _BandwidthProbe() if 1 in options.batches else None
        for batch in options.batches:
            for strategy in options.strategies:
                log(f"   {strategy}, batch {batch} ...")
                cell = measure_cell(runners, strategy, batch, options, info, probe if batch == 1 else None)
                entry["cells"].append(cell)
                log(_cell_line(cell))
        bandwidth = [value for cell in entry["cells"] for value in cell["bandwidth_gbs"]]
        if bandwidth:
            entry["bandwidth_gbs"] = statistics.median(bandwidth)
            entry["roofline_tokens_per_s"] = entry["bandwidth_gbs"] * 1e9 / info["weight_bytes_per_step"]
        del runners, probe
    results["machine"]["load_average_at_end"] = os.getloadavg()
    return results


def _cell_line(cell) -> str:
    parts = []
    for library, result in cell["results"].items():
        parts.append(f"{library} {result['tokens_per_s']:.1f}" if "tokens_per_s" in result else f"{library} n/a")
    return "      tokens/s: " + ", ".join(parts)


# ---------------------------------------------------------------------------------------------- report


def _fmt(value, digits=1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def report_tables(results: dict) -> str:
    """The results as markdown tables: throughput with ratios and roofline, then first call and memory."""
    libraries = results["settings"]["libraries"]
    peers = [library for library in libraries if library in PEERS]
    lines = []
    for entry in results["models"]:
        roofline = entry.get("roofline_tokens_per_s")
        lines += [f"#### {entry['model']} ({entry['parameters'] / 1e6:.1f}M parameters, float32)", ""]
        if roofline:
            lines += [
                f"Batch-1 roofline: {entry['weight_bytes_per_step'] / 1e6:.0f} MB of weights per step at "
                f"{entry['bandwidth_gbs']:.1f} GB/s (median matrix-vector bandwidth measured between the runs) "
                f"= **{roofline:.1f} tokens/s**.",
                "",
            ]
        # Cells measured again in a later run (tools/bench.py merges runs): one marker per set of libraries.
        markers = {}
        for cell in entry["cells"]:
            if cell.get("remeasured"):
                markers.setdefault(tuple(cell["remeasured"]), "\\*" * (len(markers) + 1))
        header = ["strategy", "batch", *libraries, *(f"tfgen ÷ {peer}" for peer in peers)]
        if roofline:
            header.append("tfgen % of roofline")
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for cell in entry["cells"]:
            speed = {lib: cell["results"].get(lib, {}).get("tokens_per_s") for lib in libraries}
            strategy = cell["strategy"] + (f" {markers[tuple(cell['remeasured'])]}" if cell.get("remeasured") else "")
            row = [strategy, str(cell["batch"]), *(_fmt(speed[lib]) for lib in libraries)]
            for peer in peers:
                both = speed.get("tfgen") and speed.get(peer)
                row.append(f"{speed['tfgen'] / speed[peer]:.2f}×" if both else "n/a")
            if roofline:
                tfgen = speed.get("tfgen")
                # The roofline is a bound for one token per row per step; beams and candidates read more.
                one_token = cell["batch"] == 1 and cell["strategy"] in ("greedy", "sample")
                row.append(f"{100 * tfgen / roofline:.0f}%" if one_token and tfgen else "")
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
        for remeasured, marker in markers.items():
            lines += [
                f"{marker} measured again in later runs for {', '.join(remeasured)}; the other libraries' figures "
                "come from the first run (tools/bench.py merges runs; docs/performance.md lists which run "
                "measured what).",
                "",
            ]
        agreements = [
            (cell, lib, cell["results"][lib]["agreement_with_tfgen"])
            for cell in entry["cells"] for lib in libraries if "agreement_with_tfgen" in cell["results"].get(lib, {})
        ]
        if agreements:
            lines += [
                "Token agreement with tfgen (deterministic strategies; mean fraction of new tokens before the "
                "first difference): "
                + ", ".join(f"{cell['strategy']}/{cell['batch']} {lib} {100 * a:.0f}%" for cell, lib, a in agreements),
                "",
            ]
        errors = sorted({
            f"{lib} {cell['strategy']}: {result['error']}"
            for cell in entry["cells"] for lib, result in cell["results"].items() if "error" in result
        })
        if errors:
            lines += ["Not measured:", "", *(f"- {error}" for error in errors), ""]
        if entry["first_call"]:
            strategies = results["settings"]["strategies"]
            header = ["library", "load s", *(f"first call {s} s" for s in strategies), "peak RSS MB"]
            lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            for library, first in entry["first_call"].items():
                if "error" in first:
                    lines.append(f"| {library} | {first['error']} |" + " |" * (len(header) - 2))
                    continue
                calls = [_fmt(first["first_call_s"].get(s)) for s in strategies]
                lines.append(
                    f"| {library} | {_fmt(first['load_s'])} | " + " | ".join(calls) + f" | {first['peak_rss_mb']:.0f} |"
                )
            lines.append("")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- the CLI


def _csv(kind, choices=None):
    def parse(text):
        values = [kind(item) for item in text.split(",") if item]
        bad = [value for value in values if choices is not None and value not in choices]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list from {choices}, got {text!r}")
        return values

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    default_models = [RANDOM_124M] + ([DEFAULT_TRAINED_MODEL] if Path(DEFAULT_TRAINED_MODEL).is_dir() else [])
    parser.add_argument(
        "--models", type=_csv(str), default=default_models,
        help=f"comma-separated: {RANDOM_124M} (GPT-2 small shape, random weights) and/or HF-layout directories "
        f"(default: {','.join(default_models)})",
    )
    parser.add_argument("--libraries", type=_csv(str, LIBRARIES), default=list(DEFAULT_LIBRARIES),
                        help=f"comma-separated subset of {','.join(LIBRARIES)} (default: {','.join(DEFAULT_LIBRARIES)})")
    parser.add_argument("--strategies", type=_csv(str, tuple(STRATEGIES)), default=list(STRATEGIES),
                        help=f"comma-separated subset of {','.join(STRATEGIES)}")
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
    for name in ("runs", "prompt_len", "new_tokens"):
        if getattr(options, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(options, name)}")
    if options.warmup < 0 or any(batch <= 0 for batch in options.batches):
        raise ValueError("--warmup must be >= 0 and --batches positive")
    if options.first_call_only and not options.first_call:
        raise ValueError("--first-call-only and --no-first-call contradict each other")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="tokens/s of generate() next to HF transformers and keras-hub")
    add_arguments(parser)
    parser.set_defaults(handler=run)


def run(options) -> int:
    apply_quick(options)
    check_options(options)
    results = run_benchmark(options, log=lambda text: print(text, file=sys.stderr, flush=True))
    if options.json:
        Path(options.json).write_text(json.dumps(results, indent=1))
    print(report_tables(results))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "--worker":
        _worker(*sys.argv[2:])
    else:
        cli = argparse.ArgumentParser(prog="python -m tfgen.commands.bench")
        add_arguments(cli)
        sys.exit(run(cli.parse_args()))
