"""Lakes written before the native core keep their buckets: the hashes the numpy path gave
(pinned in data/buckets_v1.arrow, written by tests/native/make_fixture.py) and a table written on
the numpy path and upserted on the native one."""

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
from tests.native.make_fixture import FIXTURE
from tests.native.support import KEY_TYPES, native_path, numpy_path


@pytest.mark.parametrize("kind", KEY_TYPES)
def test_pinned_hashes_of_every_key_type(kind: str) -> None:
    pinned = feather.read_table(FIXTURE)
    with native_path():
        np.testing.assert_array_equal(key_hash(pinned, [kind]),
                                      pinned[f"hash_{kind}"].to_numpy())


def test_pinned_composite_buckets() -> None:
    pinned = feather.read_table(FIXTURE)
    composite = ["string", "ts_tz", "decimal", "int32"]
    with native_path():
        np.testing.assert_array_equal(key_hash(pinned, composite),
                                      pinned["hash_composite"].to_numpy())
        assert bucket_of(pinned, composite, 16) == pinned["bucket_composite_16"].combine_chunks()


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
def test_a_table_written_on_the_numpy_path_keeps_its_buckets(tmp_path: Path,
                                                             deletion_vectors: bool) -> None:
    key = ["name", "at", "amount"]
    with numpy_path():
        lake = al.connect(str(tmp_path / "lake"))
        table = lake.create_table("t", _rows(1).schema, primary_key=key, buckets=8,
                                  deletion_vectors=deletion_vectors)
        table.upsert(_rows(1))
    with native_path():
        # Every file sits in the bucket the native hash gives its rows.
        for path in (tmp_path / "lake").rglob("*.parquet"):
            match = re.search(r"bucket-(\d+)", str(path))
            if match is None:
                continue
            rows = pq.read_table(path).select(key)
            assert set(native.bucket_of([rows[k] for k in key], 8).to_pylist()) == \
                {int(match.group(1))}, path
        # Upserting the same keys on the native path replaces them (a changed bucket would
        # leave both versions live).
        table = al.connect(str(tmp_path / "lake")).table("t")
        table.upsert(_rows(2))
        merged = table.to_arrow()
    assert merged.num_rows == _rows(1).num_rows
    assert set(merged["v"].to_pylist()) == {2}
