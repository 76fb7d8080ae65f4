"""The files of a batch job: a crash-safe, resumable JSONL output and the manifest that says which job wrote it.

Every write that matters is flushed and fsynced (the directory too after a create or rename), so a crash or a
power loss leaves at worst a torn or garbage tail after the last synced window, which `JobFiles.start` cuts.
"""

from __future__ import annotations

import json
import os
from typing import Optional

from tfgen.batch.rows import BadRow, id_key


class JobFiles:
    """The files of a job writing `<output>`.

    `<output>.job.json`: the manifest (settings that decide the output, state "running"/"complete").
    `<output>.partial`: finished windows, appended in input order with flush + fsync; renamed to `<output>`
    when the last window is written. `<output>.skipped.jsonl`: rows skipped with `on_error="skip"`.
    """

    def __init__(self, output: str):
        self.output = output
        self.partial = output + ".partial"
        self.manifest = output + ".job.json"
        self.skipped = output + ".skipped.jsonl"
        self._file = None
        self.complete = False
        self.cut_bytes = 0  # bytes of an interrupted write dropped on resume

    def start(self, settings: dict, expected_ids: list) -> int:
        """Opens the job: returns how many rows are already written (all of them when the job is complete).

        Raises ValueError when the files belong to another job (other settings or input), or when `<output>`
        exists without a manifest (not ours to overwrite).
        """
        manifest = _read_manifest(self.manifest)
        if manifest is None:
            for path in (self.output, self.partial):
                if os.path.exists(path):
                    raise ValueError(
                        f"output: {path} exists but {self.manifest} does not, so no tfgen batch job wrote it; "
                        "remove it or choose another output path."
                    )
            return self._fresh(settings)
        differing = sorted(key for key in settings.keys() | manifest["settings"].keys()
                           if settings.get(key) != manifest["settings"].get(key))
        if differing:
            raise ValueError(
                f"output: {self.output} belongs to a job with another {', '.join(differing)} (see {self.manifest}); "
                "rerun with the same arguments and input, or remove those files to start over."
            )
        if os.path.exists(self.partial):
            return self._recover(expected_ids)
        if os.path.exists(self.output):
            if manifest["state"] != "complete":  # killed between the final rename and the manifest update
                self._write_manifest(settings, "complete")
            self.complete = True
            return len(expected_ids)
        return self._fresh(settings)

    def _fresh(self, settings: dict) -> int:
        self._write_manifest(settings, "running")
        with open(self.partial, "wb") as file:
            os.fsync(file.fileno())
        _fsync_directory(self.partial)
        return 0

    def _recover(self, expected_ids: list) -> int:
        """Keeps the partial output up to the first incomplete or unreadable line (what a crash leaves: a write
        cut short, or unsynced garbage after a power loss) and cuts the rest, after checking that the kept rows
        are this job's first rows; returns their count (and sets `cut_bytes`)."""
        count = kept_bytes = 0
        with open(self.partial, "rb") as file:
            for line in file:
                try:
                    row_id = json.loads(line)["id"] if line.endswith(b"\n") else None
                except (ValueError, KeyError, TypeError):
                    row_id = None
                if row_id is None:
                    break
                if count >= len(expected_ids) or id_key(row_id) != id_key(expected_ids[count]):
                    raise ValueError(
                        f"output: line {count + 1} of {self.partial} has id {row_id!r}, which is not this job's "
                        f"row {count + 1}; remove the output files to start over."
                    )
                count += 1
                kept_bytes += len(line)
        self.cut_bytes = os.path.getsize(self.partial) - kept_bytes
        if self.cut_bytes:
            os.truncate(self.partial, kept_bytes)
        return count

    def append(self, records: list[dict]) -> None:
        """Appends result rows (JSON objects, one line each) to the partial output with one `write`."""
        self.write("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records).encode("utf-8"))

    def write(self, data: bytes) -> None:
        """Appends bytes to the partial output, flushed and fsynced before returning (the one place the job's
        output grows, so a test can stop a run at an exact byte offset by wrapping it)."""
        if self._file is None:
            self._file = open(self.partial, "ab")
        self._file.write(data)
        self._file.flush()
        os.fsync(self._file.fileno())

    def finish(self, settings: dict) -> None:
        """Publishes the complete output under its final name and marks the job complete."""
        if self._file is not None:
            self._file.close()
        os.replace(self.partial, self.output)
        _fsync_directory(self.output)
        self._write_manifest(settings, "complete")
        self.complete = True

    def write_skipped(self, bad: list[BadRow]) -> None:
        """Lists the skipped rows in `<output>.skipped.jsonl` (one JSON object per row), or removes that file."""
        if bad:
            lines = "".join(json.dumps(row.to_json(), ensure_ascii=False) + "\n" for row in bad)
            _write_atomically(self.skipped, lines)
        elif os.path.exists(self.skipped):
            os.remove(self.skipped)  # left by an earlier job on this path; this input skips nothing

    def _write_manifest(self, settings: dict, state: str) -> None:
        _write_atomically(self.manifest, json.dumps({"state": state, "settings": settings}, indent=2) + "\n")


def _fsync_directory(path: str) -> None:
    """Syncs the directory holding `path`, so that a file created or renamed there survives a power loss."""
    descriptor = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_atomically(path: str, text: str) -> None:
    """Replaces `path` with `text`: readers (and a crash) see the old file or the new one, never a mix."""
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    _fsync_directory(path)


def _read_manifest(path: str) -> Optional[dict]:
    """The manifest at `path`, or None when there is none; raises ValueError when the file is not one."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as file:
            manifest = json.load(file)
        if isinstance(manifest, dict) and isinstance(manifest.get("settings"), dict) and "state" in manifest:
            return manifest
    except ValueError:
        pass
    raise ValueError(f"output: {path} is not a tfgen batch manifest; remove it (and the output files) to start over")
