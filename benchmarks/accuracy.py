"""What a model variant costs in accuracy: perplexity over a shipped text and greedy agreement on chat prompts.

    python -m benchmarks.accuracy --quantize-b int8           # SmolLM2-135M-Instruct: float32 (A) vs int8 (B)
    python -m benchmarks.accuracy --model-b PATH              # any two models sharing a tokenizer

Two models, A (the reference) and B, each a registered name or a path and an optional `quantize` mode, are measured
on the same inputs in one process:

- **Perplexity** over `benchmarks/data/persuasion_ch1-7.txt` (public domain; see `benchmarks/data/README.md`),
  tokenized without special tokens. The text is cut into windows of `--context` tokens that start `--stride` tokens
  apart (the last one ends at the text's end); each window scores the tokens past the previous window's end, so
  every token but the first is scored exactly once and sees at least `context - stride` tokens before it (in the
  first window: all the tokens before it). Each window is one fresh sequence (positions from 0, no cache carried
  over). `perplexity = exp(mean negative log-likelihood)` over the scored tokens.
- **Greedy agreement**: the 20 `PROMPTS` through the chat template (generation prompt added), one left-padded batch,
  greedy `generate()` of `--new-tokens` tokens. A row's tokens are cut after its first eos and padded with a marker
  to `--new-tokens`, so two rows that end at the same place agree there. Reported per row and overall: the matching
  prefix (tokens before the first difference) and the fraction of the positions that are equal.

The logits come from the model protocol's `call_with_cache` through `decoding_view(rows)`, as a `generate()` prefill
computes them, `--rows` windows per call of one compiled program, the negative log-likelihoods taken in the program
(a window's logits are 200 MB on SmolLM2). An int8 model's matmuls pick their form from the rows they see, so a
window runs W8A8, the form of its multi-row decode steps (the one-row form, weight-only, multiplies the same int8
weights in float). With A = B the two columns are equal: the harness's own check.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np

TEXT = Path(__file__).parent / "data" / "persuasion_ch1-7.txt"
MODEL = "smollm2-135m-instruct"
#: Ends a row of `normalized_rows` after its eos: never a token id.
ENDED = -1

#: The agreement prompts: short everyday chat requests of several kinds (facts, explanation, how-to, writing,
#: code, arithmetic, advice), one user turn each.
PROMPTS = (
    "What is the capital of France?",
    "Explain photosynthesis in two sentences.",
    "Write a haiku about the sea.",
    "How do I boil an egg?",
    "Give me three tips for sleeping better.",
    "What is the difference between weather and climate?",
    "Write a Python function that reverses a string.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet.",
    "What are the planets of the solar system?",
    "How many minutes are in a day? Show your working.",
    "Suggest a name for a small bakery.",
    "What does a CPU do?",
    "Translate 'good morning' into Spanish and French.",
    "Write a short thank-you note to a teacher.",
    "What causes earthquakes?",
    "List five fruits that are high in vitamin C.",
    "How can I learn to play the guitar?",
    "What is machine learning?",
    "Describe a cat to someone who has never seen one.",
)


def strided_windows(tokens: int, context: int, stride: int) -> list[tuple[int, int]]:
    """The perplexity windows of a text of `tokens` tokens: a list of `(begin, first_scored)`.

    Window `i` holds tokens `[begin, begin + context)` (fewer only when the text is shorter than `context`); it
    scores the tokens `[first_scored, begin + context)`, each predicted from the window's tokens before it. Windows
    start `stride` apart, the last one moved back to end at the text's end; together they score tokens
    `1 .. tokens - 1` exactly once.
    """
    for name, value in (("tokens", tokens), ("context", context), ("stride", stride)):
        if not isinstance(value, int) or value < (2 if name == "tokens" else 1):
            raise ValueError(f"{name} must be an int >= {2 if name == 'tokens' else 1}, got {value!r}")
    if stride > context - 1 and context < tokens:
        raise ValueError(f"stride ({stride}) must be below context ({context}) for the windows to overlap")
    context = min(context, tokens)
    windows, scored_to, begin = [], 1, 0
    while scored_to < tokens:
        begin = min(begin, tokens - context)
        windows.append((begin, scored_to))
        scored_to, begin = begin + context, begin + stride
    return windows


def token_nlls(model, ids, context: int, stride: int, rows: int = 4) -> np.ndarray:
    """Negative log-likelihoods float64 `[len(ids) - 1]` of tokens `1 ..` of `ids` (one int sequence), each scored
    once in its `strided_windows` window. `rows` windows run per call of one compiled program, through
    `model.decoding_view(rows)` (see the module docstring); a short last batch repeats a window."""
    import tensorflow as tf

    from tfgen.decoding.model_protocol import capabilities

    ids = np.asarray(ids, np.int32)
    windows = strided_windows(len(ids), context, stride)
    width = min(context, len(ids))

    @tf.function(jit_compile=True)
    def window_nlls(window_ids):  # int32 [rows, width] -> float32 [rows, width - 1]
        view = model.decoding_view(rows) if capabilities(model).decoding_view else model
        positions = tf.broadcast_to(tf.range(width)[tf.newaxis], [rows, width])
        output = view.call_with_cache(window_ids, model.init_cache(rows, width), tf.constant(0, tf.int32),
                                      tf.ones([rows, width], tf.int32), positions)
        log_probs = tf.nn.log_softmax(tf.cast(output.logits[:, :-1], tf.float32))
        return -tf.gather(log_probs, window_ids[:, 1:], batch_dims=2)

    nlls = np.full(len(ids) - 1, np.nan)
    for first in range(0, len(windows), rows):
        group = windows[first:first + rows]
        batch = np.stack([ids[begin:begin + width] for begin, _ in group + group[-1:] * (rows - len(group))])
        values = np.asarray(window_nlls(tf.constant(batch)), np.float64)
        for row, (begin, scored) in enumerate(group):
            # Row column j holds the NLL of token begin + j + 1; tokens [scored, begin + width) are this window's.
            nlls[scored - 1:begin + width - 1] = values[row, scored - begin - 1:]
    return nlls


def perplexity(nlls) -> float:
    """exp of the mean negative log-likelihood."""
    return math.exp(float(np.mean(nlls)))


def normalized_rows(tokens, new_tokens: int, eos_ids) -> np.ndarray:
    """int64 `[B, new_tokens]`: each row of new tokens (a list of lists or `[B, N]`) cut after its first id in
    `eos_ids`, then `ENDED` up to `new_tokens` (a row longer than `new_tokens` is cut there)."""
    eos = set(eos_ids)
    out = np.full((len(tokens), new_tokens), ENDED, np.int64)
    for index, row in enumerate(tokens):
        row = [int(token) for token in row][:new_tokens]
        ends = [position for position, token in enumerate(row) if token in eos]
        row = row[:ends[0] + 1] if ends else row
        out[index, :len(row)] = row
    return out


def agreement(tokens_a, tokens_b, new_tokens: int, eos_ids) -> dict:
    """Greedy agreement of two models' new tokens on the same prompts (see `normalized_rows`).

    Returns {"matching_prefix": per row, the positions before the first difference (`new_tokens` when none),
    "equal_fraction": per row, the share of the `new_tokens` positions that are equal, "mean_matching_prefix",
    "equal_fraction_overall", "rows_identical"}."""
    a, b = normalized_rows(tokens_a, new_tokens, eos_ids), normalized_rows(tokens_b, new_tokens, eos_ids)
    if a.shape != b.shape:
        raise ValueError(f"the two models answered {len(a)} and {len(b)} prompts")
    equal = a == b
    prefix = np.where(equal.all(axis=1), new_tokens, np.argmin(equal, axis=1))
    return {"matching_prefix": prefix.tolist(), "equal_fraction": equal.mean(axis=1).tolist(),
            "mean_matching_prefix": float(prefix.mean()), "equal_fraction_overall": float(equal.mean()),
            "rows_identical": int(equal.all(axis=1).sum())}


def greedy_answers(model, tokenizer, prompts, new_tokens: int) -> list[list[int]]:
    """Each prompt as one user turn through the chat template (generation prompt added), all in one left-padded
    batch, greedy `generate()` of up to `new_tokens` tokens: the new tokens of each row (a list per prompt)."""
    rows = [tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
            for prompt in prompts]
    width = max(len(row) for row in rows)
    pad = tokenizer.pad_token_id or 0
    ids = np.array([[pad] * (width - len(row)) + list(row) for row in rows], np.int32)
    mask = np.array([[0] * (width - len(row)) + [1] * len(row) for row in rows], np.int32)
    output = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens)
    return np.asarray(output)[:, width:].tolist()


def eos_ids_of(model) -> list[int]:
    """The model's eos ids (generation config first, then config), as a list."""
    for source in (model.generation_config, model.config):
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            return [eos] if isinstance(eos, int) else list(eos)
    return []


