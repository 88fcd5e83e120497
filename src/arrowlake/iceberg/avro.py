"""A writer of Avro object container files, the format of Iceberg's manifests and manifest lists.

Written here rather than taken from a library: pyiceberg 0.12 cannot write v3 manifests, and
a general Avro library (fastavro) would be a dependency every lake needs just to publish a few
files of records. What Iceberg's files use of Avro is small: records, unions of null and one
type, arrays, maps, the primitive types and fixed. Avro's specification
(https://avro.apache.org/docs/1.11.1/specification/) defines, and this module implements:

- binary encoding: ``int`` and ``long`` as zig-zag varints, ``float``/``double`` as
  little-endian IEEE 754, ``bytes``/``string`` as a length and the bytes, ``fixed`` as the
  bytes, a record as its fields in order, a union as the branch index and the value, arrays
  and maps as blocks of a count and the items, ended by a block of count 0;
- the object container: the magic ``Obj\\x01``, the file metadata (a map of bytes, holding
  ``avro.schema`` and ``avro.codec``), a random 16-byte sync marker, then blocks of (record
  count, byte size, the records, possibly compressed with ``deflate``, the sync marker).

Schemas are given as their JSON form (dicts, lists and names), extra attributes such as
Iceberg's ``field-id`` included; the encoder of a schema is compiled once. Values of a record
are dicts by field name (a missing field is null), of an array lists, of a map dicts.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

Encoder = Callable[[bytearray, Any], None]

MAGIC = b"Obj\x01"
#: Records per block of a container file.
BLOCK_RECORDS = 4096

_FLOAT = struct.Struct("<f")
_DOUBLE = struct.Struct("<d")


def write_long(buf: bytearray, value: int) -> None:
    """Append ``value`` as Avro's zig-zag varint (``int`` and ``long`` alike)."""
    n = (value << 1) ^ (value >> 63)
    while n & ~0x7F:
        buf.append((n & 0x7F) | 0x80)
        n >>= 7
    buf.append(n)


def _write_bytes(buf: bytearray, value: bytes) -> None:
    write_long(buf, len(value))
    buf += value


def _write_string(buf: bytearray, value: str) -> None:
    _write_bytes(buf, value.encode("utf-8"))


def _write_boolean(buf: bytearray, value: bool) -> None:
    buf.append(1 if value else 0)


def _write_float(buf: bytearray, value: float) -> None:
    buf += _FLOAT.pack(value)


def _write_double(buf: bytearray, value: float) -> None:
    buf += _DOUBLE.pack(value)


def _write_null(buf: bytearray, value: None) -> None:
    if value is not None:
        raise ValueError(f"Avro null cannot hold {value!r}")


_PRIMITIVES: dict[str, Encoder] = {
    "null": _write_null,
    "boolean": _write_boolean,
    "int": write_long,
    "long": write_long,
    "float": _write_float,
    "double": _write_double,
    "bytes": _write_bytes,
    "string": _write_string,
}


class SchemaError(ValueError):
    """A schema this writer does not support (a bug in the caller, never user input)."""


def compile_schema(schema: Any) -> Encoder:
    """The encoder of values of ``schema`` (its JSON form)."""
    named: dict[str, Encoder] = {}
    return _compile(schema, named)


def _compile(schema: Any, named: dict[str, Encoder]) -> Encoder:
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema]
        if schema in named:
            return named[schema]
        raise SchemaError(f"Unknown Avro type {schema!r}")
    if isinstance(schema, list):
        return _compile_union(schema, named)
    kind = schema["type"]
    if kind in _PRIMITIVES:  # a primitive with attributes (a logical type)
        return _PRIMITIVES[kind]
    if kind == "record":
        return _compile_record(schema, named)
    if kind == "array":
        return _compile_array(_compile(schema["items"], named))
    if kind == "map":
        return _compile_map(_compile(schema["values"], named))
    if kind == "fixed":
        size = int(schema["size"])

        def fixed(buf: bytearray, value: bytes) -> None:
            if len(value) != size:
                raise ValueError(f"Avro fixed {schema['name']} holds {size} bytes, "
                                 f"not {len(value)}")
            buf += value

        named[schema["name"]] = fixed
        return fixed
    raise SchemaError(f"Unsupported Avro type {kind!r}")


