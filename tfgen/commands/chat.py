"""`tfgen chat [--model M]`: an interactive multi-turn chat over the model's chat template, the model and its
compiled programs loaded once for the whole session.

Each turn renders the whole conversation (`tfgen.text.conversation.Conversation`) with the template and runs
`generate()` on it, streaming the answer. The compiled programs are static in shape, so a turn reuses one when its
rendered conversation falls in the same prompt-length bucket: the chat rounds prompt lengths up to multiples of
`CHAT_PROMPT_STEP` (instead of generate's 16), so a conversation compiles a new program once every
`CHAT_PROMPT_STEP` tokens, not at almost every turn, at the price of up to that many masked columns in the prefill.
A turn does not reuse the previous turns' KV cache: it prefills the whole conversation again (future work: keeping
the cache between turns needs a program that continues a cache, which the static-shape programs do not offer yet).

Input: one turn per line; a line starting with "/" is a command (`COMMANDS`); end of input (Ctrl-D, or the end of a
pipe) ends the chat. At a terminal the prompt is ">>> "; with stdin not a terminal nothing but the answers goes to
stdout (one line each, as streamed), and the command's own lines go to stderr. Ctrl-C during an answer stops it: what
was streamed stays in the conversation as the assistant's answer (the model sees what you saw; nothing streamed: the
turn is dropped). Ctrl-C at the prompt, or twice during an answer, ends the chat.
"""

from __future__ import annotations

import contextlib
import logging
import sys

from tfgen.commands import (
    add_model_argument,
    add_sampling_arguments,
    add_seed_argument,
    check_option_flag,
    model_options,
    sampling_options,
)

logger = logging.getLogger(__name__)

#: Prompt lengths round up to multiples of this (the compiled programs' prompt-length bucket). A turn pair of a small
#: chat model is ~100-200 tokens: at 128 a three-turn SmolLM2 chat compiled twice, at 256 once; the padding costs a
#: prefill of at most 255 masked columns and ~1% of a decoding step's reads (the cache is prompt + 1,024 columns).
CHAT_PROMPT_STEP = 256

