"""`tfgen generate --model PATH_OR_ID_OR_NAME "prompt"`: on a model with a chat template, answer the prompt as a user
message in that template and print the answer only (ollama's and llama-cli's behaviour; `--raw` continues the prompt as
plain text instead); on a model without one, continue the prompt and print the text. Without `--max-new-tokens` the
answer runs to the end of its turn within `tfgen.config.budget`'s budget, and a cut answer says so on stderr."""

from __future__ import annotations

from tfgen.commands import (
    add_model_argument,
    add_sampling_arguments,
    add_seed_argument,
    add_structured_arguments,
    check_option_flag,
    check_prompt_length,
    model_options,
    sampling_options,
    structured_options,
)

# Speculative decoding (assisted generation): flag -> (generation option, the flag it needs).
DRAFTING_FLAGS = {
    "--prompt-lookup": ("prompt_lookup_num_tokens", None),
    "--max-matching-ngram-size": ("max_matching_ngram_size", "--prompt-lookup"),
    "--assistant-early-exit": ("assistant_early_exit", None),
    "--num-assistant-tokens": ("num_assistant_tokens", "--assistant-early-exit"),
}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("generate", help="continue a prompt with a model")
    parser.add_argument("prompt", help="the user's message to a model with a chat template, else (or with --raw) "
                        "the text to continue (empty: start from the model's bos token)")
    add_model_argument(parser)
    template = parser.add_mutually_exclusive_group()
    template.add_argument("--chat", action="store_true", help="render the prompt as a user message with the model's "
                          "chat template (and the assistant's turn opened), print only the answer: the default on a "
                          "model with a chat template; an error on one without")
    template.add_argument("--raw", action="store_true", help="continue the prompt as plain text, without the model's "
                          "chat template")
    parser.add_argument("--system", metavar="TEXT", help="a system message before the user's (chat template only)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="tokens to generate (default: the model's "
                        "config, else to the end of the answer within a generous budget, tfgen.config.budget)")
    add_sampling_arguments(parser)
    add_seed_argument(parser)
    parser.add_argument("--stop-string", action="append", dest="stop_strings", metavar="TEXT",
                        help="stop once the text ends with TEXT (repeatable)")
    parser.add_argument("--max-time", type=float, metavar="SECONDS", help="stop after SECONDS, compiling included")
    add_structured_arguments(parser, "the generated text")
    drafting = parser.add_argument_group(
        "speculative decoding", "draft tokens cheaply and verify them with the model in one call: greedy search "
        "writes the same text (sampling with --prompt-lookup too, for the same seed) in fewer model calls when drafts "
        "are accepted"
    )
    drafting.add_argument("--prompt-lookup", type=int, metavar="N", dest="prompt_lookup_num_tokens",
                          help="draft N tokens per round by finding the text's last n-gram earlier in the text")
    drafting.add_argument("--max-matching-ngram-size", type=int, metavar="M",
                          help="with --prompt-lookup: the longest n-gram looked up (default: config, else 2)")
    drafting.add_argument("--assistant-early-exit", type=int, metavar="L",
                          help="draft with the model's first L layers (models that can exit early)")
    drafting.add_argument("--num-assistant-tokens", type=int, metavar="K",
                          help="with --assistant-early-exit: tokens drafted per round (default: config, else 20)")
    parser.add_argument("--no-jit", action="store_true", help="run the loop eagerly (debugging)")
    parser.add_argument("--verbose", action="store_true", help="end with a line of timings on stderr: load, compile, "
                        "prompt and generation (tokens/s)")
    parser.add_argument(
        "--no-stream", dest="stream", action="store_false", help="print the text at the end instead of token by token"
    )
    parser.set_defaults(handler=run)


def run(args) -> int:
    from tfgen.auto.models import load_generation_model
    from tfgen.auto.tokenizer import AutoTokenizer
    from tfgen.commands.answers import answer_length, applies_chat_template, check_template_flags, report_answer
    from tfgen.commands.timings import Timings
    from tfgen.config.generation_config import SAMPLING_ONLY_NEUTRAL
    from tfgen.decoding.model_protocol import capabilities
    from tfgen.generation.streaming import TextStreamer
    from tfgen.hub.pull import resolve_model_argument

    check_template_flags(args.chat, args.raw, args.system)
    drafting = drafting_options(args)
    structured = structured_options(args)
    timings = Timings()
    model_path = resolve_model_argument(args.model)
    with timings.loading():
        tokenizer = AutoTokenizer.from_pretrained(model_path)
    # Before the model loads, so that a model that cannot chat is refused at once. An empty plain prompt encodes to
    # ids and mask of shape [1, 0]: generate() starts it from the model's bos token (and refuses it, naming
    # bos_token_id, when the model has none).
    chat = applies_chat_template(tokenizer, args.chat, args.raw, args.system, model_path)
    encoded = _chat_prompt(tokenizer, args) if chat else tokenizer(args.prompt, return_tensors="np")
    check_prompt_length(encoded, tokenizer)
    prompt_length = encoded["input_ids"].shape[1]
    with timings.loading():
        model = load_generation_model(model_path, **model_options(args))
    options = {
        **sampling_options(args),
        "max_new_tokens": answer_length(model, args.max_new_tokens, prompt_length),
        "stop_strings": args.stop_strings,
        "max_time": args.max_time,
        **drafting,
        **structured,
    }
    options = {name: value for name, value in options.items() if value is not None}
    if args.do_sample is False:
        # --greedy overrides a sampling config: its warpers go back to their neutral values (options the user
        # gave on the command line stay, and generate() warns about them as it should).
        options = {**SAMPLING_ONLY_NEUTRAL, **options}
    streamer = TextStreamer(tokenizer, skip_prompt=chat) if args.stream else None
    with timings.generating(model, prompt_length):
        sequences = model.generate(
            encoded["input_ids"],
            attention_mask=encoded["attention_mask"],
            seed=args.seed,
            jit_compile=not args.no_jit,
            streamer=timings.streamer(streamer) if args.verbose else streamer,
            tokenizer=tokenizer,
            **options,
        )
    row = sequences[0].numpy()
    if streamer is None:
        # A chat prints the answer: the tokens after the rendered conversation.
        print(tokenizer.decode(row[prompt_length if chat else 0 :], skip_special_tokens=True))
    # The new tokens follow the prompt; an encoder-decoder model's sequences are its decoder's, after its start token.
    new_from = 1 if capabilities(model).encoder_decoder else prompt_length
    report_answer(model, tokenizer, row[new_from:], budget_was_default=args.max_new_tokens is None,
                  stop_strings=args.stop_strings, raw_on_chat_model=args.raw and tokenizer.chat_template is not None)
    if args.verbose:
        if streamer is None:
            timings.count_answer(row[new_from:], model.generation_config.eos_token_ids())
        timings.report()
    return 0


def _chat_prompt(tokenizer, args) -> dict:
    """`input_ids` and `attention_mask` [1, T] of the conversation (the optional system message, the prompt as the
    user's), rendered with the assistant's turn opened."""
    system = [] if args.system is None else [{"role": "system", "content": args.system}]
    messages = system + [{"role": "user", "content": args.prompt}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="np", return_dict=True)


def drafting_options(args) -> dict:
    """The assisted-generation options of the drafting flags given, checked before the model loads: ValueError
    naming the flag for a value out of range, a flag without the one it needs, or two drafters."""
    if args.prompt_lookup_num_tokens is not None and args.assistant_early_exit is not None:
        raise ValueError("--prompt-lookup / --assistant-early-exit: choose one drafter")
    options = {}
    for flag, (name, needs) in DRAFTING_FLAGS.items():
        value = getattr(args, name)
        if value is None:
            continue
        if needs is not None and getattr(args, DRAFTING_FLAGS[needs][0]) is None:
            raise ValueError(f"{flag} needs {needs} (it sizes that drafter)")
        check_option_flag(flag, name, value)
        options[name] = value
    return options
