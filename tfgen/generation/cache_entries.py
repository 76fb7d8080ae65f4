"""What an entry of XLA's persistent compilation cache must look like before TensorFlow may read it.

TensorFlow 2.21 writes each entry as a binary `XlaSerializedCacheEntry` proto
(`tensorflow/compiler/jit/xla_compilation_cache.proto`):

    1 key          XlaSerializedCacheKey: 1 signature_fingerprint (uint64), 2 cluster_fingerprint (uint64),
                   3 device_type, 4 prefix, 5 compiled_using_pjrt (bool)
    2 hlo_module   xla.HloModuleProto, the program
    3 executable   bytes: the compiled program (on the CPU an `xla.cpu.CompilationResultProto`, whose field 1 is an
                   `xla.HloProto` and whose object files hold the machine code)

and names its file after the key: `[<prefix>__]<signature>__<cluster>__<device>[__pjrt].pb`. TensorFlow fails the
program's call instead of compiling it when it cannot parse an entry, when the entry's key or HLO differ from the
program's, or when the executable does not load — and remembers that failure for the rest of the process. So
`compile_cache` lets TensorFlow see only entries that pass `stored_entry_problem`: a regular file (never read
through a symbolic link) whose SHA-256 matches its name, that parses as above, whose key names the file it is in
and whose HLO hashes to the key's cluster fingerprint. What no check outside TensorFlow can see — a changed byte
inside the executable — is healed where the program runs when TensorFlow fails on it (`compile_cache.heal`), and
not at all when the changed machine code still loads (see docs/compile-cache.md).
"""

from __future__ import annotations

import hashlib
import os
import stat

# The device types whose executable is an `xla.cpu.CompilationResultProto` (field 1: an `xla.HloProto`).
_CPU_DEVICES = ("XLA_CPU_JIT", "XLA_CPU")
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_MURMUR, _MASK = 0xC6A4A7935BD1E995, 2**64 - 1


