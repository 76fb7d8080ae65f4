"""`generate()` as a TF Serving SavedModel: the whole decode loop in the graph, no Python in the serving path.

`export_saved_model` writes `export_dir/<version>/` (TF Serving's layout: `saved_model.pb`, `variables/`, and
`assets.extra/` with the generation config, a description of the export and TF Serving's warm-up requests, see
`warmup.py`). Every signature takes tensors with a leading batch axis; batch size and prompt length are `None`, so
one export serves any request shape (an XLA export compiles once per distinct `[batch, prompt length]`). The
signatures are built from `SIGNATURES`, a table: a new decoding strategy becomes a new entry there. See
`docs/serving.md`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Sequence

import tensorflow as tf

from tfgen.config.generation_config import GenerationConfig
from tfgen.config.knobs import KNOBS, declared
from tfgen.decoding.loop import DecodeSpec, generate_all
from tfgen.decoding.model_protocol import capabilities
from tfgen.decoding.strategies import described, make_loop, modes_that, strategy_for
from tfgen.export.compact import merge_constants
from tfgen.export.portable import WithoutStaticTokenCount, model_variables, xla_only_ops
from tfgen.export.request_checks import request_checks
from tfgen.export.signature_inputs import signature_run
from tfgen.export.signatures import DEFAULT_MAX_NEW_TOKENS, SIGNATURES, ExportChoices, SignatureSpec, export_choices
from tfgen.export.slot_signatures import export_slot_programs, slot_functions, slot_info
from tfgen.export.structured_inputs import (
    STRUCTURED_SIGNATURE,
    STRUCTURED_SPEC,
    check_structured_inputs,
    constrain_export,
    constraint_info,
    constraint_line,
    placeholder_tables,
    table_checks,
    table_shapes,
)
from tfgen.export.text_graph import text_signature_functions
from tfgen.export.warmup import WARMUP_FILE, warmup_prompt_tokens, warmup_requests, write_warmup_requests
from tfgen.logits.pipeline import resolve_processors
from tfgen.request.encoder import decoder_start_token_ids
from tfgen.request.prepare import base_config, pad_token_id_of, refuse_whole_call_options
from tfgen.request.size import check_request_fits
from tfgen.request.spec import decode_spec, knob_values
from tfgen.structured.automaton import constraint_automaton
from tfgen.text.tokenizer import Tokenizer
from tfgen.value_types import is_integer

logger = logging.getLogger(__name__)

EXPORT_INFO_FILE = "tfgen_export.json"
#: The folder under `assets.extra/` holding the tokenizer's files (`save_pretrained`), chat template included.
TOKENIZER_FOLDER = "tokenizer"


def export_saved_model(
    model,
    export_dir: str | os.PathLike,
    generation_config: GenerationConfig | None = None,
    *,
    max_new_tokens: int | None = None,
    version: int = 1,
    jit_compile: bool = True,
    signatures: Sequence[str] | None = None,
    tokenizer=None,
    text: bool = True,
    num_beams: int | None = None,
    contrastive_top_k: int | None = None,
    prompt_lookup_num_tokens: int | None = None,
    max_matching_ngram_size: int | None = None,
    stop_strings: Sequence[str] | None = None,
    slots: int | None = None,
    slot_length: int | None = None,
    slot_logprobs: int | None = None,
    regex: str | None = None,
    json_schema=None,
    structured_inputs: Sequence[int] | None = None,
) -> str:
    """Writes `export_dir/<version>/`, a SavedModel whose signatures run the whole generation loop.

    Args:
        model: a model implementing `tfgen.decoding.model_protocol.CausalLMProtocol` (e.g. from `AutoModelForCausalLM`).
        generation_config: decoding options of `serving_default` and defaults of the other signatures
            (default: the model's). Its mode must be greedy search, sampling, beam search, contrastive search or
            prompt lookup, with one sequence per prompt.
        max_new_tokens: the static token buffer: every signature returns `[B, T + max_new_tokens]` and per-row
            budgets are capped by it (default: the config's `max_new_tokens`, else 20). Budgets are also capped
            so that prompt plus new tokens fit in the model's positions.
        version: TF Serving version number, the name of the written subdirectory; it must not exist yet.
        jit_compile: True compiles the loop with XLA (TF Serving must then run with XLA enabled, see
            `docs/serving.md`); False exports a plain TF graph that runs on any TF Serving build.
        signatures: names from `SIGNATURES` (default: all, `generate_text` only when `tokenizer` is given and `text`
            is true, `prompt_lookup` only when the model declares `row_cache_index`).
        tokenizer: a byte-level BPE `tfgen.Tokenizer` for the `generate_text` signature (needs `tfgen[text]`), and
            the tokenizer stop strings are matched with. A `tfgen.Tokenizer` (HF files or a GGUF vocabulary) is saved
            with its chat template to `assets.extra/tokenizer/`, from which `tfgen serve` tokenizes its
            OpenAI-compatible requests.
        num_beams: beams of the `beam_search` signature (default: the config's `num_beams` when above 1, else 4).
        contrastive_top_k: candidates per step of the `contrastive` signature (default: the config's `top_k` when
            the config selects contrastive search, else 4).
        prompt_lookup_num_tokens / max_matching_ngram_size: draft tokens per round and the longest n-gram matched
            of the `prompt_lookup` signature (default: the config's, else 10 and 2).
        stop_strings: strings that end a row in every signature (HF's rules; default: the config's
            `stop_strings`), fixed at export; needs `tokenizer`.
        slots / slot_length: decode rows and buffer columns of the continuous-batching signatures (`slot_init`,
            `slot_insert`, `slot_steps`, see `tfgen.export.slot_signatures`; `tfgen serve` batches requests
            through them). Default: 8 slots when the model declares `row_cache_index` and `jit_compile`, else none
            (0 leaves them out); `slot_length` defaults to `max_new_tokens` + 256, within the model's positions.
        slot_logprobs: K, the most likely tokens whose raw log-probabilities the slot state records per new token
            (what `tfgen serve` answers OpenAI's `logprobs` / `top_logprobs` from; default 20, OpenAI's limit);
            0 records none, so a step pays no top-K over the vocabulary.
        regex / json_schema: constrain every signature's output (default: the config's), the automaton baked in;
            needs `tokenizer`. `prompt_lookup` and the slot signatures cannot carry it and are left out.
        structured_inputs: `(STATES, CLASSES)` adds the `structured` signature, whose requests carry an automaton's
            tables of these sizes (`tfgen.export.structured_inputs`).

    An encoder-decoder model (`is_encoder_decoder`, e.g. T5) is exported with the same table signatures, whose
    `input_ids` / `attention_mask` are the encoder input (padded on either side); every row's decoder starts from the
    config's `decoder_start_token_id`, and `sequences` are the decoder's tokens, `[B, 1 + max_new_tokens]`.
    T5 has no per-row cache slot (`row_cache_index`), so `prompt_lookup` and the slot signatures stay out as for any
    such model, and `generate_text` (a decoder-only prompt) is left out; naming them, or asking for slots, is a
    ValueError. `tfgen_export.json` records the start token under "encoder_decoder".

    Returns the version directory. It is written under a temporary name and renamed when complete, so TF
    Serving polling `export_dir` never loads a half-written version.
    """
    if not is_integer(version) or version < 0:
        raise ValueError(f"version must be a non-negative integer, got {version!r}")
    export_dir = os.fspath(export_dir)
    version_dir = os.path.join(export_dir, str(int(version)))
    if os.path.exists(version_dir):
        raise FileExistsError(f"version: {version_dir} already exists; export under a new version number")
    offers = capabilities(model)
    row_cache_index, encoder_decoder = offers.row_cache_index, offers.encoder_decoder
    names = _signature_names(signatures, tokenizer is not None and text, row_cache_index, encoder_decoder)
    config = _export_config(model, generation_config, stop_strings)
    if regex is not None or json_schema is not None:
        config.update(regex=regex, json_schema=json_schema)
    names, slots, left_out = constrain_export(config, names, signatures is not None, slots,
                                              row_cache_index and jit_compile)
    table_sizes = check_structured_inputs(structured_inputs)
    buffer_new_tokens = _buffer_new_tokens(model, config, max_new_tokens)
    choices = export_choices(config, num_beams, contrastive_top_k, prompt_lookup_num_tokens, max_matching_ngram_size)
    exporter = _Exporter(model, config, buffer_new_tokens, jit_compile, tokenizer, "generate_text" in names, choices,
                         None if table_sizes is None else table_shapes(*table_sizes, int(model.config.vocab_size)),
                         encoder_decoder=encoder_decoder)
    specs = {name: SIGNATURES[name] for name in names}
    if table_sizes is not None:
        specs[STRUCTURED_SIGNATURE] = STRUCTURED_SPEC
    for spec in specs.values():  # every signature's options and sizes are checked before the first is traced
        exporter.plan(spec)
    functions = {name: exporter.concrete_function(spec) for name, spec in specs.items()}
    slot_programs = export_slot_programs(exporter, model, slots, slot_length, jit_compile, slot_logprobs)
    if slot_programs is not None:
        functions.update(slot_functions(slot_programs))
    if exporter.text is not None:
        functions.update(text_signature_functions(exporter.text))
    if not jit_compile:
        xla_ops = xla_only_ops(functions.values())
        if xla_ops:
            raise ValueError(
                "jit_compile=False: the model's graph uses ops that only run through XLA "
                f"({', '.join(sorted(xla_ops))}), so the export would need an XLA-enabled server anyway; "
                "export with jit_compile=True instead."
            )

    os.makedirs(export_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".tfgen-export-{version}-", dir=export_dir)
    try:
        tf.saved_model.save(exporter.module, staging, signatures=functions)
        merge_constants(staging)  # loads in ~half the time: see compact.py
        extra = os.path.join(staging, "assets.extra")
        os.makedirs(extra, exist_ok=True)
        config.save_pretrained(extra)
        if isinstance(tokenizer, Tokenizer):
            # The tokenizer and its chat template travel with the export: `tfgen serve` tokenizes and renders chat
            # requests server-side from them (`tfgen.serving.served_model.load_export`). HF-format files only: a
            # keras-hub tokenizer's saved files do not load back as a tokenizer without its preset.
            tokenizer.save_pretrained(os.path.join(extra, TOKENIZER_FOLDER))
        elif tokenizer is not None:
            logger.info("the export does not carry the %s (only HF-format tokenizers are written to "
                        "assets.extra/%s/)", type(tokenizer).__name__, TOKENIZER_FOLDER)
        # One small request per table signature, which TF Serving (and `tfgen serve`) runs at load: see warmup.py.
        warmup = warmup_requests({name: functions[name].structured_input_signature[0][0] for name in specs},
                                 exporter.vocab_size, warmup_prompt_tokens(exporter.max_positions, buffer_new_tokens),
                                 tokenizer)
        info = {
            "max_new_tokens": buffer_new_tokens,
            "vocab_size": exporter.vocab_size,
            "max_positions": exporter.max_positions,
            "jit_compile": bool(jit_compile),
            **dataclasses.asdict(choices),
            "signatures": {name: spec.description for name, spec in specs.items()},
            "warmup_requests": write_warmup_requests(os.path.join(extra, WARMUP_FILE), warmup,
                                                     os.path.basename(os.path.normpath(export_dir))),
        }
        if slot_programs is not None:
            info["slots"] = slot_info(slot_programs, config)
        if exporter.table_shapes is not None:
            info["structured_inputs"] = {"states": table_sizes[0], "classes": table_sizes[1],
                                         "vocab_size": exporter.vocab_size}
        if encoder_decoder:
            info["encoder_decoder"] = {"decoder_start_token_id": exporter.decoder_start_token_id}
        if exporter.automaton is not None:
            info["constraint"] = constraint_info(config, exporter.automaton, left_out)
            logger.info("%s", constraint_line(info["constraint"]))
        with open(os.path.join(extra, EXPORT_INFO_FILE), "w", encoding="utf-8") as file:
            json.dump(info, file, indent=2)
        os.rename(staging, version_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return version_dir


def default_signatures(model, text: bool) -> list[str]:
    """The signatures `export_saved_model` writes for `model` when none are named: every one it can hold, the text
    ones when `text` (a tokenizer is given and text signatures wanted)."""
    offers = capabilities(model)
    return _signature_names(None, text, offers.row_cache_index, offers.encoder_decoder)


def _signature_names(signatures, has_tokenizer: bool, row_cache_index: bool, encoder_decoder: bool) -> list[str]:
    """The signatures to export: those named, else every one the model can hold (text signatures need a tokenizer
    and a decoder-only model, whose prompt the text is; `prompt_lookup` needs `row_cache_index`)."""
    if signatures is None:
        return [name for name, spec in SIGNATURES.items()
                if (has_tokenizer and not encoder_decoder or not spec.text)
                and (row_cache_index or not spec.row_cache_index)]
    names = list(dict.fromkeys(signatures))
    unknown = [name for name in names if name not in SIGNATURES]
    if unknown or not names:
        raise ValueError(f"signatures: unknown or none given ({unknown}); available: {sorted(SIGNATURES)}")
    if any(SIGNATURES[name].text for name in names):
        if encoder_decoder:
            raise ValueError("signatures: generate_text cannot be exported for an encoder-decoder model (its in-graph "
                             "tokenizer makes a decoder-only prompt); export the token-id signatures")
        if not has_tokenizer:
            raise ValueError("signatures: generate_text needs a tokenizer (pass tokenizer=)")
    return names


def _decoder_start(config: GenerationConfig, vocab_size: int) -> int:
    """An encoder-decoder export's decoder start token (`decoder_start_token_ids`): one id for every row, since a
    per-row list cannot fit a batch of any size."""
    ids = decoder_start_token_ids(config, vocab_size)
    if ids.size != 1:
        raise ValueError(f"decoder_start_token_id: an encoder-decoder export starts every row from one token id, got "
                         f"{config.decoder_start_token_id!r}")
    return int(ids[0])


def _export_config(model, generation_config, stop_strings) -> GenerationConfig:
    config = base_config(model, generation_config)
    if stop_strings is not None:
        config.update(stop_strings=list(stop_strings) if not isinstance(stop_strings, str) else stop_strings)
    refuse_whole_call_options(config, {
        "max_time": "an exported signature runs the whole loop in one call, with no clock to check between steps; "
                    "bound requests with the server's timeout instead (unset max_time to export).",
        "num_return_sequences": "must be 1 in an export (send a prompt once per sample wanted).",
    })
    return config


def _buffer_new_tokens(model, config: GenerationConfig, max_new_tokens) -> int:
    if max_new_tokens is None:
        max_new_tokens = config.max_new_tokens or DEFAULT_MAX_NEW_TOKENS
    if not is_integer(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions is not None and max_new_tokens >= max_positions:
        raise ValueError(
            f"max_new_tokens ({max_new_tokens}) leaves no room for a prompt: the model has {max_positions} positions"
        )
    return int(max_new_tokens)


class _Exporter:
    """Builds the signature functions of one export; `module` holds everything they capture."""

    def __init__(
        self, model, config: GenerationConfig, buffer_new_tokens: int, jit_compile: bool, tokenizer,
        text_signature: bool, choices: ExportChoices, table_shapes: dict | None = None, *,
        encoder_decoder: bool = False,
    ):
        self.model = model if jit_compile else WithoutStaticTokenCount(model)
        self.config = config
        self.choices = choices
        self.vocab_size = int(model.config.vocab_size)
        self.buffer_new_tokens = buffer_new_tokens
        self.jit_compile = jit_compile
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        self.pad_token_id = pad_token_id_of(config, self.vocab_size)
        # An encoder-decoder model's signatures take the encoder input; the decoder starts from one start token.
        self.encoder_decoder = encoder_decoder
        self.decoder_start_token_id = _decoder_start(config, self.vocab_size) if encoder_decoder else None
        self.module = tf.Module()
        self.module.model_variables = model_variables(model)
        self.tokenizer = tokenizer
        # The `regex` / `json_schema` automaton baked into every table signature (built once, before any trace).
        self.automaton = constraint_automaton(config, tokenizer, self.vocab_size)
        self.table_shapes = table_shapes  # {knob: shape} of the tables a `structured` signature takes
        self.text = tokenizer.in_graph(self.vocab_size) if text_signature else None
        self.module.text_tokenizer = None if self.text is None else self.text.layer
        self._decoders = {}

    def concrete_function(self, spec: SignatureSpec):
        """The signature's concrete function: checks the request in the graph, then runs the decode loop."""
        decoder = self._decoder(spec)
        if spec.text:
            input_specs = {"text": tf.TensorSpec([None], tf.string, name="text")}
        else:
            input_specs = {
                name: tf.TensorSpec([None, None], tf.int32, name=name) for name in ("input_ids", "attention_mask")
            }
        for name in spec.row_inputs:
            input_specs[name] = tf.TensorSpec([None, *declared(name).row_shape], _wire_dtype(name), name=name)
        for name in spec.table_inputs:
            input_specs[name] = tf.TensorSpec(self.table_shapes[name], KNOBS[name].dtype, name=name)

        def serve(inputs):
            if spec.text:
                input_ids, attention_mask = self.text.encode(inputs["text"])
            else:
                input_ids, attention_mask = inputs["input_ids"], inputs["attention_mask"]
            # An encoder input is checked like a prompt (ids, 0/1 mask, a token per row; either side padded) but
            # not against the positions, which bound the decoder only.
            checks = request_checks(input_ids, attention_mask, inputs, spec.row_inputs, vocab_size=self.vocab_size,
                                    max_positions=None if self.encoder_decoder else self.max_positions,
                                    buffer_new_tokens=self.buffer_new_tokens)
            if spec.table_inputs:
                checks += table_checks(inputs, *self.table_shapes["grammar_next"])
            with tf.control_dependencies(checks):
                input_ids = tf.identity(input_ids)
            outputs = decoder(input_ids, attention_mask,
                              {name: inputs[name] for name in (*spec.row_inputs, *spec.table_inputs)})
            if spec.text:
                width = tf.shape(input_ids)[1]
                return {"text": self.text.decode(outputs["sequences"], width, outputs["sequence_lengths"])}
            return {name: outputs[name] for name in ("sequences", "sequence_lengths", *spec.outputs)}

        # No autograph: the code branches on Python values only, and converting it costs seconds per trace.
        return tf.function(serve, input_signature=[input_specs], autograph=False).get_concrete_function()

    def plan(self, signature: SignatureSpec) -> tuple[DecodeSpec, dict]:
        """The program key of the signature's decoding and its knob values for one row, every option and size
        checked (nothing is traced)."""
        with warnings.catch_warnings():
            # Options the override makes irrelevant (e.g. temperature under greedy) are not the caller's doing.
            warnings.simplefilter("ignore", UserWarning)
            config = self.config.copy()
            config.update(**signature.options(self.choices))
        mode = config.get_generation_mode()
        strategy = strategy_for(mode)
        if strategy.exportable is None or not strategy.exportable(config):
            raise ValueError(
                f"generation_config: mode {mode.value!r} cannot be exported yet; these can: "
                f"{described(modes_that(lambda s: s.exportable is not None))} (assisted generation with "
                "prompt_lookup_num_tokens only: the drafter that needs no second model)"
            )
        if strategy.check_model is not None:
            strategy.check_model(self.model, None, config, ())
        # One prompt row of one token is the least any call of the signature decodes: refuse an export no call fits.
        check_request_fits(self.model, config, mode, 1, 1 + self.buffer_new_tokens,
                           1 if self.encoder_decoder else None)
        # Knob values for one row: per-row knobs are repeated to the request's batch, shared ones taken as they are.
        processors = resolve_processors(config, self.vocab_size, num_beams=int(config.num_beams))
        knobs = knob_values(config, mode, 1, processors, self.automaton)
        if signature.table_inputs:  # the request's tables replace any baked ones (one program per table size)
            knobs.update(placeholder_tables(self.table_shapes))
        spec = decode_spec(
            config, mode, processors, buffer_new_tokens=self.buffer_new_tokens, knobs=knobs,
            processor_overrides=signature.processor_overrides, tokenizer=self.tokenizer,
            encoder_decoder=self.encoder_decoder,
        )
        return spec, knobs

    def _decoder(self, signature: SignatureSpec):
        """`(input_ids, attention_mask, row_inputs) -> outputs` for the signature's decoding, traced once per
        distinct program (signatures decoding alike share one, and so one XLA compilation per shape)."""
        spec, knobs = self.plan(signature)
        if spec not in self._decoders:
            self._decoders[spec] = tf.function(
                lambda inputs: generate_all(make_loop(self.model, spec), inputs),
                jit_compile=self.jit_compile,
                autograph=False,
            )
        return signature_run(self, self._decoders[spec], knobs)


def _wire_dtype(name: str) -> tf.DType:
    """The dtype of a per-row input in a signature: the knob's, except float64 knobs (`length_penalty`,
    `penalty_alpha`) travel as float32, which every TF Serving client sends."""
    dtype = tf.as_dtype(declared(name).dtype)
    return tf.float32 if dtype == tf.float64 else dtype
