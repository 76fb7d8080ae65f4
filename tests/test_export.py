"""tfgen.export: the exported SavedModel, run where tfgen cannot be imported, matches in-process generate().

Two exports of the tiny model are built once per process (and shared with test_serve.py): an XLA one with the
model's greedy config, and a `jit_compile=False` one with a sampling config and every signature. Each is run in
a subprocess whose sys.path lacks the repo — through the TF1 session loader (TF Serving's path) and
`tf.saved_model.load` — and compared token for token with `generate()`. The references run generate() eagerly
(`jit_compile=False`), which gives the compiled program's tokens (tested in test_generate_*) without spending
an XLA compilation per reference on this 2-core machine.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import subprocess
import sys
import sysconfig

import numpy as np
import pytest
from conftest import left_padded_batch

from tfgen import Tokenizer
from tfgen.export import SIGNATURES, default_row_seeds, export_saved_model

MAX_NEW_TOKENS = 8
PROMPTS = [[5, 6, 7], [3, 4, 5, 6, 7], [9, 8]]
GREEDY_BUDGETS = [3, MAX_NEW_TOKENS, 0]
# Row 0 uses every warper, row 1 only neutral values (plain sampling), row 2 top_k=1 (must equal greedy).
SAMPLE_ROWS = {
    "seed": [[1, 2], [3, 4], [5, 6]],
    "temperature": [0.7, 1.0, 1.5],
    "top_k": [5, 0, 1],
    "top_p": [0.9, 1.0, 1.0],
    "max_new_tokens": [MAX_NEW_TOKENS, 5, MAX_NEW_TOKENS],
}
SAMPLING_OPTIONS = {"do_sample": True, "top_k": 8, "temperature": 0.9}
# Per-row knobs of the beam_search / contrastive signatures (values exact in float32, the inputs' dtype).
BEAM_ROWS = {"length_penalty": [1.0, 0.5, 2.0], "max_new_tokens": [MAX_NEW_TOKENS, MAX_NEW_TOKENS, 5]}
CONTRASTIVE_ROWS = {"penalty_alpha": [0.5, 0.25, 0.75], "max_new_tokens": [MAX_NEW_TOKENS, 6, MAX_NEW_TOKENS]}
EXPORTED_NUM_BEAMS, EXPORTED_TOP_K = 3, 4
# Draft tokens of the prompt_lookup signature (its n-gram size stays the default, 2); budgets: one that a round can
# overshoot, the full one (row 1 stops at its extra eos first), none.
EXPORTED_DRAFT_TOKENS = 3
PROMPT_LOOKUP_BUDGETS = [5, MAX_NEW_TOKENS, 0]
TEXTS = ["the quick brown", "lazy dog", "over the fox jumps"]
_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog"]


def bpe_tokenizer() -> Tokenizer:
    """A byte-level BPE over the tiny model's ids (<pad>=0, <s>=1, </s>=2), trained on a few English words."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=97, special_tokens=["<pad>", "<s>", "</s>"], show_progress=False)
    backend.train_from_iterator([" ".join(words) for words in itertools.permutations(_WORDS, 3)], trainer)
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    return Tokenizer(backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def requests() -> dict:
    """Inputs for every signature, as JSON-ready lists."""
    ids, mask = left_padded_batch(PROMPTS)
    prompt = {"input_ids": ids.tolist(), "attention_mask": mask.tolist()}
    return {
        "serving_default": prompt,
        "greedy": {**prompt, "max_new_tokens": GREEDY_BUDGETS},
        "sample": {**prompt, **SAMPLE_ROWS},
        "beam_search": {**prompt, **BEAM_ROWS},
        "contrastive": {**prompt, **CONTRASTIVE_ROWS},
        "prompt_lookup": {**prompt, "max_new_tokens": PROMPT_LOOKUP_BUDGETS},
        "generate_text": {"text": TEXTS},
    }


@dataclasses.dataclass
class Exports:
    jit: str  # version folder: XLA, the model's greedy config, serving_default and greedy (one program)
    portable: str  # version folder: jit_compile=False, SAMPLING_OPTIONS, every signature
    eos_token_ids: list  # both configs' eos: the model's plus a token greedy search produces early
    tokenizer: Tokenizer


_BUILT: dict = {}  # built once per process (tiny_model is session-scoped), shared with test_serve.py


def build_exports(tmp_path_factory, tiny_model) -> Exports:
    if "exports" not in _BUILT:
        _BUILT["exports"] = _export_tiny_model(tmp_path_factory, tiny_model)
    return _BUILT["exports"]


def build_references(tiny_model, eos_token_ids) -> dict:
    if "references" not in _BUILT:
        _BUILT["references"] = _generate_references(tiny_model, eos_token_ids)
    return _BUILT["references"]


def _export_tiny_model(tmp_path_factory, tiny_model) -> Exports:
    ids, mask = left_padded_batch(PROMPTS)
    greedy = tiny_model.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW_TOKENS, jit_compile=False).numpy()
    # An extra eos that row 1 reaches mid-way, so sequence_lengths and padding after eos are exercised.
    row = greedy[1, ids.shape[1]:].tolist()
    stop_token = next(token for index, token in enumerate(row) if index >= 2 and token not in row[:index])
    eos_token_ids = [tiny_model.generation_config.eos_token_id, stop_token]
    greedy_config = tiny_model.generation_config.copy()
    greedy_config.update(eos_token_id=eos_token_ids)
    sampling_config = greedy_config.copy()
    sampling_config.update(**SAMPLING_OPTIONS)
    tokenizer = bpe_tokenizer()
    root = tmp_path_factory.mktemp("exports")
    choices = dict(num_beams=EXPORTED_NUM_BEAMS, contrastive_top_k=EXPORTED_TOP_K,
                   prompt_lookup_num_tokens=EXPORTED_DRAFT_TOKENS)
    # prompt_lookup only in the portable export: compiling it in the XLA one would add about 20 s to these tests.
    jit = export_saved_model(tiny_model, root / "jit", greedy_config, max_new_tokens=MAX_NEW_TOKENS,
                             signatures=["serving_default", "greedy", "beam_search", "contrastive"], **choices)
    portable = export_saved_model(tiny_model, root / "portable", sampling_config, max_new_tokens=MAX_NEW_TOKENS,
                                  jit_compile=False, tokenizer=tokenizer, **choices)
    return Exports(jit, portable, eos_token_ids, tokenizer)


