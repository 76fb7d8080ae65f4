"""The results as a report: merging saved runs, markdown tables, PNG plots and the generated block of
`docs/performance.md`.

The tables go between the `<!-- bench:begin -->` / `<!-- bench:end -->` markers of the performance page (the
prose around them is left alone); plots need matplotlib (`pip install -e ".[bench]"`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from benchmarks.harness import add_roofline
from benchmarks.peers import PEERS

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


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
        add_roofline(entry)  # over every bandwidth probe of every run, as one run computes it over its own
        entry["cells"].sort(key=lambda cell: (merged["settings"]["batches"].index(cell["batch"]),
                                              merged["settings"]["strategies"].index(cell["strategy"])))
    return merged


def _fmt(value, digits=1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def report_tables(results: dict) -> str:
    """The results as markdown tables: throughput with ratios and roofline, then first call and memory."""
    lines = []
    for entry in results["models"]:
        # Each model's own columns: merged runs may measure different libraries per model (llama.cpp reads GGUF
        # files only; hf-tf and keras-hub have no Llama from GGUF).
        libraries = [library for library in results["settings"]["libraries"]
                     if any(library in cell["results"] for cell in entry["cells"])]
        peers = [library for library in libraries if library in PEERS]
        roofline = entry.get("roofline_tokens_per_s")
        stored = f"{entry['file_type']} GGUF, computed in float32 by tfgen and hf-torch" if "file_type" in entry \
            else "float32"
        lines += [f"#### {entry['model']} ({entry['parameters'] / 1e6:.1f}M parameters, {stored})", ""]
        if roofline:
            lines += [
                f"Batch-1 roofline: {entry['weight_bytes_per_step'] / 1e6:.0f} MB of float32 weights per step at "
                f"{entry['bandwidth_gbs']:.1f} GB/s (median matrix-vector bandwidth measured between the runs) "
                f"= **{roofline:.1f} tokens/s**.",
                "",
            ]
            if "stored_bytes_per_step" in entry:
                lines += [
                    f"llama.cpp reads the weights as stored, {entry['stored_bytes_per_step'] / 1e6:.0f} MB per step: "
                    f"its roofline is {entry['bandwidth_gbs'] * 1e9 / entry['stored_bytes_per_step']:.0f} tokens/s.",
                    "",
                ]
        # Cells measured again in a later run (`merge`): one marker per set of libraries.
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
                "come from the first run (benchmarks/report.py merges runs; docs/performance.md lists which run "
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
            strategies = _strategies_of(entry, results)
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


def _strategies_of(entry: dict, results: dict) -> list[str]:
    """The strategies measured for one model, in the settings' order (merged runs may measure different ones)."""
    measured = {cell["strategy"] for cell in entry["cells"]}
    return [strategy for strategy in results["settings"]["strategies"] if strategy in measured]


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in Path(text).name).strip("-")


def plot(results: dict, directory: Path) -> list[Path]:
    """Writes, per model, tokens/s against batch (one panel per strategy, one line per library) and the
    first-call seconds per library; returns the PNG paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    libraries = results["settings"]["libraries"]
    for entry in results["models"]:
        strategies = _strategies_of(entry, results)
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
        f"_Generated by `python -m benchmarks`: prompt {settings['prompt_len']} tokens, {settings['new_tokens']} new "
        f"tokens, median of {settings['runs']} interleaved runs; {machine['cpus']} CPUs, load average "
        f"{machine['load_average_at_start'][0]:.1f} at start and {machine['load_average_at_end'][0]:.1f} at end; "
        + ", ".join(f"{name} {version}" for name, version in machine["versions"].items())
        + "._",
        "",
        report_tables(results),
        *(f"![{image.stem}]({os.path.relpath(image, page.parent)})\n" for image in images),
        END,
    ]
    text = page.read_text() if page.exists() else f"# Performance\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        raise ValueError(f"{page} lacks the {BEGIN} / {END} markers")
    head, rest = text.split(BEGIN, 1)
    page.write_text(head + "\n".join(block) + rest.split(END, 1)[1])
