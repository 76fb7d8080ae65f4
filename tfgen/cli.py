"""The `tfgen` command line. Each subcommand lives in `tfgen/commands/<name>.py`.

Parsing imports no TensorFlow (the command modules import it in their handlers), so `tfgen --help` and
`tfgen CMD --help` answer at once. A command's run is quiet: TensorFlow's C++ log lines are held to
`TF_CPP_MIN_LOG_LEVEL` (3, errors that end the process, unless set) including the ones it prints before reading
it, TensorFlow's Python warnings (retracing) are hidden at level 2 and above, and tfgen's own messages (the
compile notice) show as `tfgen: <message>` on stderr (`--quiet`: warnings only). Bad input is one line on stderr and
status 2 (arguments that are not UTF-8 included; 1 for an error that carries `exit_status = 1`, such as a model
that cannot be pulled), and the flags that need no TensorFlow (`--model`, `--regex`, `--json-schema`: a command's
`precheck`) are checked before TensorFlow is imported; Ctrl-C is `tfgen: interrupted` and status 130
(`tfgen.commands.interrupts`). With stderr closed (`2>&-`) a command still runs, prints its result and exits with
its status; its messages are lost.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys

from tfgen.commands.interrupts import INTERRUPTED_MESSAGE, INTERRUPTED_STATUS, interrupt_guard
from tfgen.generation import tf_startup

# Modules whose `add_parser(subparsers)` registers one subcommand each.
SUBCOMMAND_MODULES = [
    "tfgen.commands.generate",
    "tfgen.commands.chat",
    "tfgen.commands.batch",
    "tfgen.commands.export",
    "tfgen.commands.serve",
    "tfgen.commands.bench",
    "tfgen.commands.pull",
]

class TextArgumentParser(argparse.ArgumentParser):
    """An `ArgumentParser` (its subcommands' parsers too) that refuses an argument which is not valid UTF-8 text.

    On POSIX, argv bytes that are not UTF-8 reach Python as lone surrogates ("surrogateescape"); they would fail
    later, deep in the tokenizer or a file name, with an error naming nothing. Raises ValueError naming the argument.
    """

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        for action in self._actions:
            values = getattr(namespace, action.dest, None)
            for value in values if isinstance(values, (list, tuple)) else [values]:
                if isinstance(value, str) and not _is_utf8(value):
                    name = "/".join(action.option_strings) or action.metavar or action.dest
                    raise ValueError(f"argument {name} is not valid UTF-8 text ({_raw_bytes(value)}); pass it in UTF-8")
        return namespace, extras


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _raw_bytes(text: str) -> str:
    """The argument's original bytes, as far as they can be recovered."""
    try:
        return repr(os.fsencode(text))
    except UnicodeEncodeError:
        return ascii(text)


def build_parser() -> argparse.ArgumentParser:
    """The `tfgen` parser with every subcommand of `SUBCOMMAND_MODULES`."""
    parser = TextArgumentParser(prog="tfgen", description="XLA-compiled generation for TF/Keras language models")
    _add_global_arguments(parser, default=False)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).add_parser(subparsers)
    for subparser in subparsers.choices.values():
        # `tfgen generate ... -q` as well as `tfgen -q generate ...`. Not given after the subcommand, the flag keeps
        # what the main parser read (SUPPRESS: no default written over it). A subcommand that hands its arguments
        # on untouched (`bench`, whose flags start with "-" only for its harness) gets none.
        if "-" in subparser.prefix_chars:
            _add_global_arguments(subparser, default=argparse.SUPPRESS)
    return parser


def _add_global_arguments(parser: argparse.ArgumentParser, default) -> None:
    """The flags every command takes, before or after its name."""
    parser.add_argument(
        "-q", "--quiet", action="store_true", default=default,
        help="show tfgen's warnings and errors only (no compile notice)",
    )


def main(argv=None) -> int:
    """Runs one `tfgen` command; returns its exit status: 2, with one line on stderr, for bad input; 130, with
    "tfgen: interrupted" on stderr and no traceback, for Ctrl-C (a second Ctrl-C ends the process at once, see
    `tfgen.commands.interrupts`)."""
    _usable_stderr()
    try:
        with interrupt_guard() as interrupts:
            return _run(argv, interrupts)
    except KeyboardInterrupt:
        # A command may also answer Ctrl-C itself (batch says how to resume) and return 130.
        print(INTERRUPTED_MESSAGE, file=sys.stderr)
        return INTERRUPTED_STATUS


