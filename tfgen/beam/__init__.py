"""Apache Beam: tfgen generation inside RunInference pipelines (the `beam` extra, `pip install tfgen[beam]`).

`handler.TFGenModelHandler` is a `ModelHandler` whose elements are `tfgen batch` rows and whose results are the rows
`tfgen batch` writes, generated in-process (`handler.BeamJob`) or through a tfgen export's signatures
(`export_job.ExportJob`); `pipeline` is `python -m tfgen.beam --input rows.jsonl --output out.jsonl --model ...`, the
same job as `tfgen batch` on Beam's local runner or, with Beam's pipeline options, on Dataflow, Flink or Spark
(`docs/batch.md`).

The names below load on first use (importing the package imports neither Beam nor TensorFlow).

May import `tfgen.batch`, `tfgen.export` (reading an export back), `tfgen.auto`, `tfgen.hub`, `tfgen.commands` (the
shared flags) and what they import.
"""

from __future__ import annotations

from tfgen.lazy import lazy_exports

_EXPORTS = {
    "BeamJob": "tfgen.beam.handler",
    "ExportJob": "tfgen.beam.export_job",
    "TFGenModelHandler": "tfgen.beam.handler",
    "build_pipeline": "tfgen.beam.pipeline",
    "main": "tfgen.beam.pipeline",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
