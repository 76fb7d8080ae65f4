"""The row digests of a batch job's output: a running sha256 over its rows, recorded for every row in
`<output>.digests`, so that a resumed job keeps only rows that are, byte for byte, the ones it wrote.

Row `i`'s link is `sha256(link[i-1] + line_i)` (its JSON line, newline included), starting from a sha256 of the
job's settings, so a row's digest vouches for its bytes, its position and every row before it, in this job only.
`<output>.digests` holds one text line per write of the output (a window's rows): the first `DIGEST_CHARS` hex
digits of each row's link, separated by spaces. That line is written and fsynced before the rows it vouches for:
after a crash, every row on disk has its digest, and only the rows of the last line can be cut short or garbage
(the write that the crash, or a power loss, interrupted). TensorFlow-free.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Iterator

#: Hex digits kept per row: 128 bits, so a changed row passes for the original with probability 2^-128.
DIGEST_CHARS = 32
# A well-formed line of `.digests`: one digest per row of a write, and its newline.
_DIGESTS_LINE = re.compile(rb"[0-9a-f]{%d}( [0-9a-f]{%d})*\n" % (DIGEST_CHARS, DIGEST_CHARS))
# A row's line is hashed this many bytes at a time: a row of any length (or garbage without a newline) costs no
# more memory than this.
_READ_PIECE = 1 << 20


def chain_start(settings: dict) -> bytes:
    """The link before a job's first row: a sha256 of its settings (which hold the input's fingerprint)."""
    return hashlib.sha256(b"tfgen batch rows\n" + json.dumps(settings, sort_keys=True).encode()).digest()


def digests_line(link: bytes, lines: list[bytes]) -> tuple[bytes, bytes]:
    """(the `.digests` line vouching for `lines`, the link after the last of them), continuing from `link`."""
    digests = []
    for line in lines:
        link = hashlib.sha256(link + line).digest()
        digests.append(link.hex()[:DIGEST_CHARS])
    return (" ".join(digests) + "\n").encode(), link


@dataclasses.dataclass
class Verified:
    """How much of an output its digests vouch for, from its first row.

    rows, size, sha256, link: the rows that match their digests, their bytes, the sha256 of those bytes, and the
    link after them. changed_line: the first complete line that does not match its digest (None if none), and
    changed_in_last_write: whether it is one of the last digests line's rows (which a crash can leave as garbage).
    unvouched: complete lines after the matching rows that no digest covers. digests_size, digests_tail: how to
    cut `.digests` down to the matching rows: keep its first `digests_size` bytes, then append `digests_tail`.
    """

    rows: int
    size: int
    sha256: str
    link: bytes
    changed_line: int | None
    changed_in_last_write: bool
    unvouched: int
    digests_size: int
    digests_tail: bytes


def verify(path: str, digests_path: str, start: bytes) -> Verified:
    """Checks the rows of `path` against `digests_path` (missing: no digests), from the first row until one
    does not match, is cut short, or has no digest; reads each file once, a piece at a time."""
    whole, link, rows, size, digests_size = hashlib.sha256(), start, 0, 0, 0
    with open(path, "rb") as file:
        for offset, end, digests, last in _digest_writes(digests_path):
            for count, expected in enumerate(digests):
                kept = whole.copy()
                next_link, length, complete = _hash_line(file, link, kept)
                if not complete or next_link.hex()[:DIGEST_CHARS] != expected:
                    tail = (" ".join(digests[:count]) + "\n").encode() if count else b""
                    return Verified(rows, size, whole.hexdigest(), link, rows + 1 if complete else None,
                                    last, 0, offset, tail)
                whole, link, rows, size = kept, next_link, rows + 1, size + length
            digests_size = end
        file.seek(size)
        unvouched = sum(piece.count(b"\n") for piece in iter(lambda: file.read(_READ_PIECE), b""))
    return Verified(rows, size, whole.hexdigest(), link, None, False, unvouched, digests_size, b"")


def _hash_line(file, link: bytes, whole) -> tuple[bytes, int, bool]:
    """Reads one line of `file` a piece at a time into `whole` and the next link: returns (that link, the line's
    length, whether it ended in a newline)."""
    step = hashlib.sha256(link)
    length = 0
    while piece := file.readline(_READ_PIECE):
        step.update(piece)
        whole.update(piece)
        length += len(piece)
        if piece.endswith(b"\n"):
            return step.digest(), length, True
    return step.digest(), length, False


def _digest_writes(path: str) -> Iterator[tuple[int, int, list[str], bool]]:
    """(start and end byte offsets, row digests, whether it is the last) of each complete, well-formed line of a
    `.digests` file, up to the first that is not (a write a crash cut short); nothing when there is no file. One
    line is held at a time (plus the next, to know the last)."""
    if not os.path.exists(path):
        return
    with open(path, "rb") as file:
        held, offset = None, 0
        for line in file:
            if not _DIGESTS_LINE.fullmatch(line):
                break
            if held is not None:
                yield offset, offset + len(held), held[:-1].decode("ascii").split(" "), False
                offset += len(held)
            held = line
        if held is not None:
            yield offset, offset + len(held), held[:-1].decode("ascii").split(" "), True
