"""Hostile files (issue 30): GGUF files whose layout lies (offsets, lengths, counts), and model or option files that
are not regular files (a link to /dev/zero, a FIFO) or are too large. Each is refused at once, naming the file and
the tensor, key or limit (tfgen/gguf/layout.py, tfgen/local_files.py)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf_files import finish

from tfgen.gguf.config import hf_config_dict
from tfgen.gguf.files import open_gguf
from tfgen.gguf.tensors import read_hf_tensors
from tfgen.local_files import JSON_FILE_CAP, TOKENIZER_JSON_CAP

SHIPPED = Path(__file__).resolve().parents[1] / "saved_models" / "stdlib-gpt2"
# A refusal must come at once; generous for a loaded CI machine (each takes well under 10 ms here).
FAST_SECONDS = 1.0
HIDDEN, INNER, HEADS, KV_HEADS, VOCAB = 64, 96, 4, 2, 40


# --- GGUF ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_gguf(tmp_path_factory):
    """A tiny llama GGUF file written by gguf-py (random F32 weights, a 40-token vocabulary): (bytes, reader)."""
    path = tmp_path_factory.mktemp("gguf") / "good.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for add, value in [(writer.add_name, "hostile test"), (writer.add_context_length, 64),
                       (writer.add_embedding_length, HIDDEN), (writer.add_block_count, 1),
                       (writer.add_feed_forward_length, INNER), (writer.add_head_count, HEADS),
                       (writer.add_head_count_kv, KV_HEADS), (writer.add_layer_norm_rms_eps, 1e-5),
                       (writer.add_rope_dimension_count, HIDDEN // HEADS), (writer.add_vocab_size, VOCAB),
                       (writer.add_tokenizer_model, "gpt2"), (writer.add_token_list, [f"t{i}" for i in range(VOCAB)]),
                       (writer.add_token_types, [1] * VOCAB), (writer.add_eos_token_id, 1)]:
        add(value)
    rng = np.random.default_rng(0)
    kv = KV_HEADS * HIDDEN // HEADS
    shapes = {"token_embd.weight": (VOCAB, HIDDEN), "output_norm.weight": (HIDDEN,), "output.weight": (VOCAB, HIDDEN),
              "blk.0.attn_q.weight": (HIDDEN, HIDDEN), "blk.0.attn_k.weight": (kv, HIDDEN),
              "blk.0.attn_v.weight": (kv, HIDDEN), "blk.0.attn_output.weight": (HIDDEN, HIDDEN),
              "blk.0.ffn_gate.weight": (INNER, HIDDEN), "blk.0.ffn_up.weight": (INNER, HIDDEN),
              "blk.0.ffn_down.weight": (HIDDEN, INNER), "blk.0.attn_norm.weight": (HIDDEN,),
              "blk.0.ffn_norm.weight": (HIDDEN,)}
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.normal(size=shape).astype(np.float32))
    finish(writer)
    return path.read_bytes(), gguf.GGUFReader(path)


def _tensor_entry(reader, name: str) -> dict[str, int]:
    """Byte positions of a tensor table entry's fields (name, dimension count, first dimension, type, offset)."""
    tensor = next(tensor for tensor in reader.tensors if tensor.name == name)
    name_at = tensor.field.offset + 8
    dims_at = name_at + len(name.encode()) + 4
    type_at = dims_at + 8 * len(tensor.shape)
    return {"name": name_at, "n_dims": dims_at - 4, "dim0": dims_at, "type": type_at, "offset": type_at + 4,
            "data_offset": tensor.data_offset - reader.data_offset}


def _key_entry(reader, key: str) -> dict[str, int]:
    """Byte positions of a metadata entry's fields (key bytes, value type, then an array's item type and length or
    a string's length)."""
    field = reader.fields[key]
    type_at = field.offset + 8 + len(key.encode())
    return {"key": field.offset + 8, "type": type_at, "item_type": type_at + 4, "length": type_at + 8,
            "string_length": type_at + 4}


