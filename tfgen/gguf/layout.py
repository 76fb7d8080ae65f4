"""A GGUF file's layout checked as llama.cpp's loader checks it (`ggml/src/gguf.cpp`, `gguf_init_from_reader`; the
model loader's bounds test), before gguf-py parses it: gguf-py trusts what the file claims (its parser walks a
claimed array length element by element, and it serves a tensor at any offset it is given, overlapping another or
unaligned), and a file from the Internet is untrusted input.

Checked, in file order: the tensor and key counts, each key (not empty, not repeated, a known value type, arrays not
nested), each string and array length (within llama.cpp's limits and the bytes left in the file, before anything is
read), `general.alignment` (a UINT32 power of two), each tensor's name (shorter than 64 bytes, not repeated),
dimensions (at most 4, none negative, their product below 2**63), type (a ggml type whose row size divides the
first dimension) and offset: a multiple of the alignment, where llama.cpp expects it (tensors packed in file order,
each padded to the alignment: so no two overlap and none leaves a gap), and its bytes inside the file.

Something that runs past the end of the file (a length, count or tensor the remaining bytes cannot hold) is an
`OSError`, as for any truncated file; anything else is a `ValueError`. Both name the file and the key or tensor.
"""

from __future__ import annotations

import mmap
import os
import struct

# llama.cpp's limits (gguf.cpp): GGUF_MAX_STRING_LENGTH, GGUF_MAX_ARRAY_ELEMENTS, GGML_MAX_NAME, GGML_MAX_DIMS.
MAX_STRING_BYTES = 1 << 30
MAX_ARRAY_ITEMS = 1 << 30
MAX_TENSOR_NAME_BYTES = 63
MAX_DIMENSIONS = 4
SUPPORTED_VERSIONS = (2, 3)  # gguf-py's; llama.cpp refuses version 1 too
DEFAULT_ALIGNMENT = 32
# Bytes of each scalar GGUF value type (GGUFValueType: 8 STRING and 9 ARRAY have none of their own).
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
# The fewest bytes one key / one tensor entry can take: key length, a 1-byte key, type, a 1-byte value; name
# length, an empty name, dimension count, type, offset.
_SMALLEST_KEY_BYTES = 8 + 1 + 4 + 1
_SMALLEST_TENSOR_ENTRY_BYTES = 8 + 4 + 4 + 8


class _Reader:
    """Reads little- or big-endian numbers and strings from the mapped file, refusing any that runs past its end."""

    def __init__(self, data, path: str, order: str):
        self.data, self.path, self.position = data, path, 0
        self.u32, self.i32 = struct.Struct(order + "I"), struct.Struct(order + "i")
        self.u64, self.i64 = struct.Struct(order + "Q"), struct.Struct(order + "q")

    @property
    def left(self) -> int:
        return len(self.data) - self.position

    def truncated(self, what: str, needed: int) -> OSError:
        return OSError(f"{self.path!r} is truncated or corrupt: {what} needs {needed:,} bytes, and only "
                       f"{self.left:,} are left in the file")

    def number(self, form: struct.Struct, what: str) -> int:
        if form.size > self.left:
            raise self.truncated(what, form.size)
        (value,) = form.unpack_from(self.data, self.position)
        self.position += form.size
        return value

    def skip(self, size: int, what: str) -> None:
        if size > self.left:
            raise self.truncated(what, size)
        self.position += size

    def string(self, what: str, keep: bool = True) -> bytes:
        """The next string's bytes (checked against llama.cpp's limit and the bytes left); b"" unless `keep`."""
        size = self.number(self.u64, f"the length of {what}")
        if size > MAX_STRING_BYTES:
            raise ValueError(f"{self.path!r}: {what} claims {size:,} bytes, over llama.cpp's limit of "
                             f"{MAX_STRING_BYTES:,}")
        start = self.position
        self.skip(size, what)
        return bytes(self.data[start:self.position]) if keep else b""


