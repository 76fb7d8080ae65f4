"""keras-hub's own `generate()` next to tfgen's on the same keras-hub model object (`tfgen.from_keras_hub`).

    python -m benchmarks.keras_hub_adapter                          # SmolLM2-135M in keras-hub (~20 min here)
    python -m benchmarks.keras_hub_adapter --quick                  # smoke run of the whole pipeline
    python -m benchmarks.keras_hub_adapter --json run.json --docs   # keep every timing, render docs/performance.md
    python -m benchmarks.keras_hub_adapter --from-json a.json,b.json --docs   # re-render from saved runs, merged

One process loads a keras-hub `CausalLM` once per variant (float32; `causal_lm.quantize("int8")`; bfloat16 weights
and compute, `dtype="bfloat16"` at load), and both libraries generate with that same object: keras-hub through
`causal_lm.compile(sampler=...)` and `causal_lm.generate()` (prompts at the start of a right-padded buffer of
prompt + new tokens, no stop token), tfgen through `from_keras_hub(causal_lm).generate(..., eos_token_id=None)`.
Opt-in columns: `keras-hub-xla` is keras-hub's `generate()` compiled with `jit_compile=True`, which keras-hub does
not do by default on a CPU-only machine (a second `CausalLM` of the same class over the same backbone);
`tfgen-native` is tfgen's own model class loaded from the same checkpoint (float32 and bfloat16 only), the adapter's
cost against tfgen's native implementation.

The rounds are the main benchmark's (`harness.measure_cell`): a first (compiling) call, warm-up calls, then timed
rounds alternating the libraries; tokens/s is `batch × new tokens / median seconds`; greedy and beam rows say how
many new tokens keras-hub shares with tfgen before the first difference, and the int8 / bfloat16 rows how many
tfgen's tokens share with float32 tfgen's on the same prompts.

Models (`--model`): `smollm2-135m-instruct` (the GGUF that `tfgen pull` caches, written once as an HF-layout
directory under `--cache-dir` with tfgen's `save_pretrained`, then loaded by keras-hub's own transformers converter),
an HF-layout Llama-family directory, or `tiny-llama` (a random 2-layer keras-hub Llama built in process, for tests).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.harness import _csv
from benchmarks.peers import (
    BENCH_REQUESTS,
    DEFAULT_STRATEGIES,
    DETERMINISTIC,
    Runner,
    TfgenRunner,
    Unavailable,
    is_gguf,
    keras_hub_generate,
    keras_hub_sampler,
)

DEFAULT_MODEL = "smollm2-135m-instruct"
TINY_LLAMA = "tiny-llama"
VARIANTS = ("float32", "int8", "bfloat16")
LIBRARIES = ("tfgen", "keras-hub", "keras-hub-xla", "tfgen-native")
DEFAULT_LIBRARIES = ("tfgen", "keras-hub")
BEGIN, END = "<!-- keras-hub-bench:begin -->", "<!-- keras-hub-bench:end -->"
SECTION = "## keras-hub models through tfgen"
DOCS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "performance.md"

# ---------------------------------------------------------------------------------------------- the model


def hf_layout_directory(model: str, cache_dir: str) -> str:
    """An HF-layout directory keras-hub's transformers converter reads for `model`: the directory itself, or a GGUF
    (a path, or a model name of `tfgen pull`) written once under `cache_dir` by tfgen (float32 safetensors,
    config.json, tokenizer.json)."""
    if (Path(model) / "config.json").is_file():
        return model
    from benchmarks.checkpoints import resolve_checkpoint

    checkpoint = resolve_checkpoint(model, cache_dir)
    if not is_gguf(checkpoint):
        return checkpoint
    directory = Path(cache_dir) / f"{Path(checkpoint).stem}-hf"
    if not (directory / "model.safetensors").is_file():
        from tfgen import AutoModelForCausalLM, Tokenizer

        AutoModelForCausalLM.from_pretrained(checkpoint).save_pretrained(str(directory))
        Tokenizer.from_pretrained(checkpoint).save_pretrained(str(directory))
    return str(directory)


def _tiny_llama(dtype: str):
    """A random 2-layer keras-hub Llama (vocabulary 97), weights spread wide (norms near 1, the rest N(0, 0.3)) so
    greedy choices are not near-ties that float rounding could flip; the same weights for every dtype."""
    import keras_hub

    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=97, num_layers=2, num_query_heads=4, hidden_dim=32, intermediate_dim=48,
        num_key_value_heads=2, dtype=dtype,
    )
    rng = np.random.default_rng(0)
    for variable in backbone.weights:
        shape = tuple(variable.shape)
        if "norm" in variable.path or variable.name in ("scale", "gamma"):
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            value = 0.3 * rng.standard_normal(shape)
        variable.assign(value.astype(np.float32))
    return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)


def _weight_bytes(causal_lm) -> int:
    import tensorflow as tf

    return sum(int(np.prod(variable.shape)) * tf.as_dtype(variable.dtype).size for variable in causal_lm.weights)


def load_causal_lm(model: str, variant: str, cache_dir: str):
    """(keras-hub `CausalLM` without preprocessor, info dict) of `model` in `variant` (see `VARIANTS`). The info
    gives the backbone class, parameters, weight bytes as stored, vocabulary, dtype policy and load / quantize
    seconds."""
    import keras_hub

    dtype = "bfloat16" if variant == "bfloat16" else "float32"
    start = time.perf_counter()
    if model == TINY_LLAMA:
        causal_lm = _tiny_llama(dtype)
        source = "random weights"
    else:
        directory = hf_layout_directory(model, cache_dir)
        config = json.loads((Path(directory) / "config.json").read_text())
        # keras-hub's converter does not carry rms_norm_eps over (its backbone default is 1e-6; SmolLM2's is 1e-5).
        extra = {"layer_norm_epsilon": float(config["rms_norm_eps"])} if "rms_norm_eps" in config else {}
        backbone = keras_hub.models.Backbone.from_preset(directory, dtype=dtype, **extra)
        task_name = type(backbone).__name__.removesuffix("Backbone") + "CausalLM"
        task = getattr(keras_hub.models, task_name, None)
        if task is None:
            raise ValueError(f"--model: keras-hub has no {task_name} for the {type(backbone).__name__} of {directory}")
        causal_lm = task(backbone=backbone, preprocessor=None)
        source = directory
    load_s = time.perf_counter() - start
    quantize_s = None
    if variant == "int8":
        start = time.perf_counter()
        with warnings.catch_warnings():  # keras names every layer without weights to quantize (norms, dropout, ...)
            warnings.filterwarnings("ignore", message=".*does not have a `quantize` method")
            causal_lm.quantize("int8")
        quantize_s = time.perf_counter() - start
    backbone = causal_lm.backbone
    return causal_lm, {
        "source": source,
        "backbone": type(backbone).__name__,
        "parameters": int(backbone.count_params()),
        "weight_bytes": _weight_bytes(causal_lm),
        "vocab_size": int(backbone.vocabulary_size),
        "dtype_policy": backbone.dtype_policy.name,
        "load_s": load_s,
        "quantize_s": quantize_s,
    }


# ---------------------------------------------------------------------------------------------- the runners


class TfgenOverKerasHub(TfgenRunner):
    """tfgen's `generate()` over `from_keras_hub(causal_lm)`: the keras-hub model's own variables. Keeps its first
    output per (strategy, batch) in `outputs` (for the agreement between variants)."""

    def __init__(self, causal_lm, new_tokens):  # super().__init__ loads a checkpoint; nothing to load here
        from tfgen import from_keras_hub

        self.checkpoint, self.new_tokens = None, new_tokens
        start = time.perf_counter()
        self.model = from_keras_hub(causal_lm)
        self.wrap_s = time.perf_counter() - start
        self.outputs = {}

    def generate(self, strategy, input_ids):
        tokens = super().generate(strategy, input_ids)
        self.outputs.setdefault((strategy, input_ids.shape[0]), tokens)
        return tokens


class KerasHubGenerate(Runner):
    """keras-hub's `causal_lm.generate()`, compiled with the sampler of each request when the request changes
    (`compile` drops the traced function, so a cell's first call includes the new trace). `jit_compile=None` keeps
    keras-hub's default (no XLA on a CPU-only machine); True asks for XLA."""

    def __init__(self, causal_lm, new_tokens, jit_compile=None):
        self.checkpoint, self.new_tokens = None, new_tokens
        self.causal_lm, self.jit_compile, self.strategy = causal_lm, jit_compile, None

    def generate(self, strategy, input_ids):
        if strategy != self.strategy:
            options = {} if self.jit_compile is None else {"jit_compile": self.jit_compile}
            self.causal_lm.compile(sampler=keras_hub_sampler(strategy), **options)
            self.strategy = strategy
        return keras_hub_generate(self.causal_lm, input_ids, self.new_tokens)


class TfgenNative(TfgenRunner):
    """tfgen's own model class (`AutoModelForCausalLM`) loaded from the HF-layout directory keras-hub loaded, in the
    variant's dtype: what the adapter costs against tfgen's native implementation of the same weights."""

    def __init__(self, info, variant, new_tokens):
        if not Path(str(info["source"]), "config.json").is_file():
            raise Unavailable(f"{info['source']} is no checkpoint tfgen can load")
        if variant == "int8":
            raise Unavailable("tfgen's own models have no int8 weights")
        self.dtype = "bfloat16" if variant == "bfloat16" else None
        super().__init__(info["source"], new_tokens)


def make_runners(causal_lm, libraries, new_tokens, info=None, variant="float32") -> dict:
    """{library: runner} over `causal_lm`: tfgen and keras-hub on the object itself, keras-hub-xla on a second
    `CausalLM` of the same class over the same backbone (one object cannot alternate two compiled functions), and
    tfgen-native on tfgen's own model of the checkpoint `info["source"]`."""
    # Wrapped with greedy defaults: keras-hub's default sampler (top-k 5) would otherwise become the wrapper's
    # defaults, which every request below overrides anyway (and greedy requests would warn about the unused top_k).
    causal_lm.compile(sampler=keras_hub_sampler("greedy"))
    runners = {}
    for library in libraries:
        try:
            if library == "tfgen":
                runners[library] = TfgenOverKerasHub(causal_lm, new_tokens)
            elif library == "keras-hub":
                runners[library] = KerasHubGenerate(causal_lm, new_tokens)
            elif library == "tfgen-native":
                runners[library] = TfgenNative(info or {"source": ""}, variant, new_tokens)
            else:
                sibling = type(causal_lm)(backbone=causal_lm.backbone, preprocessor=None)
                runners[library] = KerasHubGenerate(sibling, new_tokens, jit_compile=True)
        except Unavailable as error:
            runners[library] = error
        except Exception as error:  # noqa: BLE001 - e.g. the adapter refusing a model: reported, not fatal
            runners[library] = Unavailable(f"{type(error).__name__}: {error}"[:300])
    return runners


# ---------------------------------------------------------------------------------------------- the run


def run_benchmark(options, log=print) -> dict:
    """Measures every variant of `options.variants`: all `--strategies` for float32, `--variant-strategies` for
    the others, at every batch. Returns the results (the format of the `--json` files)."""
    results = {
        "benchmark": "keras_hub_adapter",
        "settings": {
            name: getattr(options, name)
            for name in ("model", "variants", "libraries", "strategies", "variant_strategies", "batches", "runs",
                         "warmup", "prompt_len", "new_tokens")
        },
        "machine": {
            "cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "load_average_at_start": os.getloadavg(), "versions": harness.library_versions(),
            "tfgen_compile_cache": os.environ.get("TFGEN_COMPILE_CACHE", "on (default)"),
        },
        "variants": [],
    }
    float32_outputs = {}
    for variant in options.variants:
        log(f"== {options.model}, {variant}: loading ...")
        try:
            causal_lm, info = load_causal_lm(options.model, variant, options.cache_dir)
        except Exception as error:  # noqa: BLE001 - a variant that cannot load is reported, the others still run
            results["variants"].append({"variant": variant, "error": f"{type(error).__name__}: {error}"[:300]})
            log(f"   {variant} failed to load: {error}")
            continue
        log(f"   {info['backbone']}, {info['parameters'] / 1e6:.1f}M parameters, {info['weight_bytes'] / 1e6:.0f} MB "
            f"stored ({info['dtype_policy']}), loaded in {info['load_s']:.1f} s")
        runners = make_runners(causal_lm, options.libraries, options.new_tokens, info, variant)
        entry = {"variant": variant, **info, "cells": []}
        if isinstance(runners.get("tfgen"), TfgenOverKerasHub):
            entry["wrap_s"] = runners["tfgen"].wrap_s
        results["variants"].append(entry)
        strategies = options.strategies if variant == "float32" else options.variant_strategies
        for batch in options.batches:
            for strategy in strategies:
                log(f"   {strategy}, batch {batch} ...")
                cell = harness.measure_cell(runners, strategy, batch, options, info)
                del cell["bandwidth_gbs"]
                tfgen = runners.get("tfgen")
                ours = tfgen.outputs.get((strategy, batch)) if isinstance(tfgen, TfgenOverKerasHub) else None
                if ours is not None and "tokens_per_s" in cell["results"]["tfgen"] and strategy in DETERMINISTIC:
                    if variant == "float32":
                        float32_outputs[(strategy, batch)] = ours
                    elif (strategy, batch) in float32_outputs:
                        cell["results"]["tfgen"]["agreement_with_float32"] = harness.prefix_agreement(
                            ours, float32_outputs[(strategy, batch)]
                        )
                entry["cells"].append(cell)
                log(harness.cell_line(cell))
        del runners, causal_lm
        gc.collect()
    results["machine"]["load_average_at_end"] = os.getloadavg()
    return results


def merge(runs: list[dict]) -> dict:
    """One results dict from several runs of the same model: a (variant, strategy, batch) cell measured again takes
    the later run's libraries (and is marked); variants keep their first order, cells sort by batch and strategy."""
    merged = json.loads(json.dumps(runs[0]))
    for run in runs[1:]:
        merged["machine"]["load_average_at_end"] = run["machine"]["load_average_at_end"]
        for name in ("variants", "libraries", "strategies", "batches"):
            merged["settings"][name] += [value for value in run["settings"][name] if value not in
                                         merged["settings"][name]]
        by_variant = {entry["variant"]: entry for entry in merged["variants"]}
        for entry in run["variants"]:
            target = by_variant.get(entry["variant"])
            if target is None or "error" in target:
                merged["variants"].append(entry) if target is None else target.update(entry)
                continue
            cells = {(cell["strategy"], cell["batch"]): cell for cell in target["cells"]}
            for cell in entry.get("cells", []):
                known = cells.get((cell["strategy"], cell["batch"]))
                if known is None:
                    target["cells"].append(cell)
                else:
                    known["results"].update(cell["results"])
                    known["remeasured"] = True
    settings = merged["settings"]
    order = settings["strategies"] + [name for name in settings["variant_strategies"] if name not in
                                      settings["strategies"]]
    for entry in merged["variants"]:
        entry.get("cells", []).sort(key=lambda cell: (settings["batches"].index(cell["batch"]),
                                                      order.index(cell["strategy"])))
    return merged


# ---------------------------------------------------------------------------------------------- the report


def _fmt(value, digits=1, suffix="") -> str:
    return "" if value is None else f"{value:.{digits}f}{suffix}"


def _percent(value) -> str:
    return "" if value is None else f"{100 * value:.0f}%"


def report_table(results: dict) -> str:
    """The results as markdown: one row per (variant, strategy, batch) with every library's tokens/s, tfgen's
    ratio to each keras-hub column, the token agreements and the first (compiling) calls."""
    settings = results["settings"]
    libraries = [library for library in settings["libraries"]
                 if any(library in cell["results"] for entry in results["variants"] for cell in entry.get("cells", []))]
    peers = [library for library in libraries if library != "tfgen"]
    header = [
        "weights", "strategy", "batch", *(f"{library} tok/s" for library in libraries),
        *(f"tfgen ÷ {peer}" for peer in peers), *(f"{peer} = tfgen tokens" for peer in peers),
        "tfgen = float32 tfgen tokens", *(f"{library} first call s" for library in libraries),
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    notes, errors = [], []
    for entry in results["variants"]:
        if "error" in entry:
            errors.append(f"{entry['variant']}: {entry['error']}")
            continue
        weights = f"{entry['variant']} ({entry['weight_bytes'] / 1e6:.0f} MB)"
        notes.append(
            f"{entry['variant']}: {entry['backbone']}, {entry['parameters'] / 1e6:.1f}M parameters, dtype policy "
            f"`{entry['dtype_policy']}`, load {entry['load_s']:.1f} s"
            + (f", `quantize(\"int8\")` {entry['quantize_s']:.1f} s" if entry.get("quantize_s") is not None else "")
            + (f", `from_keras_hub` {entry['wrap_s']:.2f} s" if entry.get("wrap_s") is not None else "")
        )
        for cell in entry["cells"]:
            measured = cell["results"]
            speed = {library: measured.get(library, {}).get("tokens_per_s") for library in libraries}
            row = [weights, cell["strategy"] + (" \\*" if cell.get("remeasured") else ""), str(cell["batch"])]
            row += [_fmt(speed[library]) for library in libraries]
            row += [f"{speed['tfgen'] / speed[peer]:.2f}×" if speed.get("tfgen") and speed[peer] else ""
                    for peer in peers]
            row += [_percent(measured.get(peer, {}).get("agreement_with_tfgen")) for peer in peers]
            row.append(_percent(measured.get("tfgen", {}).get("agreement_with_float32")))
            row += [_fmt(measured.get(library, {}).get("compile_s")) for library in libraries]
            lines.append("| " + " | ".join(row) + " |")
            errors += [f"{entry['variant']} {cell['strategy']}/{cell['batch']} {library}: {result['error']}"
                       for library, result in measured.items() if "error" in result]
    lines += ["", *(f"- {note}" for note in notes)]
    if any(cell.get("remeasured") for entry in results["variants"] for cell in entry.get("cells", [])):
        lines += ["", "\\* measured again in a later run (`--from-json` merges runs; the later run's figures win)."]
    if errors:
        lines += ["", "Not measured:", "", *(f"- {error}" for error in sorted(set(errors)))]
    return "\n".join(lines) + "\n"


def render(results: dict, page: Path) -> None:
    """Writes the table between this benchmark's markers of `page`; a page without them gets the section (heading
    and markers) appended. The prose around the markers is left alone."""
    settings, machine = results["settings"], results["machine"]
    block = "\n".join([
        BEGIN,
        "",
        f"_Generated by `python -m benchmarks.keras_hub_adapter`: {settings['model']}, prompt {settings['prompt_len']} "
        f"tokens, {settings['new_tokens']} new tokens, median of {settings['runs']} interleaved runs after "
        f"{settings['warmup']} warm-up call(s); {machine['cpus']} CPUs, load average "
        f"{machine['load_average_at_start'][0]:.1f} at start and {machine['load_average_at_end'][0]:.1f} at end; "
        + ", ".join(f"{name} {version}" for name, version in machine["versions"].items()) + "._",
        "",
        report_table(results),
        END,
    ])
    text = page.read_text() if page.exists() else "# Performance\n"
    if BEGIN not in text or END not in text:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    page.write_text(head + block + rest.split(END, 1)[1])


# ---------------------------------------------------------------------------------------------- the command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"{DEFAULT_MODEL} (default), a GGUF file, an HF-layout Llama-family directory, or "
                        f"{TINY_LLAMA} (random, for tests)")
    parser.add_argument("--variants", type=_csv(str, VARIANTS), default=list(VARIANTS),
                        help=f"comma-separated subset of {','.join(VARIANTS)}")
    parser.add_argument("--libraries", type=_csv(str, LIBRARIES), default=list(DEFAULT_LIBRARIES),
                        help=f"comma-separated subset of {','.join(LIBRARIES)} "
                        f"(default: {','.join(DEFAULT_LIBRARIES)})")
    strategies = tuple(name for name in DEFAULT_STRATEGIES if name != "contrastive")
    parser.add_argument("--strategies", type=_csv(str, tuple(BENCH_REQUESTS)), default=list(strategies),
                        help=f"the float32 rows (default: {','.join(strategies)})")
    parser.add_argument("--variant-strategies", type=_csv(str, tuple(BENCH_REQUESTS)), default=["greedy"],
                        help="the int8 and bfloat16 rows (default: greedy)")
    parser.add_argument("--batches", type=_csv(int), default=[1, 16], help="comma-separated batch sizes")
    parser.add_argument("--runs", type=int, default=3, help="timed rounds per cell; median reported")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls after the compiling one")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32,
                        help="new tokens per row (default 32: keras-hub's beam search at batch 16 is slow)")
    parser.add_argument("--cache-dir", default=os.path.join(Path.home(), ".cache", "tfgen", "bench"),
                        help="where a GGUF model is written once as an HF-layout directory")
    parser.add_argument("--json", help="also write the raw results (every timing) to this JSON file")
    parser.add_argument("--from-json", help="render saved runs (comma-separated --json files) instead of measuring")
    parser.add_argument("--docs", nargs="?", const=str(DOCS_PAGE), metavar="PAGE",
                        help=f"also write the table into PAGE's keras-hub section (default {DOCS_PAGE})")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: batch 1, 1 run, no warm-up, 8 new tokens")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.keras_hub_adapter", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    options = parser.parse_args(argv)
    if options.from_json:
        results = merge([json.loads(Path(path).read_text()) for path in options.from_json.split(",")])
    else:
        if options.quick:
            options.batches, options.runs, options.warmup, options.new_tokens = [1], 1, 0, 8
        harness.check_options(argparse.Namespace(**{**vars(options), "first_call": True, "first_call_only": False}))
        # First calls must compile: no program may come from tfgen's persistent XLA cache (unless asked for).
        os.environ.setdefault("TFGEN_COMPILE_CACHE", "0")
        results = run_benchmark(options, log=lambda text: print(text, file=sys.stderr, flush=True))
        if options.json:
            Path(options.json).write_text(json.dumps(results, indent=1))
    print(report_table(results))
    if options.docs:
        render(results, Path(options.docs))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as error:
        sys.exit(f"python -m benchmarks.keras_hub_adapter: error: {error}")
