"""Structured output's costs on SmolLM2-135M-Instruct's 49152-token vocabulary: building automata, the tables'
memory, the in-loop mask per step (batch 1 and 16), and whole greedy generations with and without a JSON schema.

    python -m benchmarks.structured --out benchmarks/results/q-structured.json

The mask is timed alone in a compiled loop of `--steps` steps over fixed logits (mask + state advance + argmax, against
argmax alone), so the figure is what the constraint adds to each decode step whatever the model. The whole
generation runs the real model (its GGUF, pulled once) on a chat prompt asking for a JSON answer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings

import numpy as np

SCHEMAS = {
    "person (5 fields, nested object, array, enum)": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer"},
            "role": {"enum": ["admin", "user", "guest"]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
            "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                        "required": ["city", "zip"]},
        },
        "required": ["name", "age", "role", "tags", "address"],
    },
    "city (2 fields)": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 30}},
        "required": ["city", "country"],
    },
}
REGEXES = {"date": r"\d{4}-\d{2}-\d{2}", "phone": r"\(\d{3}\) \d{3}-\d{4}"}
QUESTION = ("Answer in JSON with the fields city and country. What is the capital of France, and which country is "
            "it in?")


def _timed(function, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        function()
        times.append(time.perf_counter() - began)
    return times


def build_costs(tokenizer, vocab_size: int) -> dict:
    """Build time (first and cached) and table sizes of each pattern."""
    from tfgen.structured import automaton as automata
    from tfgen.structured.json_schema import schema_regex

    began = time.perf_counter()
    automata._outlines_vocabulary(tokenizer)
    results = {"vocabulary_seconds": time.perf_counter() - began, "patterns": {}}
    patterns = {name: schema_regex(schema) for name, schema in SCHEMAS.items()} | REGEXES
    for name, pattern in patterns.items():
        built = automata.build_automaton(tokenizer, vocab_size, pattern)
        began = time.perf_counter()
        automata.build_automaton(tokenizer, vocab_size, pattern)
        cached = time.perf_counter() - began
        results["patterns"][name] = {
            "build_seconds": built.build_seconds, "cached_seconds": cached, "states": built.states,
            "classes": built.classes, "table_shape": list(built.next_state.shape), "table_bytes": built.nbytes,
            "dense_bytes": built.states * vocab_size * 4,
        }
    return results


def mask_costs(tokenizer, vocab_size: int, steps: int, repeats: int) -> dict:
    """ms per step of the mask (plus state advance) at batch 1 and 16, against argmax alone."""
    import tensorflow as tf

    from tfgen.structured import graph
    from tfgen.structured.automaton import build_automaton
    from tfgen.structured.json_schema import schema_regex

    automaton = build_automaton(tokenizer, vocab_size, schema_regex(next(iter(SCHEMAS.values()))))
    knobs = {name: tf.constant(value) for name, value in automaton.knobs().items()}
    eos = tf.constant([tokenizer.eos_token_id, -1, -1, -1], tf.int32)
    results = {}
    for batch in (1, 16):
        logits = tf.constant(np.random.default_rng(0).normal(size=[batch, vocab_size]).astype(np.float32))

        def loop(constrained: bool):
            def body(step, states, total):
                scores = logits + tf.cast(step, tf.float32) * 1e-3
                if constrained:
                    scores = graph.mask_scores(knobs, states, scores, eos)
                tokens = tf.argmax(scores, axis=-1, output_type=tf.int32)
                if constrained:
                    states = graph.advance(knobs, states, tokens, tf.zeros([batch], tf.bool))
                return step + 1, states, total + tokens

            start = tf.fill([batch], 1)
            return tf.while_loop(lambda step, *_: step < steps, body, (0, start, tf.zeros([batch], tf.int32)))[2]

        row = {}
        for constrained in (False, True):
            program = tf.function(lambda c=constrained: loop(c), jit_compile=True)
            program().numpy()
            times = _timed(lambda: program().numpy(), repeats)
            row["masked" if constrained else "plain"] = statistics.median(times) / steps * 1e3
        row["mask_ms_per_step"] = row["masked"] - row["plain"]
        results[f"batch_{batch}"] = row
    return results


def whole_generation(model, tokenizer, new_tokens: int, repeats: int) -> dict:
    """Greedy tokens/s on SmolLM2 with and without the city schema, and the constrained answer."""
    messages = [{"role": "user", "content": QUESTION}]
    ids = np.array([tokenizer.apply_chat_template(messages, add_generation_prompt=True)])
    schema = SCHEMAS["city (2 fields)"]
    results = {"question": QUESTION, "schema": schema}
    for name, options in (("plain", {}), ("json_schema", {"json_schema": schema})):
        def run():
            return model.generate(ids, max_new_tokens=new_tokens, do_sample=False, tokenizer=tokenizer,
                                  return_dict_in_generate=True, **options)

        out = run()
        times = _timed(run, repeats)
        answer_ids = [t for t in out.sequences.numpy()[0, ids.shape[1]:] if t != tokenizer.eos_token_id]
        results[name] = {"seconds": statistics.median(times), "tokens": len(answer_ids),
                         "tokens_per_second": len(answer_ids) / statistics.median(times),
                         "answer": tokenizer.decode(answer_ids, skip_special_tokens=True)}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/q-structured.json")
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--skip-model", action="store_true", help="leave out the whole SmolLM2 generations")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import tfgen
    from tfgen.hub.pull import pull

    path = os.fspath(pull("smollm2-135m-instruct", progress=False))
    tokenizer = tfgen.AutoTokenizer.from_pretrained(path)
    vocab_size = tokenizer.vocab_size
    report = {"vocab_size": vocab_size, "build": build_costs(tokenizer, vocab_size),
              "mask": mask_costs(tokenizer, vocab_size, args.steps, args.repeats)}
    if not args.skip_model:
        report["generation"] = whole_generation(tfgen.AutoModelForCausalLM.from_pretrained(path), tokenizer,
                                                args.new_tokens, args.repeats)
    with open(args.out, "w", encoding="utf-8") as file:
        json.dump(report, file, indent=2)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