def _generate_references(tiny_model, eos_token_ids) -> dict:
    """What in-process generate() returns for `requests()` (greedy, per-row sampling, seeded default sampling)."""
    ids, mask = left_padded_batch(PROMPTS)
    common = {"max_new_tokens": MAX_NEW_TOKENS, "eos_token_id": list(eos_token_ids), "jit_compile": False}
    greedy = tiny_model.generate(ids, attention_mask=mask, **common).numpy()
    sampled_rows = []
    for row in range(2):  # row 2 (top_k=1) is compared with greedy search instead
        options = {name: SAMPLE_ROWS[name][row] for name in ("temperature", "top_k", "top_p")}
        sampled_rows.append(tiny_model.generate(
            ids[row:row + 1], attention_mask=mask[row:row + 1], do_sample=True,
            seed=[SAMPLE_ROWS["seed"][row]], **options, **common,
        ).numpy()[0])
    default_sampling = tiny_model.generate(
        ids, attention_mask=mask, seed=default_row_seeds(ids, mask).numpy(), **SAMPLING_OPTIONS, **common
    ).numpy()
    beam_rows, beam_scores, contrastive_rows = [], [], []
    for row, prompt in enumerate(PROMPTS):
        # Each row alone, unpadded, with its own knobs: the signature's row must not depend on its batch.
        alone = {**common, "max_new_tokens": BEAM_ROWS["max_new_tokens"][row], "do_sample": False}
        out = tiny_model.generate([prompt], num_beams=EXPORTED_NUM_BEAMS, return_dict_in_generate=True,
                                  length_penalty=BEAM_ROWS["length_penalty"][row], **alone)
        beam_rows.append(out.sequences.numpy()[0, len(prompt):])
        beam_scores.append(float(out.sequences_scores.numpy()[0]))
        alone["max_new_tokens"] = CONTRASTIVE_ROWS["max_new_tokens"][row]
        contrastive_rows.append(tiny_model.generate(
            [prompt], top_k=EXPORTED_TOP_K, penalty_alpha=CONTRASTIVE_ROWS["penalty_alpha"][row], **alone
        ).numpy()[0, len(prompt):])
    return {"greedy": greedy, "sampled_rows": sampled_rows, "default_sampling": default_sampling,
            "beam_rows": beam_rows, "beam_scores": beam_scores, "contrastive_rows": contrastive_rows}


