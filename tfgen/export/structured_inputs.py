"""Structured output in an export: the automaton baked into the signatures, or its tables as signature inputs.

Baked (`export_saved_model(regex=...)`, `json_schema=`, or the exported config's own): every table signature decodes
under the constraint, its tables (`tfgen.structured.automaton`) constants of the program. Signatures that cannot
carry it are left out: `prompt_lookup` (assisted generation) and the continuous-batching slot programs, so
`tfgen serve` runs such an export's requests as whole calls.

Tables as inputs (`export_saved_model(structured_inputs=(STATES, CLASSES))`): the `structured` signature decodes as
`sample` does (per-row seed, temperature, top-k, top-p, budget; `top_k` 1 is greedy search) under the automaton
whose tables the request carries, padded to the export's fixed sizes by `structured_tables`:

    grammar_next         int32 [STATES, CLASSES]   state after a token of each class (0: not allowed)
    grammar_token_class  int32 [V]                 each token id's class (0: allowed nowhere)
    grammar_accepting    bool  [STATES]            states where the text is a whole match

Fixed shapes make it one program: a client changes patterns per request without a new export or compilation.
The tables are not per row (every row of a call follows one automaton); they have no batch axis, so REST clients
send them in the columnar `inputs` format. See `docs/serving.md` ("Exported constraints").

TF-free at import (TensorFlow is imported inside the functions that build graph pieces).
"""

from __future__ import annotations

import numpy as np

from tfgen.config.knobs import KNOBS
from tfgen.export.signatures import SIGNATURES, SignatureSpec
from tfgen.structured.automaton import structured_option

STRUCTURED_SIGNATURE = "structured"
#: The tables a `structured` request carries, in `tfgen.config.knobs` names.
TABLE_INPUTS = ("grammar_next", "grammar_token_class", "grammar_accepting")
# Signatures that cannot carry an automaton: assisted generation (prompt lookup) refuses one.
UNCONSTRAINABLE = ("prompt_lookup",)
SLOT_SIGNATURE_NAMES = ("slot_init", "slot_insert", "slot_steps*")
# Table sizes an export may fix (a [STATES, CLASSES] int32 table of 2**24 entries is 64 MiB per request).
MAX_TABLE_ENTRIES = 1 << 24

_SAMPLE = SIGNATURES["sample"]
STRUCTURED_SPEC = SignatureSpec(
    "sampling (top_k 1: greedy search) with per-row seed, temperature, top-k, top-p and budget, under the "
    "token automaton the request carries (grammar_next, grammar_token_class, grammar_accepting; sizes fixed at "
    "export)",
    generation_options=_SAMPLE.generation_options,
    row_inputs=_SAMPLE.row_inputs,
    processor_overrides={**_SAMPLE.processor_overrides, "grammar": True},
    table_inputs=TABLE_INPUTS,
)


def check_structured_inputs(structured_inputs) -> tuple[int, int] | None:
    """`(states, classes)` of `structured_inputs` (None: no structured signature). ValueError unless two integers
    >= 2 whose table fits `MAX_TABLE_ENTRIES`."""
    if structured_inputs is None:
        return None
    try:
        states, classes = (int(size) for size in structured_inputs)
        valid = all(float(size) == int(size) for size in structured_inputs)
    except (TypeError, ValueError):
        valid = False
    if not valid or states < 2 or classes < 2 or states * classes > MAX_TABLE_ENTRIES:
        raise ValueError(f"structured_inputs must be (STATES, CLASSES), two integers >= 2 with STATES * CLASSES <= "
                         f"{MAX_TABLE_ENTRIES}, got {structured_inputs!r}")
    return states, classes


def table_shapes(states: int, classes: int, vocab_size: int) -> dict[str, tuple]:
    """`{knob name: shape}` of the tables of a `structured` signature."""
    return {"grammar_next": (states, classes), "grammar_token_class": (vocab_size,), "grammar_accepting": (states,)}


def placeholder_tables(shapes: dict[str, tuple]) -> dict[str, np.ndarray]:
    """Neutral tables of these shapes: the `structured` program's knob layout (shapes and dtypes; every request
    brings its own values, so these are never run)."""
    return {name: np.zeros(shape, KNOBS[name].dtype) for name, shape in shapes.items()}


