"""`tfgen` subcommands: each module here has `add_parser(subparsers)` registering one subcommand, plus the flags
several commands share. `tfgen --help` and `tfgen CMD --help` import no TensorFlow: a command imports what it runs
inside its `run` (a deliberate function-level import, for start-up time, never to break a circle).

May import every tfgen package.
"""

from __future__ import annotations

import argparse

from tfgen.local_files import read_json_file
from tfgen.models.quantize_modes import QUANTIZE_MODES, check_quantize

# The range `generate()` takes a seed's two integers in (`tfgen.request.input_checks.check_seed`).
_SEED_RANGE = range(-(2**31), 2**32)


def add_model_argument(parser) -> None:
    """The `--model` and `--quantize` options of the commands that load a model (generate, chat, batch, export,
    serve), as `tfgen.hub.pull.resolve_model_argument` and `model_options` read them (checked first by
    `check_before_tensorflow`)."""
    parser.add_argument(
        "--model", default=None, help="local model directory or .gguf file, hub id (HF layout), or a registered name "
        "(`tfgen pull --list`; pulled on first use); default: the shipped model",
    )
    parser.add_argument(
        "--quantize", default=None, metavar="MODE",
        help=f"load the weights quantized: {', '.join(QUANTIZE_MODES)} (int8 weights with a scale per output "
        "channel, about a quarter of the float32 bytes; GPT-2, the Llama family and T5; see docs/performance.md)",
    )
    parser.set_defaults(precheck=check_before_tensorflow)


def model_options(args) -> dict:
    """The `from_pretrained` keywords of the `add_model_argument` flags given (`quantize`)."""
    return {} if args.quantize is None else {"quantize": args.quantize}


def check_before_tensorflow(args) -> None:
    """The checks of the shared flags that need no TensorFlow, which `tfgen.cli` runs before it imports TensorFlow
    (seconds), so that their mistakes are one line at once: `--regex` / `--json-schema` (`structured_options`) and
    `--model` (`tfgen.hub.pull.check_model_argument`: a missing path, a name that is not registered). Nothing is
    fetched here: the command resolves `--model` (and pulls a registered model) as it runs. `--quantize`: one of
    `tfgen.models.quantize_modes.QUANTIZE_MODES`."""
    # Function-level: `tfgen CMD --help` needs neither.
    from tfgen.hub.pull import check_model_argument

    if hasattr(args, "regex"):
        structured_options(args)
    if hasattr(args, "model"):
        check_model_argument(args.model)
    if getattr(args, "quantize", None) is not None:
        try:
            check_quantize(args.quantize)
        except ValueError as error:
            raise ValueError(f"--quantize: {error}") from None


def add_job_arguments(parser, output_help: str) -> None:
    """The model and the input / output flags a batch job takes (`tfgen batch`, `python -m tfgen.beam`): --model,
    --quantize, --input, --output (`output_help` says where it may live), --tokenizer, --input-format."""
    from tfgen.batch.options import INPUT_FORMATS

    add_model_argument(parser)
    parser.add_argument("--input", required=True, help="prompts: .jsonl, or .tfrecord[.gz] (local path or gs://)")
    parser.add_argument("--output", required=True, help=output_help)
    parser.add_argument("--tokenizer", help="tokenizer directory or hub id (default: the model's)")
    parser.add_argument("--input-format", choices=INPUT_FORMATS, default="auto", help="default: from the extension")


def add_sampling_arguments(parser) -> None:
    """The decoding flags of the commands that generate (generate, chat, batch): greedy or sampling and the common
    warpers, as `sampling_options` reads them."""
    parser.add_argument("--do-sample", action="store_true", default=None, help="sample instead of greedy search")
    parser.add_argument("--greedy", action="store_false", dest="do_sample", help="force greedy search")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--repetition-penalty", type=float)