def _hostile_cases(reader) -> dict:
    """case -> (patches [(position, struct format, value)], error type, message pattern)."""
    attn_k, attn_v = _tensor_entry(reader, "blk.0.attn_k.weight"), _tensor_entry(reader, "blk.0.attn_v.weight")
    tokens, name = _key_entry(reader, "tokenizer.ggml.tokens"), _key_entry(reader, "general.name")
    token_types = _key_entry(reader, "tokenizer.ggml.token_type")
    last_name = reader.tensors[-1].name
    last = _tensor_entry(reader, last_name)
    return {
        # The two cases: an offset pointing at token_embd's bytes, and one not a multiple of the alignment.
        "offset_0_overlaps_token_embd": ([(attn_k["offset"], "<Q", 0)], ValueError,
                                         r"'blk.0.attn_k.weight' \(bytes 0 to 8,192 .*overlaps tensor "
                                         r"'token_embd.weight'"),
        "offset_3_unaligned": ([(attn_k["offset"], "<Q", 3)], ValueError,
                               r"'blk.0.attn_k.weight' is at offset 3, not a multiple of general.alignment \(32\)"),
        "offset_of_a_later_tensor": ([(attn_k["offset"], "<Q", attn_v["data_offset"])], ValueError,
                                     r"'blk.0.attn_v.weight' .* overlaps tensor 'blk.0.attn_k.weight'"),
        # The last tensor 32 bytes further on, the file 32 bytes longer: inside the file, but not where llama.cpp
        # expects it.
        "offset_leaving_a_gap": ([(last["offset"], "<Q", last["data_offset"] + 32), (None, None, bytes(32))],
                                 ValueError, rf"'{last_name}' is at offset {last['data_offset'] + 32:,}, expected "
                                 rf"{last['data_offset']:,}: llama.cpp expects the tensors packed"),
        "offset_past_the_end": ([(attn_k["offset"], "<Q", 1 << 40)], OSError,
                                r"truncated or corrupt: tensor 'blk.0.attn_k.weight' .* runs past the end"),
        "negative_dimension": ([(attn_k["dim0"], "<q", -64)], ValueError,
                               r"'blk.0.attn_k.weight' has a negative dimension"),
        "five_dimensions": ([(attn_k["n_dims"], "<I", 5)], ValueError,
                            r"'blk.0.attn_k.weight' has 5 dimensions; GGUF allows at most 4"),
        "unknown_ggml_type": ([(attn_k["type"], "<i", 99)], ValueError,
                              r"'blk.0.attn_k.weight' has the unknown ggml type 99"),
        "rows_not_whole_blocks": ([(attn_k["type"], "<i", int(gguf.GGMLQuantizationType.Q4_K))], ValueError,
                                  r"'blk.0.attn_k.weight' of type Q4_K has 64 values per row, not a multiple of its "
                                  r"block size 256"),
        "duplicate_tensor_name": ([(attn_k["name"] + len("blk.0.attn_"), "<c", b"q")], ValueError,
                                  r"tensor 'blk.0.attn_q.weight' appears twice"),
        "array_past_the_end": ([(tokens["length"], "<Q", 1 << 29)], OSError,
                               r"truncated or corrupt: metadata 'tokenizer.ggml.tokens' \(536,870,912 items\)"),
        "array_over_llama_cpp_limit": ([(tokens["length"], "<Q", 1 << 40)], ValueError,
                                       r"metadata 'tokenizer.ggml.tokens' claims 1,099,511,627,776 items, over "
                                       r"llama.cpp's limit"),
        # gguf-py walks a claimed length item by item, even past the end of the file (seconds, ~100 MB today).
        "numbers_past_the_end": ([(token_types["length"], "<Q", 1_000_000)], OSError,
                                 r"metadata 'tokenizer.ggml.token_type' \(1,000,000 items\) needs 4,000,000 bytes"),
        "nested_array": ([(token_types["item_type"], "<i", 9)], ValueError,
                         r"metadata 'tokenizer.ggml.token_type' is an array of arrays"),
        "string_past_the_end": ([(name["string_length"], "<Q", 100_000_000)], OSError,
                                r"truncated or corrupt: metadata 'general.name' needs 100,000,000 bytes"),
        "string_over_llama_cpp_limit": ([(name["string_length"], "<Q", 1 << 31)], ValueError,
                                        r"metadata 'general.name' claims 2,147,483,648 bytes, over llama.cpp's limit"),
        "unknown_value_type": ([(name["type"], "<i", 13)], ValueError,
                               r"metadata 'general.name' has the unknown value type 13"),
        "tensor_count": ([(8, "<Q", 1 << 40)], OSError, r"truncated or corrupt: 1,099,511,627,776 tensors"),
        "key_count": ([(16, "<Q", 1 << 40)], OSError, r"truncated or corrupt: 1,099,511,627,776 metadata keys"),
        "negative_key_count": ([(16, "<q", -1)], ValueError, r"the file claims -1 metadata keys"),
    }


