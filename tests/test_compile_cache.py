"""The persistent compilation cache (`tfgen/generation/compile_cache.py`): a second process loads what the first compiled,
bad entries never change results, and TFGEN_COMPILE_CACHE=0 leaves nothing behind. Each process runs the tiny
GPT-2 on two prompt-length buckets, so two programs: one for each kind of damage."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time

import pytest

from tfgen.generation import compile_cache
from conftest import build_hf_gpt2

# Prints the greedy tokens of two prompts (prompt-length buckets 16 and 32: two programs) as JSON. Imports
# TensorFlow before tfgen, as a user's program may: TensorFlow reads TF_XLA_FLAGS when its runtime starts, not on
# import, so the cache still applies.
WORKER = """
import json, sys
import numpy as np
import tensorflow
import tfgen
model = tfgen.AutoModelForCausalLM.from_pretrained(sys.argv[1])
tokens = [model.generate(np.array([list(range(3, 3 + length))]), max_new_tokens=4, do_sample=False).numpy().tolist()
          for length in (3, 20)]
print(json.dumps(tokens))
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cache_gpt2")
    build_hf_gpt2(directory)
    return str(directory)


def generate_in_subprocess(checkpoint, cache_root, enabled="1"):
    """The worker's tokens, in a fresh process whose cache folder is `cache_root`."""
    env = {key: value for key, value in os.environ.items() if key not in ("TF_XLA_FLAGS", "_TFGEN_ADDED_XLA_FLAG")}
    env.update(TFGEN_CACHE_DIR=str(cache_root), TFGEN_COMPILE_CACHE=enabled, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", WORKER, checkpoint], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def stored_entries(cache_root):
    """{entry file: (inode, modification time)} of every store under `cache_root`: a stored entry that is written
    again (even with the same bytes) gets a new inode."""
    return {path: (path.stat().st_ino, path.stat().st_mtime_ns) for path in (cache_root / "xla").glob("*/*.pb.*")}


def test_second_process_loads_the_programs_and_bad_entries_are_rebuilt(checkpoint, tmp_path):
    cache_root = tmp_path / "cache"
    first = generate_in_subprocess(checkpoint, cache_root)
    entries = stored_entries(cache_root)
    assert len(entries) == 2  # one per program
    assert [path.name for path in (cache_root / "xla").glob("*/runs/*")] == []  # private folders removed at exit

    # A process that compiled would have stored its entries again: an untouched store means both were loaded.
    assert generate_in_subprocess(checkpoint, cache_root) == first
    assert stored_entries(cache_root) == entries

    garbage, truncated = sorted(entries)
    garbage.write_bytes(os.urandom(garbage.stat().st_size))
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    damaged = stored_entries(cache_root)
    assert generate_in_subprocess(checkpoint, cache_root) == first
    # Both were deleted, compiled again and stored anew, each under its content's checksum.
    rebuilt = stored_entries(cache_root)
    assert len(rebuilt) == 2 and not set(rebuilt.values()) & set(damaged.values())
    assert all(compile_cache._digest(path) == path.name.rsplit(".", 1)[1] for path in rebuilt)


def test_turned_off_it_leaves_no_cache(checkpoint, tmp_path):
    cache_root = tmp_path / "cache"
    generate_in_subprocess(checkpoint, cache_root, enabled="off")
    assert not cache_root.exists()


@pytest.fixture
def fresh_configuration(monkeypatch, tmp_path):
    """Runs `compile_cache._configure()` as at a process's start, with a temporary cache folder; the environment
    is restored afterwards."""
    monkeypatch.setenv("TFGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TF_XLA_FLAGS", "")
    monkeypatch.setenv("_TFGEN_ADDED_XLA_FLAG", "")
    monkeypatch.delenv("TFGEN_COMPILE_CACHE", raising=False)
    return compile_cache._configure


def test_a_child_process_takes_its_own_directory(fresh_configuration, monkeypatch):
    """A child inherits the parent's TF_XLA_FLAGS; it replaces the parent's private folder by its own and keeps
    the user's other flags."""
    parent = fresh_configuration()
    assert os.environ["TF_XLA_FLAGS"] == f'--tf_xla_persistent_cache_directory="{parent}"'
    monkeypatch.setenv("TF_XLA_FLAGS", "--tf_xla_max_cluster_size=9 " + os.environ["TF_XLA_FLAGS"])
    child = fresh_configuration()
    assert child != parent
    assert os.environ["TF_XLA_FLAGS"] == f'--tf_xla_max_cluster_size=9 --tf_xla_persistent_cache_directory="{child}"'


def test_a_cache_directory_of_the_user_is_left_alone(fresh_configuration, monkeypatch):
    monkeypatch.setenv("TF_XLA_FLAGS", "--tf_xla_persistent_cache_directory=/elsewhere")
    assert fresh_configuration() is None
    assert os.environ["TF_XLA_FLAGS"] == "--tf_xla_persistent_cache_directory=/elsewhere"


def test_turned_off_a_child_drops_the_parents_directory(fresh_configuration, monkeypatch):
    fresh_configuration()
    monkeypatch.setenv("TFGEN_COMPILE_CACHE", "0")
    assert fresh_configuration() is None
    assert "TF_XLA_FLAGS" not in os.environ


def test_an_unwritable_folder_turns_the_cache_off(fresh_configuration, monkeypatch, tmp_path, caplog):
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("TFGEN_CACHE_DIR", str(tmp_path / "a_file"))
    assert fresh_configuration() is None
    assert "TF_XLA_FLAGS" not in os.environ
    assert "compile cache is off" in caplog.text


def test_a_bad_switch_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("TFGEN_COMPILE_CACHE", "maybe")
    with pytest.raises(ValueError, match="TFGEN_COMPILE_CACHE='maybe'"):
        compile_cache.enabled()


def store_entry(store, name, content, age_s=0.0):
    """Writes `content` into `store` as the entry for TensorFlow's `name`, `age_s` seconds old."""
    path = store / f"{name}.{hashlib.sha256(content).hexdigest()}"
    path.write_bytes(content)
    os.utime(path, (time.time() - age_s,) * 2)
    return path


def test_entries_are_linked_then_published_and_the_store_trimmed(tmp_path, monkeypatch):
    store, private = tmp_path / "store", tmp_path / "store" / "runs" / "this_process"
    private.mkdir(parents=True)
    for age, name in enumerate(["a.pb", "b.pb", "c.pb"]):
        store_entry(store, name, name.encode() * 400, age_s=10.0 * (age + 1))
    bad = store_entry(store, "d.pb", b"written", age_s=1.0)
    bad.write_bytes(b"changed since")
    monkeypatch.setattr(compile_cache, "MAX_STORE_BYTES", 3000)

    filler = compile_cache._Filler(private, store)
    filler.start()
    filler.join()
    assert filler.linked == {"a.pb", "b.pb", "c.pb"} and not bad.exists()
    assert (private / "a.pb").read_bytes() == b"a.pb" * 400
    (private / "new.pb").write_bytes(b"compiled in this process" * 40)  # as TensorFlow writes one
    compile_cache._publish(filler, os.getpid())
    assert not private.exists()
    # The newest entries within 3000 bytes: this process's (960 bytes) and a.pb (1600 bytes).
    assert sorted(path.name.split(".")[0] for path in store.glob("*.pb.*")) == ["a", "new"]


def test_folders_of_ended_processes_are_removed(fresh_configuration, tmp_path):
    ended = subprocess.Popen(["true"])
    ended.wait()
    runs = compile_cache.store_directory() / "runs"
    abandoned = runs / f"{ended.pid}@{platform.node()}@x"
    abandoned.mkdir(parents=True)
    other_host = runs / f"{ended.pid}@another-host@x"
    other_host.mkdir()
    fresh_configuration()
    assert not abandoned.exists() and other_host.exists()
