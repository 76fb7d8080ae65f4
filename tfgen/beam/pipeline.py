"""`python -m tfgen.beam --input rows.jsonl --output out.jsonl --model M --max-new-tokens N [tfgen batch's generation
flags] [Beam pipeline options]`: `tfgen batch`'s job as a Beam pipeline, writing the rows `tfgen batch` writes, in
input order.

`--model` may also be a tfgen export (`tfgen export`'s folder or a version folder), run through its signatures
(`tfgen.beam.export_job`). Beam's own options (`--runner`, `--project`, `--region`, `--temp_location`,
`--flink_master`, ...) pass through to `PipelineOptions`; without `--runner` the pipeline runs on the DirectRunner, in
this process. The launcher reads the input (JSONL or TFRecord, local or `gs://`, through `tfgen.batch.inputs`) and
refuses unreadable lines and repeated ids at once; the workers check the rest of each row (`TFGenModelHandler`). Beam
does not keep order, so every row carries its input position and the results are written sorted by it (one output
file, gathered on one worker).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys

from tfgen.batch.options import DEFAULT_BATCH_SIZE, DEFAULT_SEED
from tfgen.commands import (
    add_job_arguments,
    add_sampling_arguments,
    add_seed_argument,
    add_structured_arguments,
    sampling_options,
    structured_options,
)

#: The runner when the command line names none: Beam's local runner, in this process (no service, no download).
DEFAULT_RUNNER = "DirectRunner"


def build_parser() -> argparse.ArgumentParser:
    """The pipeline's own flags (those of `tfgen batch` that a Beam job can honour); Beam's options are the rest."""
    parser = argparse.ArgumentParser(
        prog="python -m tfgen.beam",
        # No abbreviations: an option meant for Beam must never be taken for a prefix of one of ours.
        allow_abbrev=False,
        description="tfgen batch's job on Apache Beam: JSONL/TFRecord rows in, tfgen batch's JSONL rows out (input "
        "order). Other options are Beam's pipeline options (--runner DataflowRunner --project ... --region ... "
        "--temp_location gs://..., --runner FlinkRunner --flink_master ..., --runner SparkRunner ...); default: "
        f"--runner {DEFAULT_RUNNER}, in this process.",
    )
    add_job_arguments(parser, "results JSONL, one file (local path or gs://)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="rows per compiled call")
    parser.add_argument("--min-batch-size", type=int, help="Beam's smallest batch (default: --batch-size)")
    parser.add_argument("--max-batch-size", type=int, help="Beam's largest batch, sorted by length together "
                        "(default: 64 x --batch-size)")
    parser.add_argument("--share-model", action="store_true", help="one model per machine, not per process")
    add_seed_argument(parser, default=list(DEFAULT_SEED), help_text="job seed: two integers")
    parser.add_argument("--max-new-tokens", type=int, required=True, help="tokens per row at most")
    add_sampling_arguments(parser)
    parser.add_argument("--raw", action="store_true", help="continue 'prompt' rows as plain text even when the model "
                        "has a chat template")
    parser.add_argument("--chat-template-kwargs", metavar="JSON", help="extra variables for the chat template")
    parser.add_argument("--stop-string", action="append", dest="stop_strings", metavar="TEXT",
                        help="a row stops once its text ends with TEXT (repeatable)")
    add_structured_arguments(parser, "every row's text")
    return parser


def read_rows(path: str, input_format: str) -> list:
    """The input's rows (dicts, as `tfgen batch` parses them) in order; raises ValueError naming every unreadable
    line or record and every repeated id (what the workers, seeing one batch each, cannot tell)."""
    from tfgen.batch.inputs import input_records
    from tfgen.batch.rows import BadRow, Unreadable, bad_rows_message, id_key, record_byte_limit

    records, unit = input_records(path, input_format, record_byte_limit(None))
    rows, bad, first_seen = [], [], {}
    for number, record in records:
        if isinstance(record, Unreadable):
            bad.append(BadRow(number, None, record.reason, unit))
            continue
        row_id = record.get("id") if isinstance(record, dict) else None
        if isinstance(row_id, (int, str)) and not isinstance(row_id, bool):
            key = id_key(row_id)
            if key in first_seen:
                bad.append(BadRow(number, row_id, f"duplicate id {row_id!r} (first on {unit} {first_seen[key]})",
                                  unit))
                continue
            first_seen[key] = number
        rows.append(record)
    if bad:
        raise ValueError(bad_rows_message(bad, f"input {path}"))
    return rows


def _line(keyed) -> tuple[int, str]:
    """(input position, the output line) of a keyed `PredictionResult`."""
    position, result = keyed
    return position, json.dumps(result.inference, ensure_ascii=False)


def _in_order(lines: list) -> list[str]:
    return [line for _, line in sorted(lines)]


def build_pipeline(pipeline, rows: list, handler, output: str):
    """Adds the job to `pipeline` (a `beam.Pipeline`): `rows` → RunInference(`handler`, keyed by input position) →
    one JSONL file `output` in input order. Returns the write's result."""
    import apache_beam as beam
    from apache_beam.ml.inference.base import KeyedModelHandler, RunInference

    return (
        pipeline
        | "Rows" >> beam.Create(list(enumerate(rows)))
        | "Generate" >> RunInference(KeyedModelHandler(handler))
        | "Lines" >> beam.Map(_line)
        | "Gather" >> beam.combiners.ToList()
        | "InInputOrder" >> beam.FlatMap(_in_order)
        | "Write" >> beam.io.WriteToText(output, num_shards=1, shard_name_template="")
    )


