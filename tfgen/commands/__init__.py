"""`tfgen` subcommands: each module here has `add_parser(subparsers)` registering one subcommand."""

from __future__ import annotations


def add_model_argument(parser) -> None:
    """The `--model` option of the commands that load a model (generate, batch, export), as
    `tfgen.model_pull.resolve_model_argument` reads it."""
    parser.add_argument(
        "--model", default=None, help="local model directory or .gguf file, hub id (HF layout), or a registered name "
        "(`tfgen pull --list`; pulled on first use); default: the shipped model",
    )


def check_option_flag(flag: str, name: str, value) -> None:
    """Refuses `value` of the generation option `name`, given on the command line as `flag`, by the config's own
    rules (type and range): ValueError naming the flag and the option. TensorFlow-free, so it runs before the
    model loads."""
    from tfgen.config import GenerationConfig
    from tfgen.config_rules import check_options

    config = GenerationConfig()
    vars(config)[name] = value
    try:
        check_options(config)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{flag}: {error}") from None
