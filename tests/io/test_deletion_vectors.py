"""Deletion vectors in Iceberg's ``deletion-vector-v1`` bytes, and Puffin files holding them.

The bytes are checked against the format's text (a decoder written here from the
RoaringFormatSpec) and against pyroaring, which reads the blobs arrowlake writes and writes the
blobs arrowlake reads."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest
from pyroaring import BitMap64

from arrowlake.errors import DataFileError
from arrowlake.io import deletion_vectors as dv
from arrowlake.io import puffin
from arrowlake.io.storage import LocalStorage
from tests.native import reference

POSITION_SETS = {
    "empty": np.array([], dtype=np.int64),
    "one": np.array([7]),
    "dense run": np.arange(10_000, 80_000),
    "alternating": np.arange(0, 140_000, 2),  # bitmap containers
    "sparse": np.arange(0, 5_000_000, 997),
    "past 32 bits": np.array([0, 3, 2**32 - 1, 2**32, 2**32 + 5, 2**40 + 1]),
}


def _portable_positions(data: bytes) -> list[int]:
    """Decode the portable 64-bit roaring layout by hand, independently of pyroaring, from
    the RoaringFormatSpec: a little-endian count, then per 32-bit key its 32-bit bitmap."""
    (count,) = struct.unpack_from("<Q", data, 0)
    at, out = 8, []
    for _ in range(count):
        (high,) = struct.unpack_from("<I", data, at)
        at, lows = _read_bitmap32(data, at + 4)
        out.extend((high << 32) | low for low in lows)
    assert at == len(data), "bytes left after the last bitmap"
    return out


def _read_bitmap32(data: bytes, at: int) -> tuple[int, list[int]]:
    (cookie,) = struct.unpack_from("<I", data, at)
    if cookie & 0xFFFF == 12347:  # SERIAL_COOKIE: run containers may follow
        n = (cookie >> 16) + 1
        at += 4
        run_flags = data[at:at + (n + 7) // 8]
        at += (n + 7) // 8
        has_offsets = n >= 4
    else:
        assert cookie == 12346, f"unknown cookie {cookie}"
        (n,) = struct.unpack_from("<I", data, at + 4)
        at += 8
        run_flags = bytes((n + 7) // 8)
        has_offsets = True
    header = [struct.unpack_from("<HH", data, at + 4 * i) for i in range(n)]
    at += 4 * n + (4 * n if has_offsets else 0)
    values: list[int] = []
    for i, (key, card_minus_1) in enumerate(header):
        base = key << 16
        if run_flags[i // 8] >> (i % 8) & 1:
            (runs,) = struct.unpack_from("<H", data, at)
            for r in range(runs):
                start, extra = struct.unpack_from("<HH", data, at + 2 + 4 * r)
                values.extend(base + v for v in range(start, start + extra + 1))
            at += 2 + 4 * runs
        elif card_minus_1 + 1 > 4096:
            bits = np.unpackbits(np.frombuffer(data, np.uint8, 8192, at), bitorder="little")
            values.extend(base + int(v) for v in np.flatnonzero(bits))
            at += 8192
        else:
            lows = struct.unpack_from(f"<{card_minus_1 + 1}H", data, at)
            values.extend(base + v for v in lows)
            at += 2 * (card_minus_1 + 1)
    return at, values


@pytest.mark.parametrize("name", POSITION_SETS)
def test_vector_bytes_follow_the_iceberg_blob_layout(name):
    positions = POSITION_SETS[name]
    blob, cardinality = dv.encode_positions(positions)
    expected = sorted(int(p) for p in positions)
    assert cardinality == len(expected)
    (length,) = struct.unpack(">I", blob[:4])
    assert length == len(blob) - 8  # magic + vector, not the length field or the CRC
    assert blob[4:8] == bytes([0xD1, 0xD3, 0x39, 0x64])
    (crc,) = struct.unpack(">I", blob[-4:])
    assert crc == zlib.crc32(blob[4:-4])
    vector_bytes = blob[8:-4]
    assert _portable_positions(vector_bytes) == expected
    # pyroaring reads it, and writes the same bytes (run-optimized) for the same positions.
    assert list(BitMap64.deserialize(vector_bytes)) == expected
    assert blob == reference.blob(positions)
    decoded = dv.decode_positions(blob, "f.parquet")
    assert decoded.dtype == np.uint64 and decoded.tolist() == expected
    # And the blob pyroaring writes (before run_optimize: other containers) reads alike.
    plain = reference.frame(reference.bitmap(positions).serialize())
    assert dv.decode_positions(plain, "f.parquet").tolist() == expected


def test_vectors_take_positions_of_any_integer_type_unsorted():
    blob, cardinality = dv.encode_positions(np.array([5, 1, 9, 5], np.int32))
    assert cardinality == 3
    assert dv.decode_positions(blob, "f.parquet").tolist() == [1, 5, 9]
    with pytest.raises(ValueError, match="negative"):
        dv.encode_positions(np.array([3, -1]))


@pytest.mark.parametrize("damage", ["truncated", "length", "magic", "crc", "bitmap"])
def test_a_damaged_vector_is_a_data_file_error(damage):
    blob = bytearray(dv.encode_positions(np.arange(0, 1000, 3))[0])
    if damage == "truncated":
        blob = blob[:10]
    elif damage == "length":
        blob[3] ^= 1
    elif damage == "magic":
        blob[5] ^= 0xFF
    elif damage == "crc":
        blob[-1] ^= 0xFF
    else:  # a bitmap that no longer parses, with a CRC that matches it
        body = bytes(blob[4:8]) + b"\x05" + bytes(blob[9:-4])
        blob = bytearray(struct.pack(">I", len(body)) + body
                         + struct.pack(">I", zlib.crc32(body)))
    with pytest.raises(DataFileError, match=r"^Deletion vector of f\.parquet is damaged: "):
        dv.decode_positions(bytes(blob), "f.parquet")


def test_keep_mask_covers_a_range_of_positions():
    deleted = dv.decode_positions(dv.encode_positions(np.array([0, 5, 6, 99, 150]))[0], "f")
    assert dv.keep_mask(deleted, 100, 50) is None  # nothing deleted in 100..149
    mask = dv.keep_mask(deleted, 0, 10)
    assert mask is not None and np.flatnonzero(~mask).tolist() == [0, 5, 6]
    mask = dv.keep_mask(deleted, 99, 52)
    assert mask is not None and np.flatnonzero(~mask).tolist() == [0, 51]
    assert dv.keep_mask(dv.decode_positions(reference.blob([]), "f"), 0, 10) is None


def test_puffin_file_holds_vectors_where_its_footer_says(tmp_path):
    storage = LocalStorage()
    path = str(tmp_path / "dv-1.puffin")
    vectors = {"data/a.parquet": np.arange(0, 100, 2), "data/b.parquet": np.array([2**33])}
    blobs = [puffin.Blob(dv.encode_positions(p)[0], dv.BLOB_TYPE,
                         {"referenced-data-file": f, "cardinality": str(len(p))})
             for f, p in vectors.items()]
    locations = puffin.write_puffin(storage, path, blobs)
    raw = (tmp_path / "dv-1.puffin").read_bytes()
    assert raw[:4] == b"PFA1" and raw[-4:] == b"PFA1"
    size, flags = struct.unpack("<ii", raw[-12:-4])
    assert flags == 0
    footer = json.loads(raw[-12 - size:-12])
    assert raw[-16 - size:-12 - size] == b"PFA1"
    for meta, location, (name, positions) in zip(footer["blobs"], locations, vectors.items(),
                                                 strict=True):
        assert meta["type"] == "deletion-vector-v1"
        assert meta["snapshot-id"] == -1 and meta["sequence-number"] == -1
        assert meta["properties"] == {"referenced-data-file": name,
                                      "cardinality": str(len(positions))}
        assert "compression-codec" not in meta
        assert (meta["offset"], meta["length"]) == (location.offset, location.length)
        blob = puffin.read_blob(storage, location)
        assert dv.decode_positions(blob, name).tolist() == positions.tolist()
        assert reference.blob_positions(blob) == positions.tolist()
    assert puffin.read_footer(storage, path) == footer["blobs"]


def test_a_damaged_puffin_file_is_a_data_file_error(tmp_path):
    storage = LocalStorage()
    path = str(tmp_path / "dv.puffin")
    [location] = puffin.write_puffin(
        storage, path, [puffin.Blob(dv.encode_positions(np.array([1]))[0], dv.BLOB_TYPE)])
    raw = (tmp_path / "dv.puffin").read_bytes()
    (tmp_path / "dv.puffin").write_bytes(raw[:-1])
    with pytest.raises(DataFileError, match="not a Puffin file"):
        puffin.read_footer(storage, path)
    (tmp_path / "dv.puffin").write_bytes(raw[:location.offset + 3])
    with pytest.raises(DataFileError, match="shorter than the metastore says"):
        puffin.read_blob(storage, location)
