"""Continuous batching from the export alone: the `slot_init`, `slot_insert` and `slot_steps` signatures.

They are `tfgen.engine.slot_programs.SlotPrograms` with the decode state as explicit tensors, so a driver outside
tfgen (another process, a TPU host, `tfgen serve`'s engine) runs continuous batching over a plain SavedModel:

    state = slot_init()                                       every slot empty
    state = slot_insert(**state, new_input_ids=..., ...)      admit rows into free slots (prefill + first token)
    state = slot_steps(**state, max_steps=k, release=...,     advance every running slot up to k tokens
                       record_logprobs=...)                   (K > 0 only: the slots wanting log-probabilities)
    state = slot_steps_<n>(...)                               the same over slots [0, n) only (n: powers of two)

Every state entry is an input and an output of the same name (`state_specs`), so outputs feed the next call as
they are. The contract (each entry's meaning and shape) is `tfgen.engine.slot_state.SlotState`'s docstring (the
entries are its flat form, `SlotState.to_flat`: its fields, `knob_<name>`, `cache_<i>`) and `docs/serving.md`. The
programs hold the state typed; the functions below convert at the signature boundary only. The decoding is the
`sample` signature's (the export's processors and stop strings, per-row temperature / top_k / top_p / seed /
budget), with `new_do_sample` false giving the `greedy` signature's tokens.
"""

from __future__ import annotations

import tensorflow as tf

from tfgen.config.knobs import KNOBS
from tfgen.decoding.model_protocol import capabilities
from tfgen.engine.slot_programs import SlotPrograms
from tfgen.engine.slot_state import REQUEST_KNOBS
from tfgen.export.signatures import SIGNATURES
from tfgen.value_types import is_integer

SLOT_SIGNATURES = ("slot_init", "slot_insert", "slot_steps")
#: The row inputs of `slot_insert` (each prefixed `new_`), with their dtypes and shapes after the row axis.
INSERT_INPUTS = {
    "input_ids": (tf.int32, [None]), "attention_mask": (tf.int32, [None]), "width": (tf.int32, []),
    "slot": (tf.int32, []), "max_new_tokens": (tf.int32, []), "seed": (tf.int32, [2]), "do_sample": (tf.bool, []),
    **{name: (tf.as_dtype(KNOBS[name].dtype), []) for name in REQUEST_KNOBS},
}
DEFAULT_SLOTS = 8
#: The most likely tokens whose log-probabilities the slot state records per new token by default: 20, OpenAI's and
#: vLLM's `top_logprobs` limit, what `tfgen serve` answers `logprobs` requests from. Only the steps in which a running
#: slot's request asked for them pay the top-K (`record_logprobs`): SmolLM2 served to 16 clients asking for none runs
#: at 0.96x `generate()` (docs/serving.md); when every row asks, at ~0.6x.
DEFAULT_SLOT_LOGPROBS = 20


def export_slot_programs(exporter, model, slots, slot_length, jit_compile, slot_logprobs=None):
    """The `SlotPrograms` of an export (`tfgen.export.saved_model._Exporter`) asked for `slots` rows of
    `slot_length` columns recording `slot_logprobs` top log-probabilities per token (None: the defaults of
    `export_saved_model`), or None without slot signatures; ValueError naming a bad size."""
    supported = capabilities(model).row_cache_index and jit_compile
    if slots is None:
        slots = DEFAULT_SLOTS if supported else 0
    if not is_integer(slots) or slots < 0:
        raise ValueError(f"slots must be a non-negative integer (0: no slot signatures), got {slots!r}")
    if slots and not supported:
        raise ValueError("slots: the slot signatures need jit_compile=True and a model declaring row_cache_index "
                         f"(a per-row cache slot); {type(model).__name__} with jit_compile={jit_compile} has not both.")
    if not slots:
        return None
    new_tokens, positions = exporter.buffer_new_tokens, exporter.max_positions
    if slot_length is None:
        slot_length = new_tokens + 256 if positions is None else min(new_tokens + 256, positions)
    if not is_integer(slot_length) or slot_length <= new_tokens:
        raise ValueError(f"slot_length must be an integer above max_new_tokens ({new_tokens}): room for a prompt "
                         f"and its new tokens, got {slot_length!r}")
    if slot_logprobs is None:
        slot_logprobs = DEFAULT_SLOT_LOGPROBS
    if not is_integer(slot_logprobs) or not 0 <= slot_logprobs <= exporter.vocab_size:
        raise ValueError(f"slot_logprobs must be an integer in [0, {exporter.vocab_size}] (0: the slot state records "
                         f"no log-probabilities), got {slot_logprobs!r}")
    spec, knobs = exporter.plan(SIGNATURES["sample"])
    return SlotPrograms(exporter.model, spec, knobs, pad_token_id=exporter.pad_token_id, slots=int(slots),
                        length=int(slot_length), budget_cap=new_tokens, max_positions=positions,
                        top_logprobs=int(slot_logprobs))


