"""`tfgen` subcommands: each module here has `add_parser(subparsers)` registering one subcommand, plus the flags
several commands share. `tfgen --help` and `tfgen CMD --help` import no TensorFlow: a command imports what it runs
inside its `run` (a deliberate function-level import, for start-up time, never to break a circle).

May import every tfgen package.
"""

from __future__ import annotations

from tfgen.local_files import read_json_file


def add_model_argument(parser) -> None:
    """The `--model` option of the commands that load a model (generate, chat, batch, export), as
    `tfgen.hub.pull.resolve_model_argument` reads it."""
    parser.add_argument(
        "--model", default=None, help="local model directory or .gguf file, hub id (HF layout), or a registered name "
        "(`tfgen pull --list`; pulled on first use); default: the shipped model",
    )


def add_sampling_arguments(parser) -> None:
    """The decoding flags of the commands that generate (generate, chat, batch): greedy or sampling and the common
    warpers, as `sampling_options` reads them."""
    parser.add_argument("--do-sample", action="store_true", default=None, help="sample instead of greedy search")
    parser.add_argument("--greedy", action="store_false", dest="do_sample", help="force greedy search")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--repetition-penalty", type=float)


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


def add_structured_arguments(parser, what: str) -> None:
    """`--regex PATTERN` / `--json-schema FILE` (one of them): constrain `what` to text matching them."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--regex", metavar="PATTERN", help=f"constrain {what} to text matching PATTERN as a whole")
    group.add_argument("--json-schema", metavar="FILE", help=f"constrain {what} to JSON valid for the schema in FILE")


def structured_options(args) -> dict:
    """`{"regex": ...}` or `{"json_schema": dict}` of the `add_structured_arguments` flags given (empty: neither),
    read before the model loads: ValueError naming the flag for a file that cannot be read, is not a regular file
    (a FIFO, a device), is over `tfgen.local_files.JSON_FILE_CAP` or is not a JSON object (the CLI prints it as one
    line, status 2)."""
    if args.regex is not None:
        if not args.regex:
            raise ValueError("--regex: the pattern is empty")
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
    return {"json_schema": schema}
