"""Trains tfgen's default model: a small GPT-2 on the Python standard library's own `.py` sources.

Every Python installation has that text, so this runs offline anywhere. The stdlib is PSF-licensed.
Steps: collect the sources (sorted relative paths; `test`/`tests` dirs, site-packages and generated data
modules skipped), hold out the files whose path hash falls in the eval slice, train a byte-level BPE
tokenizer on the training files, train `tfgen.models.gpt2.GPT2LMHeadModel` on packed token blocks,
evaluate on the held-out files against an add-one-smoothed unigram model, generate samples, and write an
HF-layout checkpoint plus `training_report.json`.

    nice -n 10 python tools/train_default_model.py --time-budget-minutes 32
    nice -n 10 python tools/train_default_model.py --steps 1529   # the shipped run (exact re-run of its step count)

Without `--steps`, the step count is derived from the time budget by timing the first steps; the report
records it, and `--steps N` with the same seed reproduces the run (same data, order, init and schedule).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import sysconfig
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf
import tokenizers
from tokenizers import decoders, pre_tokenizers, processors, trainers

from tfgen import GenerationConfig, Tokenizer
from tfgen.models.gpt2 import GPT2Config, GPT2LMHeadModel

REPO_ROOT = Path(__file__).resolve().parent.parent
END_OF_TEXT = "<|endoftext|>"
# `pydoc_data` is generated help text and `encodings` mostly generated codec tables: not code to imitate.
SKIPPED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "pydoc_data", "encodings"}
SAMPLE_PROMPTS = ("def fibonacci(n):", "import os\n", "class Stack:")
# Steps timed (after the first, traced one) to derive the step count from the time budget.
CALIBRATION_STEPS = 40
# Training stops at this multiple of the time budget even short of its steps (a slowed-down shared machine).
HARD_LIMIT_FACTOR = 1.5


def collect_sources(stdlib_dir: Path) -> list[tuple[str, str]]:
    """(relative POSIX path, text) of the stdlib's `.py` files, sorted by path; non-UTF-8 files skipped."""
    sources = []
    for directory, subdirs, files in os.walk(stdlib_dir):
        subdirs[:] = [name for name in subdirs if name not in SKIPPED_DIRS]
        for name in files:
            if not name.endswith(".py"):
                continue
            path = Path(directory, name)
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            sources.append((path.relative_to(stdlib_dir).as_posix(), text))
    return sorted(sources)


def is_held_out(relative_path: str, eval_percent: int) -> bool:
    """Whether a file belongs to the eval split: a stable hash of its path, independent of file order."""
    digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % 100 < eval_percent


def train_tokenizer(texts: list[str], vocab_size: int) -> tokenizers.Tokenizer:
    """A GPT-2-style byte-level BPE (no prefix space; id 0 is `<|endoftext|>`) trained on `texts`."""
    backend = tokenizers.Tokenizer(tokenizers.models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer, length=len(texts))
    return backend


def pack_blocks(documents: list[list[int]], separator_id: int, block_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Concatenates `[separator] + document` for each document and cuts the stream into rows.

    Returns (input_ids, attention_mask), int32 `[num_blocks, block_length]`; the last row is padded with the
    separator under mask 0.
    """
    stream = np.concatenate([np.asarray([separator_id] + ids, np.int32) for ids in documents])
    num_blocks = -(-len(stream) // block_length)
    input_ids = np.full(num_blocks * block_length, separator_id, np.int32)
    attention_mask = np.zeros(num_blocks * block_length, np.int32)
    input_ids[: len(stream)], attention_mask[: len(stream)] = stream, 1
    return input_ids.reshape(num_blocks, block_length), attention_mask.reshape(num_blocks, block_length)


class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to `peak`, then cosine decay to `floor * peak` at `total_steps`. `total_steps` is a
    variable so a time-budgeted run can set it after timing its first steps (the training step is traced
    before that)."""

    def __init__(self, peak: float, warmup_steps: int, total_steps: int, floor: float = 0.1):
        self.peak, self.warmup_steps, self.floor = peak, warmup_steps, floor
        self.total_steps = tf.Variable(float(total_steps), trainable=False, dtype=tf.float32)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        progress = tf.clip_by_value((step - self.warmup_steps) / (self.total_steps - self.warmup_steps), 0.0, 1.0)
        cosine = self.floor + (1 - self.floor) * 0.5 * (1 + tf.cos(math.pi * progress))
        return self.peak * tf.minimum((step + 1) / self.warmup_steps, 1.0) * cosine

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps, "floor": self.floor}