def _usable_stderr() -> None:
    """Makes a closed stderr (`2>&-`) a sink: Python then sets `sys.stderr` to None (every message would raise), and
    the next file opened would take descriptor 2 (TensorFlow's C++ log lines would land in it). Descriptor 2 is
    pointed at /dev/null instead, so the command does its work and its messages are lost, not fatal."""
    if sys.stderr is not None:
        return
    try:
        os.fstat(2)
    except OSError:  # closed: /dev/null takes its place
        descriptor = os.open(os.devnull, os.O_WRONLY)
        if descriptor != 2:
            os.dup2(descriptor, 2)
            os.close(descriptor)
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    else:  # descriptor 2 already holds another file: leave it alone
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115


def _run(argv, interrupts) -> int:
    try:
        args = build_parser().parse_args(argv)
    # argparse itself exits with status 2 and its usage; a ValueError is the UTF-8 check's (or --seed's).
    except ValueError as error:
        print(f"tfgen: error: {error}", file=sys.stderr)
        return 2
    # A command may say that this run needs no TensorFlow (`tfgen bench --help` is the harness's own help).
    needs_tensorflow = getattr(args, "needs_tensorflow", lambda args: True)(args)
    # And check its flags before TensorFlow is imported (`tfgen.commands.check_before_tensorflow`).
    precheck = getattr(args, "precheck", lambda args: None)
    with _library_messages_on_stderr(logging.WARNING if args.quiet else logging.INFO):
        try:
            precheck(args)
            with _quiet_tensorflow() if needs_tensorflow else contextlib.nullcontext():
                return args.handler(args)
        except (ValueError, TypeError, OSError, SystemError) as error:
            if interrupts.received:
                # TensorFlow turns a KeyboardInterrupt raised inside some of its conversions into a ValueError, and
                # one landing inside CPython's own list code while a program traces into a SystemError.
                raise KeyboardInterrupt from error
            if isinstance(error, SystemError):
                raise
            # Input problems are the user's to fix: one clear line, not a stack trace. Status 2, unless the error
            # says otherwise (1: a model that cannot be fetched or cannot chat, not a malformed argument).
            print(f"tfgen: error: {error}", file=sys.stderr)
            return getattr(error, "exit_status", 2)


@contextlib.contextmanager
def _library_messages_on_stderr(level: int):
    """Shows the records of the "tfgen" loggers at `level` and above on stderr as `tfgen: <message>`, once each."""
    library_logger = logging.getLogger("tfgen")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("tfgen: %(message)s"))
    previous_level = library_logger.level
    library_logger.addHandler(handler)
    library_logger.setLevel(level)
    # A module-level `logging.info` (TensorFlow's SavedModel writer has one) would otherwise give the root logger a
    # handler of its own (`logging.basicConfig`), and every tfgen line after it would be printed twice.
    root_handler = logging.NullHandler() if not logging.root.handlers else None
    if root_handler is not None:
        logging.root.addHandler(root_handler)
    try:
        yield
    finally:
        # main() also runs inside other programs (tests): leave the logger as it was.
        library_logger.removeHandler(handler)
        library_logger.setLevel(previous_level)
        if root_handler is not None:
            logging.root.removeHandler(root_handler)


@contextlib.contextmanager
def _quiet_tensorflow():
    """Imports TensorFlow with its C++ log lines held to `TF_CPP_MIN_LOG_LEVEL` (set to 3 for the whole command unless
    the user set it; the lines printed before TensorFlow reads it are dropped by `tfgen.generation.tf_startup`), and
    hides TensorFlow's Python warnings (such as retracing) at level 2 and above, until the block ends."""
    os.environ.setdefault(tf_startup.LEVEL_VARIABLE, str(tf_startup.QUIET_LEVEL))
    min_level = tf_startup.min_log_level()
    tf_startup.import_tensorflow_quietly(min_level)
    tf_logger = logging.getLogger("tensorflow")
    previous_level = tf_logger.level
    if min_level >= 2:
        tf_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        tf_logger.setLevel(previous_level)


if __name__ == "__main__":
    sys.exit(main())
