"""tfgen.export on an encoder-decoder model (T5): the signatures take the encoder input, the decoder starts from
`decoder_start_token_id`, and the exported serving_default / greedy / sample / beam_search / contrastive signatures
equal in-process generate()
token for token; bad requests fail in the graph like a decoder-only export's; `tfgen serve` answers :predict with the
same tokens.

One tiny random T5 is exported once (XLA, five signatures) and loaded once, through `tfgen.serving.load_export`
(`tf.saved_model.load` underneath), so the direct calls and the server share its compiled programs. The references
run generate() eagerly (`jit_compile=False`), as in test_export.py.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
import tensorflow as tf
from t5_checkpoints import build_branching_model, word_level_t5_tokenizer
from test_export import within_budget
from test_serve import as_columns, as_instances, call
from test_t5_generate import NEW_TOKENS, encoder_batch, mid_way_eos

from tfgen.export import export_saved_model
from tfgen.export.saved_model import EXPORT_INFO_FILE
from tfgen.serving import ModelServer, load_export, start_in_thread

pytestmark = pytest.mark.slow

MODEL = "t5"
NUM_BEAMS = 3
GREEDY_BUDGETS = [NEW_TOKENS, 4, NEW_TOKENS]
SAMPLE_ROWS = {"seed": [[1, 2], [3, 4], [5, 6]], "temperature": [0.8] * 3, "top_k": [20] * 3, "top_p": [0.9] * 3,
               "max_new_tokens": [NEW_TOKENS] * 3}
BEAM_ROWS = {"length_penalty": [1.0] * 3, "max_new_tokens": [NEW_TOKENS] * 3}
CONTRASTIVE_ROWS = {"penalty_alpha": [0.5] * 3, "max_new_tokens": [NEW_TOKENS] * 3}
TOP_K = 4
SIGNATURE_NAMES = ["serving_default", "greedy", "sample", "beam_search", "contrastive"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(HF model, tfgen model, eos ids, version directory, export seconds) of the one export."""
    hf_model, model = build_branching_model("t5", tmp_path_factory.mktemp("t5_export_checkpoint"))
    ids, mask = encoder_batch()
    eos_token_ids = [1, mid_way_eos(hf_model, ids, mask)]
    config = model.generation_config.copy()
    config.update(eos_token_id=eos_token_ids)
    began = time.perf_counter()
    version_dir = export_saved_model(model, tmp_path_factory.mktemp("t5_exports") / MODEL, config,
                                     max_new_tokens=NEW_TOKENS, signatures=SIGNATURE_NAMES, num_beams=NUM_BEAMS,
                                     contrastive_top_k=TOP_K)
    seconds = time.perf_counter() - began
    print(f"t5 export ({', '.join(SIGNATURE_NAMES)}): {seconds:.1f} s")
    return hf_model, model, eos_token_ids, version_dir, seconds


@pytest.fixture(scope="module")
def served(built):
    began = time.perf_counter()
    # As `tfgen serve` loads it: the warm-up requests (one compile per signature for the warm-up shape) and
    # continuous batching asked for, which an export without slot signatures declines.
    loaded = load_export(os.path.dirname(built[3]), MODEL, batching={"steps_per_call": 4})
    print(f"t5 export load with warm-up: {time.perf_counter() - began:.1f} s")
    return loaded


@pytest.fixture(scope="module")
def references(built) -> dict:
    _, model, eos_token_ids, _, _ = built
    ids, mask = encoder_batch()
    common = {"max_new_tokens": NEW_TOKENS, "eos_token_id": eos_token_ids, "jit_compile": False}
    greedy = model.generate(ids, attention_mask=mask, **common).numpy()
    sample = model.generate(ids, attention_mask=mask, do_sample=True, seed=np.array(SAMPLE_ROWS["seed"]),
                            temperature=0.8, top_k=20, top_p=0.9, **common).numpy()
    beam = model.generate(ids, attention_mask=mask, num_beams=NUM_BEAMS, length_penalty=1.0,
                          return_dict_in_generate=True, **common)
    contrastive = model.generate(ids, attention_mask=mask, penalty_alpha=0.5, top_k=TOP_K, **common).numpy()
    return {"greedy": greedy, "sample": sample, "beam": beam.sequences.numpy(),
            "beam_scores": beam.sequences_scores.numpy(), "contrastive": contrastive}


def _inputs(rows: dict, left_padded: bool = False) -> dict:
    ids, mask = encoder_batch()
    if left_padded:  # the same rows, padded on the other side
        shifts = ids.shape[1] - mask.sum(axis=1)
        ids, mask = (np.stack([np.roll(row, shift) for row, shift in zip(array, shifts)]) for array in (ids, mask))
    return {"input_ids": ids, "attention_mask": mask, **{name: np.asarray(value) for name, value in rows.items()}}


def _run(served, name: str, rows: dict, left_padded: bool = False) -> dict:
    dtypes = {"temperature": np.float32, "top_p": np.float32, "length_penalty": np.float32,
              "penalty_alpha": np.float32}
    inputs = {key: value.astype(dtypes.get(key, np.int32)) for key, value in _inputs(rows, left_padded).items()}
    began = time.perf_counter()
    outputs = served.predict(name, inputs)
    print(f"t5 {name} first call (XLA compile + run): {time.perf_counter() - began:.1f} s")
    return outputs


def test_encoder_decoder_signatures_and_export_info(built):
    with open(os.path.join(built[3], "assets.extra", EXPORT_INFO_FILE), encoding="utf-8") as file:
        info = json.load(file)
    assert set(info["signatures"]) == set(SIGNATURE_NAMES)
    assert info["encoder_decoder"] == {"decoder_start_token_id": 0}
    assert "slots" not in info