def _compile_union(branches: list[Any], named: dict[str, Encoder]) -> Encoder:
    if len(branches) != 2 or "null" not in branches:
        raise SchemaError(f"Only unions of null and one type are supported, not {branches}")
    null_index = branches.index("null")
    other_index = 1 - null_index
    other = _compile(branches[other_index], named)

    def union(buf: bytearray, value: Any) -> None:
        if value is None:
            buf.append(null_index * 2)  # the varint of a small index
        else:
            buf.append(other_index * 2)
            other(buf, value)

    return union


def _compile_record(schema: Mapping[str, Any], named: dict[str, Encoder]) -> Encoder:
    fields: list[tuple[str, Encoder]] = []

    def record(buf: bytearray, value: Mapping[str, Any]) -> None:
        get = value.get
        for name, encode in fields:
            encode(buf, get(name))

    # Registered before its fields are compiled, as Avro lets a record refer to itself.
    named[schema["name"]] = record
    fields.extend((f["name"], _compile(f["type"], named)) for f in schema["fields"])
    return record


def _compile_array(items: Encoder) -> Encoder:
    def array(buf: bytearray, values: list[Any]) -> None:
        if values:
            write_long(buf, len(values))
            for value in values:
                items(buf, value)
        buf.append(0)

    return array


def _compile_map(values: Encoder) -> Encoder:
    def map_(buf: bytearray, value: Mapping[str, Any]) -> None:
        if value:
            write_long(buf, len(value))
            for key, item in value.items():
                _write_string(buf, key)
                values(buf, item)
        buf.append(0)

    return map_


def container(schema: Mapping[str, Any], records: Iterable[Mapping[str, Any]], *,
              metadata: Mapping[str, str] | None = None, codec: str = "deflate") -> bytes:
    """An Avro object container file holding ``records`` of ``schema``, with ``metadata``
    (string keys and values) in its header."""
    if codec not in ("null", "deflate"):
        raise SchemaError(f"Unsupported Avro codec {codec!r}")
    encode = compile_schema(schema)
    sync = os.urandom(16)
    out = bytearray(MAGIC)
    header = {**(metadata or {}), "avro.schema": json.dumps(schema, separators=(",", ":")),
              "avro.codec": codec}
    write_long(out, len(header))
    for key, value in header.items():
        _write_string(out, key)
        _write_bytes(out, value.encode("utf-8"))
    out.append(0)
    out += sync
    block = bytearray()
    count = 0

    def flush() -> None:
        nonlocal block, count
        data = bytes(block)
        if codec == "deflate":
            compressor = zlib.compressobj(6, zlib.DEFLATED, -15)  # raw deflate, as Avro says
            data = compressor.compress(data) + compressor.flush()
        write_long(out, count)
        write_long(out, len(data))
        out.extend(data)
        out.extend(sync)
        block = bytearray()
        count = 0

    for record in records:
        encode(block, record)
        count += 1
        if count == BLOCK_RECORDS:
            flush()
    if count:
        flush()
    return bytes(out)


def _read_long(data: bytes, pos: int) -> tuple[int, int]:
    shift = n = 0
    while True:
        byte = data[pos]
        pos += 1
        n |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (n >> 1) ^ -(n & 1), pos


def header(data: bytes) -> dict[str, bytes]:
    """The file metadata of a container file (to check what was written)."""
    if data[:4] != MAGIC:
        raise ValueError("Not an Avro object container file")
    pos = 4
    out: dict[str, bytes] = {}
    while True:
        count, pos = _read_long(data, pos)
        if count == 0:
            return out
        if count < 0:
            _, pos = _read_long(data, pos)
            count = -count
        for _ in range(count):
            size, pos = _read_long(data, pos)
            key = data[pos:pos + size].decode()
            pos += size
            size, pos = _read_long(data, pos)
            out[key] = data[pos:pos + size]
            pos += size
