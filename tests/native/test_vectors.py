"""Deletion vectors of the native core: the same bytes as pyroaring's portable 64-bit
serialization, read both ways, in the deletion-vector-v1 framing of io/deletion_vectors.py."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap64

from arrowlake import native
from arrowlake.errors import DataFileError
from arrowlake.io import deletion_vectors as dv
from arrowlake.io.storage import LocalStorage
from tests.native.support import native_path, numpy_path

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
def test_blobs_equal_the_numpy_path(new: list[int], old: list[int]) -> None:
    fresh = np.asarray(new, dtype=np.uint64)
    before = np.unique(np.asarray(old, dtype=np.uint64))
    with numpy_path():
        expected = dv.encode_positions(fresh, before)
    with native_path():
        got = dv.encode_positions(fresh, before)
        decoded = dv.decode_positions(got[0], "file.parquet")
    assert got == expected
    assert got[1] == len(set(new) | set(old))
    np.testing.assert_array_equal(decoded, np.asarray(sorted(set(new) | set(old)), np.uint64))
    # pyroaring reads the native blob through the numpy path's decoder.
    assert list(dv.decode(got[0], "file.parquet")) == sorted(set(new) | set(old))


def _blob() -> bytes:
    return dv.encode(dv.vector_of([1, 5, 9]))


@pytest.mark.parametrize("damage", ["short", "length", "magic", "crc", "bitmap"])
def test_damaged_blobs_are_refused_alike(damage: str) -> None:
    blob = bytearray(_blob())
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
    errors = []
    for path in (numpy_path, native_path):
        with path(), pytest.raises(DataFileError) as info:
            dv.decode_positions(bytes(blob), "f.parquet (kept in the metastore)")
        errors.append(str(info.value))
    assert errors[0].startswith("Deletion vector of f.parquet (kept in the metastore) is damaged")
    if damage != "bitmap":  # pyroaring and roaring-rs word a bad bitmap differently
        assert errors[0] == errors[1]
    else:
        assert errors[1].startswith(errors[0].split(":")[0])


def test_negative_positions_are_refused() -> None:
    with native_path(), pytest.raises(ValueError, match="never negative"):
        dv.encode_positions(np.array([-1, 2]))


@settings(max_examples=40, deadline=None)
@given(files=st.lists(st.tuples(positions, st.none() | positions), max_size=5))
def test_many_files_extended_at_once(files: list[tuple[list[int], list[int] | None]]) -> None:
    """Each file's current vector (a blob, as the metastore keeps it) united with its new
    positions: the native path unites the blobs as bitmaps, the numpy path decodes them."""
    given = []
    for i, (new, old) in enumerate(files):
        current = None
        if old is not None:
            vector = dv.vector_of(np.asarray(old, np.uint64))
            current = dv.VectorRef(len(vector), blob=dv.encode(vector))
        given.append((np.asarray(new, np.uint64), current, f"f{i}.parquet"))
    with numpy_path():
        expected = dv.extend_many(LOCAL, given)
    with native_path():
        got = dv.extend_many(LOCAL, given)
    assert got == expected
    for (new, old), (blob, cardinality) in zip(files, got, strict=True):
        union = sorted(set(new) | set(old or []))
        assert cardinality == len(union)
        assert list(dv.decode(blob, "f.parquet")) == union


@pytest.mark.parametrize("damage", ["crc", "cardinality"])
def test_extending_a_damaged_vector_names_its_file(damage: str) -> None:
    blob = bytearray(_blob())
    cardinality = 3
    if damage == "crc":
        blob[-1] ^= 1
    else:
        cardinality = 4
    given = [(np.array([2], np.uint64), None, "a.parquet"),
             (np.array([2], np.uint64), dv.VectorRef(cardinality, blob=bytes(blob)), "b.parquet")]
    for path in (numpy_path, native_path):
        with path(), pytest.raises(DataFileError, match=r"Deletion vector of b\.parquet"):
            dv.extend_many(LOCAL, given)
