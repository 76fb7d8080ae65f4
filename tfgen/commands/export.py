"""`tfgen export --model PATH_OR_ID OUT_DIR`: write a TF Serving SavedModel with generate() in the graph."""

from __future__ import annotations

import sys


def add_parser(subparsers) -> None:
    from tfgen.export import SIGNATURES

    parser = subparsers.add_parser(
        "export",
        help="export generate() as a TF Serving SavedModel (OUT_DIR/<version>/)",
        description="Writes OUT_DIR/<version>/ with the signatures "
        + ", ".join(SIGNATURES)
        + " (generate_text when the model folder has a byte-level BPE tokenizer). See docs/serving.md.",
    )
    parser.add_argument("out_dir", metavar="OUT_DIR", help="model base folder (TF Serving's --model_base_path)")
    parser.add_argument("--model", required=True, help="local model directory or hub id (HF layout)")
    parser.add_argument("--max-new-tokens", type=int, help="token buffer of every signature (default: config, else 20)")
    parser.add_argument("--version", type=int, default=1, help="version folder to write (default 1; must not exist)")
    parser.add_argument("--no-jit", action="store_true", help="plain TF graph: runs on TF Serving without XLA")
    parser.add_argument(
        "--signatures", type=lambda names: names.split(","), metavar="NAMES",
        help=f"comma-separated subset of {','.join(SIGNATURES)} (default: all)",
    )
    parser.add_argument("--no-text", action="store_true", help="skip generate_text even when a tokenizer is present")
    parser.add_argument("--num-beams", type=int, help="beams of the beam_search signature (default: config, else 4)")
    parser.add_argument("--contrastive-top-k", type=int,
                        help="candidates per step of the contrastive signature (default: config, else 4)")
    parser.set_defaults(handler=run)


def run(args) -> int:
    import os

    from tfgen.export import export_saved_model
    from tfgen.models.auto import AutoModelForCausalLM
    from tfgen.tokenizer import Tokenizer

    model = AutoModelForCausalLM.from_pretrained(args.model)
    wants_text = not args.no_text and (args.signatures is None or "generate_text" in args.signatures)
    tokenizer = None
    if wants_text:
        try:
            tokenizer = Tokenizer.from_pretrained(args.model)
        except OSError:
            if args.signatures is not None:
                raise
            print("tfgen export: no tokenizer.json next to the model, so no generate_text signature",
                  file=sys.stderr)
    try:
        version_dir = export_saved_model(
            model,
            args.out_dir,
            max_new_tokens=args.max_new_tokens,
            version=args.version,
            jit_compile=not args.no_jit,
            signatures=args.signatures,
            tokenizer=tokenizer,
            num_beams=args.num_beams,
            contrastive_top_k=args.contrastive_top_k,
        )
    except ImportError as error:
        raise ValueError(f"{error} (or pass --no-text)") from None
    print(os.path.abspath(version_dir))
    return 0
