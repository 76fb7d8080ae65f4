"""The persistent compilation cache (`tfgen/generation/compile_cache.py`): `import tfgen` creates nothing, a second
process loads what the first compiled, bad entries never change results, and TFGEN_COMPILE_CACHE=0 leaves nothing
behind. Each generating process runs the tiny GPT-2 on two prompt-length buckets, so two programs: one for each kind
of damage."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
from conftest import build_hf_gpt2

from tfgen.generation import compile_cache

# Prints the greedy tokens of two prompts (prompt-length buckets 16 and 32: two programs) and what the cache folder
# held once the model was built, as JSON. Imports TensorFlow before tfgen, as a user's program may: TensorFlow reads
# TF_XLA_FLAGS when its runtime starts, not on import, so the cache still applies.
WORKER = """
import json, os, sys
import numpy as np
import tensorflow
import tfgen
model = tfgen.AutoModelForCausalLM.from_pretrained(sys.argv[1])
root = os.environ["TFGEN_CACHE_DIR"]
before = sorted(os.path.join(folder, name) for folder, folders, files in os.walk(root) for name in folders + files)
tokens = [model.generate(np.array([list(range(3, 3 + length))]), max_new_tokens=4, do_sample=False).numpy().tolist()
          for length in (3, 20)]
print(json.dumps({"tokens": tokens, "before_generate": before}))
"""

# Imports tfgen and uses a few of its TensorFlow-free names, then prints what the cache would see.
IMPORT_ONLY = """
import json, os, sys, threading
import tfgen
from tfgen.generation import compile_cache
tfgen.GenerationConfig(max_new_tokens=3, do_sample=False).to_dict()
sorted(dir(tfgen)), tfgen.__version__, compile_cache.enabled(), compile_cache.configure()
print(json.dumps({"flags": os.environ.get("TF_XLA_FLAGS", ""), "threads": [t.name for t in threading.enumerate()],
                  "tensorflow": "tensorflow" in sys.modules}))