class _SeedAction(argparse.Action):
    """Stores `--seed A B` as two ints. argparse's own `type=int` would say "invalid int value: 'hi'" for
    `--seed 1 "hi"` (the prompt taken as B); this says what the flag takes. A ValueError, not argparse's error, so
    that the CLI prints it as one line (status 2)."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            seed = [int(value) for value in values]
        except ValueError:
            got = " ".join(repr(value) for value in values)
            raise ValueError(f"{option_string} takes two integers A B (got {got})") from None
        if any(value not in _SEED_RANGE for value in seed):
            raise ValueError(f"{option_string} takes two integers A B that fit in 32 bits (got {seed[0]} {seed[1]})")
        setattr(namespace, self.dest, seed)


def add_seed_argument(parser, *, default=None, help_text: str = "sampling seed: two integers") -> None:
    """`--seed A B` of the commands that sample (generate, batch, chat): exactly two integers, each within 32 bits;
    anything else is a one-line ValueError naming the flag and what it got."""
    parser.add_argument("--seed", nargs=2, metavar=("A", "B"), action=_SeedAction, default=default, help=help_text)


def sampling_options(args) -> dict:
    """The generation options of the `add_sampling_arguments` flags given (and `--max-new-tokens`)."""
    names = ("max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "repetition_penalty")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def check_option_flag(flag: str, name: str, value) -> None:
    """Refuses `value` of the generation option `name`, given on the command line as `flag`, by the config's own
    rules (type and range): ValueError naming the flag and the option. TensorFlow-free, so it runs before the
    model loads."""
    from tfgen.config.generation_config import GenerationConfig
    from tfgen.config.rules import check_options

    config = GenerationConfig()
    vars(config)[name] = value
    try:
        check_options(config)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{flag}: {error}") from None


def check_prompt_length(encoded, tokenizer) -> None:
    """Refuses, before the model loads, a prompt (`encoded["input_ids"]`, [1, T]) that fills the model's context
    (`tokenizer.context_length`, from the checkpoint's config or GGUF metadata; None: unknown, left to generate()):
    ValueError naming both numbers."""
    # Function-level: the request checks import TensorFlow, which `tfgen CMD --help` does not need.
    from tfgen.request.input_checks import check_prompt_fits

    context = getattr(tokenizer, "context_length", None)
    check_prompt_fits(int(encoded["input_ids"].shape[1]), context, name=None,
                      remedy="use a shorter prompt")


def add_structured_arguments(parser, what: str) -> None:
    """`--regex PATTERN` / `--json-schema FILE` (one of them): constrain `what` to text matching them."""
    parser.set_defaults(precheck=check_before_tensorflow)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--regex", metavar="PATTERN", help=f"constrain {what} to text matching PATTERN as a whole")
    group.add_argument("--json-schema", metavar="FILE", help=f"constrain {what} to JSON valid for the schema in FILE")


def structured_options(args) -> dict:
    """`{"regex": ...}` or `{"json_schema": dict}` of the `add_structured_arguments` flags given (empty: neither),
    read and compiled as far as it can be without the model's vocabulary, before the model loads: ValueError naming
    the flag for a file that cannot be read, is not a regular file (a FIFO, a device), is over
    `tfgen.local_files.JSON_FILE_CAP` or is not a JSON object, a schema that cannot be turned into a regex and a
    regex outlines-core cannot compile (`tfgen.structured.pattern_check`; the CLI prints it as one line, status 2)."""
    # Function-level: the check imports numpy and outlines-core, which `tfgen CMD --help` does not need.
    from tfgen.structured.pattern_check import check_pattern, check_schema

    if args.regex is not None:
        if not args.regex:
            raise ValueError("--regex: the pattern is empty")
        check_pattern(args.regex, "--regex")
        return {"regex": args.regex}
    if args.json_schema is None:
        return {}
    try:
        # A regular file under the JSON cap: a FIFO or /dev/zero is refused before it is opened.
        schema = read_json_file(args.json_schema)
    except OSError as error:
        raise ValueError(f"--json-schema: {error}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"--json-schema: {args.json_schema!r} holds a JSON {type(schema).__name__}, not a schema "
                         "object")
    check_schema(schema, "--json-schema")
    return {"json_schema": schema}