def check_layout(real_path: str, path: str) -> None:
    """Checks the GGUF file at `real_path` (shown as `path` in messages) as the module docstring says; returns
    nothing when it passes. Reads only the header, metadata and tensor table (the file is memory-mapped)."""
    import gguf  # lazy, as in tfgen.gguf.files: only GGUF loading needs it

    with open(real_path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size < 24:  # magic, version and the two counts
            raise OSError(f"{path!r} is not a readable GGUF file (not GGUF, or truncated): {size} bytes")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if data[:4] != b"GGUF":
                raise OSError(f"{path!r} is not a readable GGUF file (not GGUF, or truncated): no GGUF magic")
            # As gguf-py does: a version whose low half is zero was written on a host of the other byte order.
            order = "<" if struct.unpack_from("<I", data, 4)[0] & 0xFFFF else ">"
            reader = _Reader(data, path, order)
            reader.position = 4
            version = reader.number(reader.u32, "the version")
            if version not in SUPPORTED_VERSIONS:
                raise OSError(f"{path!r} is GGUF version {version}; tfgen reads versions 2 and 3")
            tensor_count = reader.number(reader.i64, "the tensor count")
            key_count = reader.number(reader.i64, "the metadata key count")
            _check_count(reader, tensor_count, "tensors", 0)  # the keys come first
            _check_count(reader, key_count, "metadata keys", _SMALLEST_KEY_BYTES)
            alignment = _check_metadata(reader, key_count)
            _check_count(reader, tensor_count, "tensors", _SMALLEST_TENSOR_ENTRY_BYTES)
            _check_tensors(reader, tensor_count, alignment, gguf.GGML_QUANT_SIZES, gguf.GGMLQuantizationType)


def _check_count(reader: _Reader, count: int, what: str, smallest: int) -> None:
    if count < 0:
        raise ValueError(f"{reader.path!r}: the file claims {count} {what}")
    if count * smallest > reader.left:
        raise reader.truncated(f"{count:,} {what} (at least {smallest} bytes each)", count * smallest)


def _check_metadata(reader: _Reader, key_count: int) -> int:
    """Walks the metadata; returns `general.alignment` (checked) or the default."""
    keys, alignment = set(), DEFAULT_ALIGNMENT
    for number in range(key_count):
        raw_key = reader.string(f"metadata key {number}")
        key = raw_key.decode("utf-8", errors="replace")
        if not key:
            raise ValueError(f"{reader.path!r}: metadata key {number} is empty")
        if key in keys:
            raise ValueError(f"{reader.path!r}: metadata key {key!r} appears twice")
        keys.add(key)
        value_type = reader.number(reader.i32, f"the type of metadata {key!r}")
        if key == "general.alignment" and value_type != _UINT32:
            raise ValueError(f"{reader.path!r}: metadata 'general.alignment' must be a UINT32 (llama.cpp's rule)")
        if value_type == _ARRAY:
            item_type = reader.number(reader.i32, f"the item type of metadata {key!r}")
            if item_type == _ARRAY:
                raise ValueError(f"{reader.path!r}: metadata {key!r} is an array of arrays, which GGUF readers "
                                 "(llama.cpp's) refuse")
            _check_type(reader, item_type, key)
            count = reader.number(reader.u64, f"the length of metadata {key!r}")
            if count > MAX_ARRAY_ITEMS:
                raise ValueError(f"{reader.path!r}: metadata {key!r} claims {count:,} items, over llama.cpp's "
                                 f"limit of {MAX_ARRAY_ITEMS:,}")
            item_bytes = _SCALAR_BYTES.get(item_type, 8)  # a string takes its 8-byte length at least
            if count * item_bytes > reader.left:
                raise reader.truncated(f"metadata {key!r} ({count:,} items)", count * item_bytes)
            if item_type == _STRING:
                for index in range(count):
                    reader.string(f"item {index} of metadata {key!r}", keep=False)
            else:
                reader.skip(count * item_bytes, f"metadata {key!r}")
            continue
        _check_type(reader, value_type, key)
        if value_type == _STRING:
            reader.string(f"metadata {key!r}", keep=False)
            continue
        start = reader.position
        reader.skip(_SCALAR_BYTES[value_type], f"metadata {key!r}")
        if key == "general.alignment":
            (alignment,) = reader.u32.unpack_from(reader.data, start)
            if alignment == 0 or alignment & (alignment - 1):
                raise ValueError(f"{reader.path!r}: metadata 'general.alignment' is {alignment}, not a power of 2")
    return alignment


def _check_type(reader: _Reader, value_type: int, key: str) -> None:
    if value_type != _STRING and value_type not in _SCALAR_BYTES:
        raise ValueError(f"{reader.path!r}: metadata {key!r} has the unknown value type {value_type}")


def _check_tensors(reader: _Reader, count: int, alignment: int, type_sizes, type_names) -> None:
    """Walks the tensor table, then checks each tensor's offset and extent (see the module docstring)."""
    path, entries, names = reader.path, [], set()
    known = {int(key): value for key, value in type_sizes.items()}  # ggml type -> (block values, block bytes)
    for number in range(count):
        name = reader.string(f"the name of tensor {number}").decode("utf-8", errors="replace")
        if len(name.encode("utf-8")) > MAX_TENSOR_NAME_BYTES:
            raise ValueError(f"{path!r}: tensor {number}'s name is longer than llama.cpp's "
                             f"{MAX_TENSOR_NAME_BYTES} bytes: {name[:80]!r}")
        if name in names:
            raise ValueError(f"{path!r}: tensor {name!r} appears twice")
        names.add(name)
        dimension_count = reader.number(reader.u32, f"the dimension count of tensor {name!r}")
        if dimension_count > MAX_DIMENSIONS:
            raise ValueError(f"{path!r}: tensor {name!r} has {dimension_count} dimensions; GGUF allows at most "
                             f"{MAX_DIMENSIONS}")
        dims = [reader.number(reader.i64, f"the shape of tensor {name!r}") for _ in range(dimension_count)]
        elements = 1
        for size in dims:
            if size < 0:
                raise ValueError(f"{path!r}: tensor {name!r} has a negative dimension: {dims}")
            elements *= size
        if elements >= 1 << 63:
            raise ValueError(f"{path!r}: tensor {name!r} of shape {dims} has 2**63 elements or more")
        type_number = reader.number(reader.i32, f"the type of tensor {name!r}")
        if type_number not in known:
            raise ValueError(f"{path!r}: tensor {name!r} has the unknown ggml type {type_number}")
        block, block_bytes = known[type_number]
        row = dims[0] if dims else 1  # ggml's missing dimensions are 1
        if row % block:
            raise ValueError(f"{path!r}: tensor {name!r} of type {type_names(type_number).name} has {row} "
                             f"values per row, not a multiple of its block size {block}")
        offset = reader.number(reader.u64, f"the offset of tensor {name!r}")
        entries.append((name, offset, elements // block * block_bytes))
    data_start = -(-reader.position // alignment) * alignment if count else reader.position
    file_size = len(reader.data)
    for name, offset, size in entries:
        if offset % alignment:
            raise ValueError(f"{path!r}: tensor {name!r} is at offset {offset}, not a multiple of general.alignment "
                             f"({alignment})")
        if data_start + offset + size > file_size:
            raise OSError(f"{path!r} is truncated or corrupt: tensor {name!r} ({size:,} bytes at offset {offset:,} of "
                          f"the data section) runs past the end of the file ({file_size:,} bytes)")
    # Overlaps first (the clearer reason), then llama.cpp's packing rule; extents: (start, end, table index, name).
    extents = sorted((offset, offset + size, index, name) for index, (name, offset, size) in enumerate(entries) if size)
    for first, second in zip(extents, extents[1:]):  # any overlap shows between two neighbours in this order
        if second[0] < first[1]:
            earlier, later = sorted((first, second), key=lambda extent: extent[2])
            raise ValueError(f"{path!r}: tensor {later[3]!r} (bytes {later[0]:,} to {later[1]:,} of the data section) "
                             f"overlaps tensor {earlier[3]!r} (bytes {earlier[0]:,} to {earlier[1]:,})")
    expected = 0  # where llama.cpp expects the next tensor
    for name, offset, size in entries:
        if offset != expected:
            raise ValueError(f"{path!r}: tensor {name!r} is at offset {offset:,}, expected {expected:,}: llama.cpp "
                             "expects the tensors packed in table order, each padded to general.alignment")
        expected += -(-size // alignment) * alignment
