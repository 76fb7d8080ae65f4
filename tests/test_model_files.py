"""A model's config and files are checked before anything is built: bad config values (types, ranges, sizes that
cannot fit in memory) are a ValueError/TypeError naming the field and the file, in milliseconds; malformed
`config.json`, `generation_config.json`, tokenizer files, safetensors indexes and shards are errors naming the
file (or the index entry)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from conftest import TINY_GPT2, word_level_tokenizer

from tfgen.auto.models import AutoModelForCausalLM
from tfgen.config.generation_config import GenerationConfig
from tfgen.models.gpt2 import GPT2Config, GPT2LMHeadModel
from tfgen.models.loading import read_safetensors_weights
from tfgen.text.tokenizer import Tokenizer

# Every refusal must come before anything is built: well under the time it takes to build even the tiny model.
FAST_SECONDS = 2.0


@pytest.fixture(autouse=True)
def one_gib_of_memory(monkeypatch):
    """The memory check sees 1 GiB, whatever this host has, so the size cases answer the same everywhere."""
    monkeypatch.setenv("TFGEN_MEMORY_LIMIT_BYTES", str(2**30))


class Timer:
    def __enter__(self):
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc_info):
        self.seconds = time.monotonic() - self.started


# --- model configs ---------------------------------------------------------------------------------------------------

BAD_CONFIGS = [
    # (override, error type, words the message must hold)
    ({"n_layer": 10**6}, ValueError, ["n_layer", "1024"]),  # would hang building a million layers
    ({"n_embd": 10**6}, ValueError, ["n_embd=1000000", "GiB"]),  # would take terabytes
    ({"vocab_size": 10**9}, ValueError, ["vocab_size=1000000000", "GiB"]),  # was a raw OOM trace
    ({"n_positions": 10**8, "n_embd": 64}, ValueError, ["n_positions=100000000"]),
    ({"layer_norm_epsilon": "1e-5"}, TypeError, ["layer_norm_epsilon"]),
    ({"layer_norm_epsilon": -1e-5}, ValueError, ["layer_norm_epsilon"]),
    ({"layer_norm_epsilon": 0}, ValueError, ["layer_norm_epsilon"]),
    ({"layer_norm_epsilon": float("nan")}, ValueError, ["layer_norm_epsilon", "finite"]),
    ({"n_layer": True}, TypeError, ["n_layer"]),
    ({"n_layer": 2.0}, TypeError, ["n_layer"]),
    ({"n_head": "4"}, TypeError, ["n_head"]),
    ({"vocab_size": 0}, ValueError, ["vocab_size"]),
    ({"n_inner": -4}, ValueError, ["n_inner"]),
    ({"n_head": 5}, ValueError, ["n_embd", "n_head"]),
    ({"attn_pdrop": 1.0}, ValueError, ["attn_pdrop"]),
    ({"resid_pdrop": -0.1}, ValueError, ["resid_pdrop"]),
    ({"embd_pdrop": None}, TypeError, ["embd_pdrop"]),
    ({"initializer_range": float("inf")}, ValueError, ["initializer_range"]),
    ({"tie_word_embeddings": "false"}, TypeError, ["tie_word_embeddings"]),
    ({"activation_function": None}, TypeError, ["activation_function"]),
    ({"eos_token_id": TINY_GPT2["vocab_size"]}, ValueError, ["eos_token_id", "vocabulary"]),
    ({"eos_token_id": [2, -1]}, ValueError, ["eos_token_id"]),
    ({"eos_token_id": []}, ValueError, ["eos_token_id"]),
    ({"bos_token_id": "1"}, TypeError, ["bos_token_id"]),
    ({"pad_token_id": 1.0}, TypeError, ["pad_token_id"]),
]


@pytest.mark.parametrize("override, error, words", BAD_CONFIGS, ids=lambda case: str(case)[:40])
def test_bad_config_is_refused_at_once_naming_the_field(override, error, words):
    with Timer() as timer, pytest.raises(error) as raised:
        GPT2LMHeadModel(GPT2Config.from_dict({**TINY_GPT2, **override}))
    assert timer.seconds < FAST_SECONDS
    assert type(raised.value) is error
    for word in words:
        assert word in str(raised.value)


@pytest.mark.parametrize("override, error, field", [
    ({"n_layer": 10**6}, ValueError, "n_layer"),
    ({"vocab_size": 10**9}, ValueError, "vocab_size"),
    ({"layer_norm_epsilon": "small"}, TypeError, "layer_norm_epsilon"),
    ({"model_type": ["gpt2"]}, ValueError, "model_type"),
], ids=["n_layer", "vocab_size", "layer_norm_epsilon", "model_type"])
def test_bad_config_json_names_the_file_before_reading_weights(tmp_path, override, error, field):
    """No weights in the folder: the refusal comes first, naming config.json and the field."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", **TINY_GPT2, **override}))
    with Timer() as timer, pytest.raises(error) as raised:
        AutoModelForCausalLM.from_pretrained(tmp_path)
    assert timer.seconds < FAST_SECONDS
    assert str(tmp_path / "config.json") in str(raised.value) and field in str(raised.value)