def main(argv=None) -> int:
    """Runs the pipeline; returns 0, or 2 with one line on stderr for bad input (an option, the model, a row)."""
    args, beam_args = build_parser().parse_known_args(argv)
    try:
        return _run(args, beam_args)
    except (ValueError, TypeError, OSError) as error:
        print(f"tfgen.beam: error: {error}", file=sys.stderr)
        return 2


def _run(args, beam_args: list[str]) -> int:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from tfgen.batch.chatrows import parse_template_kwargs
    from tfgen.beam.handler import TFGenModelHandler

    options = {**sampling_options(args), **structured_options(args)}
    if args.stop_strings is not None:
        options["stop_strings"] = args.stop_strings
    template_kwargs = None if args.chat_template_kwargs is None else parse_template_kwargs(args.chat_template_kwargs)
    handler = TFGenModelHandler(
        args.model if args.model is not None else _default_model(), tokenizer=args.tokenizer, quantize=args.quantize,
        batch_size=args.batch_size, seed=args.seed, raw=args.raw, chat_template_kwargs=template_kwargs,
        min_batch_size=args.min_batch_size, max_batch_size=args.max_batch_size,
        share_model_across_processes=args.share_model, **options,
    )
    rows = read_rows(args.input, args.input_format)
    if not any(arg == "--runner" or arg.startswith("--runner=") for arg in beam_args):
        beam_args = [f"--runner={DEFAULT_RUNNER}", *beam_args]
    options = PipelineOptions(beam_args)
    # On the DirectRunner a failing row's error comes back here and is printed as one line: Beam's log of the same
    # error with its traceback (a worker's log elsewhere) would repeat it.
    local = options.get_all_options().get("runner") in (DEFAULT_RUNNER, None)
    with _quiet_logger("apache_beam.runners.common", local), beam.Pipeline(options=options) as pipeline:
        build_pipeline(pipeline, rows, handler, args.output)
    logging.getLogger(__name__).info("%d rows in %s", len(rows), args.output)
    return 0


@contextlib.contextmanager
def _quiet_logger(name: str, quiet: bool):
    """Holds logger `name` to CRITICAL inside the block when `quiet`."""
    logger = logging.getLogger(name)
    level = logger.level
    if quiet:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _default_model() -> str:
    from tfgen.hub.default_model import default_model_path

    return default_model_path()
