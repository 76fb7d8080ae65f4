"""`tfgen export [--model PATH_OR_ID_OR_NAME] OUT_DIR`: write a TF Serving SavedModel with generate() in the graph (of
the shipped model unless --model names another)."""

from __future__ import annotations

import logging
import os

from tfgen.commands import add_model_argument, add_structured_arguments, check_option_flag, structured_options

logger = logging.getLogger(__name__)

# Caps of the export's static sizes (`check_export_arguments`). Beams and contrastive candidates multiply every
# request's rows and KV cache; published beam searches use at most a few dozen.
MAX_BEAMS = 1024
MAX_NEW_TOKENS = 2**31 - 1  # programs hold token counts as int32
MAX_VERSION = 2**63 - 1  # TF Serving reads version folders as int64


def add_parser(subparsers) -> None:
    from tfgen.export import SIGNATURES

    parser = subparsers.add_parser(
        "export",
        help="export generate() as a TF Serving SavedModel (OUT_DIR/<version>/)",
        description="Writes OUT_DIR/<version>/ with the signatures "
        + ", ".join(SIGNATURES)
        + " (generate_text when the model's tokenizer has an exact in-graph form: byte-level BPE as GPT-2, SmolLM2, "
        "Llama 3, Qwen2; SentencePiece BPE as Llama 2; else it is left out, saying why). See docs/serving.md.",
    )
    parser.add_argument("out_dir", metavar="OUT_DIR", help="model base folder (TF Serving's --model_base_path)")
    add_model_argument(parser)
    parser.add_argument("--max-new-tokens", type=int, help="token buffer of every signature (default: the model "
                        "config's, else 1024 within the context, leaving room for a 256-token prompt)")
    parser.add_argument("--version", type=int, default=1, help="version folder to write (default 1; must not exist)")
    parser.add_argument("--no-jit", action="store_true", help="plain TF graph: runs on TF Serving without XLA")
    parser.add_argument(
        "--signatures", type=lambda names: names.split(","), metavar="NAMES",
        help=f"comma-separated subset of {','.join(SIGNATURES)} (default: all)",
    )
    parser.add_argument("--leave-out", type=lambda names: names.split(","), metavar="NAMES",
                        help="comma-separated signatures to leave out of the default ones (instead of --signatures)")
    parser.add_argument("--no-text", action="store_true", help="skip generate_text even when a tokenizer is "
                        "present (its files and chat template are still written to assets.extra/tokenizer/)")
    parser.add_argument("--num-beams", type=int,
                        help=f"beams of the beam_search signature, 2..{MAX_BEAMS} (default: config, else 4)")
    parser.add_argument("--contrastive-top-k", type=int,
                        help=f"candidates per step of the contrastive signature, 2..{MAX_BEAMS} (default: config, "
                        "else 4)")
    parser.add_argument("--prompt-lookup", type=int, metavar="N", dest="prompt_lookup_num_tokens",
                        help="draft tokens per round of the prompt_lookup signature (default: config, else 10)")
    parser.add_argument("--max-matching-ngram-size", type=int, metavar="M",
                        help="longest n-gram the prompt_lookup signature looks up (default: config, else 2)")
    parser.add_argument("--stop-string", action="append", dest="stop_strings", metavar="TEXT",
                        help="end a row once its text ends with TEXT, in every signature (repeatable; needs the "
                        "model's tokenizer)")
    parser.add_argument("--slots", type=int,
                        help="decode rows of the continuous-batching signatures slot_init / slot_insert / slot_steps, "
                        "which `tfgen serve` batches requests through (default 8 with XLA on a model with a per-row "
                        "cache slot; 0: none)")
    parser.add_argument("--slot-length", type=int,
                        help="buffer columns of a slot: a request's prompt plus its new tokens (default: "
                        "--max-new-tokens + 256, within the model's positions)")
    parser.add_argument("--slot-logprobs", type=int, metavar="K",
                        help="most likely tokens whose log-probabilities the slot signatures record per new token, "
                        "which `tfgen serve` answers OpenAI's logprobs / top_logprobs from (default 20, OpenAI's "
                        "limit; a step pays the top-K over the vocabulary only when a request asked for them; 0: none)")
    add_structured_arguments(parser, "every signature's output (the automaton is baked in; prompt_lookup and the "
                             "slot signatures are left out)")
    parser.add_argument("--structured-inputs", type=_table_sizes, metavar="STATES,CLASSES",
                        help="add the `structured` signature, whose requests carry a regex's token automaton as "
                        "tables of these sizes (one program for every pattern that fits)")
    parser.set_defaults(handler=run)


# Beyond these, a slot program's state would not fit this machine's memory for any model worth serving.
MAX_SLOTS = 1024
MAX_SLOT_LENGTH = 1 << 20
MAX_SLOT_LOGPROBS = 1024  # beyond what any client asks for (OpenAI's limit is 20)