def _patched(data: bytes, patches) -> bytes:
    """`data` with each `(position, struct format, value)` packed in; `(None, None, extra)` appends `extra`."""
    data = bytearray(data)
    for position, form, value in patches:
        if position is None:
            data += value
        else:
            struct.pack_into(form, data, position, value)
    return bytes(data)


def test_the_fixture_loads(good_gguf, tmp_path):
    path = tmp_path / "good.gguf"
    path.write_bytes(good_gguf[0])
    file = open_gguf(path)
    tensors = read_hf_tensors(file, hf_config_dict(file))
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (KV_HEADS * HIDDEN // HEADS, HIDDEN)


@pytest.mark.parametrize("case", [
    "offset_0_overlaps_token_embd", "offset_3_unaligned", "offset_of_a_later_tensor", "offset_leaving_a_gap",
    "offset_past_the_end", "negative_dimension", "five_dimensions", "unknown_ggml_type", "rows_not_whole_blocks",
    "duplicate_tensor_name", "array_past_the_end", "array_over_llama_cpp_limit", "numbers_past_the_end",
    "nested_array", "string_past_the_end", "string_over_llama_cpp_limit", "unknown_value_type", "tensor_count",
    "key_count", "negative_key_count",
])
def test_a_gguf_file_whose_layout_lies_is_refused_naming_the_tensor_or_key(good_gguf, tmp_path, case):
    patches, error, pattern = _hostile_cases(good_gguf[1])[case]
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(_patched(good_gguf[0], patches))
    started = time.perf_counter()
    with pytest.raises(error, match=pattern) as raised:
        open_gguf(path)
    assert time.perf_counter() - started < FAST_SECONDS
    assert str(path) in str(raised.value)


def test_a_repeated_metadata_key_is_refused(good_gguf, tmp_path):
    reader = good_gguf[1]
    keys = [key for key in reader.fields if not key.startswith("GGUF.")]
    # A key renamed to an earlier one of the same length (the layout stays the same).
    first, second = next((a, b) for index, a in enumerate(keys) for b in keys[index + 1:] if len(a) == len(b))
    path = tmp_path / "repeated.gguf"
    path.write_bytes(_patched(good_gguf[0], [(_key_entry(reader, second)["key"], f"<{len(first)}s", first.encode())]))
    with pytest.raises(ValueError, match=rf"metadata key '{first}' appears twice"):
        open_gguf(path)


# --- Model and option files that are not regular files, or too large ------------------------------------------------

# file -> (what reads it, the cap it is held to; None: read in place, not capped). Each reader is one line of
# `_RUNNER` below.
MODEL_FILES = {
    "config.json": ("config", JSON_FILE_CAP),
    "generation_config.json": ("generation_config", JSON_FILE_CAP),
    "tokenizer.json": ("tokenizer", TOKENIZER_JSON_CAP),
    "tokenizer_config.json": ("tokenizer", JSON_FILE_CAP),
    "special_tokens_map.json": ("tokenizer", JSON_FILE_CAP),
    "chat_template.jinja": ("tokenizer", JSON_FILE_CAP),
    "model.safetensors.index.json": ("weights", JSON_FILE_CAP),
    "model.safetensors": ("weights", None),
    "schema.json": ("json_schema", JSON_FILE_CAP),
    "model.gguf": ("gguf", None),
}
# Run in a child process under a memory limit and a per-case alarm, so that a reader that streams /dev/zero or
# waits on a FIFO fails its case (MemoryError, TimeoutError) instead of taking the test run down with it.
_RUNNER = textwrap.dedent("""
    import argparse, json, os, resource, signal, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    from tfgen.commands import structured_options
    from tfgen.config.generation_config import GenerationConfig
    from tfgen.gguf import is_gguf_path
    from tfgen.gguf.files import open_gguf
    from tfgen.models.loading import read_config_dict, read_safetensors_weights
    from tfgen.text.tokenizer import Tokenizer

    READERS = {
        "config": lambda path: read_config_dict(os.path.dirname(path)),
        "generation_config": lambda path: GenerationConfig.from_pretrained(os.path.dirname(path)),
        "tokenizer": lambda path: Tokenizer.from_pretrained(os.path.dirname(path)),
        "weights": lambda path: read_safetensors_weights(os.path.dirname(path)),
        "json_schema": lambda path: structured_options(argparse.Namespace(regex=None, json_schema=path)),
        "gguf": open_gguf,
        "is_gguf_path": is_gguf_path,
    }

    def timeout(*args):
        raise TimeoutError("still reading after 10 s")

    signal.signal(signal.SIGALRM, timeout)
    for case, reader, path in json.loads(sys.argv[1]):
        started = time.perf_counter()
        signal.alarm(10)
        try:
            outcome = {"returned": repr(READERS[reader](path))[:200]}
        except BaseException as error:
            outcome = {"error": type(error).__name__, "message": str(error)[:2000]}
        signal.alarm(0)
        print(json.dumps({"case": case, "seconds": time.perf_counter() - started, **outcome}), flush=True)
""")


def _hostile_entry(path: Path, kind: str, cap: int | None) -> None:
    """Replaces `path` by a link to /dev/zero, a FIFO, or a (sparse) regular file one byte over `cap`."""
    if path.is_symlink() or path.exists():
        path.unlink()
    if kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        with open(path, "wb") as file:
            file.truncate(cap + 1)


def _model_folder(folder: Path) -> None:
    """The shipped model's small files copied into `folder`, its weights linked."""
    folder.mkdir(parents=True)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SHIPPED / name, folder / name)
    (folder / "model.safetensors").symlink_to(SHIPPED / "model.safetensors")


