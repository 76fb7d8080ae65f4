"""`tfgen batch --input prompts.jsonl --output results.jsonl [--model PATH_OR_ID_OR_NAME]`: generate for every row of a
file on every device, resumably (rerun the same command after a crash). See `docs/batch.md`."""

from __future__ import annotations

import logging
import sys

# TensorFlow-free, so that `tfgen --help` and `tfgen batch --help` answer without importing TensorFlow.
from tfgen.batch.options import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_SEED,
    DISTRIBUTION_STRATEGIES,
    INPUT_FORMATS,
    ON_ERROR,
    WINDOW_GROUPS,
)
from tfgen.commands import add_model_argument, add_sampling_arguments, sampling_options

logger = logging.getLogger(__name__)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "batch",
        help="generate for every prompt of a JSONL/TFRecord file (multi-device, resumable)",
        description="Rows are JSONL objects {\"id\": ..., \"prompt\": \"...\"} or {\"id\": ..., \"input_ids\": [...]}, "
        "or tf.train.Example records with features id and input_ids (or prompt). Results go to OUTPUT in input "
        "order; rerunning the same command after a crash or Ctrl-C resumes where the last complete window ended. "
        "A second run on the same OUTPUT is refused while the first runs (lock file OUTPUT.lock).",
    )
    add_model_argument(parser)
    parser.add_argument("--input", required=True, help="prompts: .jsonl, or .tfrecord[.gz] (local path or gs://)")
    parser.add_argument("--output", required=True, help="results JSONL (local path); sidecar files share its name")
    parser.add_argument("--tokenizer", help="tokenizer directory or hub id (default: the model's)")
    parser.add_argument("--input-format", choices=INPUT_FORMATS, default="auto", help="default: from the extension")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="rows per replica per call")
    parser.add_argument(
        "--window", type=int, help=f"rows sorted by length together and committed at once (default {WINDOW_GROUPS}"
        " x batch size)"
    )
    parser.add_argument(
        "--strategy", choices=DISTRIBUTION_STRATEGIES, default="auto", help="how to spread over devices"
    )
    parser.add_argument("--tpu", default="local", help="TPU name or grpc:// address ('local' on a TPU VM)")
    parser.add_argument(
        "--cpu-devices", type=int, help="split the host CPU into N logical devices (rehearse a multi-replica run)"
    )
    parser.add_argument("--on-error", choices=ON_ERROR, default="stop", help="bad rows: stop before anything, or skip")
    parser.add_argument("--seed", type=int, nargs=2, metavar=("A", "B"), default=list(DEFAULT_SEED), help="job seed")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="tokens per row (default: config, else 20)")
    add_sampling_arguments(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.set_defaults(handler=run)


def run(args) -> int:
    import tensorflow as tf

    if args.cpu_devices is not None:
        if args.cpu_devices < 1:
            raise ValueError(f"--cpu-devices must be positive, got {args.cpu_devices}")
        # Must happen before anything initialises the devices, i.e. before the strategy and the model.
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.cpu_devices)

    from tfgen.auto.models import load_generation_model
    from tfgen.auto.tokenizer import AutoTokenizer
    from tfgen.batch import JobInterrupted, make_strategy, run_batch_job
    from tfgen.batch.joblock import OutputLock
    from tfgen.hub.pull import resolve_model_argument

    model_path = resolve_model_argument(args.model, progress=not args.no_progress)
    strategy = make_strategy(args.strategy, tpu=args.tpu)
    if strategy.extended.should_checkpoint:
        OutputLock(args.output).check_free()  # refuse a second run on this output before loading the model
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or model_path)
    except OSError as error:
        if args.tokenizer:
            raise
        logger.warning("no tokenizer (%s); rows need input_ids and 'text' will be null", error)
        tokenizer = None
    with strategy.scope():
        model = load_generation_model(model_path)
    try:
        result = run_batch_job(
            model,
            args.input,
            args.output,
            strategy=strategy,
            batch_size=args.batch_size,
            window=args.window,
            tokenizer=tokenizer,
            seed=args.seed,
            on_error=args.on_error,
            input_format=args.input_format,
            progress=not args.no_progress,
            **sampling_options(args),
        )
    except KeyboardInterrupt as interrupt:
        # Ctrl-C is how a job is paused: one line saying how to go on, not a traceback; 130 is the shell's status
        # for a process ended by SIGINT.
        saved = getattr(interrupt, "saved", None) if isinstance(interrupt, JobInterrupted) else None
        where = "" if saved is None else f" ({saved} of {interrupt.rows} rows are saved in {interrupt.output}.partial)"
        print(f"tfgen batch: interrupted{where}; run the same command again to resume.", file=sys.stderr)
        return 130
    where = result.output if strategy.extended.should_checkpoint else f"{result.output} (written by the chief)"
    print(
        f"tfgen batch: {result.rows} rows in {where} ({result.resumed_from} already done, "
        f"{result.skipped} skipped); this run: {result.new_tokens} tokens in {result.seconds:.1f} s "
        f"({result.tokens_per_second:,.0f} tok/s) on {strategy.num_replicas_in_sync} replica(s)",
        file=sys.stderr,
    )
    return 0