def text_reference(tiny_model, tokenizer: Tokenizer, eos_token_ids) -> list[str]:
    """generate_text's expected output: tokenize in Python, sample like serving_default, decode the new tokens."""
    batch = tokenizer(TEXTS)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    sequences = tiny_model.generate(
        ids, attention_mask=mask, seed=default_row_seeds(ids, mask).numpy(), max_new_tokens=MAX_NEW_TOKENS,
        eos_token_id=list(eos_token_ids), jit_compile=False, **SAMPLING_OPTIONS,
    ).numpy()
    return tokenizer.batch_decode(sequences[:, ids.shape[1]:], skip_special_tokens=True)


def within_budget(sequences: np.ndarray, width: int, budgets, eos_token_ids, pad_token_id: int):
    """`sequences` cut to each row's budget (pad after it) and the TF-Serving `sequence_lengths` they imply."""
    expected = np.array(sequences)
    lengths = []
    for row, budget in enumerate(budgets):
        generated = expected[row, width:width + budget].tolist()
        count = next((i + 1 for i, token in enumerate(generated) if token in eos_token_ids), len(generated))
        expected[row, width + count:] = pad_token_id
        lengths.append(width + count)
    return expected, lengths


_ISOLATED_RUNNER = r"""
import ctypes, json, os, sys
export_dir, request_file, xla, site_packages = sys.argv[1:5]
sys.path.append(site_packages)
try:
    import tfgen
    tfgen_importable = True
except ImportError:
    tfgen_importable = False
import numpy as np
import tensorflow as tf
import tensorflow_text  # registers the TF Text ops of generate_text, as TF Serving links them in

libtensorflow = ctypes.CDLL(os.path.join(os.path.dirname(tf.__file__), "libtensorflow_cc.so.2"))
disable_xla = libtensorflow._ZN10tensorflow21DisableXlaCompilationEv  # what tensorflow_model_server calls
if xla == "disable-xla-first":
    disable_xla()
requests = json.load(open(request_file))
dtypes = {"temperature": np.float32, "top_p": np.float32, "length_penalty": np.float32, "penalty_alpha": np.float32}
plain = lambda array: np.char.decode(array.astype(bytes)).tolist() if array.dtype == object else array.tolist()
results = {"tfgen_importable": tfgen_importable, "saved_model.load": {}, "tf1_session": {}}
with tf.compat.v1.Session(graph=tf.Graph()) as session:
    meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
    names = [name for name in requests if name in meta_graph.signature_def]
    feeds = {name: {key: np.array([v.encode() for v in value], object) if key == "text"
                    else np.array(value, dtypes.get(key, np.int32)) for key, value in requests[name].items()}
             for name in names}
    fetches = {name: {key: info.name for key, info in meta_graph.signature_def[name].outputs.items()} for name in names}
    feed_dict = {meta_graph.signature_def[name].inputs[key].name: value
                 for name in names for key, value in feeds[name].items()}
    for name, outputs in session.run(fetches, feed_dict).items():
        results["tf1_session"][name] = {key: plain(value) for key, value in outputs.items()}
# The session above optimized the graph as TF Serving does; this path skips Grappler, which would spend
# seconds per signature again on a 2-core machine.
tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
loaded = tf.saved_model.load(export_dir)
for name in names:
    outputs = loaded.signatures[name](**{key: tf.constant(value) for key, value in feeds[name].items()})
    results["saved_model.load"][name] = {key: plain(value.numpy()) for key, value in outputs.items()}
if xla == "disable-xla-after":
    disable_xla()
    try:  # a new shape, so nothing compiled earlier is reused
        loaded.signatures["serving_default"](input_ids=tf.constant([[5, 6]]), attention_mask=tf.constant([[1, 1]]))
        results["error_without_xla"] = None
    except tf.errors.OpError as error:
        results["error_without_xla"] = error.message
json.dump(results, sys.stdout)
"""