COMMANDS = {
    "/reset": "forget the conversation (the system message stays)",
    "/system TEXT": "set the system message (no TEXT: remove it); the turns so far stay",
    "/save FILE": 'write the conversation to FILE as JSON ({"messages": [...]})',
    "/help": "this list",
    "/exit": "leave (as Ctrl-D, or Ctrl-C at the prompt)",
}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("chat", help="talk with a chat model, turn by turn (the model stays loaded)")
    add_model_argument(parser)
    parser.add_argument("--system", metavar="TEXT", help="the system message (also /system TEXT in the chat)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="tokens per answer at most (default: the "
                        "model's config, else to the end of the answer within a generous budget)")
    add_sampling_arguments(parser)
    add_seed_argument(parser, help_text="sampling seed (every turn's): two integers")
    parser.add_argument("--stop-string", action="append", dest="stop_strings", metavar="TEXT",
                        help="end an answer once its text ends with TEXT (repeatable)")
    parser.add_argument("--verbose", action="store_true", help="after each answer, a line of timings on stderr: "
                        "load (first answer), compile, prompt and generation (tokens/s)")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from tfgen.auto.models import load_generation_model
    from tfgen.auto.tokenizer import AutoTokenizer
    from tfgen.commands.timings import Timings
    from tfgen.config.generation_config import SAMPLING_ONLY_NEUTRAL
    from tfgen.hub.pull import resolve_model_argument
    from tfgen.request.buckets import BucketPolicy
    from tfgen.text.chat_template import MissingChatTemplateError
    from tfgen.text.conversation import Conversation

    options = sampling_options(args)
    for name, value in options.items():  # bad values are one line before the model loads
        check_option_flag("--" + name.replace("_", "-"), name, value)
    model_path = resolve_model_argument(args.model)
    timings = Timings()
    with timings.loading():
        tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.chat_template is None:
        raise MissingChatTemplateError(
            f"tfgen chat needs a chat template, and the model {model_path!r} has none (no chat_template.jinja, no "
            "chat_template in tokenizer_config.json); `tfgen generate` continues plain text"
        )
    with timings.loading():
        model = load_generation_model(model_path, **model_options(args))
    model.generation_buckets = BucketPolicy(length_step=CHAT_PROMPT_STEP)
    options.pop("max_new_tokens", None)  # per turn: answer_length
    if args.stop_strings:
        options["stop_strings"] = args.stop_strings
    if args.do_sample is False:
        # --greedy overrides a sampling config, as in `tfgen generate`.
        options = {**SAMPLING_ONLY_NEUTRAL, **options}
    session = ChatSession(model, tokenizer, Conversation(args.system), args, options,
                          timings=timings if args.verbose else None)
    return session.run_lines()


class ChatSession:
    """The loop of `tfgen chat`: reads a line, runs a command or answers a turn, until the input ends."""

    def __init__(self, model, tokenizer, conversation, args, options: dict, timings=None):
        self.model = model
        self.timings = timings  # --verbose: a Timings whose line follows each answer (the load on the first only)
        self.tokenizer = tokenizer
        self.conversation = conversation
        self.args = args
        self.options = options
        self.interactive = sys.stdin.isatty()
        self.max_positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)

    def run_lines(self) -> int:
        """Reads and handles lines until end of input, `/exit` or Ctrl-C at the prompt; returns the exit status."""
        if self.interactive:
            _line_editing()
            _say("chatting with the model; /help lists the commands, Ctrl-D leaves")
        while True:
            try:
                line = self._read_line()
            except (EOFError, KeyboardInterrupt):
                if self.interactive:
                    print(file=sys.stderr)
                return 0
            line = line.strip()
            if not line:
                continue
            if line.startswith("/"):
                if not self.command(line):
                    return 0
                continue
            self.answer(line)

    def _read_line(self) -> str:
        if self.interactive:
            return input(">>> ")
        line = sys.stdin.readline()
        if not line:
            raise EOFError
        return line

    def command(self, line: str) -> bool:
        """Runs one "/command" line; False when it ends the chat."""
        name, _, rest = line.partition(" ")
        rest = rest.strip()
        if name in ("/exit", "/quit", "/bye"):
            return False
        if name == "/reset":
            self.conversation.reset()
            _say("the conversation is reset")
        elif name == "/system":
            self.conversation.system = rest or None
            _say("system message set" if rest else "system message removed")
        elif name == "/save":
            if not rest:
                _say("/save needs a file name: /save FILE")
            else:
                try:
                    self.conversation.save(rest)
                except OSError as error:
                    _say(f"/save: {error}")
                else:
                    _say(f"saved the conversation to {rest}")
        elif name == "/help":
            _say("\n".join(f"  {usage:<14} {meaning}" for usage, meaning in COMMANDS.items()), prefix="")
        else:
            _say(f"unknown command {name}; /help lists the commands")
        return True

    def answer(self, text: str) -> None:
        """Answers the user's message `text` (streamed to stdout) and adds the turn to the conversation. A
        conversation that no longer fits the context, or an error of the turn, is one line on stderr and the turn is
        dropped; Ctrl-C stops the answer and keeps what was streamed."""
        from tfgen.commands.interrupts import interrupt_handled, interrupt_pending
        from tfgen.generation.streaming import TextStreamer

        transcript = _Transcript()
        try:
            ids = self.conversation.prompt_ids(self.tokenizer, text)
            budget = self._budget(len(ids))
            if budget is False:
                return
            streamer = TextStreamer(self.tokenizer, skip_prompt=True, stream=transcript)
            timed = self.timings.generating(self.model, len(ids)) if self.timings else contextlib.nullcontext()
            with timed:
                sequences = self.model.generate(
                    [ids], seed=self.args.seed, tokenizer=self.tokenizer,
                    streamer=self.timings.streamer(streamer) if self.timings else streamer,
                    **self.options, **({} if budget is None else {"max_new_tokens": budget}),
                )
        except KeyboardInterrupt:
            self._stopped(text, transcript.text)
            interrupt_handled()
            return
        except (ValueError, TypeError) as error:
            if interrupt_pending():  # a library turned the KeyboardInterrupt into an error
                self._stopped(text, transcript.text)
                interrupt_handled()
                return
            _say(f"error: {error}")
            return
        self._finish(text, sequences[0].numpy()[len(ids):])

    def _budget(self, prompt_length: int):
        """The turn's `max_new_tokens` (None: the model's config sets it), or False, with one line said, when the
        conversation leaves no room for an answer."""
        from tfgen.commands.answers import answer_length

        asked = self.args.max_new_tokens
        budget = answer_length(self.model, asked, prompt_length)
        room = None if self.max_positions is None else self.max_positions - prompt_length
        if room is not None and (room < 1 or (asked is not None and asked > room)):
            needs = "" if asked is None else f" and --max-new-tokens {asked}"
            _say(f"the conversation ({prompt_length} tokens{needs}) no longer fits the model's context of "
                 f"{self.max_positions} positions; /reset to start again (or a shorter message)")
            return False
        return budget

    def _finish(self, text: str, new_tokens) -> None:
        """Adds a finished turn to the conversation and says, on stderr, when the budget cut it or it is empty."""
        from tfgen.commands.answers import report_answer

        self.conversation.add_turn(text, self.tokenizer.decode(new_tokens, skip_special_tokens=True))
        report_answer(self.model, self.tokenizer, new_tokens, budget_was_default=self.args.max_new_tokens is None,
                      stop_strings=self.args.stop_strings, raw_on_chat_model=False)
        if self.timings is not None:
            self.timings.report()
            self.timings.restart()  # the next answer's line: its own call, no load

    def _stopped(self, text: str, streamed: str) -> None:
        """After Ctrl-C during an answer: keeps what was streamed as the answer (nothing: the turn is dropped)."""
        if streamed:
            self.conversation.add_turn(text, streamed)
        _say("answer stopped (Ctrl-C); " + ("what was shown stays in the conversation" if streamed else
                                           "the message is dropped"))


class _Transcript:
    """The stream a `TextStreamer` writes the answer to: stdout, keeping what it wrote (`text`, without the newline
    the streamer ends with)."""

    def __init__(self):
        self.written = ""

    def write(self, text: str) -> None:
        self.written += text
        sys.stdout.write(text)

    def flush(self) -> None:
        sys.stdout.flush()

    @property
    def text(self) -> str:
        return self.written.removesuffix("\n")


def _say(message: str, prefix: str = "tfgen: ") -> None:
    """One of the chat's own lines, on stderr (stdout carries only the answers)."""
    print(prefix + message, file=sys.stderr, flush=True)


def _line_editing() -> None:
    """At a terminal, `input()` gets line editing and history when Python has `readline`."""
    try:
        import readline  # noqa: F401 (imported for its effect on input())
    except ImportError:
        pass
