"""A key written again with every value as it was is no change, whatever the values' types
(issue 31, item 3).

Deletion-vector tables decide it twice: the write (engines that merge with the live row write
only rows that differ) and the stream (a snapshot's deleted rows paired with its new ones). The
``lookup`` changelog of merge-on-read tables and catch-up's net change decide it too. All four
ask one equality (``arrowlake.merge.equality``): nested types by value, NaN equal to NaN, nulls
equal to nulls, extension types by storage, the null type always equal, and ``-0.0`` different
from ``0.0`` (both are kept as written).
"""

from __future__ import annotations

import json
import math
import uuid

import numpy as np
import pyarrow as pa
import pytest

import arrowlake as al

NAN = float("nan")
UUID_A, UUID_B = uuid.UUID(int=1).bytes, uuid.UUID(int=2).bytes


def _ext(typ: pa.ExtensionType, values: list) -> pa.Array:
    return pa.ExtensionArray.from_storage(typ, pa.array(values, typ.storage_type))


#: Per column: its type, the value every key holds first, and another value (None: the column
#: has no other value, as the null type). Every key changes only its own column in the third
#: write; ``k = 0`` changes nothing.
COLUMNS: dict[str, tuple[pa.DataType, object, object]] = {
    "f64_nan": (pa.float64(), NAN, 1.5),
    "f32_nan": (pa.float32(), NAN, 2.5),
    "f16_nan": (pa.float16(), np.float16("nan"), np.float16(1.0)),
    "zero": (pa.float64(), 0.0, -0.0),  # kept as written: -0.0 is a change
    "struct": (pa.struct([("a", pa.int64()), ("f", pa.float64()), ("s", pa.string())]),
               {"a": 1, "f": NAN, "s": None}, {"a": 1, "f": NAN, "s": "x"}),
    "list": (pa.list_(pa.float64()), [1.0, NAN, None], [1.0, NAN]),
    "large_list": (pa.large_list(pa.string()), ["a", None], ["a", "b"]),
    "fixed_list": (pa.list_(pa.float32(), 2), [NAN, 1.0], [NAN, 2.0]),
    "map": (pa.map_(pa.string(), pa.float64()), [("x", NAN), ("y", None)], [("x", NAN)]),
    "nested": (pa.list_(pa.struct([("m", pa.map_(pa.string(), pa.list_(pa.int64())))])),
               [{"m": [("a", [1, None])]}, None], [{"m": [("a", [1, 2])]}, None]),
    "uuid": (pa.uuid(), UUID_A, UUID_B),
    "json": (pa.json_(), json.dumps({"a": [1, 2]}), json.dumps({"a": [2, 1]})),
    "null": (pa.null(), None, None),
    "dict": (pa.dictionary(pa.int32(), pa.string()), "red", "blue"),
    "decimal": (pa.decimal128(10, 2), "1.50", "1.51"),
}
CHANGING = [c for c, (_, _, other) in COLUMNS.items() if c != "null"]


def _column(name: str, values: list) -> pa.Array:
    typ = COLUMNS[name][0]
    if isinstance(typ, pa.ExtensionType):
        return _ext(typ, values)
    if pa.types.is_decimal(typ):
        from decimal import Decimal
        return pa.array([None if v is None else Decimal(v) for v in values], typ)
    if pa.types.is_float16(typ):
        return pa.array(np.array(values, dtype=np.float16), typ)
    if pa.types.is_dictionary(typ):
        return pa.array(values, pa.string()).dictionary_encode().cast(typ)
    return pa.array(values, typ)


SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False),
                    *[pa.field(n, t) for n, (t, _, _) in COLUMNS.items()]])
KEYS = list(range(len(CHANGING) + 1))  # key i (from 1) changes CHANGING[i - 1]


def rows(changed: bool) -> pa.Table:
    """Every key with the first values; with ``changed``, key i holds the other value of its
    column."""
    data = {"k": pa.array(KEYS, pa.int64())}
    for name, (_, first, other) in COLUMNS.items():
        values = [first] * len(KEYS)
        if changed and name in CHANGING:
            values[CHANGING.index(name) + 1] = other
        data[name] = _column(name, values)
    return pa.table(data, schema=SCHEMA)


def stream_keys(t: al.Table, start: int, **kw) -> list[list[tuple[int, str]]]:
    """Per change from snapshot ``start`` on: its (key, row kind) pairs in key order."""
    kw.setdefault("catch_up_threshold", None)
    out = []
    for change in t.stream(start=start, stop_at_latest=True, include_row_kind=True,
                           columns=["k"], **kw):
        got = change.to_arrow()
        out.append(sorted(zip(got.column("k").to_pylist(),
                              got.column("_row_kind").to_pylist(), strict=True)))
    return out