def _start_isolated(export_dir, request_file, xla_mode: str) -> subprocess.Popen:
    # -I -S: no site module (so no editable-install hook), no user site, no cwd on sys.path; the runner adds
    # the plain site-packages folder itself.
    command = [sys.executable, "-I", "-S", "-c", _ISOLATED_RUNNER, str(export_dir), str(request_file), xla_mode,
               sysconfig.get_paths()["purelib"]]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
                            cwd=os.path.dirname(str(export_dir)))


@functools.cache
def _finished(process: subprocess.Popen) -> dict:
    stdout, stderr = process.communicate(timeout=900)
    assert process.returncode == 0, stderr[-3000:]
    return json.loads(stdout)


@pytest.fixture(scope="module")
def exports(tmp_path_factory, tiny_model) -> Exports:
    return build_exports(tmp_path_factory, tiny_model)


@pytest.fixture(scope="module")
def references(tiny_model, exports) -> dict:
    return build_references(tiny_model, exports.eos_token_ids)


@pytest.fixture(scope="module")
def isolated_runs(exports, tmp_path_factory) -> dict:
    """Both exports run at once in isolated subprocesses: export name -> process (see `_finished`)."""
    request_file = tmp_path_factory.mktemp("requests") / "requests.json"
    request_file.write_text(json.dumps(requests()))
    return {
        # TF Serving's default (XLA compilation disabled) must still run the portable export...
        "portable": _start_isolated(exports.portable, request_file, "disable-xla-first"),
        # ...and refuse the XLA one, which runs with XLA on.
        "jit": _start_isolated(exports.jit, request_file, "disable-xla-after"),
    }


@pytest.fixture(scope="module", params=["jit", "portable"])
def isolated(request, isolated_runs) -> tuple[str, dict]:
    """(export name, results of its isolated run)."""
    return request.param, _finished(isolated_runs[request.param])


@pytest.fixture(scope="module")
def portable_results(isolated_runs) -> dict:
    return _finished(isolated_runs["portable"])


LOADERS = ["tf1_session", "saved_model.load"]


