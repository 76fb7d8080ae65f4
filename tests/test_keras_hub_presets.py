"""A keras-hub preset directory (`causal_lm.save_to_preset`) through tfgen: `from_pretrained`, the keras-hub
tokenizer behind tfgen's interface (text in, text out), `tfgen generate --model ./preset`, and an export whose TF
Serving REST `:predict` answers (token and text signatures) equal in-process generate."""

from __future__ import annotations

import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")

from keras_hub_models import randomize  # noqa: E402

import tfgen  # noqa: E402
from tfgen.keras_hub import KerasHubCausalLM, KerasHubTokenizer  # noqa: E402

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
LETTERS = list("abcdefghijklmnopqrstuvwxyz") + ["Ġ"]
MERGES = ["Ġ q", "u i", "c k", "ui ck", "Ġq uick", "Ġ f", "o x", "Ġf ox", "Ġ a", "t h", "Ġ th", "Ġth e"]
TEXTS = ["a quick fox and the fox", "the fox"]
NEW_TOKENS = 6


def _vocabulary() -> dict[str, int]:
    tokens = SPECIALS + LETTERS
    for merge in MERGES:
        tokens.append(merge.replace(" ", ""))
    return {token: index for index, token in enumerate(dict.fromkeys(tokens))}


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    """A tiny Llama 3 preset with a byte-level BPE tokenizer, saved by keras-hub itself."""
    tokenizer = keras_hub.models.Llama3Tokenizer(vocabulary=_vocabulary(), merges=MERGES)
    preprocessor = keras_hub.models.Llama3CausalLMPreprocessor(tokenizer, sequence_length=24)
    backbone = keras_hub.models.Llama3Backbone(vocabulary_size=64, num_layers=2, num_query_heads=4,
                                               num_key_value_heads=2, hidden_dim=32, intermediate_dim=48)
    causal_lm = keras_hub.models.Llama3CausalLM(backbone=backbone, preprocessor=preprocessor)
    randomize(causal_lm, 3)
    causal_lm.compile(sampler="greedy")
    directory = tmp_path_factory.mktemp("llama3-preset")
    causal_lm.save_to_preset(str(directory))
    return directory, causal_lm


@pytest.fixture(scope="module")
def loaded(preset):
    directory, _ = preset
    return tfgen.AutoModelForCausalLM.from_pretrained(directory), tfgen.AutoTokenizer.from_pretrained(directory)


def test_preset_loads_as_a_wrapped_model_with_keras_hubs_tokenizer(preset, loaded):
    _, causal_lm = preset
    model, tokenizer = loaded
    assert isinstance(model, KerasHubCausalLM) and isinstance(tokenizer, KerasHubTokenizer)
    # Defaults read from the preset: keras-hub's default sampler (a preset does not store `compile()`: top-k, k=5),
    # its sequence length, the two stop tokens of Llama 3.
    config = model.generation_config
    assert (config.do_sample, config.top_k, config.max_length) == (True, 5, 24)
    assert sorted(config.eos_token_id) == sorted([tokenizer.layer.token_to_id(t) for t in
                                                  ("<|end_of_text|>", "<|eot_id|>")])
    # The ids keras-hub's own generate() would start from (start token first), left padded.
    batch = tokenizer(TEXTS)
    packed = causal_lm.preprocessor.generate_preprocess(TEXTS, sequence_length=16)
    for row, (ids, mask) in enumerate(zip(np.asarray(packed["token_ids"]), np.asarray(packed["padding_mask"]))):
        ours = batch["input_ids"][row][batch["attention_mask"][row] == 1]
        np.testing.assert_array_equal(ours, ids[mask])
    assert batch["attention_mask"][1].tolist()[0] == 0  # the shorter row is padded on the left
    assert tokenizer.batch_decode(batch["input_ids"], skip_special_tokens=True) == TEXTS
    assert tokenizer.decode(batch["input_ids"][0]).startswith("<|begin_of_text|>")


def test_tfgen_generate_cli_runs_a_preset(preset, loaded, capsys):
    from tfgen.cli import main as cli_main

    directory, _ = preset
    model, tokenizer = loaded
    assert cli_main(["generate", "--model", str(directory), "--max-new-tokens", str(NEW_TOKENS), "--no-stream",
                     "--greedy", TEXTS[0]]) == 0
    printed = capsys.readouterr().out
    encoded = tokenizer(TEXTS[0])
    expected = model.generate(encoded["input_ids"], attention_mask=encoded["attention_mask"],
                              max_new_tokens=NEW_TOKENS, do_sample=False)
    expected_text = tokenizer.decode(np.asarray(expected)[0, encoded["input_ids"].shape[1]:],
                                     skip_special_tokens=True)
    assert expected_text and expected_text in printed