def _table_sizes(text: str) -> tuple[int, int]:
    import argparse

    from tfgen.export.structured_inputs import MAX_TABLE_ENTRIES, check_structured_inputs

    try:
        return check_structured_inputs(text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected STATES,CLASSES: two integers >= 2 (a table of at most "
                                         f"{MAX_TABLE_ENTRIES} entries), got {text!r}") from None


def run(args) -> int:
    check_export_arguments(args)
    structured = structured_options(args)
    version_dir = export_model(
        args.model,
        args.out_dir,
        quantize=args.quantize,
        max_new_tokens=args.max_new_tokens,
        version=args.version,
        jit_compile=not args.no_jit,
        signatures=args.signatures,
        leave_out=args.leave_out or (),
        text=not args.no_text,
        num_beams=args.num_beams,
        contrastive_top_k=args.contrastive_top_k,
        prompt_lookup_num_tokens=args.prompt_lookup_num_tokens,
        max_matching_ngram_size=args.max_matching_ngram_size,
        stop_strings=args.stop_strings,
        slots=args.slots,
        slot_length=args.slot_length,
        slot_logprobs=args.slot_logprobs,
        structured_inputs=args.structured_inputs,
        **structured,
    )
    print(os.path.abspath(version_dir))
    return 0


def check_export_arguments(args) -> None:
    """Range checks of the numbers that shape every exported program, before the model is even loaded: an export
    with a million beams would be written, but every call of it would fail."""
    for option, value, low, high in (
        ("--num-beams", args.num_beams, 2, MAX_BEAMS),
        ("--contrastive-top-k", args.contrastive_top_k, 2, MAX_BEAMS),
        ("--max-new-tokens", args.max_new_tokens, 1, MAX_NEW_TOKENS),
        ("--version", args.version, 0, MAX_VERSION),
        ("--slots", args.slots, 0, MAX_SLOTS),
        ("--slot-length", args.slot_length, 2, MAX_SLOT_LENGTH),
        ("--slot-logprobs", args.slot_logprobs, 0, MAX_SLOT_LOGPROBS),
    ):
        if value is not None and not low <= value <= high:
            raise ValueError(f"{option} must be in {low}..{high}, got {value}")
    for flag, name in (("--prompt-lookup", "prompt_lookup_num_tokens"),
                       ("--max-matching-ngram-size", "max_matching_ngram_size")):
        if getattr(args, name) is not None:
            check_option_flag(flag, name, getattr(args, name))


def export_model(
    model_path: str | None, out_dir: str, *, signatures=None, leave_out=(), text: bool = True, stop_strings=None,
    quantize=None, **options
) -> str:
    """Exports the model at `model_path` (None: the shipped model), loaded with `quantize` (None or "int8": the
    export then stores int8 variables and their scales), to `out_dir/<version>/` with `export_saved_model`
    and its `options`, adding generate_text when `text` is true, `signatures` allows it and a tokenizer sits next
    to the model; `stop_strings` (which need that tokenizer) end rows in every signature. Without `signatures`,
    the default ones but those in `leave_out`. Returns the version folder."""
    from tfgen.auto.models import load_generation_model
    from tfgen.auto.tokenizer import AutoTokenizer
    from tfgen.config.budget import export_budget
    from tfgen.export import SIGNATURES, export_saved_model
    from tfgen.gguf import is_gguf_path
    from tfgen.hub.pull import resolve_model_argument
    from tfgen.models.loading import resolve_model_directory

    if signatures is not None and leave_out:
        raise ValueError("signatures and leave_out (--signatures, --leave-out): give one, the signatures to export "
                         "or those to leave out of the default ones")
    unknown = [name for name in leave_out if name not in SIGNATURES]
    if unknown:
        raise ValueError(f"leave_out: unknown signature {unknown[0]!r}; the signatures are {', '.join(SIGNATURES)}")
    if set(SIGNATURES) <= set(leave_out):
        raise ValueError("leave_out: names every signature, leaving none to export")
    model_path = resolve_model_argument(model_path)
    # A GGUF file holds its tokenizer; a directory may lack one.
    source = model_path if is_gguf_path(model_path) else resolve_model_directory(model_path)
    model = load_generation_model(source, **({} if quantize is None else {"quantize": quantize}))
    if options.get("max_new_tokens") is None:
        # The command's buffer runs answers to eos (the library's export_saved_model keeps HF's 20).
        options["max_new_tokens"] = export_budget(model.generation_config,
                                                  getattr(model.config, "max_position_embeddings", None))
    has_tokenizer = is_gguf_path(model_path) or (source / "tokenizer.json").is_file()
    tokenizer = None
    constrained = options.get("regex") is not None or options.get("json_schema") is not None
    if stop_strings or constrained or (text and (signatures is None or "generate_text" in signatures)):
        # Only a missing tokenizer.json is a reason to skip generate_text; a malformed one is an error.
        if has_tokenizer or signatures is not None or stop_strings or constrained:
            tokenizer = AutoTokenizer.from_pretrained(source)
        else:
            logger.warning("no tokenizer.json next to the model, so no generate_text signature")
    if tokenizer is None and has_tokenizer:
        # Without generate_text too: the export carries the tokenizer and chat template (assets.extra/tokenizer/).
        tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer is not None and text and signatures is None:
        problem = tokenizer.in_graph_problem()
        if problem is not None:  # asked for by name (--signatures), the export refuses it instead
            logger.warning("no generate_text signature (text_tokenize / text_detokenize neither): %s", problem)
            text = False
    if signatures is None and leave_out:
        from tfgen.export.saved_model import default_signatures

        signatures = [name for name in default_signatures(model, tokenizer is not None and text)
                      if name not in leave_out]
        if not signatures:
            raise ValueError(f"leave_out: {', '.join(leave_out)} leaves none of the signatures this model can "
                             "have")
    if stop_strings:
        options["stop_strings"] = stop_strings
    try:
        return export_saved_model(model, out_dir, signatures=signatures, tokenizer=tokenizer, text=text, **options)
    except ImportError as error:
        raise ValueError(f"{error} (or pass --no-text)") from None