@pytest.mark.slow
def test_signature_defs_leave_batch_and_prompt_length_open(exports):
    from tensorflow.core.protobuf import saved_model_pb2

    with open(os.path.join(exports.portable, "saved_model.pb"), "rb") as file:
        signature_defs = saved_model_pb2.SavedModel.FromString(file.read()).meta_graphs[0].signature_def

    def layout(tensors):
        return {name: (info.dtype, [dim.size for dim in info.tensor_shape.dim]) for name, info in tensors.items()}

    int32, float32, string = 3, 1, 7  # DataType enum values
    prompt = {"input_ids": (int32, [-1, -1]), "attention_mask": (int32, [-1, -1])}
    outputs = {"sequences": (int32, [-1, -1]), "sequence_lengths": (int32, [-1])}
    assert set(SIGNATURES) <= set(signature_defs)
    assert layout(signature_defs["serving_default"].inputs) == prompt
    assert layout(signature_defs["greedy"].inputs) == {**prompt, "max_new_tokens": (int32, [-1])}
    assert layout(signature_defs["sample"].inputs) == {
        **prompt, "seed": (int32, [-1, 2]), "temperature": (float32, [-1]), "top_k": (int32, [-1]),
        "top_p": (float32, [-1]), "max_new_tokens": (int32, [-1]),
    }
    assert layout(signature_defs["beam_search"].inputs) == {
        **prompt, "length_penalty": (float32, [-1]), "max_new_tokens": (int32, [-1]),
    }
    assert layout(signature_defs["contrastive"].inputs) == {
        **prompt, "penalty_alpha": (float32, [-1]), "max_new_tokens": (int32, [-1]),
    }
    assert layout(signature_defs["prompt_lookup"].inputs) == {**prompt, "max_new_tokens": (int32, [-1])}
    for name in ("serving_default", "greedy", "sample", "contrastive"):
        assert layout(signature_defs[name].outputs) == outputs
    assert layout(signature_defs["prompt_lookup"].outputs) == {
        **outputs, "draft_accepted": (int32, [-1]), "draft_rounds": (int32, [-1]),
    }
    assert layout(signature_defs["beam_search"].outputs) == {**outputs, "sequences_scores": (float32, [-1])}
    assert layout(signature_defs["generate_text"].inputs) == {"text": (string, [-1])}
    assert layout(signature_defs["generate_text"].outputs) == {"text": (string, [-1])}
    info = json.loads(open(os.path.join(exports.portable, "assets.extra", "tfgen_export.json")).read())
    assert info["max_new_tokens"] == MAX_NEW_TOKENS and info["jit_compile"] is False
    assert (info["num_beams"], info["contrastive_top_k"]) == (EXPORTED_NUM_BEAMS, EXPORTED_TOP_K)
    assert (info["prompt_lookup_num_tokens"], info["max_matching_ngram_size"]) == (EXPORTED_DRAFT_TOKENS, 2)
    assert set(info["signatures"]) == set(SIGNATURES)


@pytest.mark.slow
def test_the_isolated_process_cannot_import_tfgen(isolated):
    assert isolated[1]["tfgen_importable"] is False


@pytest.mark.slow
@pytest.mark.parametrize("loader", LOADERS)
def test_greedy_signatures_match_generate(isolated, references, exports, loader):
    name, results = isolated
    width = len(requests()["greedy"]["input_ids"][0])
    greedy = references["greedy"]
    expected, lengths = within_budget(greedy, width, GREEDY_BUDGETS, exports.eos_token_ids, pad_token_id=0)
    assert results[loader]["greedy"]["sequences"] == expected.tolist()
    assert results[loader]["greedy"]["sequence_lengths"] == lengths
    full, full_lengths = within_budget(greedy, width, [MAX_NEW_TOKENS] * 3, exports.eos_token_ids, pad_token_id=0)
    # Row 1 stops at the extra eos, so the lengths cover both an eos and a spent budget.
    assert min(full_lengths) < width + MAX_NEW_TOKENS == max(full_lengths)
    default = results[loader]["serving_default"]
    if name == "jit":  # the greedy config
        assert default["sequences"] == full.tolist() and default["sequence_lengths"] == full_lengths
    else:  # the sampling config, keyed by default_row_seeds
        expected, lengths = within_budget(references["default_sampling"], width, [MAX_NEW_TOKENS] * 3,
                                          exports.eos_token_ids, pad_token_id=0)
        assert default["sequences"] == expected.tolist() and default["sequence_lengths"] == lengths


@pytest.mark.slow
@pytest.mark.parametrize("loader", LOADERS)
def test_sample_signature_matches_generate_row_by_row(portable_results, references, exports, loader):
    results = portable_results[loader]["sample"]
    width = len(requests()["sample"]["input_ids"][0])
    rows = np.stack([*references["sampled_rows"], references["greedy"][2]])  # top_k=1 samples greedily
    expected, lengths = within_budget(rows, width, SAMPLE_ROWS["max_new_tokens"], exports.eos_token_ids, 0)
    assert results["sequences"] == expected.tolist()
    assert results["sequence_lengths"] == lengths
    # The plain-sampling row really sampled: it left greedy search somewhere.
    assert references["sampled_rows"][1][width:width + 5].tolist() != references["greedy"][1][width:width + 5].tolist()


