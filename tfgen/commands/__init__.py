"""`tfgen` subcommands: each module here has `add_parser(subparsers)` registering one subcommand."""

from __future__ import annotations


def add_model_argument(parser) -> None:
    """The `--model` option of the commands that load a model (generate, batch, export), as
    `tfgen.model_pull.resolve_model_argument` reads it."""
    parser.add_argument(
        "--model", default=None, help="local model directory or .gguf file, hub id (HF layout), or a registered name "
        "(`tfgen pull --list`; pulled on first use); default: the shipped model",
    )
