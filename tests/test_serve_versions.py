"""`tfgen serve` picks up new versions without a restart (`ServedModels` polling the export folder, TF Serving's
`--file_system_poll_wait_seconds`), under TF Serving's `latest` and `all` version policies; folders removed from
disk are unloaded and versions that fail to load are logged and skipped.

One small portable export of the tiny model (greedy only); further versions are a second export written while the
server runs, or copies of the first.
"""

from __future__ import annotations

import logging
import os
import shutil
import time

import pytest
from test_serve import call

from tfgen.export import export_saved_model
from tfgen.serving import ModelServer, serve, start_in_thread
from tfgen.serving.errors import RequestError
from tfgen.serving.versions import ServedModels, check_polling_options

MODEL = "tiny"
NEW_TOKENS = 3
EXPORT = dict(signatures=["greedy"], jit_compile=False, max_new_tokens=NEW_TOKENS)
PREDICT = {"signature_name": "greedy",
           "instances": [{"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], "max_new_tokens": NEW_TOKENS}]}


@pytest.fixture(scope="module")
def version_one(tmp_path_factory, tiny_model) -> str:
    """A version folder `1` of the tiny model (greedy, no XLA), to copy into export folders."""
    return export_saved_model(tiny_model, tmp_path_factory.mktemp("first") / MODEL, version=1, **EXPORT)


def _folder_with(tmp_path, version_one: str, *versions: int) -> str:
    folder = tmp_path / MODEL
    for version in versions:
        shutil.copytree(version_one, folder / str(version))
    return str(folder)


def _served_versions(server) -> list[str]:
    code, answer = call(server, "GET", f"/v1/models/{MODEL}")
    assert code == 200, answer
    return [entry["version"] for entry in answer["model_version_status"]]


def _wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the server did not pick up the change in time"
        time.sleep(0.05)


def test_a_new_version_is_served_without_a_restart(tmp_path, tiny_model, version_one):
    folder = _folder_with(tmp_path, version_one, 1)
    models = ServedModels(folder, MODEL)
    server = ModelServer(models, port=0)
    start_in_thread(server)
    models.start_polling(0.05)
    try:
        assert _served_versions(server) == ["1"]
        export_saved_model(tiny_model, folder, version=2, **EXPORT)  # while the server runs
        _wait_for(lambda: _served_versions(server) == ["2"])  # latest policy: 1 unloaded once 2 is ready
        code, answer = call(server, "POST", f"/v1/models/{MODEL}/versions/2:predict", PREDICT)
        assert code == 200, answer
        sequence = answer["predictions"][0]["sequences"]
        assert sequence[:3] == [5, 6, 7] and len(sequence) == 3 + NEW_TOKENS
        assert call(server, "POST", f"/v1/models/{MODEL}:predict", PREDICT) == (200, answer)
        code, answer = call(server, "POST", f"/v1/models/{MODEL}/versions/1:predict", PREDICT)
        assert code == 404 and "version 1" in answer["error"] and "serving 2" in answer["error"]
        assert call(server, "GET", f"/v1/models/{MODEL}/versions/1")[0] == 404
        # Version 2's folder removed: it is unloaded and the newest left on disk is served again.
        shutil.rmtree(os.path.join(folder, "2"))
        _wait_for(lambda: _served_versions(server) == ["1"])
        assert call(server, "POST", f"/v1/models/{MODEL}/versions/1:predict", PREDICT)[0] == 200
    finally:
        server.shutdown()
        server.server_close()
        models.close()


def test_all_policy_serves_every_version_and_unloads_removed_ones(tmp_path, version_one, caplog):
    folder = _folder_with(tmp_path, version_one, 1, 2)
    models = ServedModels(folder, MODEL, version_policy="all", warmup=False)
    try:
        assert [model.version for model in models.available()] == [1, 2]
        assert models.resolve(MODEL, 1).version == 1 and models.resolve(MODEL).version == 2
        os.makedirs(os.path.join(folder, "3"))
        with open(os.path.join(folder, "3", "saved_model.pb"), "wb") as file:
            file.write(b"not a SavedModel")
        with caplog.at_level(logging.ERROR, logger="tfgen.serving.versions"):
            models.poll()
            models.poll()  # a version that failed is not tried again while its folder stays
        assert caplog.text.count("version 3 of 'tiny' failed to load") == 1
        assert [model.version for model in models.available()] == [1, 2]
        shutil.rmtree(os.path.join(folder, "1"))
        models.poll()
        assert [model.version for model in models.available()] == [2]
        for version in ("2", "3"):
            shutil.rmtree(os.path.join(folder, version))
        models.poll()
        assert models.available() == []
        with pytest.raises(RequestError, match="no version of 'tiny' is served now") as refused:
            models.resolve(MODEL)
        assert refused.value.status == 404
    finally:
        models.close()


def test_latest_policy_keeps_serving_when_the_newest_version_fails_to_load(tmp_path, version_one, caplog):
    folder = _folder_with(tmp_path, version_one, 1)
    models = ServedModels(folder, MODEL, warmup=False)
    try:
        os.makedirs(os.path.join(folder, "2"))
        with open(os.path.join(folder, "2", "saved_model.pb"), "wb") as file:
            file.write(b"half written")
        with caplog.at_level(logging.ERROR, logger="tfgen.serving.versions"):
            models.poll()
        assert "version 2 of 'tiny' failed to load; still serving [1]" in caplog.text
        assert [model.version for model in models.available()] == [1]
        # Written anew under another number, it loads; the policy then unloads version 1.
        shutil.rmtree(os.path.join(folder, "2"))
        shutil.copytree(version_one, os.path.join(folder, "3"))
        models.poll()
        assert [model.version for model in models.available()] == [3]
    finally:
        models.close()


def test_bad_polling_options_are_refused_by_name(tmp_path, version_one):
    with pytest.raises(ValueError, match="version_policy must be one of latest, all"):
        check_polling_options(version_policy="newest")
    for interval in (-1, float("nan"), "1"):
        with pytest.raises(ValueError, match="poll_interval_s"):
            check_polling_options(poll_interval_s=interval)
    with pytest.raises(ValueError, match="poll_interval_s"):  # refused before anything loads
        serve(tmp_path / "missing", port=0, poll_interval_s=-2)
    with pytest.raises(ValueError, match="version_policy"):
        ServedModels(tmp_path / "missing", version_policy="newest")
    models = ServedModels(_folder_with(tmp_path, version_one, 1), MODEL, warmup=False)
    try:
        with pytest.raises(ValueError, match="interval_s must be a positive number"):
            models.start_polling(0)
        models.start_polling(10)
        with pytest.raises(ValueError, match="already polling"):
            models.start_polling(10)
    finally:
        models.close()


def test_the_command_line_sets_the_poll_interval(monkeypatch, capsys, tmp_path):
    import tfgen.serving
    from tfgen.cli import main

    seen = {}
    monkeypatch.setattr(tfgen.serving, "serve", lambda export_dir, **options: seen.update(options))
    ports = ["--port", "0", "--rest_api_port", "0"]
    assert main(["serve", str(tmp_path), *ports, "--file_system_poll_wait_seconds", "0.5"]) == 0
    assert seen["poll_interval_s"] == 0.5
    assert main(["serve", str(tmp_path), *ports]) == 0 and seen["poll_interval_s"] == 1.0  # TF Serving's default
    for bad in ("-1", "nan"):
        assert main(["serve", str(tmp_path), *ports, "--file-system-poll-wait-seconds", bad]) == 2
        assert "--file_system_poll_wait_seconds must be a finite number" in capsys.readouterr().err
