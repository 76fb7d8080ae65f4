"""A poisoned compile cache (`tfgen/generation/compile_cache.py`, `cache_entries.py`, `programs.HealingProgram`)
never turns a working command into a failing one: each damaged entry of issue 30 — truncated, random bytes, a
flipped byte, two programs' entries swapped, a symbolic link to another entry, each renamed to its new content's
SHA-256 so that the store's checksum passes — is removed with one warning and its program compiles again, with the
tokens of an uncached run; the cache is healthy afterwards. Each generating process runs the tiny GPT-2 on up to
seven shapes (one compiled program, so one entry, each)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import build_hf_gpt2

from tfgen.generation import cache_entries, compile_cache

# Prints the greedy tokens of the first argv[2] shapes (rows, prompt length): one program each.
WORKER = """
import json, sys
import numpy as np
import tfgen
model = tfgen.AutoModelForCausalLM.from_pretrained(sys.argv[1])
shapes = [(1, 3), (1, 20), (1, 40), (2, 3), (2, 20), (2, 40), (4, 3)][: int(sys.argv[2])]
print(json.dumps([model.generate(np.arange(rows * length).reshape(rows, length) % 90 + 3, max_new_tokens=4,
                                 do_sample=False).numpy().tolist() for rows, length in shapes]))