def structured_tables(automaton, states: int, classes: int, vocab_size: int | None = None) -> dict[str, np.ndarray]:
    """A `tfgen.structured.automaton.TokenAutomaton`'s tables padded to an export's `states` x `classes` (the
    `structured` signature's inputs; `tfgen_export.json` gives the sizes under "structured_inputs"). ValueError
    when the automaton has more states or classes, or (with `vocab_size`) was built for another vocabulary size.

        automaton = build_automaton(tokenizer, vocab_size, pattern)     # tfgen.structured.automaton
        signature(**prompt, **rows, **structured_tables(automaton, 64, 64))
    """
    if automaton.states > states or automaton.classes > classes:
        raise ValueError(
            f"the automaton of {_short(automaton.pattern)} has {automaton.states} states and {automaton.classes} "
            f"token classes; the export's structured signature takes at most {states} and {classes}. Export with "
            f"larger --structured-inputs, or bake the pattern into an export (--regex / --json-schema)."
        )
    if vocab_size is not None and len(automaton.token_class) != vocab_size:
        raise ValueError(f"the automaton was built for {len(automaton.token_class)} token ids, the export's model has "
                         f"{vocab_size}")
    next_state = np.zeros([states, classes], np.int32)
    next_state[: automaton.states, : automaton.classes] = automaton.next_state[: automaton.states, : automaton.classes]
    accepting = np.zeros([states], np.bool_)
    accepting[: automaton.states] = automaton.accepting[: automaton.states]
    return {"grammar_next": next_state, "grammar_token_class": np.asarray(automaton.token_class, np.int32),
            "grammar_accepting": accepting}


def table_checks(inputs: dict, states: int, classes: int) -> list:
    """Assert ops refusing tables that index outside themselves (InvalidArgumentError, a 400 from a server):
    states in [0, STATES) and classes in [0, CLASSES)."""
    import tensorflow as tf

    next_state, token_class = inputs["grammar_next"], inputs["grammar_token_class"]
    return [
        tf.debugging.Assert(tf.reduce_all((next_state >= 0) & (next_state < states)),
                            [f"grammar_next: states must be in [0, {states})"]),
        tf.debugging.Assert(tf.reduce_all((token_class >= 0) & (token_class < classes)),
                            [f"grammar_token_class: classes must be in [0, {classes})"]),
    ]


def constrain_export(config, names: list[str], explicit: bool, slots, slots_by_default: bool):
    """`(names, slots, left_out)` of an export whose `config` may set `regex` / `json_schema`: under a constraint,
    the table signatures without those that cannot carry the automaton and no slot programs, with what that left
    out of the defaults; ValueError when the caller named such a signature or asked for slots."""
    option = structured_option(config)
    if option is None:
        return names, slots, []
    refused = [name for name in names if name in UNCONSTRAINABLE]
    if refused and explicit:
        raise ValueError(f"signatures: {', '.join(refused)} (assisted generation) cannot carry a {option} "
                         "constraint; leave it out or export without the constraint")
    if slots:
        raise ValueError(f"slots: the continuous-batching signatures cannot carry a {option} constraint; "
                         "export with slots=0 (tfgen serve then runs requests as whole calls)")
    left_out = refused + (list(SLOT_SIGNATURE_NAMES) if slots is None and slots_by_default else [])
    return [name for name in names if name not in UNCONSTRAINABLE], 0, left_out


def constraint_info(config, automaton, left_out: list[str]) -> dict:
    """What `tfgen_export.json` records under "constraint": the option, the automaton's regex, sizes and table
    bytes, and the signatures left out."""
    option = structured_option(config)
    return {
        "option": option, option: getattr(config, option), "pattern": automaton.pattern,
        "states": automaton.states, "classes": automaton.classes, "padded_states": int(automaton.next_state.shape[0]),
        "padded_classes": int(automaton.next_state.shape[1]), "table_bytes": int(automaton.nbytes),
        "left_out": left_out,
    }


def constraint_line(info: dict) -> str:
    """One line for the log: the constraint and what it left out."""
    sizes = f"{info['states']} states, {info['classes']} token classes, {info['table_bytes']} table bytes"
    left_out = f"; left out (they cannot carry it): {', '.join(info['left_out'])}" if info["left_out"] else ""
    if SLOT_SIGNATURE_NAMES[0] in info["left_out"]:
        left_out += " (`tfgen serve` runs its requests as whole calls)"
    return f"constrained export ({info['option']}: {sizes}){left_out}"


def _short(pattern: str, limit: int = 60) -> str:
    return repr(pattern if len(pattern) <= limit else pattern[:limit] + "...")