def load(spec: str, quantize: str | None):
    """(model, tokenizer) of a registered name or a path, with `quantize=` passed only when set."""
    import tfgen

    options = {} if quantize in (None, "none") else {"quantize": quantize}
    return tfgen.AutoModelForCausalLM.from_pretrained(spec, **options), tfgen.AutoTokenizer.from_pretrained(spec)


def measure(args) -> dict:
    """Both models through both measures; the report as a dict (see `main`)."""
    specs = {"A": (args.model, args.quantize), "B": (args.model_b or args.model, args.quantize_b)}
    text = Path(args.text).read_text(encoding="utf-8")
    report = {"text": os.path.basename(args.text), "context": args.context, "stride": args.stride, "rows": args.rows,
              "new_tokens": args.new_tokens, "prompts": list(PROMPTS[:args.prompts]), "models": {}}
    answers, nlls = {}, {}
    for name, (spec, quantize) in specs.items():
        model, tokenizer = load(spec, quantize)
        ids = tokenizer.encode(text, add_special_tokens=False)[:args.max_tokens]
        entry = report["models"][name] = {"model": spec, "quantize": quantize or "none", "text_tokens": len(ids)}
        if not args.skip_perplexity:
            began = time.perf_counter()
            nlls[name] = token_nlls(model, ids, args.context, args.stride, args.rows)
            entry.update(perplexity=perplexity(nlls[name]), scored_tokens=len(nlls[name]),
                         perplexity_seconds=time.perf_counter() - began)
        began = time.perf_counter()
        answers[name] = greedy_answers(model, tokenizer, PROMPTS[:args.prompts], args.new_tokens)
        entry.update(generate_seconds=time.perf_counter() - began, eos_token_ids=eos_ids_of(model))
        rows = normalized_rows(answers[name], args.new_tokens, entry["eos_token_ids"])
        entry["answers"] = tokenizer.batch_decode([[int(token) for token in row if token != ENDED] for row in rows],
                                                  skip_special_tokens=True)
        del model
    if nlls:
        a, b = report["models"]["A"]["perplexity"], report["models"]["B"]["perplexity"]
        report["perplexity_relative_change"] = b / a - 1
        report["mean_abs_nll_difference"] = float(np.mean(np.abs(nlls["B"] - nlls["A"])))
    report["agreement"] = agreement(answers["A"], answers["B"], args.new_tokens,
                                    report["models"]["A"]["eos_token_ids"])
    return report


