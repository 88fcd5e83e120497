"""Deletion vectors of the native core: the same bytes as pyroaring's portable 64-bit
serialization, read both ways, in the deletion-vector-v1 framing of io/deletion_vectors.py
(pyroaring's side is in tests/native/reference.py)."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pyroaring import BitMap64

from arrowlake import native
from arrowlake.errors import DataFileError
from arrowlake.io import deletion_vectors as dv
from arrowlake.io.storage import LocalStorage
from tests.native import reference

LOCAL = LocalStorage()

# Positions in runs (run containers), sparse (arrays), dense (bitmaps) and above 2**32.
positions = st.one_of(
    st.lists(st.integers(0, 2**64 - 1), max_size=50),
    st.lists(st.integers(0, 70_000), max_size=400),
    st.tuples(st.integers(0, 2**40), st.integers(0, 10_000)).map(
        lambda t: list(range(t[0], t[0] + t[1]))),
    st.tuples(st.integers(0, 3), st.integers(1, 7)).map(
        lambda t: list(range(t[0] << 32, (t[0] << 32) + 70_000, t[1]))),
)


def _pyroaring_bytes(values: list[int]) -> bytes:
    vector = BitMap64(values)
    vector.run_optimize()
    return vector.serialize()


@settings(max_examples=150, deadline=None)
@given(values=positions)
def test_portable_bytes_equal_pyroaring_both_ways(values: list[int]) -> None:
    array = np.asarray(values, dtype=np.uint64)
    ours = native.bitmap_serialize(array)
    theirs = _pyroaring_bytes(values)
    assert ours == theirs
    assert list(BitMap64.deserialize(ours)) == sorted(set(values))
    np.testing.assert_array_equal(native.bitmap_positions(theirs),
                                  np.asarray(sorted(set(values)), dtype=np.uint64))


@settings(max_examples=100, deadline=None)
@given(new=positions, old=positions)
def test_blobs_equal_pyroaring_blobs(new: list[int], old: list[int]) -> None:
    """A blob of new positions united with a file's earlier ones is the blob pyroaring writes
    for the union, and each side reads the other's."""
    fresh = np.asarray(new, dtype=np.uint64)
    before = np.unique(np.asarray(old, dtype=np.uint64))
    union = sorted(set(new) | set(old))
    expected = reference.blob(union)
    got = dv.encode_positions(fresh, before)
    assert got == (expected, len(union))
    # pyroaring reads ours, and we read pyroaring's.
    assert reference.blob_positions(got[0]) == union
    np.testing.assert_array_equal(dv.decode_positions(expected, "file.parquet"),
                                  np.asarray(union, np.uint64))
    decoded = dv.decode_positions(got[0], "file.parquet")
    assert decoded.dtype == np.uint64
    np.testing.assert_array_equal(decoded, np.asarray(union, np.uint64))
    # Without earlier positions, and with them given empty: the blob of the new ones alone.
    alone = reference.blob(sorted(set(new)))
    assert dv.encode_positions(fresh) == dv.encode_positions(fresh, before[:0]) \
        == (alone, len(set(new)))


def test_positions_of_any_integer_dtype() -> None:
    for values in (np.array([9, 1, 5, 5]), np.array([9, 1, 5], np.int32),
                   np.array([9, 1, 5], np.uint16), np.array([], np.int64)):
        blob, cardinality = dv.encode_positions(values)
        assert (blob, cardinality) == (reference.blob(sorted(set(values.tolist()))),
                                       len(set(values.tolist())))


def _blob() -> bytes:
    return reference.blob([1, 5, 9])


WHERE = "f.parquet (kept in the metastore)"


@pytest.mark.parametrize("damage", ["short", "length", "magic", "crc", "bitmap"])
def test_damaged_blobs_are_refused_naming_the_file(damage: str) -> None:
    blob = bytearray(_blob())
    held = len(blob) - 8  # magic and bitmap
    said = {  # what each damage is called (a bad bitmap in roaring-rs's words: not pinned)
        "short": "10 bytes is too short for a deletion-vector-v1 blob",
        "length": f"its length field says {held ^ 1} bytes, the blob holds {held}",
        "magic": "wrong magic d0d33964 (expected d1d33964)",
        "crc": "CRC-32 mismatch",
        "bitmap": "",
    }[damage]
    if damage == "short":
        blob = blob[:10]
    elif damage == "length":
        blob[3] ^= 1
    elif damage == "magic":
        blob[4] ^= 1
    elif damage == "crc":
        blob[-1] ^= 1
    else:
        # A bitmap that does not parse, framed correctly.
        body = dv.MAGIC + b"\x05" + b"\x00" * 7
        blob = bytearray(struct.pack(">I", len(body)) + body + struct.pack(">I", zlib.crc32(body)))
        with pytest.raises(ValueError):  # pyroaring refuses it too
            reference.blob_positions(bytes(blob))
    with pytest.raises(DataFileError) as info:
        dv.decode_positions(bytes(blob), WHERE)
    message = str(info.value)
    assert message.startswith(f"Deletion vector of {WHERE} is damaged: {said}")
    if damage != "bitmap":
        assert message == f"Deletion vector of {WHERE} is damaged: {said}"


