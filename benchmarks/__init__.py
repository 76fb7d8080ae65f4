"""The side-by-side benchmark: tokens/s of tfgen's `generate()` next to its peers, on the same weights.

It lives in the source tree, not in the installed `tfgen` package. Run it from a checkout with
`python -m benchmarks` (or `tfgen bench`, which forwards its arguments here); `docs/performance.md` describes
the method and shows the results, whose raw runs are kept in `benchmarks/results/`.

- `peers.py`: what is benchmarked: the requests (`BENCH_REQUESTS`) and one runner per library.
- `checkpoints.py`: the checkpoints every library loads, and their sizes.
- `harness.py`: the steady-state rounds, the bandwidth probe and roofline, the command-line options.
- `first_call.py`: first-call time and peak memory, each library in a fresh process.
- `report.py`: merging saved runs, the markdown tables, the plots and the generated block of the docs page.
- `run.py`: the command line (`main`).
- `keras_hub_adapter.py`: `python -m benchmarks.keras_hub_adapter`, keras-hub's own `generate()` next to tfgen's
  (`tfgen.from_keras_hub`) on the same keras-hub model, in float32, int8 and bfloat16.
- `accuracy.py`: `python -m benchmarks.accuracy`, what a model variant (int8) costs in accuracy: perplexity over
  `data/persuasion_ch1-7.txt` and greedy agreement on 20 chat prompts, two models side by side.
"""