def table(report) -> str:
    """The report as a markdown table."""
    lines = ["| model | quantize | perplexity | scored tokens | vs A |", "| --- | --- | --- | --- | --- |"]
    for name, entry in report["models"].items():
        change = "" if name == "A" or "perplexity_relative_change" not in report else (
            f"{100 * report['perplexity_relative_change']:+.2f}%")
        ppl = f"{entry['perplexity']:.4f}" if "perplexity" in entry else "-"
        lines.append(f"| {name}: {entry['model']} | {entry['quantize']} | {ppl} | {entry.get('scored_tokens', '-')} "
                     f"| {change} |")
    agree = report["agreement"]
    rows = len(agree["matching_prefix"])
    lines += ["", f"greedy agreement over {report['new_tokens']} new tokens, {rows} chat prompts: "
              f"{agree['rows_identical']}/{rows} rows identical, mean matching prefix "
              f"{agree['mean_matching_prefix']:.1f} tokens, {100 * agree['equal_fraction_overall']:.1f}% of "
              f"positions equal", f"matching prefix per row: {agree['matching_prefix']}"]
    return "\n".join(lines)


def parse_args(argv=None, prog=None):
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=MODEL, help=f"model A: a registered name or a path (default {MODEL})")
    parser.add_argument("--quantize", default=None, help="model A's quantize mode (default none: float32)")
    parser.add_argument("--model-b", default=None, help="model B (default: model A's)")
    parser.add_argument("--quantize-b", default=None, help="model B's quantize mode, e.g. int8 (default none)")
    parser.add_argument("--text", default=str(TEXT), help="the perplexity text (default the shipped one)")
    parser.add_argument("--max-tokens", type=int, default=None, help="score only the text's first N tokens")
    parser.add_argument("--context", type=int, default=1024, help="perplexity window, tokens (default 1024)")
    parser.add_argument("--stride", type=int, default=768, help="distance between windows (default 768)")
    parser.add_argument("--rows", type=int, default=4, help="windows per call: decoding_view(rows) (default 4)")
    parser.add_argument("--new-tokens", type=int, default=64, help="greedy tokens per prompt (default 64)")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"prompts used (1-{len(PROMPTS)})")
    parser.add_argument("--skip-perplexity", action="store_true", help="agreement only")
    parser.add_argument("--out", default=None, help="the JSON report (default benchmarks/results/"
                        "accuracy-<A>-vs-<B>.json)")
    args = parser.parse_args(argv)
    for name in ("context", "stride", "rows", "new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if not 1 <= args.prompts <= len(PROMPTS):
        parser.error(f"--prompts must be 1 to {len(PROMPTS)}")
    if args.max_tokens is not None and args.max_tokens < 2:
        parser.error("--max-tokens must be at least 2")
    return args


def main(argv=None, prog="python -m benchmarks.accuracy") -> dict:
    """Measures, prints the table, writes the JSON report; returns the report."""
    args = parse_args(argv, prog)
    report = measure(args)
    label = "-vs-".join((report["models"][name]["quantize"]) for name in ("A", "B"))
    out = Path(args.out or Path(__file__).parent / "results" / f"accuracy-{label}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(table(report))
    print(f"report: {out}")
    return report


if __name__ == "__main__":
    main()
