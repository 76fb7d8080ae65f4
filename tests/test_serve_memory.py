"""The memory of a served version: once loaded and warmed up, `load_export` hands back to the system what loading
and the warm-up freed (a garbage collection and glibc's `malloc_trim`: 0.39 GB of SmolLM2-135M's export, which
glibc otherwise keeps; see docs/serving.md's "Memory")."""

from __future__ import annotations

import pytest

from tfgen.export import export_saved_model


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, tiny_model) -> str:
    root = tmp_path_factory.mktemp("memory") / "tiny"
    export_saved_model(tiny_model, root, signatures=["greedy"], jit_compile=False, max_new_tokens=2)
    return str(root)


def test_load_export_hands_back_what_the_warm_up_freed(export_dir, monkeypatch):
    from tfgen.serving import served_model

    steps = []
    replay, release = served_model.replay_warmup_requests, served_model.release_memory

    def replayed(*args, **kwargs):
        steps.append("warm-up")
        return replay(*args, **kwargs)

    def released(*args, **kwargs):
        steps.append(("release", args, kwargs))
        return release(*args, **kwargs)

    monkeypatch.setattr(served_model, "replay_warmup_requests", replayed)
    monkeypatch.setattr(served_model, "release_memory", released)
    served = served_model.load_export(export_dir)
    # After the warm-up, without dropping any compiled program (nothing was unloaded).
    assert steps == ["warm-up", ("release", (), {})]
    assert served_model.engine_signatures(served) == frozenset()  # no engine: every record is replayed
    outputs = served.predict("greedy", {"input_ids": [[5, 6]], "attention_mask": [[1, 1]], "max_new_tokens": [2]})
    assert outputs["sequences"].shape == (1, 4)  # and it still serves