class TrainingMonitor(keras.callbacks.Callback):
    """Stops at the target step count (or at HARD_LIMIT_FACTOR x the time budget), sets the count from the
    time budget when none was given, prints a progress bar (loss, tokens/s, ETA) to stderr, and records the
    loss of each logging window."""

    def __init__(self, schedule: WarmupCosine, steps: int | None, budget_seconds: float, tokens_per_step: int):
        super().__init__()
        self.schedule, self.steps, self.budget_seconds = schedule, steps, budget_seconds
        self.tokens_per_step = tokens_per_step
        self.step, self.window_losses, self.timed_start, self.hit_time_limit = 0, [], None, False
        self.started = time.perf_counter()
        self.interactive = sys.stderr.isatty()

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        now = time.perf_counter()
        if self.step == 1:
            self.timed_start = now  # the first step includes tracing; rates are measured after it
        elif self.steps is None and self.step == 1 + CALIBRATION_STEPS:
            seconds_per_step = (now - self.timed_start) / CALIBRATION_STEPS
            self.steps = self.step + int((self.budget_seconds - (now - self.started)) / seconds_per_step)
            self.schedule.total_steps.assign(float(self.steps))
            print(f"\ncalibrated: {seconds_per_step:.3f} s/step -> {self.steps} steps", file=sys.stderr, flush=True)
        if self.interactive or self.step % 25 == 0 or self.step == self.steps:
            self._print_bar(logs["loss"], now)
        self.hit_time_limit = now - self.started > HARD_LIMIT_FACTOR * self.budget_seconds
        if self.hit_time_limit or (self.steps is not None and self.step >= self.steps):
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        self.window_losses.append([self.step, round(float(logs["loss"]), 4)])

    def _print_bar(self, loss: float, now: float) -> None:
        rate = (self.step - 1) * self.tokens_per_step / max(now - self.timed_start, 1e-9)
        if self.steps is None:
            bar, eta = "calibrating", ""
        else:
            filled = int(30 * self.step / self.steps)
            remaining = (self.steps - self.step) * self.tokens_per_step / max(rate, 1e-9)
            bar = f"[{'#' * filled}{'.' * (30 - filled)}] {self.step}/{self.steps}"
            eta = f" eta {remaining / 60:.1f} min"
        line = f"{bar} loss {loss:.4f} {rate:,.0f} tok/s{eta}"
        # On a terminal the bar redraws in place; in a log file it is one line per report.
        print("\r" + line if self.interactive else line, end="" if self.interactive else "\n", file=sys.stderr,
              flush=True)


def per_token_cross_entropy(model: GPT2LMHeadModel, input_ids: np.ndarray, attention_mask: np.ndarray,
                            batch_size: int) -> float:
    """Mean next-token cross-entropy (nats) over the real targets (positions 1.. of each row)."""

    @tf.function(autograph=False)
    def summed_loss(ids, mask):
        logits = model(ids, attention_mask=mask).logits[:, :-1]
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(ids[:, 1:], logits)
        return tf.reduce_sum(losses * tf.cast(mask[:, 1:], tf.float32))

    total = sum(
        float(summed_loss(input_ids[i : i + batch_size], attention_mask[i : i + batch_size]))
        for i in range(0, len(input_ids), batch_size)
    )
    return total / int(attention_mask[:, 1:].sum())


def unigram_cross_entropy(train_ids: np.ndarray, input_ids: np.ndarray, attention_mask: np.ndarray,
                          vocab_size: int) -> float:
    """Cross-entropy (nats) on the same targets as `per_token_cross_entropy` of a unigram model with
    add-one-smoothed frequencies from the real tokens of `train_ids`."""
    counts = np.bincount(train_ids, minlength=vocab_size) + 1.0
    log_probabilities = np.log(counts / counts.sum())
    targets = input_ids[:, 1:][attention_mask[:, 1:] == 1]
    return float(-log_probabilities[targets].mean())