def test_exported_model_answers_rest_predict_like_generate(loaded, tmp_path):
    from test_serve import as_columns, as_instances, call

    from tfgen.serving import ModelServer, load_export, start_in_thread

    model, tokenizer = loaded
    out = tmp_path / "export"
    # serving_default (and generate_text, serving_default on text) decode greedily with this config.
    greedy = model.generation_config.copy()
    greedy.update(do_sample=False, top_k=None)
    tfgen.export_saved_model(model, out, greedy, max_new_tokens=NEW_TOKENS, tokenizer=tokenizer,
                             signatures=["greedy", "generate_text"])
    server = ModelServer(load_export(str(out), "khub"), port=0)
    start_in_thread(server)
    try:
        encoded = tokenizer(TEXTS)
        columns = {"input_ids": encoded["input_ids"].tolist(), "attention_mask": encoded["attention_mask"].tolist(),
                   "max_new_tokens": [NEW_TOKENS] * len(TEXTS)}
        status, answer = call(server, "POST", "/v1/models/khub:predict",
                              {"signature_name": "greedy", "instances": as_instances(columns)})
        text_status, text_answer = call(server, "POST", "/v1/models/khub:predict",
                                        {"signature_name": "generate_text", "instances": TEXTS})
    finally:
        server.shutdown()
        server.server_close()
    assert (status, text_status) == (200, 200), (answer, text_answer)
    reference = np.asarray(model.generate(encoded["input_ids"], attention_mask=encoded["attention_mask"],
                                          max_new_tokens=NEW_TOKENS, do_sample=False))
    width = encoded["input_ids"].shape[1]
    predicted = as_columns(answer["predictions"])
    eos = set(model.generation_config.eos_token_id)
    for row in range(len(TEXTS)):
        generated = reference[row, width:].tolist()
        stop = next((i + 1 for i, token in enumerate(generated) if token in eos), len(generated))
        assert predicted["sequences"][row][width:width + stop] == generated[:stop]
        assert predicted["sequence_lengths"][row] == width + stop
        assert text_answer["predictions"][row] == tokenizer.decode(generated[:stop], skip_special_tokens=True)


def test_tfgen_batch_runs_a_preset(preset, loaded, tmp_path):
    import json

    from tfgen.cli import main as cli_main

    directory, _ = preset
    model, tokenizer = loaded
    rows = tmp_path / "in.jsonl"
    rows.write_text("".join(json.dumps({"id": str(i), "prompt": text}) + "\n" for i, text in enumerate(TEXTS)))
    output = tmp_path / "out.jsonl"
    assert cli_main(["batch", "--model", str(directory), "--input", str(rows), "--output", str(output),
                     "--max-new-tokens", str(NEW_TOKENS), "--greedy", "--no-progress"]) == 0
    results = {row["id"]: row for row in map(json.loads, output.read_text().splitlines())}
    for index, text in enumerate(TEXTS):
        encoded = tokenizer(text)
        width = encoded["input_ids"].shape[1]
        expected = np.asarray(model.generate(encoded["input_ids"], attention_mask=encoded["attention_mask"],
                                             max_new_tokens=NEW_TOKENS, do_sample=False))[0, width:]
        eos = model.generation_config.eos_token_id
        stop = next((i + 1 for i, token in enumerate(expected) if token in eos), len(expected))
        assert results[str(index)]["token_ids"] == expected[:stop].tolist()
        assert results[str(index)]["text"] == tokenizer.decode(expected[:stop], skip_special_tokens=True)


def test_stop_strings_and_streaming_work_with_keras_hubs_tokenizer(loaded):
    model, tokenizer = loaded
    encoded = tokenizer(TEXTS[:1])
    width = encoded["input_ids"].shape[1]
    options = dict(attention_mask=encoded["attention_mask"], max_new_tokens=NEW_TOKENS, do_sample=False, top_k=None,
                   eos_token_id=None)
    free = np.asarray(model.generate(encoded["input_ids"], **options))[0, width:]
    # A stop string that the third generated token completes (its text's last character, after the first two).
    text_before = tokenizer.decode(free[:2])
    stop = tokenizer.decode(free[:3])[len(text_before):][-1:]
    assert stop and stop not in text_before
    stopped = np.asarray(model.generate(encoded["input_ids"], stop_strings=[stop], tokenizer=tokenizer, **options))
    np.testing.assert_array_equal(stopped[0, width:width + 3], free[:3])
    assert (stopped[0, width + 3:] == tokenizer.pad_token_id).all()

    streamer = tfgen.TextIteratorStreamer(tokenizer, skip_prompt=True)
    model.generate(encoded["input_ids"], streamer=streamer, **options)
    assert "".join(streamer) == tokenizer.decode(free, skip_special_tokens=True)