def test_negative_positions_are_refused() -> None:
    with pytest.raises(ValueError, match="never negative"):
        dv.encode_positions(np.array([-1, 2]))
    current = dv.VectorRef(3, blob=_blob())
    with pytest.raises(ValueError, match="never negative"):
        dv.extend_many(LOCAL, [(np.array([4, -2]), current, "a.parquet")])


@settings(max_examples=40, deadline=None)
@example(files=[([7, 9, 11], [0, 1, 2, 3, 4, 5])])  # a run as big as its array, after a union
@given(files=st.lists(st.tuples(positions, st.none() | positions), max_size=5))
def test_many_files_extended_at_once(files: list[tuple[list[int], list[int] | None]]) -> None:
    """Each file's current vector (a blob pyroaring wrote, as the metastore keeps it) united
    with its new positions: the blob pyroaring writes for the union, whatever containers the
    current blob held (a run as big as an array included)."""
    given = []
    for i, (new, old) in enumerate(files):
        current = None
        if old is not None:
            current = dv.VectorRef(len(set(old)), blob=reference.blob(old))
        given.append((np.asarray(new, np.uint64), current, f"f{i}.parquet"))
    got = dv.extend_many(LOCAL, given)
    assert len(got) == len(files)
    for (new, old), (blob, cardinality) in zip(files, got, strict=True):
        union = sorted(set(new) | set(old or []))
        assert (blob, cardinality) == (reference.blob(union), len(union))
        assert reference.blob_positions(blob) == union


def test_extending_a_vector_kept_in_a_puffin_file(tmp_path) -> None:
    """A current vector in a Puffin file (read from its range) is extended like one kept in
    the metastore; an empty one (cardinality 0) is no vector."""
    from arrowlake.io import puffin

    path = str(tmp_path / "dv.puffin")
    [location] = puffin.write_puffin(LOCAL, path, [puffin.Blob(reference.blob([3, 4]),
                                                               dv.BLOB_TYPE)])
    kept = dv.VectorRef(2, path=path, offset=location.offset, length=location.length)
    got = dv.extend_many(LOCAL, [(np.array([1]), kept, "a.parquet"),
                                 (np.array([7]), dv.VectorRef(0), "b.parquet")])
    assert got == [(reference.blob([1, 3, 4]), 3), (reference.blob([7]), 1)]


@pytest.mark.parametrize("damage", ["crc", "cardinality", "puffin"])
def test_extending_a_damaged_vector_names_its_file(damage: str, tmp_path) -> None:
    blob = bytearray(_blob())
    current = dv.VectorRef(3, blob=bytes(blob))
    where = r"b\.parquet \(kept in the metastore\)"
    if damage == "crc":
        blob[-1] ^= 1
        current = dv.VectorRef(3, blob=bytes(blob))
        said = "CRC-32 mismatch"
    elif damage == "cardinality":
        current = dv.VectorRef(4, blob=bytes(blob))
        said = "it holds 3 positions, the metastore says 4"
    else:  # a Puffin file's range, its CRC damaged
        blob[-2] ^= 1
        (tmp_path / "dv.puffin").write_bytes(b"xx" + bytes(blob))
        current = dv.VectorRef(3, path=str(tmp_path / "dv.puffin"), offset=2, length=len(blob))
        where = r"b\.parquet \(in .*dv\.puffin at 2\)"
        said = "CRC-32 mismatch"
    given = [(np.array([2], np.uint64), None, "a.parquet"),
             (np.array([2], np.uint64), current, "b.parquet"),
             (np.array([2], np.uint64), dv.VectorRef(3, blob=_blob()), "c.parquet")]
    with pytest.raises(DataFileError, match=rf"^Deletion vector of {where} is damaged: {said}$"):
        dv.extend_many(LOCAL, given)