"""
WARNING = "tfgen's compile cache"


def run_worker(checkpoint, cache_root, programs):
    """`(tokens, stderr)` of a fresh process running `programs` programs with its cache in `cache_root`."""
    env = {key: value for key, value in os.environ.items() if key not in ("TF_XLA_FLAGS", "_TFGEN_ADDED_XLA_FLAG")}
    env.update(TFGEN_CACHE_DIR=str(cache_root), TFGEN_COMPILE_CACHE="1", TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", WORKER, checkpoint, str(programs)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """`(checkpoint, cache root, tokens)`: a store holding the seven programs, made by a first process (which
    compiled them all: its tokens are an uncached run's)."""
    checkpoint = tmp_path_factory.mktemp("hostile_cache_gpt2")
    build_hf_gpt2(checkpoint)
    root = tmp_path_factory.mktemp("warm") / "cache"
    tokens, _ = run_worker(str(checkpoint), root, 7)
    assert len(stored(root)) == 7
    return str(checkpoint), root, tokens


def stored(root):
    """{entry path: (inode, modification time)} of the store under `root` (links not followed): an entry written
    again gets a new inode, so an unchanged dict means the process loaded every program."""
    return {path: (path.lstat().st_ino, path.lstat().st_mtime_ns) for path in sorted((root / "xla").glob("*/*.pb.*"))}


def renamed(path, content):
    """Replaces the entry `path` by `content`, named after its new SHA-256 (as an attacker would); the new path."""
    path.unlink()
    new = path.with_name(f"{path.name.rsplit('.', 1)[0]}.{hashlib.sha256(content).hexdigest()}")
    new.write_bytes(content)
    return new


def healthy(path):
    """A regular file whose name's checksum, key and HLO all match its content."""
    name, digest = path.name.rsplit(".", 1)
    return not path.is_symlink() and cache_entries.stored_entry_problem(path, name, digest, 2**30) is None


def test_each_poisoned_entry_is_removed_once_and_compiled_again(warm, tmp_path):
    checkpoint, warm_root, uncached = warm
    root = tmp_path / "cache"
    shutil.copytree(warm_root, root, symlinks=True)
    truncated, random_bytes, flipped, swap_a, swap_b, link, target = entries = sorted(stored(root))
    content = {path: path.read_bytes() for path in entries}
    renamed(truncated, content[truncated][: len(content[truncated]) // 2])
    renamed(random_bytes, os.urandom(len(content[random_bytes])))
    # A letter of the HLO module's name (the module starts with it): the entry still parses.
    at = content[flipped].index(cache_entries._fields(content[flipped], None)[2]) + 5
    renamed(flipped, content[flipped][:at] + bytes([content[flipped][at] ^ 0x01]) + content[flipped][at + 1 :])
    renamed(swap_a, content[swap_b])
    renamed(swap_b, content[swap_a])
    link.unlink()
    link.with_name(f"{link.name.rsplit('.', 1)[0]}.{hashlib.sha256(content[target]).hexdigest()}").symlink_to(target)

    tokens, stderr = run_worker(checkpoint, root, 7)
    assert tokens == uncached
    assert stderr.count(WARNING) == 1 and "removed 6 damaged entries" in stderr
    for why in ("not a cache entry", "its HLO does not match its key", "its key names", "a symbolic link"):
        assert why in stderr
    healed = stored(root)
    assert len(healed) == 7 and all(healthy(path) for path in healed)
    assert target in healed and healed[target] == (target.stat().st_ino, target.stat().st_mtime_ns)

    tokens, stderr = run_worker(checkpoint, root, 7)  # loads every program, warns nothing
    assert tokens == uncached and WARNING not in stderr and stored(root) == healed


def test_an_entry_tensorflow_fails_to_load_is_healed_where_it_runs(warm, tmp_path):
    """An entry that passes every check made before TensorFlow reads it (its framing, key and HLO are intact) but
    whose executable does not parse: the first call fails inside TensorFlow, the cache drops what it gave this
    process, and the call runs again on a program traced anew."""
    checkpoint, warm_root, uncached = warm
    root = tmp_path / "cache"
    shutil.copytree(warm_root, root, symlinks=True)
    # A process running the first two programs loads them (their entries' names depend on the order of traces).
    first_two = uncached[:2]
    for path in stored(root):
        content = path.read_bytes()
        executable = cache_entries._fields(content, None)[3]
        if executable[:1] == b"\n":  # an `xla.cpu.CompilationResultProto`: break a message nested in field 6
            nested = cache_entries._fields(executable, None)[6]
            at = content.index(nested)
            broken = renamed(path, content[:at] + b"\x07" + content[at + 1 :])
            assert healthy(broken)  # nothing outside TensorFlow can tell
            break

    tokens, stderr = run_worker(checkpoint, root, 2)
    assert tokens == first_two
    assert stderr.count(WARNING) == 1 and "a program loaded from it failed" in stderr and not broken.exists()
    # The retried program was traced anew, under another name: the next process compiles what it looks for ...
    tokens, stderr = run_worker(checkpoint, root, 2)
    assert tokens == first_two and WARNING not in stderr
    assert all(healthy(path) for path in stored(root))
    before = stored(root)
    # ... and the one after it loads everything.
    tokens, stderr = run_worker(checkpoint, root, 2)
    assert tokens == first_two and WARNING not in stderr and stored(root) == before


def test_entries_that_are_not_regular_files_are_removed_unread(tmp_path, monkeypatch, caplog):
    """A FIFO (which blocked the old checksum read forever), a link to /dev/zero and a file past the store's size
    limit: removed without being read, one warning."""
    store, private = tmp_path / "store", tmp_path / "store" / "runs" / "this_process"
    private.mkdir(parents=True)
    digest = "0" * 64
    os.mkfifo(store / f"fifo.pb.{digest}")
    (store / f"zero.pb.{digest}").symlink_to("/dev/zero")
    with open(store / f"huge.pb.{digest}", "wb") as huge:
        huge.truncate(4096)
    monkeypatch.setattr(compile_cache, "MAX_STORE_BYTES", 1024)
    filler = compile_cache._Filler(private, store)
    filler.start()
    filler.join(timeout=30)
    assert not filler.is_alive()
    assert sorted(Path(store).glob("*.pb.*")) == [] and filler.linked == set()
    assert caplog.text.count(WARNING) == 1
    for why in ("not a regular file", "a symbolic link", "more than the store's 1024"):
        assert why in caplog.text


def test_a_store_other_users_may_write_is_not_loaded(tmp_path, caplog):
    """Its entries are machine code this process would run: a world-writable store is left unread, with a warning."""
    store, private = tmp_path / "store", tmp_path / "store" / "runs" / "this_process"
    private.mkdir(parents=True)
    entry = store / f"a.pb.{hashlib.sha256(b'x').hexdigest()}"
    entry.write_bytes(b"x")
    store.chmod(0o777)
    filler = compile_cache._Filler(private, store)
    filler.start()
    filler.join(timeout=30)
    assert filler.linked == set() and list(private.iterdir()) == [] and entry.exists()
    assert caplog.text.count(WARNING) == 1 and "another user owns it or may write to it" in caplog.text
