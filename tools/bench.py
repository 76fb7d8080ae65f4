"""Runs `tfgen bench` and renders its results into `docs/performance.md` and PNG plots.

    python tools/bench.py                          # full run (see `tfgen bench --help` for the flags)
    python tools/bench.py --quick                  # smoke run of the whole pipeline
    python tools/bench.py --from-json results.json # re-render the docs from a saved run
    python tools/bench.py --from-json a.json,b.json # ... or from several runs, merged (e.g. more batch sizes)

The tables go between the `<!-- bench:begin -->` / `<!-- bench:end -->` markers of the performance page (the
prose around them is left alone); plots need matplotlib (`pip install -e ".[bench]"`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from tfgen.commands import bench

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in Path(text).name).strip("-")


def merge(runs: list[dict]) -> dict:
    """One results dict from several runs: cells of the same model are concatenated (in run order) — a cell
    measured again takes the later run's results for the libraries that run measured — settings list the
    union of batches and strategies, the last run that measured first calls supplies them, and the roofline
    is recomputed from every bandwidth probe."""
    merged = json.loads(json.dumps(runs[0]))
    for run in runs[1:]:
        settings = merged["settings"]
        for name in ("libraries", "strategies", "batches"):
            settings[name] += [value for value in run["settings"][name] if value not in settings[name]]
        settings["runs"] = min(settings["runs"], run["settings"]["runs"])
        merged["machine"]["load_average_at_end"] = run["machine"]["load_average_at_end"]
        by_name = {entry["model"]: entry for entry in merged["models"]}
        for entry in run["models"]:
            if entry["model"] not in by_name:
                merged["models"].append(entry)
                continue
            target = by_name[entry["model"]]
            cells = {(cell["strategy"], cell["batch"]): cell for cell in target["cells"]}
            for cell in entry["cells"]:
                known = cells.get((cell["strategy"], cell["batch"]))
                if known is None:
                    target["cells"].append(cell)
                else:  # a re-measurement: the later run's libraries replace the earlier ones'
                    known["results"].update(cell["results"])
                    known["bandwidth_gbs"] = known["bandwidth_gbs"] + cell["bandwidth_gbs"]
                    known["remeasured"] = list(dict.fromkeys([*known.get("remeasured", []), *cell["results"]]))
            if entry.get("first_call"):  # measured again: the later run's fresh processes win
                target["first_call"] = entry["first_call"]
    for entry in merged["models"]:
        # The roofline over every bandwidth probe of every run, as one run computes it over its own.
        bandwidth = [value for cell in entry["cells"] for value in cell["bandwidth_gbs"]]
        if bandwidth:
            entry["bandwidth_gbs"] = statistics.median(bandwidth)
            entry["roofline_tokens_per_s"] = entry["bandwidth_gbs"] * 1e9 / entry["weight_bytes_per_step"]
        entry["cells"].sort(key=lambda cell: (merged["settings"]["batches"].index(cell["batch"]),
                                              merged["settings"]["strategies"].index(cell["strategy"])))
    return merged


def plot(results: dict, directory: Path) -> list[Path]:
    """Writes, per model, tokens/s against batch (one panel per strategy, one line per library) and the
    first-call seconds per library; returns the PNG paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    libraries = results["settings"]["libraries"]
    strategies = results["settings"]["strategies"]
    for entry in results["models"]:
        figure, axes = plt.subplots(1, len(strategies), figsize=(4 * len(strategies), 3.6), squeeze=False)
        for axis, strategy in zip(axes[0], strategies):
            cells = [cell for cell in entry["cells"] if cell["strategy"] == strategy]
            for library in libraries:
                points = [
                    (cell["batch"], cell["results"][library]["tokens_per_s"])
                    for cell in cells if "tokens_per_s" in cell["results"].get(library, {})
                ]
                if points:
                    axis.plot(*zip(*points), marker="o", label=library)
            if strategy == "greedy" and entry.get("roofline_tokens_per_s"):
                axis.axhline(entry["roofline_tokens_per_s"], color="grey", linestyle=":", label="batch-1 roofline")
            axis.set(title=strategy, xlabel="batch", xscale="log", yscale="log")
            axis.set_xticks([cell["batch"] for cell in cells], [str(cell["batch"]) for cell in cells])
            axis.grid(alpha=0.3)
        axes[0][0].set_ylabel("tokens/s (median)")
        axes[0][-1].legend(fontsize=8)
        figure.suptitle(f"{entry['model']}: generated tokens per second")
        figure.tight_layout()
        written.append(directory / f"perf_tokens_per_s_{_slug(entry['model'])}.png")
        figure.savefig(written[-1], dpi=110)
        plt.close(figure)

        first = {lib: value for lib, value in entry["first_call"].items() if "first_call_s" in value}
        if first:
            figure, axis = plt.subplots(figsize=(7, 3.6))
            width = 0.8 / max(len(strategies), 1)
            for index, strategy in enumerate(strategies):
                values = [first[lib]["first_call_s"].get(strategy, 0.0) for lib in first]
                axis.bar([i + index * width for i in range(len(first))], values, width, label=strategy)
            axis.set_xticks([i + width * (len(strategies) - 1) / 2 for i in range(len(first))], list(first))
            axis.set(ylabel="seconds", title=f"{entry['model']}: first call at batch 1 (fresh process)")
            axis.legend(fontsize=8)
            axis.grid(axis="y", alpha=0.3)
            figure.tight_layout()
            written.append(directory / f"perf_first_call_{_slug(entry['model'])}.png")
            figure.savefig(written[-1], dpi=110)
            plt.close(figure)
    return written


def render(results: dict, page: Path, images: list[Path]) -> None:
    """Replaces the generated block of `page` (created if missing) with the tables and plot links."""
    settings = results["settings"]
    machine = results["machine"]
    block = [
        BEGIN,
        "",
        f"_Generated by `python tools/bench.py`: prompt {settings['prompt_len']} tokens, {settings['new_tokens']} new "
        f"tokens, median of {settings['runs']} interleaved runs; {machine['cpus']} CPUs, load average "
        f"{machine['load_average_at_start'][0]:.1f} at start and {machine['load_average_at_end'][0]:.1f} at end; "
        + ", ".join(f"{name} {version}" for name, version in machine["versions"].items())
        + "._",
        "",
        bench.report_tables(results),
        *(f"![{image.stem}]({os.path.relpath(image, page.parent)})\n" for image in images),
        END,
    ]
    text = page.read_text() if page.exists() else f"# Performance\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        raise ValueError(f"{page} lacks the {BEGIN} / {END} markers")
    head, rest = text.split(BEGIN, 1)
    page.write_text(head + "\n".join(block) + rest.split(END, 1)[1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_arguments(parser)
    parser.add_argument("--from-json", help="render saved runs (comma-separated --json files) instead of measuring")
    parser.add_argument("--docs", default=str(ROOT / "docs"), help="where performance.md and the plots go")
    parser.add_argument("--no-docs", action="store_true", help="print the tables only")
    options = parser.parse_args(argv)
    if options.from_json:
        results = merge([json.loads(Path(path).read_text()) for path in options.from_json.split(",")])
    else:
        bench.apply_quick(options)
        bench.check_options(options)
        results = bench.run_benchmark(options, log=lambda text: print(text, file=sys.stderr, flush=True))
        if options.json:
            Path(options.json).write_text(json.dumps(results, indent=1))
    print(bench.report_tables(results))
    if not options.no_docs:
        docs = Path(options.docs)
        docs.mkdir(parents=True, exist_ok=True)
        render(results, docs / "performance.md", plot(results, docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
