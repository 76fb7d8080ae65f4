"""The table of exported signatures: what each one decodes and which per-request inputs it takes.

TF-free (the `tfgen export` command reads it to build its `--help`). `tfgen.export.saved_model` builds every
signature from its entry; a new decoding strategy becomes a new entry here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

# Used when neither the caller nor the generation config sets max_new_tokens (HF's default length of 20).
DEFAULT_MAX_NEW_TOKENS = 20
# Beams of the beam_search signature and candidates of the contrastive one, unless the export or its
# generation config says otherwise (HF's contrastive examples use top_k=4).
DEFAULT_NUM_BEAMS = 4
DEFAULT_CONTRASTIVE_TOP_K = 4
# Draft tokens per round and the longest n-gram matched of the prompt_lookup signature, unless the export or its
# generation config says otherwise (HF's prompt lookup examples draft 10 tokens; HF's default n-gram size is 2).
DEFAULT_PROMPT_LOOKUP_NUM_TOKENS = 10
DEFAULT_MAX_MATCHING_NGRAM_SIZE = 2


@dataclasses.dataclass(frozen=True)
class ExportChoices:
    """Static choices of one export that shape its programs: beams of `beam_search`, candidates of `contrastive`,
    draft tokens per round and longest matched n-gram of `prompt_lookup`."""

    num_beams: int
    contrastive_top_k: int
    prompt_lookup_num_tokens: int
    max_matching_ngram_size: int


@dataclasses.dataclass(frozen=True)
class SignatureSpec:
    """What one exported signature runs.

    description: one line for `assets.extra/tfgen_export.json` and the docs.
    generation_options: overrides of the exported GenerationConfig (a dict, or a function of the export's
        `ExportChoices` returning one); the decoding strategy is the mode the result selects.
    row_inputs: per-row inputs taken besides `input_ids` and `attention_mask`, each a knob or request value of
        `tfgen.config.knobs` (its dtype, shape and valid range make the input's spec and in-graph check).
    processor_overrides: processors forced on, with their static values (`ProcessorSpec.forced`), so that the row
        inputs always apply (a row sending a neutral value — top_k 0, top_p 1, temperature 1 — leaves its scores
        untouched); top-k's static value is its candidate cap, 0 for the whole vocabulary.
    outputs: entries of the decode result returned besides `sequences` and `sequence_lengths`.
    text: takes `text` string `[B]` instead of token ids and returns the generated `text` (needs a tokenizer).
    row_cache_index: decodes speculatively, so it needs a model declaring `row_cache_index` (a per-row cache slot,
        `tfgen.decoding.model_protocol`); left out of the default signatures of a model without it.
    table_inputs: shared knobs taken as inputs of shapes fixed at export, without a batch axis (the `structured`
        signature's automaton tables, `tfgen.export.structured_inputs`).
    """

    description: str
    generation_options: dict | Callable[[ExportChoices], dict] = dataclasses.field(default_factory=dict)
    row_inputs: tuple[str, ...] = ()
    processor_overrides: dict = dataclasses.field(default_factory=dict)
    outputs: tuple[str, ...] = ()
    text: bool = False
    row_cache_index: bool = False
    table_inputs: tuple[str, ...] = ()

    def options(self, choices: ExportChoices) -> dict:
        """The generation options of this signature in an export made with `choices`."""
        return self.generation_options(choices) if callable(self.generation_options) else self.generation_options


# Plain greedy search / sampling: no beams, no contrastive search, no drafting (a config's prompt lookup applies to
# serving_default and prompt_lookup only).
_ONE_TOKEN_PER_STEP = {"num_beams": 1, "penalty_alpha": None, "prompt_lookup_num_tokens": None,
                       "assistant_early_exit": None}

SIGNATURES: dict[str, SignatureSpec] = {
    "serving_default": SignatureSpec("the exported generation config's decoding (sampling keys from the prompt)"),
    "greedy": SignatureSpec(
        "greedy search with a per-row budget",
        generation_options={"do_sample": False, **_ONE_TOKEN_PER_STEP},
        row_inputs=("max_new_tokens",),
    ),
    "sample": SignatureSpec(
        "multinomial sampling with per-row seed, temperature, top-k, top-p and budget",
        generation_options={"do_sample": True, **_ONE_TOKEN_PER_STEP},
        row_inputs=("seed", "temperature", "top_k", "top_p", "max_new_tokens"),
        processor_overrides={"temperature": True, "top_k": 0, "top_p": True},
    ),
    "beam_search": SignatureSpec(
        "beam search (beams fixed at export) with per-row length_penalty and budget; returns sequences_scores",
        generation_options=lambda choices: {
            "do_sample": False, "num_beams": choices.num_beams, "num_beam_groups": 1, "penalty_alpha": None,
        },
        row_inputs=("length_penalty", "max_new_tokens"),
        outputs=("sequences_scores",),
    ),
    "contrastive": SignatureSpec(
        "contrastive search (top_k candidates fixed at export) with per-row penalty_alpha and budget",
        generation_options=lambda choices: {
            "do_sample": False, "num_beams": 1, "top_k": choices.contrastive_top_k,
            # Any value > 0 selects the mode; each row's own value comes from the penalty_alpha input.
            "penalty_alpha": 0.5,
        },
        row_inputs=("penalty_alpha", "max_new_tokens"),
    ),
    "prompt_lookup": SignatureSpec(
        "greedy search with prompt lookup drafting (draft tokens and n-gram size fixed at export: greedy's tokens in "
        "fewer model calls) and a per-row budget; returns draft_accepted and draft_rounds",
        generation_options=lambda choices: {
            **_ONE_TOKEN_PER_STEP, "do_sample": False,
            "prompt_lookup_num_tokens": choices.prompt_lookup_num_tokens,
            "max_matching_ngram_size": choices.max_matching_ngram_size,
        },
        row_inputs=("max_new_tokens",),
        outputs=("draft_accepted", "draft_rounds"),
        row_cache_index=True,
    ),
    "generate_text": SignatureSpec(
        "serving_default on text: byte-level BPE tokenization in the graph, returns the generated text",
        text=True,
    ),
}


def export_choices(config, num_beams, contrastive_top_k, draft_tokens, max_ngram) -> ExportChoices:
    """The export's static choices: the arguments given, else the exported `GenerationConfig`'s values where it
    selects the strategy (its `num_beams` above 1, its `top_k` under contrastive search, its prompt lookup sizes),
    else the defaults above. ValueError naming a choice out of range."""
    # Here, not at the top: `tfgen export --help` reads the table and needs none of these.
    from tfgen.config.generation_config import GenerationConfig, GenerationMode
    from tfgen.config.rules import check_options
    from tfgen.value_types import is_integer

    if num_beams is None:
        num_beams = config.num_beams if config.num_beams > 1 else DEFAULT_NUM_BEAMS
    if contrastive_top_k is None:
        selects_contrastive = config.get_generation_mode() == GenerationMode.CONTRASTIVE_SEARCH
        contrastive_top_k = config.top_k if selects_contrastive else DEFAULT_CONTRASTIVE_TOP_K
    if draft_tokens is None:
        draft_tokens = config.prompt_lookup_num_tokens or DEFAULT_PROMPT_LOOKUP_NUM_TOKENS
    if max_ngram is None:
        max_ngram = config.max_matching_ngram_size or DEFAULT_MAX_MATCHING_NGRAM_SIZE
    for name, value in (("num_beams", num_beams), ("contrastive_top_k", contrastive_top_k)):
        if not is_integer(value) or value < 2:
            raise ValueError(f"{name} must be an integer >= 2, got {value!r}")
    probe = GenerationConfig()
    vars(probe).update(prompt_lookup_num_tokens=draft_tokens, max_matching_ngram_size=max_ngram)
    check_options(probe)  # the config's own rules (type and range) for the drafting sizes
    return ExportChoices(int(num_beams), int(contrastive_top_k), int(draft_tokens), int(max_ngram))