@pytest.fixture(scope="module")
def hostile_outcomes(tmp_path_factory):
    """case -> what the reader did with it (`error`, `message`, `seconds`), one child process for them all."""
    root = tmp_path_factory.mktemp("hostile")
    cases = []
    for name, (reader, cap) in MODEL_FILES.items():
        for kind in ("zero", "fifo", "large") if cap else ("zero", "fifo"):
            folder = root / f"{name}-{kind}"
            _model_folder(folder)
            _hostile_entry(folder / name, kind, cap)
            cases.append((f"{name}-{kind}", reader, str(folder / name)))
    cases.append(("--json-schema /dev/zero", "json_schema", "/dev/zero"))
    os.mkfifo(root / "model.bin")  # a GGUF file is told by its magic bytes when its name does not say
    cases.append(("is_gguf_path-fifo", "is_gguf_path", str(root / "model.bin")))
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                                              os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(cases)], capture_output=True, text=True,
                         timeout=300, env=environment)
    outcomes = {line["case"]: line for line in map(json.loads, run.stdout.splitlines())}
    assert len(outcomes) == len(cases), run.stderr[-3000:]
    return {case: (outcomes[case], path) for case, _, path in cases}


WHAT_IT_IS = {"zero": "is a character device, not a regular file", "fifo": "is a FIFO (named pipe), not a regular file"}


@pytest.mark.parametrize("case", [f"{name}-{kind}" for name, (_, cap) in MODEL_FILES.items()
                                  for kind in (("zero", "fifo", "large") if cap else ("zero", "fifo"))])
def test_a_model_or_option_file_that_is_not_a_regular_file_or_too_large_is_refused_at_once(hostile_outcomes, case):
    outcome, path = hostile_outcomes[case]
    name, kind = case.rsplit("-", 1)
    expected = WHAT_IT_IS.get(kind) or f"is larger than the {MODEL_FILES[name][1]:,}-byte limit"
    assert outcome.get("error") in ("OSError", "ValueError"), outcome
    assert path in outcome["message"] and expected in outcome["message"], outcome
    assert outcome["seconds"] < FAST_SECONDS, outcome


def test_json_schema_dev_zero_and_a_fifo_named_like_a_model_are_refused_at_once(hostile_outcomes):
    outcome, _ = hostile_outcomes["--json-schema /dev/zero"]
    assert outcome.get("error") == "ValueError", outcome
    assert outcome["message"].startswith("--json-schema: '/dev/zero' is a character device"), outcome
    assert outcome["seconds"] < FAST_SECONDS
    outcome, _ = hostile_outcomes["is_gguf_path-fifo"]
    assert outcome.get("returned") == "False" and outcome["seconds"] < FAST_SECONDS, outcome


@pytest.mark.parametrize("argv, link", [
    (["generate", "hi", "--json-schema", "/dev/zero"], None),
    (["generate", "hi", "--model", "{folder}"], "config.json"),
])
def test_the_command_line_says_it_in_one_line(tmp_path, argv, link):
    folder = tmp_path / "model"
    _model_folder(folder)
    if link:
        _hostile_entry(folder / link, "zero", None)
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "tfgen.cli", *[part.format(folder=folder) for part in argv]],
                         capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - started
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert "is a character device, not a regular file" in run.stderr
    assert (str(folder / link) if link else "'/dev/zero'") in run.stderr
    print(f"{argv}: refused in {elapsed:.1f} s (the process, TensorFlow's import included)")