def test_memory_check_uses_the_available_memory_and_the_dtype(monkeypatch):
    config = GPT2Config(**{**TINY_GPT2, "vocab_size": 10**6, "n_embd": 64})  # ~64M weights: 256 MiB in float32
    config.check_fits_in_memory()
    monkeypatch.setenv("TFGEN_MEMORY_LIMIT_BYTES", str(200 * 2**20))
    with pytest.raises(ValueError, match=r"float32 weights .* needs at least .* but 200\.0 MiB is available"):
        config.check_fits_in_memory()
    config.check_fits_in_memory("bfloat16")  # half the bytes fit
    with pytest.raises(ValueError, match="float32"):
        config.check_fits_in_memory("mixed_bfloat16")  # its variables stay float32


def test_parameter_count_matches_the_built_model():
    for override in ({}, {"tie_word_embeddings": False, "n_inner": 48}):
        config = GPT2Config(**{**TINY_GPT2, **override})
        assert config.parameter_count() == GPT2LMHeadModel(config).count_params()


# --- config.json and generation_config.json ------------------------------------------------------------------------


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", "\"gpt2\""], ids=["not_json", "list", "string"])
@pytest.mark.parametrize("name", ["config.json", "generation_config.json"])
def test_malformed_config_files_name_the_file(tmp_path, name, content):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", **TINY_GPT2}))
    (tmp_path / name).write_text(content)
    with pytest.raises(OSError) as raised:
        AutoModelForCausalLM.from_pretrained(tmp_path)
    assert str(tmp_path / name) in str(raised.value)


def test_bad_generation_config_value_names_the_file(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"max_new_tokens": -1}))
    with pytest.raises(ValueError) as raised:
        GenerationConfig.from_pretrained(tmp_path)
    assert str(tmp_path / "generation_config.json") in str(raised.value) and "max_new_tokens" in str(raised.value)


# --- tokenizer files ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer")
    word_level_tokenizer().save_pretrained(directory)
    return directory


@pytest.mark.parametrize("name, content", [
    ("tokenizer.json", "{not json"),
    ("tokenizer.json", "[]"),
    ("tokenizer.json", json.dumps({"version": "1.0", "model": {"type": "NoSuchModel"}})),
    ("tokenizer_config.json", "{not json"),
    ("tokenizer_config.json", "[\"<s>\"]"),
    ("special_tokens_map.json", "{\"eos_token\": "),
    ("generation_config.json", "7"),
    ("config.json", "\xff\xfe"),
], ids=["tokenizer_not_json", "tokenizer_list", "tokenizer_rejected", "tokenizer_config_not_json",
        "tokenizer_config_list", "special_tokens_map_truncated", "generation_config_number", "config_not_utf8"])
