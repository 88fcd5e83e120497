"""Puffin files (Iceberg's container for blobs such as deletion vectors).

Layout, as Iceberg's Puffin spec gives it: the magic ``PFA1``, the blobs one after another,
then the footer: the magic, a UTF-8 JSON payload (``{"blobs": [...], "properties": {...}}``,
LZ4-framed when flag bit 0 is set), the payload's length as a 4-byte little-endian signed
integer, 4 bytes of flags, and the magic again. Each blob's metadata names its ``type``,
``fields``, ``snapshot-id`` and ``sequence-number`` (-1 for deletion vectors, which are
written before their snapshot exists), ``offset``, ``length`` and ``properties``.

arrowlake records where each blob lives (path, offset, length) in the metastore, so a reader
fetches one byte range per vector and never needs the footer; the footer is written so that
other readers of the format find the blobs.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from arrowlake.errors import DataFileError
from arrowlake.io.storage import Storage

MAGIC = b"PFA1"
_FLAG_COMPRESSED = 1
#: Payload length + flags + trailing magic.
_FOOTER_TAIL = 12


@dataclass(frozen=True)
class BlobLocation:
    """Where one blob of a Puffin file is: what a reader needs to fetch it."""

    path: str
    offset: int
    length: int


@dataclass(frozen=True)
class Blob:
    """A blob to write: its bytes, type and string properties."""

    data: bytes
    type: str
    properties: Mapping[str, str] = field(default_factory=dict)
    fields: Sequence[int] = ()


def write_puffin(storage: Storage, path: str, blobs: Sequence[Blob], *,
                 created_by: str = "arrowlake") -> list[BlobLocation]:
    """Write ``blobs`` as a new Puffin file at ``path``; where each one landed, in order."""
    locations: list[BlobLocation] = []
    metadata: list[dict[str, Any]] = []
    offset = len(MAGIC)
    with storage.open_output(path) as out:
        out.write(MAGIC)
        for blob in blobs:
            out.write(blob.data)
            locations.append(BlobLocation(path, offset, len(blob.data)))
            metadata.append({
                "type": blob.type, "fields": list(blob.fields), "snapshot-id": -1,
                "sequence-number": -1, "offset": offset, "length": len(blob.data),
                "properties": dict(blob.properties)})
            offset += len(blob.data)
        payload = json.dumps({"blobs": metadata, "properties": {"created-by": created_by}},
                             separators=(",", ":")).encode()
        out.write(MAGIC + payload + struct.pack("<ii", len(payload), 0) + MAGIC)
    return locations


def read_footer(storage: Storage, path: str) -> list[dict[str, Any]]:
    """The blob metadata of the Puffin file at ``path`` (as its footer records them)."""
    tail = storage.read_suffix(path, _FOOTER_TAIL)
    if len(tail) < _FOOTER_TAIL or tail[-4:] != MAGIC:
        raise DataFileError(f"{path} is not a Puffin file: its last bytes are not {MAGIC!r}")
    size, flags = struct.unpack("<ii", tail[:8])
    footer = storage.read_suffix(path, _FOOTER_TAIL + size + len(MAGIC))
    if size < 0 or len(footer) != _FOOTER_TAIL + size + len(MAGIC) or footer[:4] != MAGIC:
        raise DataFileError(f"{path} is a damaged Puffin file: its footer length {size} does "
                            "not lead to the footer's magic")
    payload = footer[4:4 + size]
    if flags & _FLAG_COMPRESSED:
        payload = pa.CompressedInputStream(pa.BufferReader(payload), "lz4").read()
    try:
        return list(json.loads(payload)["blobs"])
    except (ValueError, KeyError, TypeError) as exc:
        raise DataFileError(f"{path} is a damaged Puffin file: its footer is not the JSON "
                            f"the spec describes ({exc})") from None


def read_blob(storage: Storage, location: BlobLocation) -> bytes:
    """One blob's bytes: a single range read."""
    data = storage.read_range(location.path, location.offset,
                              location.offset + location.length)
    if len(data) != location.length:
        raise DataFileError(
            f"{location.path} is shorter than the metastore says: the blob at offset "
            f"{location.offset} should hold {location.length} bytes, {len(data)} were read")
    return data
