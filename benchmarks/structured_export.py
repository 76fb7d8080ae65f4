"""An exported constraint baked into the signatures against its tables as signature inputs (issue 18): the first
call (XLA compile) and the per-call time of the `sample` signature of a baked export and of the `structured` signature
with the same automaton padded to its bucket, on the shipped model (2 rows, 32-token budget, sampling).

Both forms run in one process, the calls alternated so that a busy machine slows them alike; each pattern runs in two
processes with the compile order swapped; XLA's persistent cache is off. The figures are in `docs/serving.md`
("Exported constraints").

    python -m benchmarks.structured_export                    # 4 processes, about 2 minutes on 2 CPUs
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

R = r"(0|[1-9][0-9]{0,3})-[a-z]{2,5}"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 6},
          "age": {"type": "integer"}, "role": {"enum": ["admin", "user"]}}, "required": ["name", "age", "role"]}
N = 32


def measure(label: str, first_form: str, root: str) -> dict:
    import numpy as np
    import tensorflow as tf

    import tfgen
    from tfgen.export import export_saved_model
    from tfgen.export.structured_inputs import structured_tables
    from tfgen.hub.default_model import default_model_path
    from tfgen.structured.automaton import build_automaton
    from tfgen.structured.json_schema import schema_regex

    path = default_model_path()
    model = tfgen.AutoModelForCausalLM.from_pretrained(path)
    tokenizer = tfgen.AutoTokenizer.from_pretrained(path)
    encoded = tokenizer(["def add(a, b):", "import"], return_tensors="np")
    ids, mask = encoded["input_ids"].astype(np.int32), encoded["attention_mask"].astype(np.int32)
    rows = {"seed": np.array([[1, 2], [3, 4]], np.int32), "temperature": np.ones([2], np.float32),
            "top_k": np.zeros([2], np.int32), "top_p": np.ones([2], np.float32),
            "max_new_tokens": np.full([2], N, np.int32)}
    pattern = R if label == "regex" else schema_regex(SCHEMA)
    automaton = build_automaton(tokenizer, int(model.config.vocab_size), pattern)
    bucket = tuple(int(size) for size in automaton.next_state.shape)  # (states, classes), each padded
    baked = export_saved_model(model, f"{root}/baked", max_new_tokens=N, signatures=["sample"], tokenizer=tokenizer,
                               regex=pattern)
    inputs = export_saved_model(model, f"{root}/inputs", max_new_tokens=N, signatures=["sample"], slots=0,
                                structured_inputs=bucket)
    functions = {"baked": (tf.saved_model.load(baked).signatures["sample"], {}),
                 "inputs": (tf.saved_model.load(inputs).signatures["structured"],
                            structured_tables(automaton, *bucket))}

    def call(form):
        function, tables = functions[form]
        return function(input_ids=ids, attention_mask=mask, **rows, **tables)

    order = [first_form, "inputs" if first_form == "baked" else "baked"]
    first, outputs = {}, {}
    for form in order:
        began = time.perf_counter()
        outputs[form] = call(form)
        first[form] = time.perf_counter() - began
    times = {"baked": [], "inputs": []}
    for _ in range(30):
        for form in order:
            began = time.perf_counter()
            call(form)
            times[form].append(time.perf_counter() - began)
    return {
        "pattern": label, "compiled_first": first_form, "states": automaton.states, "classes": automaton.classes,
        "bucket": list(bucket), "first_call_s": {form: round(value, 2) for form, value in first.items()},
        "median_call_ms": {form: round(statistics.median(value) * 1e3, 1) for form, value in times.items()},
        "fastest_call_ms": {form: round(min(value) * 1e3, 1) for form, value in times.items()},
        "same_tokens": bool((outputs["baked"]["sequences"].numpy() == outputs["inputs"]["sequences"].numpy()).all()),
        "new_tokens": (outputs["baked"]["sequence_lengths"].numpy() - ids.shape[1]).tolist(),
    }


def main() -> None:
    if len(sys.argv) == 4:  # one measurement, in its own process
        print(json.dumps(measure(*sys.argv[1:4])))
        return
    env = {**os.environ, "TFGEN_COMPILE_CACHE": "0", "TF_CPP_MIN_LOG_LEVEL": "3"}
    results = []
    with tempfile.TemporaryDirectory() as root:
        for label, first_form in (("regex", "baked"), ("schema", "inputs"), ("regex", "inputs"), ("schema", "baked")):
            done = subprocess.run([sys.executable, "-m", "benchmarks.structured_export", label, first_form,
                                   os.path.join(root, label + first_form)], env=env, capture_output=True, text=True,
                                  check=True)
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), flush=True)


if __name__ == "__main__":
    main()