@pytest.mark.parametrize("change, match", [
    ({"signatures": ["greedy", "prompt_lookup"]}, "row_cache_index"),
    ({"signatures": ["greedy", "generate_text"]}, "generate_text cannot be exported for an encoder-decoder"),
    ({"slots": 2}, "slots: the slot signatures need"),
])
def test_what_an_encoder_decoder_export_cannot_hold_is_refused(built, tmp_path, change, match):
    with pytest.raises(ValueError, match=match):
        export_saved_model(built[1], tmp_path / "refused", max_new_tokens=NEW_TOKENS, **change)
    assert not os.path.exists(tmp_path / "refused" / "1")


def test_greedy_signature_matches_generate(served, built, references):
    outputs = _run(served, "greedy", {"max_new_tokens": GREEDY_BUDGETS})
    assert outputs["sequences"].shape == (3, 1 + NEW_TOKENS)
    expected, lengths = within_budget(references["greedy"], 1, GREEDY_BUDGETS, built[2], 0)
    np.testing.assert_array_equal(outputs["sequences"], expected)
    assert outputs["sequence_lengths"].tolist() == lengths
    assert (outputs["sequences"][:, 0] == 0).all()  # the decoder start token first
    assert min(lengths) < 1 + NEW_TOKENS == max(lengths)  # a row stopped at the mid-way eos or its budget
    # Left padding gives the same tokens (the encoder attends both ways).
    np.testing.assert_array_equal(_run(served, "greedy", {"max_new_tokens": GREEDY_BUDGETS}, True)["sequences"],
                                  expected)
    # serving_default decodes the exported (greedy) config with the whole buffer.
    np.testing.assert_array_equal(_run(served, "serving_default", {})["sequences"], references["greedy"])


def test_sample_signature_matches_seeded_generate(served, references):
    outputs = _run(served, "sample", SAMPLE_ROWS)
    np.testing.assert_array_equal(outputs["sequences"], references["sample"])
    assert not np.array_equal(references["sample"], references["greedy"])  # it really sampled


def test_beam_search_signature_matches_generate(served, references):
    outputs = _run(served, "beam_search", BEAM_ROWS)
    np.testing.assert_array_equal(outputs["sequences"], references["beam"])
    np.testing.assert_allclose(outputs["sequences_scores"], references["beam_scores"], atol=1e-5)


def test_contrastive_signature_matches_generate(served, references):
    np.testing.assert_array_equal(_run(served, "contrastive", CONTRASTIVE_ROWS)["sequences"], references["contrastive"])


@pytest.mark.parametrize("change, match", [
    ({"input_ids": [[13, 7, 500, 1]]}, r"token ids must be in \[0, 99\)"),
    ({"attention_mask": [[1, 1, 1, 1], [0, 0, 0, 0]], "input_ids": [[13, 7, 42, 1], [0, 0, 0, 0]]},
     "every row needs at least one token"),
])
def test_bad_encoder_inputs_fail_in_the_graph(built, served, change, match):
    inputs = {"input_ids": [[13, 7, 42, 1]], "attention_mask": [[1, 1, 1, 1]], **change}
    inputs = {name: tf.constant(value, tf.int32) for name, value in inputs.items()}
    rows = len(inputs["input_ids"])
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        served.signatures["greedy"](**inputs, max_new_tokens=tf.fill([rows], NEW_TOKENS))


def test_serve_predict_matches_generate(served, built, references):
    assert served.engine is None  # every request runs its signature as a whole call
    server = ModelServer(served, port=0)
    start_in_thread(server)
    try:
        body = {"signature_name": "greedy", "instances": as_instances(
            {name: value.tolist() for name, value in _inputs({"max_new_tokens": GREEDY_BUDGETS}).items()})}
        code, answer = call(server, "POST", f"/v1/models/{MODEL}:predict", body)
        assert code == 200, answer
        expected, lengths = within_budget(references["greedy"], 1, GREEDY_BUDGETS, built[2], 0)
        assert as_columns(answer["predictions"]) == {"sequences": expected.tolist(), "sequence_lengths": lengths}
        bad = {"signature_name": "greedy",
               "inputs": {"input_ids": [[5, 500]], "attention_mask": [[1, 1]], "max_new_tokens": [3]}}
        code, answer = call(server, "POST", f"/v1/models/{MODEL}:predict", bad)
        assert code == 400 and "token ids must be in [0, 99)" in answer["error"], answer
    finally:
        server.shutdown()
        server.server_close()


def test_cli_export_of_a_t5_directory_leaves_out_what_it_cannot_hold(tmp_path, capsys):
    """`tfgen export --model T5_DIR` with a tokenizer in the folder: every signature an encoder-decoder can hold; the
    text signature (a decoder-only prompt), prompt lookup and the slots stay out of the defaults."""
    from tfgen.cli import main

    checkpoint = tmp_path / "t5"
    build_branching_model("t5", checkpoint)
    word_level_t5_tokenizer().save_pretrained(checkpoint)
    out = tmp_path / "exported"
    assert main(["export", str(out), "--model", str(checkpoint), "--no-jit", "--max-new-tokens", "2"]) == 0
    assert capsys.readouterr().out.strip() == str(out / "1")
    info = json.loads((out / "1" / "assets.extra" / EXPORT_INFO_FILE).read_text())
    assert set(info["signatures"]) == set(SIGNATURE_NAMES) and "slots" not in info