def as_exported(generated_rows, budgets) -> np.ndarray:
    """Rows of new tokens (generated alone, each up to its budget) laid out as a signature returns them: the
    left-padded prompts, the new tokens, pad (0) up to the export's buffer."""
    ids, _ = left_padded_batch(PROMPTS)
    full = np.zeros((len(PROMPTS), ids.shape[1] + MAX_NEW_TOKENS), np.int64)
    full[:, : ids.shape[1]] = ids
    for row, (tokens, budget) in enumerate(zip(generated_rows, budgets)):
        full[row, ids.shape[1] : ids.shape[1] + budget] = tokens[:budget]
    return full


@pytest.mark.slow
@pytest.mark.parametrize("loader", LOADERS)
def test_beam_and_contrastive_signatures_match_generate_row_by_row(isolated, references, exports, loader):
    _, results = isolated
    width = len(requests()["beam_search"]["input_ids"][0])
    for name, rows, knobs in (("beam_search", references["beam_rows"], BEAM_ROWS),
                              ("contrastive", references["contrastive_rows"], CONTRASTIVE_ROWS)):
        budgets = knobs["max_new_tokens"]
        expected, lengths = within_budget(as_exported(rows, budgets), width, budgets, exports.eos_token_ids, 0)
        assert results[loader][name]["sequences"] == expected.tolist(), name
        assert results[loader][name]["sequence_lengths"] == lengths, name
    np.testing.assert_allclose(results[loader]["beam_search"]["sequences_scores"], references["beam_scores"],
                               atol=1e-5)
    # The per-row knobs have teeth: the beam rows differ in length penalty and budget, and contrastive search
    # with these alphas left greedy search somewhere.
    assert len(set(references["beam_scores"])) == 3


@pytest.mark.slow
@pytest.mark.parametrize("loader", LOADERS)
def test_prompt_lookup_signature_gives_greedy_tokens(portable_results, references, exports, loader):
    width = len(requests()["prompt_lookup"]["input_ids"][0])
    expected, lengths = within_budget(references["greedy"], width, PROMPT_LOOKUP_BUDGETS, exports.eos_token_ids, 0)
    result = portable_results[loader]["prompt_lookup"]
    assert result["sequences"] == expected.tolist()
    assert result["sequence_lengths"] == lengths
    # Each round keeps its accepted drafts and one token of the model's; the first token comes from the prefill.
    for new_tokens, accepted, rounds in zip(np.array(lengths) - width, result["draft_accepted"],
                                            result["draft_rounds"]):
        assert (1 + rounds <= new_tokens <= 1 + rounds + accepted) if new_tokens else (accepted, rounds) == (0, 0)


@pytest.mark.slow
@pytest.mark.parametrize("loader", LOADERS)
def test_text_signature_matches_python_tokenization_and_generate(portable_results, exports, tiny_model, loader):
    results = portable_results[loader]["generate_text"]
    expected = text_reference(tiny_model, exports.tokenizer, exports.eos_token_ids)
    assert results["text"] == expected
    assert all(expected)


@pytest.mark.slow
def test_xla_export_needs_xla_in_the_server_and_the_portable_one_does_not(isolated_runs, portable_results):
    # The portable export ran everything above with XLA compilation disabled (TF Serving's default).
    assert set(portable_results["tf1_session"]) == set(portable_results["saved_model.load"]) == set(SIGNATURES)
    assert "XLA compilation disabled" in _finished(isolated_runs["jit"])["error_without_xla"]


