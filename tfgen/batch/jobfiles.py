"""The files of a batch job: a crash-safe, resumable JSONL output, the manifest that says which job wrote it, and
the lock that keeps a second run off them.

Every write that matters is flushed and fsynced (the directory too after a create or rename), so a crash or a
power loss leaves at worst a torn or garbage tail after the last synced window, which `JobFiles.start` cuts. A
finished job's manifest records the output's row count and sha256, so a later run that finds the output
truncated or changed refuses instead of calling the job done.
"""

from __future__ import annotations

import hashlib
import json
import os

from tfgen.batch.joblock import OutputLock
from tfgen.batch.rows import BadRow, id_key

# The manifest's layout. A manifest of another layout (an older tfgen) is refused rather than misread: its model
# digest is not comparable, and a finished job's output carries no checksum to verify.
MANIFEST_FORMAT = 2
_READ_BLOCK = 1 << 20


class JobFiles:
    """The files of a job writing `<output>`.

    `<output>.job.json`: the manifest (settings that decide the output, state "running"/"complete", and once
    complete the output's row count and sha256). `<output>.partial`: finished windows, appended in input order
    with flush + fsync; renamed to `<output>` when the last window is written. `<output>.skipped.jsonl`: rows
    skipped with `on_error="skip"`. `<output>.lock`: held (`flock`) from `start` to `close`.
    """

    def __init__(self, output: str):
        self.output = output
        self.partial = output + ".partial"
        self.manifest = output + ".job.json"
        self.skipped = output + ".skipped.jsonl"
        self.lock = OutputLock(output)
        self._file = None
        self.complete = False
        self.cut_bytes = 0  # bytes of an interrupted write dropped on resume
        self.rows_written: int | None = None  # rows on disk once started

    def start(self, settings: dict, expected_ids: list) -> int:
        """Locks the job's files and opens the job: returns how many rows are already written (all of them when
        the job is complete). The lock is held until `close`, also when this raises.

        Raises ValueError when another run holds the lock (naming its pid and host), when the files belong to
        another job (other settings or input), when `<output>` exists without a manifest (not ours to
        overwrite), or when a finished job's output no longer matches its recorded row count and sha256.
        """
        self.lock.acquire()
        self.rows_written = self._open(settings, expected_ids)
        return self.rows_written

    def _open(self, settings: dict, expected_ids: list) -> int:
        manifest = _read_manifest(self.manifest)
        if manifest is None:
            for path in (self.output, self.partial):
                if os.path.exists(path):
                    raise ValueError(
                        f"output: {path} exists but {self.manifest} does not, so no tfgen batch job wrote it; "
                        "remove it or choose another output path."
                    )
            return self._fresh(settings)
        if manifest.get("format") != MANIFEST_FORMAT:
            raise ValueError(
                f"output: {self.manifest} was written by another version of tfgen batch; finish the job with that "
                f"version, or remove {self.output} and its {self.output}.* files to start over."
            )
        differing = sorted(key for key in settings.keys() | manifest["settings"].keys()
                           if settings.get(key) != manifest["settings"].get(key))
        if differing:
            raise ValueError(
                f"output: {self.output} belongs to a job with another {', '.join(differing)} (see {self.manifest}); "
                "rerun with the same arguments and input, or remove those files to start over."
            )
        if os.path.exists(self.partial):
            # Also when the manifest says "complete": the run was killed between recording the finished output and
            # renaming it; the job then finishes again (nothing is left to generate).
            return self._recover(expected_ids)
        if os.path.exists(self.output):
            self._verify_finished(manifest)
            self.complete = True
            return len(expected_ids)
        return self._fresh(settings)

    def _verify_finished(self, manifest: dict) -> None:
        """Checks a finished job's output against the row count and sha256 its manifest recorded; raises
        ValueError saying what differs."""
        recorded = manifest.get("output")
        if manifest["state"] != "complete" or not isinstance(recorded, dict):
            raise ValueError(
                f"output: {self.output} exists but {self.manifest} does not record it as this job's finished "
                f"output; remove {self.output} and its {self.output}.* files to start over."
            )
        rows, digest, torn = _count_and_digest(self.output)
        if (rows, digest) == (recorded.get("rows"), recorded.get("sha256")) and not torn:
            return
        hint = ""
        if rows != recorded.get("rows") or torn:
            tail = " and an unfinished last line" if torn else ""
            found = f"{rows} complete line(s){tail}, but the job wrote {recorded.get('rows')} rows"
            hint = f" (If it was only cut short: rename it to {self.partial} and run again to regenerate the rest.)"
        else:
            found = f"{rows} lines as the job wrote, but other bytes (sha256 {digest}, not {recorded.get('sha256')})"
        raise ValueError(
            f"output: {self.output} is not the file this job finished: it holds {found} (see {self.manifest}); it "
            f"was truncated or changed after the job ended. Restore it, or remove it and its {self.output}.* files "
            f"to run the job again.{hint}"
        )

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
        self.rows_written += len(records)

    def write(self, data: bytes) -> None:
        """Appends bytes to the partial output, flushed and fsynced before returning (the one place the job's
        output grows, so a test can stop a run at an exact byte offset by wrapping it)."""
        if self._file is None:
            self._file = open(self.partial, "ab")
        self._file.write(data)
        self._file.flush()
        os.fsync(self._file.fileno())

    def finish(self, settings: dict) -> None:
        """Records the complete output's row count and sha256 in the manifest (state "complete"), then publishes
        the output under its final name."""
        if self._file is not None:
            self._file.close()
            self._file = None
        rows, digest, _ = _count_and_digest(self.partial)
        # The record goes first: a crash before the rename leaves a complete manifest beside the `.partial`, which
        # the next run recovers and finishes again; the other order would leave an output with nothing to verify.
        self._write_manifest(settings, "complete", output={"rows": rows, "sha256": digest})
        os.replace(self.partial, self.output)
        _fsync_directory(self.output)
        self.complete = True

    def close(self) -> None:
        """Closes the output and releases the lock (the files stay as they are: a job not complete resumes)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self.lock.release()

    def write_skipped(self, bad: list[BadRow]) -> None:
        """Lists the skipped rows in `<output>.skipped.jsonl` (one JSON object per row), or removes that file."""
        if bad:
            lines = "".join(json.dumps(row.to_json(), ensure_ascii=False) + "\n" for row in bad)
            _write_atomically(self.skipped, lines)
        elif os.path.exists(self.skipped):
            os.remove(self.skipped)  # left by an earlier job on this path; this input skips nothing

    def _write_manifest(self, settings: dict, state: str, **fields) -> None:
        manifest = {"format": MANIFEST_FORMAT, "state": state, "settings": settings, **fields}
        _write_atomically(self.manifest, json.dumps(manifest, indent=2) + "\n")


def _count_and_digest(path: str) -> tuple[int, str, bool]:
    """(complete lines, sha256 hex of the whole file, whether it ends inside an unfinished line) of `path`."""
    digest = hashlib.sha256()
    lines, last = 0, b"\n"
    with open(path, "rb") as file:
        while block := file.read(_READ_BLOCK):
            digest.update(block)
            lines += block.count(b"\n")
            last = block[-1:]
    return lines, digest.hexdigest(), last != b"\n"


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


def _read_manifest(path: str) -> dict | None:
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