def pairs(keys: list[int]) -> list[tuple[int, str]]:
    return sorted((k, kind) for k in keys for kind in ("-U", "+U"))


ENGINES = {
    "deduplicate": {},
    "partial-update": {"merge_engine": "partial-update"},
    "aggregation": {"merge_engine": "aggregation", "default_aggregation": "last_value"},
    "first-row": {"merge_engine": "first-row"},
}
MODES = [(True, "none"), (True, "lookup"), (False, "lookup")]


@pytest.mark.parametrize(("vectors", "producer"), MODES,
                         ids=[f"{'dv' if v else 'mor'}-{p}" for v, p in MODES])
@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_row_written_again_unchanged_streams_nothing_whatever_its_types(
        sqlite_lake, engine, vectors, producer):
    t = sqlite_lake.create_table("s.t", SCHEMA, primary_key=["k"], buckets=2,
                                 deletion_vectors=vectors, changelog_producer=producer,
                                 **ENGINES[engine])
    t.upsert(rows(changed=False))
    first = t.current_snapshot_id
    behind = t.stream(start="latest", stop_at_latest=True, include_row_kind=True,
                      columns=["k"], catch_up_threshold=1)
    t.upsert(rows(changed=False))  # every row again, unchanged
    t.upsert(rows(changed=True))  # key i changes only column i
    t.upsert(rows(changed=True))  # unchanged again
    t.upsert(rows(changed=False).slice(0, 1).set_column(0, "k", pa.array([100])))
    per_snapshot = stream_keys(t, first)
    changed = [] if engine == "first-row" else KEYS[1:]
    inserts = sorted((k, "+I") for k in KEYS)
    # Snapshots whose change is empty may yield no change at all, or an empty one.
    assert [c for c in per_snapshot if c] == \
        [c for c in (inserts, pairs(changed), [(100, "+I")]) if c], _which(per_snapshot)
    # Catch-up's net change over the writes after the first sees the same (a +U per key).
    net = [sorted(zip(c.to_arrow().column("k").to_pylist(),
                      c.to_arrow().column("_row_kind").to_pylist(), strict=True))
           for c in behind]
    assert [c for c in net if c] == [sorted([(k, "+U") for k in changed] + [(100, "+I")])], \
        _which(net)
    # The rows read back are the last ones written (or the first, for first-row).
    want = rows(changed=engine != "first-row")
    assert _rows(t.to_arrow().filter(pa.compute.less(t.to_arrow().column("k"), 100))) == \
        _rows(want)


def _which(per_change: list[list[tuple[int, str]]]) -> str:
    names = {i + 1: c for i, c in enumerate(CHANGING)}
    return "streamed: " + repr([[(names.get(k, k), kind) for k, kind in c] for c in per_change])


def _rows(table: pa.Table) -> list[tuple]:
    """Rows comparable with ==: NaN as a marker, -0.0 told from 0.0, extension values by
    storage."""
    def plain(v: object) -> object:
        if isinstance(v, float):
            return "nan" if math.isnan(v) else (v, math.copysign(1.0, v))
        if isinstance(v, dict):
            return tuple((k, plain(x)) for k, x in v.items())
        if isinstance(v, list):
            return tuple(plain(x) for x in v)
        if isinstance(v, tuple):
            return tuple(plain(x) for x in v)
        return v

    table = table.sort_by("k")
    columns = []
    for name in SCHEMA.names:
        column = table.column(name)
        if isinstance(column.type, pa.ExtensionType):
            column = column.cast(column.type.storage_type)
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        columns.append([plain(v) for v in column.to_pylist()])
    return list(zip(*columns, strict=True))


@pytest.mark.parametrize("vectors", [True, False], ids=["dv", "mor"])
def test_partial_update_writes_nothing_for_rows_written_again_unchanged(sqlite_lake, vectors):
    """Partial-update on a deletion-vector table writes only rows that differ from the live
    ones: rows of every type written again unchanged commit nothing; on merge-on-read the
    lookup changelog of the write is empty."""
    t = sqlite_lake.create_table("s.t", SCHEMA, primary_key=["k"], buckets=1,
                                 deletion_vectors=vectors, merge_engine="partial-update",
                                 changelog_producer="lookup")
    t.upsert(rows(changed=False))
    first = t.current_snapshot_id
    t.upsert(rows(changed=False))
    if vectors:
        # Nothing differed: no row was written and no position deleted, so nothing committed.
        assert t.current_snapshot_id == first
    else:
        assert stream_keys(t, first + 1) in ([], [[]])
    assert t.count() == len(KEYS)
