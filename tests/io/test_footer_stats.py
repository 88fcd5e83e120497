"""Bounds taken from the Parquet writer's row-group statistics (io/stats.py
``fill_deferred_bounds``) equal what Arrow's ``min_max`` gives, type by type, and pruning by
them keeps every matching row."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import arrowlake as al
from arrowlake.expressions import col
from arrowlake.io.stats import column_stats, encode_scalar, footer_layout, merge_stats
from arrowlake.schema import field_id

ROWS = 60
GROUP_ROWS = 6

INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(),
             pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
TEMPORAL_TYPES = [pa.date32(), pa.date64(), pa.timestamp("s"), pa.timestamp("ms"),
                  pa.timestamp("us"), pa.timestamp("ns"), pa.timestamp("us", "Europe/Berlin"),
                  pa.timestamp("ms", "UTC"), pa.time32("s"), pa.time32("ms"),
                  pa.time64("us"), pa.time64("ns"),
                  pa.duration("s"), pa.duration("ms"), pa.duration("us"), pa.duration("ns")]


def _ints(rng: np.random.Generator, typ: pa.DataType) -> list[int | None]:
    info = np.iinfo(typ.to_pandas_dtype())
    dtype = typ.to_pandas_dtype()
    values: list[int | None] = [int(v) for v in rng.integers(info.min, info.max, ROWS,
                                                                 dtype=dtype, endpoint=True)]
    values[3], values[17], values[40] = int(info.min), int(info.max), 0
    if info.min < 0:
        values[25] = -1
    return values


def _temporal(rng: np.random.Generator, typ: pa.DataType) -> pa.Array:
    if pa.types.is_date64(typ):
        days = rng.integers(-20_000, 20_000, ROWS)
        return pa.array(days * 86_400_000, pa.int64()).cast(typ)
    if pa.types.is_time(typ):
        per_day = {"s": 86_400, "ms": 86_400_000, "us": 86_400_000_000,
                   "ns": 86_400_000_000_000}[typ.unit]
        storage = pa.int32() if pa.types.is_time32(typ) else pa.int64()
        return pa.array(rng.integers(0, per_day, ROWS), storage).cast(typ)
    if pa.types.is_date32(typ):
        return pa.array(rng.integers(-100_000, 100_000, ROWS), pa.int32()).cast(typ)
    span = {"s": 2**32, "ms": 2**40, "us": 2**50, "ns": 2**60}[typ.unit]
    return pa.array(rng.integers(-span, span, ROWS), pa.int64()).cast(typ)


def _with_nulls(arr: pa.Array, rng: np.random.Generator) -> pa.Array:
    mask = rng.random(len(arr)) < 0.15
    mask[GROUP_ROWS:2 * GROUP_ROWS] = True  # a row group of nulls only
    return pc.if_else(pa.array(mask), pa.scalar(None, arr.type), arr)


def _floats(rng: np.random.Generator, dtype: type) -> pa.Array:
    values = (rng.standard_normal(ROWS) * 1e3).astype(dtype)
    values[5] = np.nan
    values[2 * GROUP_ROWS:3 * GROUP_ROWS] = np.nan  # a row group of NaN only
    values[3 * GROUP_ROWS:4 * GROUP_ROWS] = [0.0, -0.0, 0.0, -0.0, 0.0, 0.0]  # zeros only
    values[4 * GROUP_ROWS:4 * GROUP_ROWS + 3] = [-0.0, -0.0, -0.0]
    values[4 * GROUP_ROWS + 3:5 * GROUP_ROWS] = np.abs(values[4 * GROUP_ROWS + 3:5 * GROUP_ROWS])
    values[7 * GROUP_ROWS:8 * GROUP_ROWS] = -np.abs(values[7 * GROUP_ROWS:8 * GROUP_ROWS])
    values[7 * GROUP_ROWS + 5] = 0.0  # a negative group whose max is zero
    return pa.array(values)


def _data(seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    cols: dict[str, pa.Array] = {}
    for typ in INT_TYPES:
        cols[f"i_{typ}"] = _with_nulls(pa.array(_ints(rng, typ), typ), rng)
    cols["f32"] = _with_nulls(_floats(rng, np.float32), rng)
    cols["f64"] = _with_nulls(_floats(rng, np.float64), rng)
    cols["f64_plain"] = _floats(rng, np.float64)  # no nulls at all
    cols["b"] = _with_nulls(pa.array(rng.random(ROWS) < 0.5), rng)
    cols["b_true"] = pa.array([True] * ROWS)
    for i, typ in enumerate(TEMPORAL_TYPES):
        cols[f"t{i}"] = _with_nulls(_temporal(rng, typ), rng)
    cols["s"] = _with_nulls(pa.array([f"v{int(x)}" for x in rng.integers(-99, 99, ROWS)]), rng)
    cols["nothing"] = pa.nulls(ROWS, pa.int64())
    return pa.table(cols)


def _expected(rows: pa.Table, schema: pa.Schema) -> dict:
    """The file's statistics as min_max computes them, row group by row group (durations,
    which min_max cannot bound, bounded as their int64 values)."""
    parts = []
    for batch in rows.to_batches(max_chunksize=GROUP_ROWS):
        stats = column_stats(batch, schema)
        for field in schema:
            if pa.types.is_duration(field.type) and batch.column(field.name).null_count < \
                    batch.num_rows:
                mm = pc.min_max(batch.column(field.name).cast(pa.int64()))
                stats[str(field_id(field))][:2] = [encode_scalar(mm["min"]),
                                                   encode_scalar(mm["max"])]
        parts.append((stats, batch.num_rows))
    return merge_stats(parts, schema)


def _same(stored: object, expected: object) -> bool:
    """Equal, and of the same JSON kind (True is not 1, 1.0 is not 1)."""
    if isinstance(expected, list) and isinstance(stored, list):
        return len(stored) == len(expected) and all(
            _same(a, b) for a, b in zip(stored, expected, strict=True))
    return type(stored) is type(expected) and stored == expected


@pytest.fixture
def written(sqlite_lake: al.Lake) -> tuple[al.Table, pa.Table]:
    data = pa.concat_tables([_data(1), _data(2)])
    t = sqlite_lake.create_table("footer", data.schema, properties={
        "write.row-group-rows": str(GROUP_ROWS), "write.encodings": "auto",
        # Small enough that one append rolls over into a second file mid-way.
        "write.target-file-size": "25000"})
    t.append(data)
    t.append(_data(3).slice(0, 4 * GROUP_ROWS))
    return t, pa.concat_tables([data, _data(3).slice(0, 4 * GROUP_ROWS)])


def test_bounds_from_the_footer_equal_min_max(written: tuple[al.Table, pa.Table]) -> None:
    t, _ = written
    files = t._metastore.live_files(t._record.table_id, t.current_snapshot_id)
    group_counts = []
    for path, text in zip(files.column("path").to_pylist(), files.column("stats").to_pylist(),
                          strict=True):
        stored = json.loads(text)
        parquet = pq.ParquetFile(t._storage.join(t._record.location, path))
        group_counts.append(parquet.metadata.num_row_groups)
        rows = parquet.read()  # date64 reads back as date32
        rows = pa.table([rows.column(f.name).cast(f.type) for f in t.schema], schema=t.schema)
        expected = _expected(rows, t.schema)
        for field in t.schema:
            fid = str(field_id(field))
            assert _same(stored[fid], expected[fid]), (path, field.name, field.type,
                                                       stored[fid], expected[fid])
            if field.name not in ("nothing",) and footer_layout(field.type) is not None:
                assert stored[fid][0] is not None, (field.name, "bounds should be known")
    # Several files, one of them written by a writer that rolled over, several groups each.
    assert len(group_counts) >= 3 and min(group_counts) > 1, group_counts


def test_footer_float_bounds_handle_nan_and_zero(written: tuple[al.Table, pa.Table]) -> None:
    t, data = written
    stats = t.files()
    for name in ("f32", "f64", "f64_plain"):
        values = [v for v in data.column(name).to_pylist() if v is not None and not math.isnan(v)]
        assert min(stats.column(f"min.{name}").to_pylist()) == min(values)
        assert max(stats.column(f"max.{name}").to_pylist()) == max(values)
        nans = sum(1 for v in data.column(name).to_pylist() if v is not None and math.isnan(v))
        assert sum(stats.column(f"nans.{name}").to_pylist()) == nans


def _probes(values: list) -> list:
    present = sorted({v for v in values if v is not None
                      and not (isinstance(v, float) and math.isnan(v))})
    picks = [present[0], present[len(present) // 3], present[len(present) // 2], present[-1]]
    if isinstance(present[0], float):
        picks += [0.0, -0.0, present[0] - 1.0, present[-1] + 1.0]
    elif isinstance(present[0], int) and not isinstance(present[0], bool):
        picks += [present[0] - 1, present[-1] + 1]
    return picks


@pytest.mark.parametrize("name", [f"i_{t}" for t in INT_TYPES] + [
    "f32", "f64", "f64_plain", "b", "b_true", "t0", "t2", "t3", "t5", "t6", "t9", "t11", "t14",
    "s"])
def test_pruning_by_footer_bounds_keeps_every_match(written: tuple[al.Table, pa.Table],
                                                    name: str) -> None:
    t, data = written
    column = data.column(name)
    typ = column.type
    for probe in _probes(column.to_pylist()):
        try:
            scalar = pa.scalar(probe, typ)
        except (OverflowError, pa.ArrowInvalid):
            continue  # one past the type's range
        for op in ("<", "<=", "=", ">=", ">", "!="):
            kernel = {"<": pc.less, "<=": pc.less_equal, "=": pc.equal, ">=": pc.greater_equal,
                      ">": pc.greater, "!=": pc.not_equal}[op]
            want = pc.sum(pc.cast(pc.fill_null(kernel(column, scalar), False), pa.int64()))
            expr = {"<": col(name) < probe, "<=": col(name) <= probe, "=": col(name) == probe,
                    ">=": col(name) >= probe, ">": col(name) > probe,
                    "!=": col(name) != probe}[op]
            scan = t.scan(filter=expr)
            assert scan.to_arrow().num_rows == (want.as_py() or 0), (name, op, probe)
    # The bounds prune: nothing is above the column's maximum, so no file is left to read.
    # (Python values of nanosecond types are truncated to microseconds.)
    if not pa.types.is_boolean(typ) and getattr(typ, "unit", None) != "ns":
        top = max(v for v in column.to_pylist() if v is not None and v == v)
        assert t.scan(filter=col(name) > top).files().num_rows == 0, name