def test_default_row_seeds_depend_on_the_prompt_only():
    ids, mask = left_padded_batch([[5, 6, 7], [3, 4, 5, 6, 7], [5, 6, 8]])
    seeds = default_row_seeds(ids, mask).numpy()
    alone = default_row_seeds(np.array([[5, 6, 7]]), np.array([[1, 1, 1]])).numpy()
    padded_more = default_row_seeds(np.array([[0, 0, 0, 9, 5, 6, 7]]), np.array([[0, 0, 0, 0, 1, 1, 1]])).numpy()
    np.testing.assert_array_equal(seeds[0], alone[0])
    np.testing.assert_array_equal(seeds[0], padded_more[0])
    assert len({tuple(row) for row in seeds}) == 3  # different prompts, different keys


@pytest.mark.parametrize(
    "change, error, match",
    [
        ({"version": -1}, ValueError, "version"),
        ({"signatures": ["beam"]}, ValueError, "signatures"),
        ({"signatures": ["generate_text"]}, ValueError, "needs a tokenizer"),
        ({"max_new_tokens": 64}, ValueError, "positions"),
        ({"max_new_tokens": 0}, ValueError, "max_new_tokens"),
        ({"generation_config": {"num_beams": 2, "num_beam_groups": 2, "diversity_penalty": 0.5}}, ValueError,
         "cannot be exported yet"),
        ({"num_beams": 1}, ValueError, "num_beams"),
        ({"contrastive_top_k": 1}, ValueError, "contrastive_top_k"),
        ({"prompt_lookup_num_tokens": 0}, ValueError, "prompt_lookup_num_tokens"),
        ({"max_matching_ngram_size": 17}, ValueError, "max_matching_ngram_size"),
        ({"generation_config": {"assistant_early_exit": 1}}, ValueError, "cannot be exported yet"),
        ({"generation_config": {"do_sample": True, "num_return_sequences": 2}}, ValueError, "num_return_sequences"),
        ({"tokenizer": "word_level"}, ValueError, "byte-level BPE"),
    ],
)
def test_export_arguments_are_checked_before_anything_is_written(tiny_model, tmp_path, change, error, match):
    from conftest import word_level_tokenizer

    arguments = {"max_new_tokens": 4, **change}
    if "generation_config" in arguments:
        config = tiny_model.generation_config.copy()
        config.update(**arguments["generation_config"])
        arguments["generation_config"] = config
    if arguments.get("tokenizer") == "word_level":
        arguments["tokenizer"] = word_level_tokenizer()
    with pytest.raises(error, match=match):
        export_saved_model(tiny_model, tmp_path / "out", **arguments)
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def test_prompt_lookup_needs_a_model_with_a_row_cache_index(tiny_model, tmp_path):
    class OneSlotForAllRows:
        """The tiny model, not declaring a per-row cache index (a protocol model with a scalar one only)."""

        row_cache_index = False

        def __init__(self, model):
            self.model = model

        def __getattr__(self, name):
            return getattr(self.model, name)

    with pytest.raises(ValueError, match="row_cache_index"):
        export_saved_model(OneSlotForAllRows(tiny_model), tmp_path / "out", max_new_tokens=2,
                           signatures=["greedy", "prompt_lookup"])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_portable_export_refuses_a_model_that_needs_xla(tiny_model, tmp_path):
    from tensorflow.compiler.tf2xla.python.xla import dynamic_update_slice

    class NeedsXla:
        """The tiny model, plus an XLA-only op in every cached call however it is traced."""

        def __init__(self, model):
            self.model = model

        def __getattr__(self, name):
            return getattr(self.model, name)

        def call_with_cache(self, *args, **kwargs):
            output = self.model.call_with_cache(*args, **kwargs)
            return output._replace(logits=dynamic_update_slice(output.logits, output.logits[:, :1], [0, 0, 0]))

    with pytest.raises(ValueError, match="XlaDynamicUpdateSlice"):
        export_saved_model(NeedsXla(tiny_model), tmp_path / "out", max_new_tokens=2, jit_compile=False,
                           signatures=["greedy"])
    assert not (tmp_path / "out").exists()