def test_malformed_tokenizer_files_name_the_file(tokenizer_dir, tmp_path, name, content):
    shutil.copytree(tokenizer_dir, tmp_path, dirs_exist_ok=True)
    (tmp_path / name).write_bytes(content.encode("latin-1"))
    with pytest.raises(OSError) as raised:
        Tokenizer.from_pretrained(tmp_path)
    assert str(tmp_path / name) in str(raised.value)


def test_special_token_entry_of_the_wrong_type_names_the_file(tokenizer_dir, tmp_path):
    shutil.copytree(tokenizer_dir, tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": 2}))
    with pytest.raises(ValueError) as raised:
        Tokenizer.from_pretrained(tmp_path)
    assert str(tmp_path / "tokenizer_config.json") in str(raised.value) and "eos_token" in str(raised.value)


# --- safetensors: sharded indexes and corrupt files -------------------------------------------------------------------


def write_index(directory: Path, weight_map) -> Path:
    path = directory / "model.safetensors.index.json"
    path.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


@pytest.fixture
def sharded_dir(tiny_checkpoint, tmp_path):
    """A folder with the tiny checkpoint as one shard (`shard.safetensors`) and an index that maps to it."""
    directory = tmp_path / "model"
    directory.mkdir()
    shutil.copy(Path(tiny_checkpoint[0]) / "model.safetensors", directory / "shard.safetensors")
    return directory


def test_index_entries_pointing_outside_the_folder_are_refused(sharded_dir, tmp_path):
    outside = tmp_path / "outside.safetensors"
    shutil.copy(sharded_dir / "shard.safetensors", outside)
    (sharded_dir / "link.safetensors").symlink_to(outside)
    for target, words in [
        (str(outside), "no absolute path"),
        ("../outside.safetensors", "no '..'"),
        ("sub/../../outside.safetensors", "no '..'"),
        ("link.safetensors", "link leading outside"),
    ]:
        index = write_index(sharded_dir, {"transformer.wte.weight": "shard.safetensors",
                                          "transformer.wpe.weight": target})
        with pytest.raises(OSError) as raised:
            read_safetensors_weights(sharded_dir)
        message = str(raised.value)
        assert str(index) in message and "'transformer.wpe.weight'" in message and words in message, message


def test_missing_shard_is_named(sharded_dir):
    write_index(sharded_dir, {"transformer.wte.weight": "shard.safetensors",
                              "transformer.wpe.weight": "gone.safetensors"})
    with pytest.raises(OSError, match=r"'transformer.wpe.weight': 'gone.safetensors' names a shard that is missing"):
        read_safetensors_weights(sharded_dir)


@pytest.mark.parametrize("weight_map", [["shard.safetensors"], {"transformer.wte.weight": 3}, {"a": ""}])
def test_malformed_index_names_the_file(sharded_dir, weight_map):
    index = write_index(sharded_dir, weight_map)
    with pytest.raises(OSError, match="not a valid safetensors index") as raised:
        read_safetensors_weights(sharded_dir)
    assert str(index) in str(raised.value)


def test_hub_snapshot_links_into_blobs_are_allowed(tiny_checkpoint, tmp_path):
    """The Hub cache stores files in `blobs/` and links them from `snapshots/<revision>/`: that must still load."""
    repo = tmp_path / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    shutil.copy(Path(tiny_checkpoint[0]) / "model.safetensors", repo / "blobs" / "f00d")
    (snapshot / "shard.safetensors").symlink_to(os.path.join("..", "..", "blobs", "f00d"))
    tensors = read_safetensors_weights(Path(tiny_checkpoint[0]))
    write_index(snapshot, {name: "shard.safetensors" for name in tensors})
    assert sorted(read_safetensors_weights(snapshot)) == sorted(tensors)


@pytest.mark.parametrize("cut", [0, 5, 200, -7], ids=["empty", "in_header_size", "in_header", "in_data"])
def test_truncated_safetensors_names_the_file(tiny_checkpoint, tmp_path, cut):
    data = (Path(tiny_checkpoint[0]) / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:cut])
    with pytest.raises(OSError, match="cannot read safetensors file") as raised:
        read_safetensors_weights(tmp_path)
    assert str(tmp_path / "model.safetensors") in str(raised.value)