def read_entry(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of `path`, read only when it is a regular file (a symbolic link at its last component is never
    followed) of at most `limit` bytes. Raises ValueError saying why not, FileNotFoundError when it is gone."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise
    except OSError as error:  # ELOOP: a symbolic link
        raise ValueError("a symbolic link" if os.path.islink(path) else f"unreadable ({error.strerror})") from None
    with os.fdopen(descriptor, "rb") as file:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise ValueError("not a regular file")
        if status.st_size > limit:
            raise ValueError(f"{status.st_size} bytes, more than the store's {limit}")
        return file.read(limit + 1)


def stored_entry_problem(path: str | os.PathLike, file_name: str, digest: str, limit: int) -> str | None:
    """Why the store entry at `path` must not reach TensorFlow as `file_name`: not a regular file of at most
    `limit` bytes (a symbolic link is never followed), content that does not match its SHA-256 `digest`, or bytes
    TensorFlow cannot load as `file_name` (`entry_problem`). None for a healthy entry, and for one another
    process deleted meanwhile (linking it then fails quietly)."""
    try:
        content = read_entry(path, limit)
    except FileNotFoundError:
        return None
    except ValueError as error:
        return str(error)
    if hashlib.sha256(content).hexdigest() != digest:
        return "its content does not match its checksum"
    return entry_problem(file_name, content)


def entry_problem(file_name: str, content: bytes) -> str | None:
    """Why `content` cannot be the entry TensorFlow reads as `file_name` (its name without the store's checksum),
    or None when it can: it must parse as an `XlaSerializedCacheEntry` (each field once, nothing after it), its key
    must name `file_name`, its HLO must parse and hash to the key's cluster fingerprint, and its executable must
    not be empty (a CPU one's HLO must parse too)."""
    try:
        entry = _fields(content, {1: _LENGTH, 2: _LENGTH, 3: _LENGTH})
        key = _fields(entry.get(1, b""), {1: _VARINT, 2: _VARINT, 3: _LENGTH, 4: _LENGTH, 5: _VARINT})
    except ValueError as error:
        return f"not a cache entry ({error})"
    named = _file_name(key)
    if named != file_name:
        return f"its key names {named!r}"
    if not entry.get(3):
        return "no executable"
    # Imported here, not at the top: `import tfgen` imports this module and must not import TensorFlow; the
    # entries are checked in the cache's thread, started with the first compiled program (TensorFlow loaded).
    from google.protobuf.message import DecodeError

    try:
        from tensorflow.compiler.xla.service import hlo_pb2
    except ImportError:  # a TensorFlow build without XLA's Python protos: its call heals (compile_cache.heal)
        return None
    try:
        hlo = hlo_pb2.HloModuleProto.FromString(entry.get(2, b"")).SerializeToString(deterministic=True)
        if key.get(3, b"").decode("utf-8", "replace") in _CPU_DEVICES:
            hlo_pb2.HloProto.FromString(_fields(entry[3], None).get(1, b""))
    except (DecodeError, ValueError) as error:
        return f"a damaged program ({type(error).__name__})"
    if hash64(hlo) != key.get(2):
        # TensorFlow would refuse it ("Serialized HLO does not match"), failing the call.
        return "its HLO does not match its key"
    return None


def hash64(data: bytes, seed: int = 0xDECAFCAFFE) -> int:
    """TensorFlow's `Hash64` (MurmurHash64A with TensorFlow's default seed): the key's cluster fingerprint is
    `Hash64` of the HLO module's deterministic serialization (`DeterministicProtoHash64`)."""
    import numpy as np  # here, not at the top: `import tfgen` imports this module and stays quick

    words = len(data) // 8
    # The per-word mixing, vectorized; numpy's uint64 arithmetic wraps as C's does.
    mixed = np.frombuffer(data, "<u8", count=words).astype(np.uint64) * np.uint64(_MURMUR)
    mixed ^= mixed >> np.uint64(47)
    mixed *= np.uint64(_MURMUR)
    h = (seed ^ (len(data) * _MURMUR)) & _MASK
    for word in mixed.tolist():
        h = ((h ^ word) * _MURMUR) & _MASK
    if len(data) % 8:
        h = ((h ^ int.from_bytes(data[words * 8 :], "little")) * _MURMUR) & _MASK
    h ^= h >> 47
    h = (h * _MURMUR) & _MASK
    return h ^ (h >> 47)


def _file_name(key: dict) -> str:
    """TensorFlow's file name for a parsed key (`XlaSerializedCacheKeyToFileName`)."""
    prefix = key.get(4, b"").decode("utf-8", "replace")
    device = key.get(3, b"").decode("utf-8", "replace")
    return (f"{prefix}{'__' if prefix else ''}{key.get(1, 0)}__{key.get(2, 0)}__{device}"
            f"{'__pjrt' if key.get(5) else ''}.pb")


def _fields(message: bytes, expected: dict[int, int] | None) -> dict:
    """The top level of a serialized protobuf message: {field number: value} (varints as int, length-delimited
    fields as bytes; a repeated field keeps its last value). With `expected` ({field number: wire type}), any other
    field, wire type or a field seen twice is an error. Raises ValueError when the framing is broken."""
    fields: dict = {}
    position = 0
    while position < len(message):
        tag, position = _varint(message, position)
        number, wire_type = tag >> 3, tag & 7
        if expected is not None and (expected.get(number) != wire_type or number in fields):
            raise ValueError(f"unexpected field {number} (wire type {wire_type}) at byte {position}")
        if wire_type == _VARINT:
            fields[number], position = _varint(message, position)
        elif wire_type == _LENGTH:
            length, position = _varint(message, position)
            if position + length > len(message):
                raise ValueError(f"field {number} runs past the end")
            fields[number], position = message[position : position + length], position + length
        elif wire_type in (_FIXED64, _FIXED32):
            position += 8 if wire_type == _FIXED64 else 4
            if position > len(message):
                raise ValueError(f"field {number} runs past the end")
        else:
            raise ValueError(f"wire type {wire_type} at byte {position}")
    return fields


def _varint(message: bytes, position: int) -> tuple[int, int]:
    """The varint at `position` and the position after it."""
    value = shift = 0
    while True:
        if position >= len(message) or shift > 63:
            raise ValueError(f"a broken varint at byte {position}")
        byte = message[position]
        value |= (byte & 0x7F) << shift
        position, shift = position + 1, shift + 7
        if not byte & 0x80:
            return value, position
