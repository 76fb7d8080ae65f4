"""The files of a batch job: a crash-safe, resumable JSONL output, the digests of its rows, the manifest that says
which job wrote it, and the lock that keeps a second run off them.

Every write that matters is flushed and fsynced (the directory too after a create or rename), so a crash or a
power loss leaves at worst a torn or garbage tail after the last synced window, which `JobFiles.start` cuts. The
rows a resumed job keeps must match their digests (`tfgen.batch.rowdigests`), and a finished job's manifest
records the output's row count and sha256, so a row changed on disk is refused, never certified. A full disk or
a file size limit ends the run with one line naming the file, the job resumable.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os

from tfgen.batch.joblock import OutputLock
from tfgen.batch.rowdigests import chain_start, digests_line, verify
from tfgen.batch.rows import BadRow

logger = logging.getLogger(__name__)

# The manifest's layout. A manifest of another layout (an older tfgen) is refused rather than misread: its model
# digest is not comparable, and a finished job's output carries no checksum to verify.
MANIFEST_FORMAT = 2
_READ_BLOCK = 1 << 20
# Write errors that mean "no room" (not a bad path or a permission): the job stops with one line and resumes
# once there is room.
_NO_ROOM = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file size limit (`ulimit -f`) or the file system's largest file",
}


class OutputWriteError(OSError):
    """A job's file could not be written for want of room (ENOSPC, EDQUOT, EFBIG). What was written before stays
    and the job resumes when run again; the `tfgen` command prints the message and exits with status 1."""

    exit_status = 1


class JobFiles:
    """The files of a job writing `<output>`.

    `<output>.job.json`: the manifest (settings that decide the output, state "running"/"complete", and once
    complete the output's row count and sha256). `<output>.partial`: finished windows, appended in input order
    with flush + fsync; renamed to `<output>` when the last window is written. `<output>.digests`: a digest of
    every row (`tfgen.batch.rowdigests`), written before the rows. `<output>.skipped.jsonl`: rows skipped with
    `on_error="skip"`. `<output>.lock`: held (`flock`) from `start` to `close`.
    """

    def __init__(self, output: str):
        self.output = output
        self.partial = output + ".partial"
        self.digests = output + ".digests"
        self.manifest = output + ".job.json"
        self.skipped = output + ".skipped.jsonl"
        self.lock = OutputLock(output)
        self._file = None
        self._digests_file = None
        self._link = b""  # the running hash after the last row on disk
        self.complete = False
        self.cut_bytes = 0  # bytes of an interrupted write dropped on resume
        self.rows_written: int | None = None  # rows on disk once started
        self.rows_total: int | None = None

    def start(self, settings: dict, expected_ids: list) -> int:
        """Locks the job's files and opens the job: returns how many rows are already written (all of them when
        the job is complete). The lock is held until `close`, also when this raises.

        Raises ValueError when another run holds the lock (naming its pid and host), when the files belong to
        another job (other settings or input), when `<output>` exists without a manifest (not ours to
        overwrite), when a row of the partial output no longer matches its digest (naming its line), or when a
        finished job's output no longer matches its recorded row count and sha256. Raises `OutputWriteError`
        when there is no room to create the job's files.
        """
        self.lock.acquire()
        self.rows_total = len(expected_ids)
        self._link = chain_start(settings)
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
            return self._recover()
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
        with self._writing(self.manifest):
            self._write_manifest(settings, "running")
        for path in (self.partial, self.digests):
            with self._writing(path), open(path, "wb") as file:
                os.fsync(file.fileno())
        _fsync_directory(self.partial)
        return 0

    def _recover(self) -> int:
        """Keeps the rows of the partial output that match their digests and cuts the rest (what a crash leaves:
        a write cut short, or unsynced garbage after a power loss; rows no digest vouches for are generated
        again); returns their count (and sets `cut_bytes`). Raises ValueError naming the line when a row that
        was synced before the last write no longer matches its digest: it was changed after it was written."""
        found = verify(self.partial, self.digests, self._link)
        if found.changed_line is not None and not found.changed_in_last_write:
            raise ValueError(self._changed_message(found.changed_line, "since it was written"))
        if found.unvouched:
            logger.warning("%d row(s) of %s after row %d have no digest in %s; they are generated again",
                           found.unvouched, self.partial, found.rows, self.digests)
        self.cut_bytes = os.path.getsize(self.partial) - found.size
        if self.cut_bytes:
            os.truncate(self.partial, found.size)
        with self._writing(self.digests), open(self.digests, "ab", buffering=0) as file:
            file.truncate(found.digests_size)  # the digests of the kept rows, and nothing after them
            _write_synced(file, found.digests_tail)
        self._link = found.link
        return found.rows

    def _changed_message(self, line: int, when: str) -> str:
        return (
            f"output: line {line} of {self.partial} is not the row this job wrote there (it does not match its "
            f"digest in {self.digests}): it was changed {when}. Restore it; or keep only the {line - 1} line(s) "
            f"before it (e.g. with `head -n {line - 1}`) and run again to generate the rest; or remove "
            f"{self.output} and its {self.output}.* files to start over."
        )

    def append(self, records: list[dict]) -> None:
        """Appends result rows (JSON objects, one line each) to the partial output with one `write`, after
        appending their digests to `<output>.digests`."""
        if not records:
            return
        lines = [(json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8") for record in records]
        digests, link = digests_line(self._link, lines)
        with self._writing(self.digests):
            if self._digests_file is None:
                self._digests_file = open(self.digests, "ab", buffering=0)
            _write_synced(self._digests_file, digests)
        with self._writing(self.partial):
            self.write(b"".join(lines))
        self._link = link
        self.rows_written += len(records)

    def write(self, data: bytes) -> None:
        """Appends bytes to the partial output, synced before returning (the one place the job's output grows,
        so a test can stop a run at an exact byte offset by wrapping it). Unbuffered, so that a write that fails
        leaves nothing behind to be written later."""
        if self._file is None:
            self._file = open(self.partial, "ab", buffering=0)
        _write_synced(self._file, data)

    @contextlib.contextmanager
    def _writing(self, path: str):
        """Turns a write error that means "no room" into an `OutputWriteError` naming `path` and saying how much
        of the job is saved."""
        try:
            yield
        except OSError as error:
            if error.errno not in _NO_ROOM or isinstance(error, OutputWriteError):
                raise
            saved = ("nothing is generated yet" if self.rows_written is None
                     else f"{self.rows_written} of {self.rows_total} rows are saved in {self.partial}")
            failure = OutputWriteError(
                f"output: could not write {path}: {error.strerror} ({_NO_ROOM[error.errno]}); {saved}. Make room, "
                "then run the same command again to resume."
            )
            failure.errno = error.errno
            raise failure from None

    def finish(self, settings: dict) -> None:
        """Records the complete output's row count and sha256 in the manifest (state "complete"), then publishes
        the output under its final name. Raises ValueError, certifying nothing, when the partial output no
        longer holds exactly the rows this job wrote (it was changed while the job ran)."""
        self._close_files()
        found = verify(self.partial, self.digests, chain_start(settings))
        if found.changed_line is not None:
            raise ValueError(self._changed_message(found.changed_line, "while the job ran"))
        if found.rows != self.rows_total or found.size != os.path.getsize(self.partial):
            raise ValueError(
                f"output: {self.partial} holds {found.rows} row(s) that match their digests and "
                f"{os.path.getsize(self.partial) - found.size} byte(s) after them, but this job wrote "
                f"{self.rows_total} rows: it was changed while the job ran. Run the same command again to "
                "generate what is missing."
            )
        rows, digest = found.rows, found.sha256
        # The record goes first: a crash before the rename leaves a complete manifest beside the `.partial`, which
        # the next run recovers and finishes again; the other order would leave an output with nothing to verify.
        with self._writing(self.manifest):
            self._write_manifest(settings, "complete", output={"rows": rows, "sha256": digest})
        os.replace(self.partial, self.output)
        _fsync_directory(self.output)
        self.complete = True

    def _close_files(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._digests_file is not None:
            self._digests_file.close()
            self._digests_file = None

    def close(self) -> None:
        """Closes the output and releases the lock (the files stay as they are: a job not complete resumes)."""
        self._close_files()
        self.lock.release()

    def write_skipped(self, bad: list[BadRow]) -> None:
        """Lists the skipped rows in `<output>.skipped.jsonl` (one JSON object per row), or removes that file."""
        if bad:
            lines = "".join(json.dumps(row.to_json(), ensure_ascii=False) + "\n" for row in bad)
            with self._writing(self.skipped):
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


def _write_synced(file, data: bytes) -> None:
    """Writes all of `data` to an unbuffered file (a short write goes on where it stopped), then fsyncs it."""
    view = memoryview(data)
    while view:
        view = view[file.write(view) :]
    os.fsync(file.fileno())


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
    try:
        with open(temporary, "wb", buffering=0) as file:
            _write_synced(file, text.encode("utf-8"))
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(temporary)  # half a file, of no use to anyone
        raise
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
