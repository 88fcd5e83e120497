"""``write.encodings``: the default writes only encodings every reader arrowlake claims decodes
(Spark 4.1's vectorized Parquet reader among them, which lacks BYTE_STREAM_SPLIT); the faster
float encoding is a property value away, and the files of either read back exactly, by
pyarrow, DuckDB and Polars alike."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowlake as al
from arrowlake.errors import ValidationError

#: What Spark 4.1's and 4.2's vectorized Parquet readers, Iceberg's (1.11+), DuckDB, Polars and
#: pyarrow 16 all decode (RLE: definition levels and booleans; the dictionaries' own).
PORTABLE = {"PLAIN", "RLE", "RLE_DICTIONARY", "PLAIN_DICTIONARY", "BIT_PACKED",
            "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY"}

SCHEMA = pa.schema([
    ("id", pa.int64()), ("i32", pa.int32()), ("u16", pa.uint16()), ("f32", pa.float32()),
    ("f64", pa.float64()), ("s", pa.string()), ("b", pa.binary()), ("d", pa.date32()),
    ("ts", pa.timestamp("us", tz="UTC")), ("dec", pa.decimal128(12, 3)), ("flag", pa.bool_()),
    ("tags", pa.list_(pa.float64())), ("few", pa.string()),
])


def rows(n: int = 5000) -> pa.Table:
    rng = np.random.default_rng(5)
    ints = rng.integers(-(1 << 40), 1 << 40, n)
    floats = rng.standard_normal(n)
    floats[::11] = np.nan
    floats[1::13] = -0.0
    floats[2::17] = np.inf
    data = {
        "id": pa.array(np.arange(n)), "i32": pa.array(ints % 1000, pa.int32()),
        "u16": pa.array(np.abs(ints) % 60000, pa.uint16()),
        "f32": pa.array(floats.astype(np.float32)), "f64": pa.array(floats),
        "s": pa.array([f"row-{v}" for v in ints.tolist()]),
        "b": pa.array([v.to_bytes(8, "little", signed=True) for v in ints.tolist()]),
        "d": pa.array([dt.date(2026, 1, 1) + dt.timedelta(days=int(v % 300)) for v in ints]),
        "ts": pa.array(ints, pa.timestamp("us", tz="UTC")),
        "dec": pa.array([Decimal(int(v) % 10**9).scaleb(-3) for v in ints], pa.decimal128(12, 3)),
        "flag": pa.array(ints % 2 == 0),
        "tags": pa.array([[float(v), None] for v in floats.tolist()], pa.list_(pa.float64())),
        "few": pa.array(["eu", "us"] * (n // 2)),
    }
    table = pa.table(data, schema=SCHEMA)
    mask = pa.array(np.arange(n) % 7 == 3)  # nulls in every column
    return pa.table({c: pa.compute.if_else(mask, pa.nulls(n, table[c].type), table[c])
                     for c in table.column_names}, schema=SCHEMA)


def encodings(table: al.Table) -> dict[str, set[str]]:
    used: dict[str, set[str]] = {}
    for path in table.files()["path"].to_pylist():
        metadata = pq.ParquetFile(path).metadata
        for g in range(metadata.num_row_groups):
            for c in range(metadata.num_columns):
                chunk = metadata.row_group(g).column(c)
                used.setdefault(chunk.path_in_schema, set()).update(chunk.encodings)
    return used


def test_default_files_use_only_encodings_every_claimed_reader_decodes(tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("e.default", SCHEMA)
    data = rows()
    t.append(data)
    used = encodings(t)
    assert all(e <= PORTABLE for e in used.values()), used
    assert "DELTA_BINARY_PACKED" in used["id"] and "DELTA_LENGTH_BYTE_ARRAY" in used["s"]
    assert used["f64"] <= {"PLAIN", "RLE"}, used["f64"]
    assert same(t.to_arrow(), data)


def test_byte_stream_split_floats_are_a_property_away_and_read_back_exactly(tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("e.bss", SCHEMA, properties={"write.encodings": "Byte-Stream-Split"})
    data = rows()
    t.append(data)
    used = encodings(t)
    assert "BYTE_STREAM_SPLIT" in used["f32"] and "BYTE_STREAM_SPLIT" in used["f64"]
    assert all(e <= PORTABLE for c, e in used.items() if c not in ("f32", "f64")), used
    assert same(t.to_arrow(), data)
    # Switching the property back makes the next files portable again.
    before = set(t.files()["path"].to_pylist())
    t.set_properties(**{"write.encodings": "auto"})
    t.append(data)
    [newest] = set(t.files()["path"].to_pylist()) - before
    assert "BYTE_STREAM_SPLIT" not in set().union(*(
        pq.ParquetFile(newest).metadata.row_group(g).column(SCHEMA.get_field_index("f64"))
        .encodings for g in range(pq.ParquetFile(newest).metadata.num_row_groups)))


def test_an_unknown_encoding_policy_is_refused_naming_the_values(tmp_path):
    lake = al.connect(tmp_path / "lake")
    with pytest.raises(ValidationError, match="auto, byte-stream-split, plain"):
        lake.create_table("e.bad", SCHEMA, properties={"write.encodings": "bss"})


@pytest.mark.parametrize("policy", ["auto", "byte-stream-split"])
def test_duckdb_and_polars_read_the_files_as_pyarrow_does(tmp_path, policy):
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("e.engines", SCHEMA, properties={"write.encodings": policy})
    data = rows()
    t.append(data)
    paths = t.files()["path"].to_pylist()
    expected = pa.concat_tables([pq.read_table(p, schema=data.schema) for p in paths])
    duckdb = pytest.importorskip("duckdb")
    got = duckdb.connect().sql(
        f"SELECT * FROM read_parquet({paths!r}) ORDER BY id NULLS FIRST").to_arrow_table()
    want = expected.sort_by([("id", "ascending", "at_start")])
    assert got.num_rows == want.num_rows
    for name in ("f32", "f64", "s", "b", "id", "dec", "ts"):
        assert comparable(got[name]) == comparable(want[name]), name
    polars = pytest.importorskip("polars")
    frame = polars.read_parquet(paths)
    assert frame.height == data.num_rows
    for name in ("f32", "f64", "s", "id"):
        assert comparable(frame[name].to_arrow()) == comparable(expected[name]), name


def comparable(values: pa.Array | pa.ChunkedArray) -> list:
    """The values as a list in which NaN equals NaN (and -0.0 stays apart from 0.0)."""
    return [_comparable(v) for v in values.to_pylist()]


def _comparable(v: object) -> object:
    if isinstance(v, float):
        return "NaN" if v != v else (v, str(v))
    if isinstance(v, list):
        return [_comparable(x) for x in v]
    return v


def same(a: pa.Table, b: pa.Table) -> bool:
    return a.schema == b.schema and all(comparable(a[c]) == comparable(b[c])
                                        for c in a.column_names)
