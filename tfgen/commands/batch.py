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
    ON_ERROR,
    WINDOW_GROUPS,
    WINDOW_SPLITS,
)
from tfgen.commands import (
    add_job_arguments,
    add_sampling_arguments,
    add_seed_argument,
    add_structured_arguments,
    model_options,
    sampling_options,
    structured_options,
)

logger = logging.getLogger(__name__)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "batch",
        help="generate for every prompt of a JSONL/TFRecord file (multi-device, resumable)",
        description="Rows are JSONL objects {\"id\": ..., \"prompt\": \"...\"}, {\"id\": ..., \"messages\": "
        "[{\"role\": ..., \"content\": ...}, ...]} (a chat, rendered with the model's chat template) or {\"id\": ..., "
        "\"input_ids\": [...]}, optionally with their own max_new_tokens, temperature, top_p or seed; or "
        "tf.train.Example records with features id and input_ids (or prompt). On a model with a chat template a "
        "prompt is sent as a user message (--raw: continued as plain text). Results go to OUTPUT in input "
        "order; rerunning the same command after a crash or Ctrl-C resumes where the last complete window ended. "
        "A second run on the same OUTPUT is refused while the first runs (lock file OUTPUT.lock).",
    )
    add_job_arguments(parser, "results JSONL (local path); sidecar files share its name")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="rows per replica per call")
    parser.add_argument(
        "--window", type=int, help="rows sorted by length together and committed at once (default: 1/"
        f"{WINDOW_SPLITS} of the rows in whole batches, at least one batch, at most {WINDOW_GROUPS} batches)"
    )
    parser.add_argument(
        "--strategy", choices=DISTRIBUTION_STRATEGIES, default="auto", help="how to spread over devices"
    )
    parser.add_argument("--tpu", default="local", help="TPU name or grpc:// address ('local' on a TPU VM)")
    parser.add_argument(
        "--cpu-devices", type=int, help="split the host CPU into N logical devices (rehearse a multi-replica run)"
    )
    parser.add_argument("--on-error", choices=ON_ERROR, default="stop", help="bad rows: stop before anything, or skip")
    add_seed_argument(parser, default=list(DEFAULT_SEED), help_text="job seed: two integers")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="tokens per row at most (default: the "
                        "model's config, else up to 1024 within the context the longest prompt leaves)")
    add_sampling_arguments(parser)
    parser.add_argument("--raw", action="store_true", help="continue 'prompt' rows as plain text even when the model "
                        "has a chat template ('messages' rows are always rendered with it)")
    parser.add_argument("--chat-template-kwargs", metavar="JSON", help="extra variables for the chat template, a "
                        "JSON object such as '{\"enable_thinking\": false}'")
    parser.add_argument("--stop-string", action="append", dest="stop_strings", metavar="TEXT",
                        help="a row stops once its text ends with TEXT (repeatable; finish_reason \"stop\")")
    add_structured_arguments(parser, "every row's text")
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
    from tfgen.batch.chatrows import parse_template_kwargs
    from tfgen.batch.joblock import OutputLock
    from tfgen.config.budget import budget_cut_message
    from tfgen.hub.pull import resolve_model_argument

    # Read before anything loads: a flag that cannot be used is one line at once.
    options = {**sampling_options(args), **structured_options(args)}
    if args.stop_strings is not None:
        options["stop_strings"] = args.stop_strings
    template_kwargs = None if args.chat_template_kwargs is None else parse_template_kwargs(args.chat_template_kwargs)
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
    _refuse_chats_without_template(args, tokenizer, model_path, template_kwargs)
    with strategy.scope():
        model = load_generation_model(model_path, **model_options(args))
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
            raw=args.raw,
            chat_template_kwargs=template_kwargs,
            **options,
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
    if result.cut:
        print(f"tfgen batch: {result.cut} of this run's {result.rows - result.resumed_from} row(s) stopped at their "
              f"budget (finish_reason \"length\"): {budget_cut_message(result.max_new_tokens)}", file=sys.stderr)
    return 0


def _refuse_chats_without_template(args, tokenizer, model_path: str, template_kwargs: dict | None) -> None:
    """Before the model loads: `--chat-template-kwargs` the template cannot take (ValueError), and on a model without
    a chat template, the flag or an input with `messages` rows (MissingChatTemplateError, one line, status 1)."""
    from tfgen.batch.chatrows import check_template_kwargs
    from tfgen.batch.inputs import first_messages_line
    from tfgen.text.chat_template import MissingChatTemplateError

    try:
        check_template_kwargs(template_kwargs, tokenizer)
    except (TypeError, ValueError) as error:
        what = str(error).removeprefix("chat_template_kwargs")
        raise ValueError(f"--chat-template-kwargs{what} (the model {model_path!r})") from None
    if getattr(tokenizer, "chat_template", None) is not None:
        return
    line = first_messages_line(args.input, args.input_format)
    if line is not None:
        raise MissingChatTemplateError(
            f"input {args.input}: line {line} is a chat ('messages'), which needs a chat template, and the model "
            f"{model_path!r} has none (no chat_template.jinja, no chat_template in tokenizer_config.json); give "
            "such rows a 'prompt' to continue plain text"
        )