def bytes_per_target(backend: tokenizers.Tokenizer, input_ids: np.ndarray, attention_mask: np.ndarray) -> float:
    """Mean UTF-8 bytes a target token (as in `per_token_cross_entropy`) stands for, to turn nats/token into
    the vocabulary-independent bits/byte. Byte-level BPE spells each byte as one character; specials are 0."""
    special_ids = set(backend.get_added_tokens_decoder())
    vocabulary = range(backend.get_vocab_size())
    lengths = np.asarray([0 if i in special_ids else len(backend.id_to_token(i)) for i in vocabulary])
    return float(lengths[input_ids[:, 1:][attention_mask[:, 1:] == 1]].mean())


def generate_samples(model: GPT2LMHeadModel, tokenizer: Tokenizer, max_new_tokens: int) -> list[dict]:
    """Greedy and seeded sampled continuations (with the checkpoint's sampling defaults) of SAMPLE_PROMPTS."""
    modes = {"greedy": {"do_sample": False, "temperature": None, "top_p": None}, "sampled": {"seed": [0, 0]}}
    samples = []
    for prompt in SAMPLE_PROMPTS:
        encoded = tokenizer(prompt)
        for mode, options in modes.items():
            sequences = model.generate(encoded["input_ids"], attention_mask=encoded["attention_mask"],
                                       max_new_tokens=max_new_tokens, **options)
            text = tokenizer.decode(sequences[0].numpy(), skip_special_tokens=True)
            samples.append({"prompt": prompt, "mode": mode, "text": text})
    return samples


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", type=Path, default=REPO_ROOT / "saved_models" / "stdlib-gpt2")
    parser.add_argument("--time-budget-minutes", type=float, default=32.0,
                        help="training time (model steps only) used to derive --steps when it is not given")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (overrides the time budget)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-percent", type=int, default=5, help="percent of files held out (by path hash)")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=192)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--context", type=int, default=256, help="block length = the model's positions")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--warmup-steps", type=int, default=100)
    parser.add_argument("--stdlib-dir", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps <= args.warmup_steps:
        parser.error(f"--steps must exceed --warmup-steps ({args.warmup_steps})")
    if not 0 < args.eval_percent < 100:
        parser.error("--eval-percent must be in (0, 100)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    run_started = time.perf_counter()
    keras.utils.set_random_seed(args.seed)

    sources = collect_sources(args.stdlib_dir)
    train_sources = [(path, text) for path, text in sources if not is_held_out(path, args.eval_percent)]
    eval_sources = [(path, text) for path, text in sources if is_held_out(path, args.eval_percent)]
    print(f"{len(sources)} files: {len(train_sources)} train, {len(eval_sources)} held out", file=sys.stderr)

    backend = train_tokenizer([text for _, text in train_sources], args.vocab_size)
    tokenizer = Tokenizer(backend, bos_token=END_OF_TEXT, eos_token=END_OF_TEXT)
    eos_id = tokenizer.eos_token_id
    train_ids, train_mask, eval_ids, eval_mask = (
        array
        for split in (train_sources, eval_sources)
        for array in pack_blocks([e.ids for e in backend.encode_batch([t for _, t in split])], eos_id, args.context)
    )
    print(f"tokenizer: {tokenizer.vocab_size} ids; {int(train_mask.sum()):,} train / {int(eval_mask.sum()):,} "
          f"held-out tokens ({time.perf_counter() - run_started:.0f} s)", file=sys.stderr)

    config = GPT2Config(
        vocab_size=tokenizer.vocab_size, n_positions=args.context, n_embd=args.width, n_layer=args.layers,
        n_head=args.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,  # a few epochs: no dropout needed
        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
    )
    model = GPT2LMHeadModel(config)
    parameters = int(sum(np.prod(v.shape) for v in model.trainable_variables))
    schedule = WarmupCosine(args.learning_rate, args.warmup_steps, args.steps or 10 * args.warmup_steps)
    optimizer = keras.optimizers.AdamW(schedule, weight_decay=0.1, beta_2=0.98, global_clipnorm=1.0)
    optimizer.exclude_from_weight_decay(var_names=["bias", "ln_"])
    # XLA and mixed_bfloat16 measured no faster for training on the 2-core CPU this was built on.
    model.compile(optimizer=optimizer, jit_compile=False)

    dataset = (
        tf.data.Dataset.from_tensor_slices({"input_ids": train_ids, "attention_mask": train_mask})
        .shuffle(len(train_ids), seed=args.seed, reshuffle_each_iteration=True)
        .repeat()
        .batch(args.batch_size, drop_remainder=True)
        .prefetch(2)
    )
    monitor = TrainingMonitor(schedule, args.steps, args.time_budget_minutes * 60, args.batch_size * args.context)
    print(f"model: {parameters:,} parameters; training", file=sys.stderr)
    training_started = time.perf_counter()
    model.fit(dataset, epochs=10**6, steps_per_epoch=50, shuffle=False, verbose=0, callbacks=[monitor])
    training_seconds = time.perf_counter() - training_started
    print(file=sys.stderr)
    model.generation_config = GenerationConfig(
        do_sample=True, temperature=0.8, top_p=0.95, top_k=50, max_new_tokens=64,
        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
    )
    # Saved before evaluating and sampling, so a failure there does not lose the training run.
    args.output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.output_dir)
    tokenizer.save_pretrained(args.output_dir)

    model_ce = per_token_cross_entropy(model, eval_ids, eval_mask, 4 * args.batch_size)
    unigram_ce = unigram_cross_entropy(train_ids[train_mask == 1], eval_ids, eval_mask, config.vocab_size)
    nats_to_bits_per_byte = 1 / (math.log(2) * bytes_per_target(backend, eval_ids, eval_mask))
    print(f"held-out cross-entropy: model {model_ce:.4f} nats/token (perplexity {math.exp(model_ce):.2f}, "
          f"{model_ce * nats_to_bits_per_byte:.3f} bits/byte), unigram {unigram_ce:.4f} (perplexity "
          f"{math.exp(unigram_ce):.2f}, {unigram_ce * nats_to_bits_per_byte:.3f} bits/byte)", file=sys.stderr)

    report = {
        "data": {
            "source": f"Python {sys.version.split()[0]} standard library .py files",
            "skipped_dirs": sorted(SKIPPED_DIRS),
            "eval_split": f"sha256(relative path) % 100 < {args.eval_percent}",
            "train_files": len(train_sources),
            "eval_files": len(eval_sources),
            "eval_file_list": [path for path, _ in eval_sources],
            "train_tokens": int(train_mask.sum()),
            "eval_tokens": int(eval_mask.sum()),
        },
        "tokenizer": {"type": "byte-level BPE", "vocab_size": tokenizer.vocab_size, "eos_bos_pad": END_OF_TEXT},
        "model": {**config.to_dict(), "parameters": parameters},
        "training": {
            "command_args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                             if k not in ("output_dir", "stdlib_dir")},
            "steps": monitor.step,
            "stopped_by_time_limit": monitor.hit_time_limit,
            "batch_size": args.batch_size,
            "tokens_seen": monitor.step * args.batch_size * args.context,
            "epochs": round(monitor.step * args.batch_size / len(train_ids), 3),
            "training_seconds": round(training_seconds, 1),
            "total_seconds": round(time.perf_counter() - run_started, 1),
            "loss_by_step": monitor.window_losses,
        },
        "eval": {
            "targets": int(eval_mask[:, 1:].sum()),
            "model_cross_entropy": round(model_ce, 4),
            "model_perplexity": round(math.exp(model_ce), 3),
            "unigram_cross_entropy": round(unigram_ce, 4),
            "unigram_perplexity": round(math.exp(unigram_ce), 3),
            "model_bits_per_byte": round(model_ce * nats_to_bits_per_byte, 4),
            "unigram_bits_per_byte": round(unigram_ce * nats_to_bits_per_byte, 4),
        },
        "samples": [],
    }
    report_path = args.output_dir / "training_report.json"
    report_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    report["samples"] = generate_samples(model, tokenizer, max_new_tokens=64)
    for sample in report["samples"]:
        print(f"--- {sample['mode']}: {sample['prompt']!r}\n{sample['text']}", file=sys.stderr)
    report_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.output_dir} ({(time.perf_counter() - run_started) / 60:.1f} min in total)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