"""
_CACHE_VARIABLES = ("TF_XLA_FLAGS", "_TFGEN_ADDED_XLA_FLAG", "TFGEN_COMPILE_CACHE", "TFGEN_CACHE_DIR", "XDG_CACHE_HOME")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cache_gpt2")
    build_hf_gpt2(directory)
    return str(directory)


def generate_in_subprocess(checkpoint, cache_root, enabled="1"):
    """The worker's report (`tokens`, `before_generate`) and stderr, from a fresh process whose cache folder is
    `cache_root`."""
    env = {key: value for key, value in os.environ.items() if key not in ("TF_XLA_FLAGS", "_TFGEN_ADDED_XLA_FLAG")}
    env.update(TFGEN_CACHE_DIR=str(cache_root), TFGEN_COMPILE_CACHE=enabled, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", WORKER, checkpoint], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def stored_entries(cache_root):
    """{entry file: (inode, modification time)} of every store under `cache_root`: a stored entry that is written
    again (even with the same bytes) gets a new inode."""
    return {path: (path.stat().st_ino, path.stat().st_mtime_ns) for path in (cache_root / "xla").glob("*/*.pb.*")}


@pytest.mark.parametrize("where", ["TFGEN_CACHE_DIR", "XDG_CACHE_HOME", "HOME"])
def test_importing_tfgen_creates_nothing(tmp_path, where):
    """With the cache on and aimed at a fresh folder (by each variable that can place it), `import tfgen` sets
    TensorFlow's flag but creates no file or folder, starts no thread and imports no TensorFlow."""
    env = {key: value for key, value in os.environ.items() if key not in _CACHE_VARIABLES}
    env.update(HOME=str(tmp_path), TMPDIR=str(tmp_path), TF_CPP_MIN_LOG_LEVEL="3")
    if where != "HOME":
        env[where] = str(tmp_path / where.lower())
    done = subprocess.run([sys.executable, "-c", IMPORT_ONLY], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    expected_root = {"TFGEN_CACHE_DIR": tmp_path / "tfgen_cache_dir",
                     "XDG_CACHE_HOME": tmp_path / "xdg_cache_home" / "tfgen",
                     "HOME": tmp_path / ".cache" / "tfgen"}[where]
    assert seen["flags"].startswith(f'--tf_xla_persistent_cache_directory="{expected_root}/xla/')  # the cache is on
    assert seen["threads"] == ["MainThread"] and not seen["tensorflow"]
    assert sorted(tmp_path.rglob("*")) == [] and "compile cache" not in done.stderr


def test_second_process_loads_the_programs_and_bad_entries_are_rebuilt(checkpoint, tmp_path):
    cache_root = tmp_path / "cache"
    first, _ = generate_in_subprocess(checkpoint, cache_root)
    assert first["before_generate"] == []  # a built model (TensorFlow's runtime started) but no program yet: no file
    entries = stored_entries(cache_root)
    assert len(entries) == 2  # one per program
    assert [path.name for path in (cache_root / "xla").glob("*/runs/*")] == []  # private folders removed at exit

    # A process that compiled would have stored its entries again: an untouched store means both were loaded.
    assert generate_in_subprocess(checkpoint, cache_root)[0]["tokens"] == first["tokens"]
    assert stored_entries(cache_root) == entries

    garbage, truncated = sorted(entries)
    garbage.write_bytes(os.urandom(garbage.stat().st_size))
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    damaged = stored_entries(cache_root)
    assert generate_in_subprocess(checkpoint, cache_root)[0]["tokens"] == first["tokens"]
    # Both were deleted, compiled again and stored anew, each under its content's checksum.
    rebuilt = stored_entries(cache_root)
    assert len(rebuilt) == 2 and not set(rebuilt.values()) & set(damaged.values())
    assert all(compile_cache._digest(path) == path.name.rsplit(".", 1)[1] for path in rebuilt)


def test_turned_off_it_leaves_no_cache(checkpoint, tmp_path):
    cache_root = tmp_path / "cache"
    generate_in_subprocess(checkpoint, cache_root, enabled="off")
    assert not cache_root.exists()


def test_an_unwritable_folder_never_fails_generate(checkpoint, tmp_path):
    """TensorFlow fails every compile when it cannot create the folder its flag names: tfgen sets no flag for a
    cache folder that cannot be created, and says so once, at the first program."""
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    report, stderr = generate_in_subprocess(checkpoint, a_file)
    assert len(report["tokens"]) == 2
    assert stderr.count("compile cache is off") == 1 and "cannot create folders in" in stderr


def new_process(monkeypatch):
    """The compile cache's state as a newly started process has it (before `import tfgen` configured it)."""
    for name, value in [("_configured", False), ("_directory", None), ("_configured_pid", None), ("_off_reason", None),
                        ("_started", False)]:
        monkeypatch.setattr(compile_cache, name, value)


@pytest.fixture
def fresh_process(monkeypatch, tmp_path):
    """A process's start, with a temporary cache folder (`tmp_path / "cache"`). The exit hooks `start()` registers
    are collected in the returned list instead, and run at the end of the test (so they may also run earlier);
    the environment and the module's state are restored afterwards."""
    monkeypatch.setenv("TFGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TF_XLA_FLAGS", "")
    monkeypatch.setenv("_TFGEN_ADDED_XLA_FLAG", "")
    monkeypatch.delenv("TFGEN_COMPILE_CACHE", raising=False)
    hooks = []
    monkeypatch.setattr(compile_cache, "atexit", types.SimpleNamespace(
        register=lambda function, *args: hooks.append(functools.partial(function, *args))))
    new_process(monkeypatch)
    yield hooks
    for hook in hooks:
        hook()


def cache_threads():
    return [thread for thread in threading.enumerate() if thread.name == "tfgen-compile-cache"]


def test_configure_creates_nothing_and_the_first_start_starts_the_cache(fresh_process, tmp_path):
    private = compile_cache.configure()
    assert os.environ["TF_XLA_FLAGS"] == f'--tf_xla_persistent_cache_directory="{private}"'
    assert Path(private).parent == compile_cache.store_directory() / "runs"
    assert not (tmp_path / "cache").exists() and cache_threads() == []

    # Many threads reaching their first program at once: one folder, one filler, one exit hook.
    barrier = threading.Barrier(8)
    starters = [threading.Thread(target=lambda: (barrier.wait(), compile_cache.start())) for _ in range(8)]
    for starter in starters:
        starter.start()
    for starter in starters:
        starter.join()
    compile_cache.start()
    assert Path(private).is_dir() and len(fresh_process) == 1

    (Path(private) / "new.pb").write_bytes(b"compiled in this process")  # as TensorFlow writes one
    fresh_process.pop()()
    assert not Path(private).exists() and cache_threads() == []
    assert [path.name.split(".")[0] for path in compile_cache.store_directory().glob("*.pb.*")] == ["new"]


def test_start_keeps_what_tensorflow_wrote_before_it(fresh_process):
    """A user's own jit function compiled before tfgen's first program: TensorFlow made the folder and wrote its
    entry there; start() takes the folder as it is, and the entry is published at exit."""
    private = Path(compile_cache.configure())
    private.mkdir(parents=True)
    (private / "users.pb").write_bytes(b"a user's program")
    compile_cache.start()
    assert (private / "users.pb").exists()
    fresh_process.pop()()
    assert [path.name.split(".")[0] for path in compile_cache.store_directory().glob("*.pb.*")] == ["users"]


def test_a_child_process_takes_its_own_directory(fresh_process, monkeypatch):
    """A child inherits the parent's TF_XLA_FLAGS; it replaces the parent's private folder by its own and keeps
    the user's other flags."""
    parent = compile_cache.configure()
    assert os.environ["TF_XLA_FLAGS"] == f'--tf_xla_persistent_cache_directory="{parent}"'
    monkeypatch.setenv("TF_XLA_FLAGS", "--tf_xla_max_cluster_size=9 " + os.environ["TF_XLA_FLAGS"])
    new_process(monkeypatch)
    child = compile_cache.configure()
    assert child != parent
    assert os.environ["TF_XLA_FLAGS"] == f'--tf_xla_max_cluster_size=9 --tf_xla_persistent_cache_directory="{child}"'


def test_a_child_forked_before_the_first_program_leaves_the_parents_directory(fresh_process, monkeypatch):
    """It shares the parent's directory: creating it here would register a hook that deletes it at the child's
    exit, under the parent."""
    private = compile_cache.configure()
    monkeypatch.setattr(compile_cache, "_configured_pid", os.getpid() + 1)  # as seen from a forked child
    compile_cache.start()
    assert fresh_process == [] and not Path(private).exists() and cache_threads() == []


def test_a_cache_directory_of_the_user_is_left_alone(fresh_process, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("TF_XLA_FLAGS", "--tf_xla_persistent_cache_directory=/elsewhere")
    assert compile_cache.configure() is None
    compile_cache.start()
    assert os.environ["TF_XLA_FLAGS"] == "--tf_xla_persistent_cache_directory=/elsewhere"
    assert fresh_process == [] and not (tmp_path / "cache").exists() and caplog.text == ""


def test_turned_off_a_child_drops_the_parents_directory(fresh_process, monkeypatch, tmp_path):
    compile_cache.configure()
    monkeypatch.setenv("TFGEN_COMPILE_CACHE", "0")
    new_process(monkeypatch)
    assert compile_cache.configure() is None
    compile_cache.start()
    assert "TF_XLA_FLAGS" not in os.environ
    assert fresh_process == [] and not (tmp_path / "cache").exists()


def test_an_unwritable_folder_turns_the_cache_off(fresh_process, monkeypatch, tmp_path, caplog):
    """No flag (TensorFlow would fail every compile), and one warning at the first program, none on import."""
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("TFGEN_CACHE_DIR", str(tmp_path / "a_file"))
    assert compile_cache.configure() is None
    assert "TF_XLA_FLAGS" not in os.environ and caplog.text == ""
    compile_cache.start()
    compile_cache.start()
    assert caplog.text.count("compile cache is off") == 1 and fresh_process == []


def test_a_folder_that_cannot_be_made_at_start_is_warned(fresh_process, tmp_path, caplog):
    """The folder could be made on import, not at the first program (the flag is read by then): a warning that
    says how to turn the cache off, and no error of tfgen's own."""
    assert compile_cache.configure() is not None
    (tmp_path / "cache").write_text("")  # the cache folder's place taken since
    compile_cache.start()
    assert "cannot create its folder" in caplog.text and "TFGEN_COMPILE_CACHE=0" in caplog.text
    assert fresh_process == [] and cache_threads() == []


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
    # These entries are not TensorFlow's: only their checksums are checked here (tests/test_hostile_cache.py checks
    # the rest).
    monkeypatch.setattr(compile_cache, "stored_entry_problem",
                        lambda path, name, digest, limit: None if compile_cache._digest(path) == digest else "changed")

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


def test_folders_of_ended_processes_are_removed(fresh_process):
    ended = subprocess.Popen(["true"])
    ended.wait()
    runs = compile_cache.store_directory() / "runs"
    abandoned = runs / f"{ended.pid}@{platform.node()}@x"
    abandoned.mkdir(parents=True)
    other_host = runs / f"{ended.pid}@another-host@x"
    other_host.mkdir()
    compile_cache.configure()
    assert abandoned.exists()  # configure() touches no folder
    compile_cache.start()
    assert not abandoned.exists() and other_host.exists()
