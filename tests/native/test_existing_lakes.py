"""Lakes written before the native core keep their buckets: the hashes the numpy path gave
(pinned in data/buckets_v1.arrow, written by tests/native/make_fixture.py; that numpy hash is
now tests/native/reference.py's), and a table whose files sit in the buckets the numpy hash
gives their rows, upserted again."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

import arrowlake as al
from arrowlake import native
from arrowlake.merge.bucketing import bucket_of, key_hash
from tests.native import reference
from tests.native.make_fixture import FIXTURE
from tests.native.support import KEY_TYPES


@pytest.mark.parametrize("kind", KEY_TYPES)
def test_pinned_hashes_of_every_key_type(kind: str) -> None:
    pinned = feather.read_table(FIXTURE)
    expected = pinned[f"hash_{kind}"].to_numpy()
    np.testing.assert_array_equal(key_hash(pinned, [kind]), expected)
    # The reference is still the hash that wrote them.
    np.testing.assert_array_equal(reference.key_hash(pinned, [kind]), expected)


def test_pinned_composite_buckets() -> None:
    pinned = feather.read_table(FIXTURE)
    composite = ["string", "ts_tz", "decimal", "int32"]
    for hash_of, bucket in ((key_hash, bucket_of), (reference.key_hash, reference.bucket_of)):
        np.testing.assert_array_equal(hash_of(pinned, composite),
                                      pinned["hash_composite"].to_numpy())
        assert bucket(pinned, composite, 16) == pinned["bucket_composite_16"].combine_chunks()


def _rows(version: int) -> pa.Table:
    n = 300
    return pa.table({
        "name": pa.array([f"user-{i % 97}-\u00e9" for i in range(n)], pa.string_view()),
        "at": pa.array([dt.datetime(2024, 1, 1) + dt.timedelta(minutes=i // 97)
                        for i in range(n)], pa.timestamp("us", tz="Europe/Paris")),
        "amount": pa.array([Decimal(i % 7) / 4 for i in range(n)], pa.decimal128(10, 2)),
        "v": pa.array([version] * n, pa.int64()),
    })


@pytest.mark.parametrize("deletion_vectors", [True, False])
def test_a_table_keeps_the_buckets_of_the_numpy_hash(tmp_path: Path,
                                                     deletion_vectors: bool) -> None:
    key = ["name", "at", "amount"]
    lake = al.connect(str(tmp_path / "lake"))
    table = lake.create_table("t", _rows(1).schema, primary_key=key, buckets=8,
                              deletion_vectors=deletion_vectors)
    table.upsert(_rows(1))
    # Every file sits in the bucket the numpy hash (which wrote the lakes before the native
    # core) and the native one give its rows: a lake the numpy hash wrote holds these files.
    seen = 0
    for path in (tmp_path / "lake").rglob("*.parquet"):
        match = re.search(r"bucket-(\d+)", str(path))
        if match is None:
            continue
        rows = pq.read_table(path).select(key)
        bucket = {int(match.group(1))}
        assert set(reference.bucket_of(rows, key, 8).to_pylist()) == bucket, path
        assert set(native.bucket_of([rows[k] for k in key], 8).to_pylist()) == bucket, path
        seen += 1
    assert seen > 1
    # Upserting the same keys again replaces them (a changed bucket would leave both
    # versions live).
    table = al.connect(str(tmp_path / "lake")).table("t")
    table.upsert(_rows(2))
    merged = table.to_arrow()
    assert merged.num_rows == _rows(1).num_rows
    assert set(merged["v"].to_pylist()) == {2}
