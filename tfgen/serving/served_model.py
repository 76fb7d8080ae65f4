"""One loaded export version as `tfgen serve` holds it (`ServedModel`: its signatures, their input specs and
SignatureDefs, and its continuous-batching engine when it runs one), and loading one from an export folder
(`load_export`, TF Serving's version folders)."""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import tensorflow as tf
from google.protobuf import json_format
from tensorflow.core.protobuf import saved_model_pb2

from tfgen.engine.scheduler import warm_up as warm_up_engine
from tfgen.export.reading import export_tokenizer, export_versions
from tfgen.export.warmup import replay_warmup_requests
from tfgen.generation import compile_cache
from tfgen.serving.batching import attach_engine, engine_predict, engine_signatures
from tfgen.serving.errors import bad_request, error_text
from tfgen.serving.xla_programs import drop_compiled_programs
from tfgen.value_types import is_integer

logger = logging.getLogger(__name__)



@dataclasses.dataclass
class ServedModel:
    """One loaded export version: its signature functions, their input specs and their SignatureDefs."""

    name: str
    version: int
    directory: str
    signatures: dict  # name -> concrete function
    input_specs: dict  # name -> {input name: tf.TensorSpec}
    signature_defs: dict  # name -> SignatureDef as TF Serving's JSON
    #: The continuous-batching engine (`tfgen.engine.scheduler.SlotEngine`) when the export has slot signatures
    #: and the server runs one (`tfgen.serving.batching.attach_engine`), else None.
    engine: Any = None
    #: The export's tokenizer (`assets.extra/tokenizer/`, with its chat template) when it has one, else None: the
    #: OpenAI-compatible routes tokenize and render chat requests with it (`tfgen.serving.openai_api`).
    tokenizer: Any = None
    #: Whether the export's signatures run XLA programs (functions marked `jit_compile`): unloading it drops them.
    xla: bool = False
    #: Requests using this version now (`hold` / `release`): `close` waits for them.
    users: int = dataclasses.field(default=0, repr=False)
    _users_changed: threading.Condition = dataclasses.field(default_factory=threading.Condition, repr=False)

    def hold(self) -> None:
        """Counts a request that uses this version until `release()` (`close` lets it finish first)."""
        with self._users_changed:
            self.users += 1

    def release(self) -> None:
        with self._users_changed:
            self.users -= 1
            self._users_changed.notify_all()

    def predict(self, signature_name: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runs one signature on numpy inputs — greedy and sampling rows through the continuous-batching engine when
        there is one (the same outputs) — graph checks that fail become a 400 RequestError, a full engine queue
        a 503."""
        if self.engine is not None:
            outputs = engine_predict(self, signature_name, inputs)
            if outputs is not None:
                return outputs
        function = self.signatures[signature_name]
        try:
            outputs = function(**{name: tf.constant(value) for name, value in inputs.items()})
        except tf.errors.InvalidArgumentError as error:
            raise bad_request(error_text(error.message)) from None
        return {name: tensor.numpy() for name, tensor in outputs.items()}

    def close(self, timeout: float | None = 0.0) -> int:
        """Unloads this version: waits up to `timeout` seconds (None: without limit) for the requests using it to
        finish, stops its engine (rows still decoding then get a 503) and drops its signatures, so that the memory
        they hold can be returned (`release_memory`). Returns how many requests were still running (cut off)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._users_changed:
            while self.users and (deadline is None or deadline > time.monotonic()):
                self._users_changed.wait(None if deadline is None else deadline - time.monotonic())
            cut = self.users
        if self.engine is not None:
            self.engine.close()
        # The loaded SavedModel lives as long as a concrete function of it does (and its compiled programs too).
        self.signatures, self.input_specs, self.engine = {}, {}, None
        return cut

    def warm_up(self) -> None:
        """Runs the version's warm-up requests again (and its engine's warm-up row), so that the programs
        `release_memory` dropped compile again before a request needs them. A failure is logged: the version
        keeps serving (its requests compile what they run)."""
        try:
            warm_up_version(self)
        except Exception:
            logger.exception("warming version %d of %r up again failed", self.version, self.name)


def warm_up_version(served: ServedModel) -> None:
    """Compiles what `served` runs before a request needs it: its engine's programs (`warm_up_engine`) in a thread
    beside the export's warm-up records (`replay_warmup_requests`), so the two use both cores, leaving out the
    records of the signatures the engine decodes (`engine_signatures`: those programs would serve no request)."""
    with ThreadPoolExecutor(1, thread_name_prefix="tfgen-engine-warm-up") as pool:
        engine = None if served.engine is None else pool.submit(warm_up_engine, served.engine)
        replay_warmup_requests(served.directory, served.signatures, skip=engine_signatures(served))
        if engine is not None:
            logger.info("continuous batching: warm-up %.1f s", engine.result())


def release_memory(xla: bool = False, served: list[ServedModel] | tuple = ()) -> None:
    """Hands what unloaded versions held back to the system: collects the reference cycles of loaded SavedModels
    (their functions keep each other alive until a collection), with `xla` (an XLA export was unloaded) drops
    every compiled XLA program, which TensorFlow never evicts, and warms the versions still `served` up again
    (their programs compile again, from the persistent compilation cache when it is on), then asks glibc to return
    its free heap pages (`malloc_trim`; without it the freed memory of TensorFlow's many small allocations stays in
    the process)."""
    gc.collect()
    if xla and drop_compiled_programs():
        started = time.monotonic()
        for model in served:
            model.warm_up()
        if served:
            logger.info("dropped the unloaded version's XLA programs; warmed %s up again in %.1f s",
                        ", ".join(str(model.version) for model in served), time.monotonic() - started)
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to trim


def load_export(export_dir: str | os.PathLike, model_name: str | None = None, *, version: int | None = None,
                warmup: bool = True, batching: dict | None = None) -> ServedModel:
    """Loads a version under `export_dir` for serving: `version`, else the newest (TF Serving's default policy).

    `export_dir` holds numeric version folders, as `tfgen export` writes them. `model_name` defaults to the
    folder's name (TF Serving's docker image takes it from `MODEL_NAME`). With `warmup`, the export's
    `assets.extra/tf_serving_warmup_requests` run once each before it returns, as TF Serving runs them, so the
    first request does not build the programs. The export's tokenizer (`assets.extra/tokenizer/`) is loaded when
    it has one (`ServedModel.tokenizer`). `batching`: options of `tfgen.serving.batching.attach_engine`
    (`steps_per_call`, `max_queue`) to decode greedy and sampling requests with continuous batching when the
    export has slot signatures (None: every request runs its signature as a whole call). Raises OSError when no
    (such) version exists.
    """
    export_dir = os.fspath(export_dir)
    versions = export_versions(export_dir)
    if not versions:
        raise OSError(f"export_dir: no version folder with a saved_model.pb in {export_dir!r} (expected <dir>/1/...)")
    if version is None:
        version = versions[-1]
    elif not is_integer(version):
        raise ValueError(f"version must be an integer (a version folder's name), got {version!r}")
    elif version not in versions:
        raise OSError(f"version: no folder {version} with a saved_model.pb in {export_dir!r} (found {versions})")
    directory = os.path.join(export_dir, str(version))
    try:
        import tensorflow_text  # noqa: F401  registers the TF Text ops of the generate_text signature
    except ImportError:
        pass
    # An XLA export's signatures compile on their first call (the warm-up's, or a request's).
    compile_cache.start()
    started = time.monotonic()
    logger.info("loading %s", directory)
    loaded = tf.saved_model.load(directory)
    with open(os.path.join(directory, "saved_model.pb"), "rb") as file:
        meta_graph = saved_model_pb2.SavedModel.FromString(file.read()).meta_graphs[0]
    signatures = dict(loaded.signatures)
    xla = any(function.attr["_XlaMustCompile"].b for function in meta_graph.graph_def.library.function)
    served = ServedModel(
        name=model_name or os.path.basename(os.path.normpath(export_dir)),
        version=int(version),
        directory=directory,
        signatures=signatures,
        xla=xla,
        input_specs={name: function.structured_input_signature[1] for name, function in signatures.items()},
        signature_defs={
            name: json_format.MessageToDict(definition, preserving_proto_field_name=True)
            for name, definition in meta_graph.signature_def.items()
        },
    )
    try:
        served.tokenizer = export_tokenizer(directory)
    except (OSError, ValueError) as error:  # the version still serves its signatures
        logger.warning("version %d of %r: its tokenizer (assets.extra/) does not load, so the OpenAI routes cannot "
                       "take text: %s", served.version, served.name, error)
    if batching is not None:
        attach_engine(served, **batching)
    if warmup:
        logger.info("loaded in %.1f s; warming up (the programs compile on their first call)",
                    time.monotonic() - started)
        warm_up_version(served)
    # Loading and the first compiles free much (the restore's buffers, the compilers' working memory) that glibc
    # would keep: ~0.1 GB after loading SmolLM2-135M's export, ~0.4 GB after its warm-up and engine.
    release_memory()
    return served