def slot_functions(programs: SlotPrograms, jit_compile: bool = True) -> dict:
    """{signature name: concrete function} of the three slot signatures."""
    state_specs = programs.state_specs()
    row_specs = {f"new_{name}": tf.TensorSpec([None, *shape], dtype, name=f"new_{name}")
                 for name, (dtype, shape) in INSERT_INPUTS.items()}
    steps_specs = {"max_steps": tf.TensorSpec([], tf.int32, name="max_steps"),
                   "release": tf.TensorSpec([programs.slots], tf.bool, name="release")}
    if programs.top_logprobs:  # the slots whose requests want log-probabilities (see SlotPrograms.steps)
        steps_specs["record_logprobs"] = tf.TensorSpec([programs.slots], tf.bool, name="record_logprobs")
    insert_program = tf.function(programs.insert, jit_compile=jit_compile, autograph=False)
    steps_program = tf.function(programs.steps, jit_compile=jit_compile, autograph=False, reduce_retracing=False)

    def init():
        return programs.init_state().to_flat()

    def insert(inputs):
        state = programs.state_from_flat({name: inputs[name] for name in state_specs})
        rows = {name: inputs[f"new_{name}"] for name in INSERT_INPUTS}
        return insert_program(state, rows).to_flat()

    def steps_over(rows):
        def steps(inputs):
            state = programs.state_from_flat({name: inputs[name] for name in state_specs})
            return steps_program(state, inputs["max_steps"], inputs["release"], rows,
                                 inputs.get("record_logprobs")).to_flat()

        return tf.function(steps, input_signature=[{**state_specs, **steps_specs}], autograph=False)

    functions = {
        "slot_init": tf.function(init, input_signature=[], autograph=False).get_concrete_function(),
        "slot_insert": tf.function(insert, input_signature=[{**state_specs, **row_specs}],
                                   autograph=False).get_concrete_function(),
    }
    # `slot_steps` runs every slot; `slot_steps_<n>` only slots [0, n) (a lightly loaded engine's cheaper step).
    for rows in programs.row_buckets():
        name = "slot_steps" if rows == programs.slots else f"slot_steps_{rows}"
        functions[name] = steps_over(rows).get_concrete_function()
    return functions


def slot_info(programs: SlotPrograms, config) -> dict:
    """What a driver needs besides the signatures (written to `assets.extra/tfgen_export.json` under "slots"):
    sizes, the pad id, and the config's sampling defaults (what `serving_default` / `generate_text` decode with)."""
    defaults = {name: programs.row_knobs[name].item() for name in REQUEST_KNOBS if name in programs.row_knobs}
    return {
        "slots": programs.slots, "length": programs.length, "row_buckets": programs.row_buckets(),
        "max_new_tokens": programs.budget_cap, "pad_token_id": programs.pad_token_id, "vocab_size": programs.vocab_size,
        "max_positions": programs.max_positions, "top_logprobs": programs.top_logprobs,
        "serving_default_mode": config.get_generation_mode().value, "knobs": defaults,
    }


__all__ = ["DEFAULT_SLOT_LOGPROBS", "DEFAULT_SLOTS", "INSERT_INPUTS", "SLOT_SIGNATURES", "export_slot_programs",
           "slot_functions", "slot_info"]
