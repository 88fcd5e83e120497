"""Merge engines against an obviously-correct row-at-a-time model of their semantics."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowlake.errors import ColumnNotFound, SchemaMismatch, ValidationError
from arrowlake.merge import (
    ROW_KIND,
    SEQUENCE,
    Aggregation,
    Deduplicate,
    FirstRow,
    PartialUpdate,
    RowKind,
    dedupe_within_write,
    engine_from_options,
    sort_by_key,
    validate_aggregations,
)

SCHEMA = pa.schema(
    {
        "k": pa.int64(),
        "a": pa.int64(),
        "f": pa.float64(),
        "s": pa.string(),
        "flag": pa.bool_(),
        "ts": pa.int64(),
        ROW_KIND: pa.int8(),
        SEQUENCE: pa.int64(),
    }
)
VALUE_COLUMNS = ["a", "f", "s", "flag", "ts"]
RETRACTIONS = (RowKind.UPDATE_BEFORE, RowKind.DELETE)

settings.register_profile("merge", deadline=None, max_examples=80)
settings.load_profile("merge")


# -- generating versions ---------------------------------------------------------------------


@st.composite
def version_rows(draw, keys=None, max_size=40):
    """Rows of several runs: random keys from a small domain, kinds, values with nulls."""
    keys = st.integers(0, 5) if keys is None else keys
    n = draw(st.integers(0, max_size))
    seqs = draw(st.permutations(range(n)))
    rows = []
    for i in range(n):
        rows.append(
            {
                "k": draw(keys),
                "a": draw(st.none() | st.integers(-50, 50)),
                "f": draw(st.none() | st.integers(-40, 40).map(lambda x: x / 4)),
                "s": draw(st.none() | st.text("xyz", max_size=3)),
                "flag": draw(st.none() | st.booleans()),
                "ts": draw(st.none() | st.integers(0, 3)),  # ties on purpose
                ROW_KIND: draw(st.sampled_from(list(RowKind))).value,
                SEQUENCE: seqs[i] * 10,
            }
        )
    return rows


def to_table(rows: list[dict], schema: pa.Schema = SCHEMA, chunks: int = 1) -> pa.Table:
    table = pa.Table.from_pylist(rows, schema=schema)
    if chunks > 1 and table.num_rows > 1:
        cut = table.num_rows // 2
        table = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    return table


# -- the model: one key at a time, one version at a time --------------------------------------


def by_key(rows: list[dict], key: list[str]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[c] for c in key), []).append(row)
    return dict(sorted(groups.items()))


def version_order(versions: list[dict], sequence_field: str | None) -> list[dict]:
    def rank(row: dict) -> tuple:
        if sequence_field is None:
            return (row[SEQUENCE],)
        value = row[sequence_field]
        return (value is not None, value if value is not None else 0, row[SEQUENCE])

    return sorted(versions, key=rank)


def retracts(row: dict) -> bool:
    return row[ROW_KIND] in RETRACTIONS


def tombstone(row: dict) -> dict:
    return {**row, ROW_KIND: RowKind.DELETE.value}


def restarts(row: dict) -> bool:
    return row[ROW_KIND] == RowKind.RESTART


def as_addition(row: dict) -> dict:
    """A merged row that no longer needs to hide older versions: a restart becomes +U."""
    return {**row, ROW_KIND: RowKind.UPDATE_AFTER.value} if restarts(row) else row


def model_deduplicate(rows, key, sequence_field, keep, ignore_delete=False):
    out = []
    for versions in by_key(rows, key).values():
        versions = version_order(versions, sequence_field)
        if ignore_delete:
            versions = [v for v in versions if not retracts(v)]
            if not versions:
                continue
        newest = versions[-1]
        if retracts(newest):
            if keep:
                out.append(tombstone(newest))
        else:
            out.append(newest if keep else as_addition(newest))
    return out


def model_first_row(rows, key, sequence_field):
    out = []
    for versions in by_key(rows, key).values():
        versions = [v for v in version_order(versions, sequence_field) if not retracts(v)]
        if versions:
            out.append(as_addition(versions[0]))
    return out


def model_partial_update(rows, key, sequence_field, keep, ignore_delete=False):
    out = []
    for versions in by_key(rows, key).values():
        versions = version_order(versions, sequence_field)
        if ignore_delete:
            versions = [v for v in versions if not retracts(v)]
            if not versions:
                continue
        if retracts(versions[-1]):
            if keep:
                out.append(tombstone(versions[-1]))
            continue
        merged: dict = {}
        restarted = False
        for version in versions:
            if retracts(version):
                merged, restarted = {}, True  # a retraction resets the row
                continue
            if restarts(version):
                merged, restarted = {}, True  # and so does a restart, keeping its values
            for column, value in version.items():
                if column in key or column in (ROW_KIND, SEQUENCE) or value is not None:
                    merged[column] = value
        row = as_addition({column: merged.get(column) for column in versions[-1]})
        if keep and restarted:
            row[ROW_KIND] = RowKind.RESTART.value
        out.append(row)
    return out


def fold(function: str, versions: list[dict], column: str):
    acc = 0 if function == "count" else None
    seen: list = []
    for version in versions:
        value, retract = version[column], retracts(version)
        if function == "sum":
            if value is not None:
                acc = (0 if acc is None else acc) + (-value if retract else value)
        elif function == "count":
            acc += -(value or 0) if retract else (value or 0)
        elif function == "last_value":
            acc = None if retract else value
        elif function == "last_non_null_value":
            if value is not None and not retract:
                acc = value
        elif value is not None or function == "first_value":
            seen.append(value)
    if function in ("sum", "count", "last_value", "last_non_null_value"):
        return acc
    if function == "first_value":
        return seen[0] if seen else None
    if not seen:
        return None
    return {
        "first_non_null_value": lambda: seen[0],
        "min": lambda: min(seen),
        "max": lambda: max(seen),
        "bool_and": lambda: all(seen),
        "bool_or": lambda: any(seen),
        "listagg": lambda: ",".join(seen),
    }[function]()


class CannotRetract(Exception):
    pass


def model_aggregation(rows, key, sequence_field, keep, engine: Aggregation):
    out = []
    for versions in by_key(rows, key).values():
        versions = version_order(versions, sequence_field)
        restarted = False
        if engine.remove_record_on_delete:
            deletes = [i for i, v in enumerate(versions) if v[ROW_KIND] == RowKind.DELETE]
            if deletes and deletes[-1] == len(versions) - 1:
                if keep:
                    out.append(tombstone(versions[-1]))
                continue
            starts = [i + 1 for i in deletes] + [i for i, v in enumerate(versions) if restarts(v)]
            versions_in = versions[max(starts):] if starts else versions
            restarted = bool(starts)
        else:
            versions_in = versions
        newest = versions[-1]
        kind = RowKind.UPDATE_AFTER.value if retracts(newest) or restarts(newest) \
            else newest[ROW_KIND]
        if keep and restarted:
            kind = RowKind.RESTART.value
        merged = {**newest, ROW_KIND: kind}
        for column in VALUE_COLUMNS:
            function = engine.function_of(column)
            folded = versions_in
            if column in engine.ignore_retract:
                folded = [v for v in versions_in if not retracts(v)]
            elif function not in ("sum", "count", "last_value", "last_non_null_value") and any(
                retracts(v) for v in folded
            ):
                raise CannotRetract(column)
            merged[column] = fold(function, folded, column)
        out.append(merged)
    return out


def rows_of(table: pa.Table) -> list[dict]:
    return table.to_pylist()


# -- engines against the model ----------------------------------------------------------------

sequence_fields = st.sampled_from([None, "ts"])


@given(version_rows(), st.booleans(), sequence_fields, st.booleans(), st.integers(1, 2))
def test_deduplicate_matches_model(rows, keep, sequence_field, ignore_delete, chunks):
    merged = Deduplicate(ignore_delete=ignore_delete).merge(
        to_table(rows, chunks=chunks), ["k"], sequence_field, keep
    )
    assert rows_of(merged) == model_deduplicate(rows, ["k"], sequence_field, keep, ignore_delete)


@given(version_rows(), st.booleans(), sequence_fields)
def test_first_row_matches_model(rows, keep, sequence_field):
    merged = FirstRow().merge(to_table(rows), ["k"], sequence_field, keep)
    assert rows_of(merged) == model_first_row(rows, ["k"], sequence_field)


@given(version_rows(), st.booleans(), sequence_fields, st.booleans(), st.integers(1, 2))
def test_partial_update_matches_model(rows, keep, sequence_field, ignore_delete, chunks):
    merged = PartialUpdate(ignore_delete=ignore_delete).merge(
        to_table(rows, chunks=chunks), ["k"], sequence_field, keep
    )
    expected = model_partial_update(rows, ["k"], sequence_field, keep, ignore_delete)
    assert rows_of(merged) == expected


FUNCTIONS_FOR = {
    "a": [
        "sum",
        "min",
        "max",
        "last_value",
        "last_non_null_value",
        "first_value",
        "first_non_null_value",
        "count",
    ],
    "f": ["sum", "min", "max", "last_value", "first_non_null_value"],
    "s": ["min", "max", "listagg", "last_value", "last_non_null_value", "first_value"],
    "flag": ["bool_and", "bool_or", "last_non_null_value", "min", "max"],
}


@st.composite
def aggregations(draw):
    functions = {
        column: draw(st.sampled_from(choices))
        for column, choices in FUNCTIONS_FOR.items()
        if draw(st.booleans())
    }
    ignore = draw(st.sets(st.sampled_from(list(FUNCTIONS_FOR))))
    return Aggregation(
        functions=functions,
        ignore_retract=frozenset(ignore),
        remove_record_on_delete=draw(st.booleans()),
    )


@given(version_rows(), st.booleans(), sequence_fields, aggregations(), st.integers(1, 2))
def test_aggregation_matches_model(rows, keep, sequence_field, engine, chunks):
    table = to_table(rows, chunks=chunks)
    try:
        expected = model_aggregation(rows, ["k"], sequence_field, keep, engine)
    except CannotRetract as exc:
        with pytest.raises(ValidationError, match=f"column '{exc.args[0]}'"):
            engine.merge(table, ["k"], sequence_field, keep)
        return
    assert rows_of(engine.merge(table, ["k"], sequence_field, keep)) == expected


@given(version_rows(), st.booleans())
def test_retractable_aggregations_never_raise(rows, keep):
    engine = Aggregation({"a": "sum", "f": "sum", "s": "last_value"})
    expected = model_aggregation(rows, ["k"], None, keep, engine)
    assert rows_of(engine.merge(to_table(rows), ["k"], None, keep)) == expected


# -- compaction: merging newer runs first must not change what a reader sees --------------------


@given(version_rows(max_size=30), st.integers(0, 30), st.sampled_from(["dedupe", "sum", "first"]))
def test_compacting_newer_runs_keeps_the_answer(rows, cut, engine_name):
    engine = {
        "dedupe": Deduplicate(),
        "sum": Aggregation({"a": "sum", "f": "sum", "ts": "count"}),
        "first": FirstRow(),
    }[engine_name]
    rows = sorted(rows, key=lambda r: r[SEQUENCE])
    older, newer = rows[:cut], rows[cut:]
    compacted = engine.merge(to_table(newer), ["k"], None, keep_retractions=True)
    assert RowKind.UPDATE_BEFORE not in compacted[ROW_KIND].to_pylist()  # tombstones are -D
    two_step = engine.merge(pa.concat_tables([to_table(older), compacted]), ["k"])
    assert rows_of(two_step.drop_columns([SEQUENCE])) == rows_of(
        engine.merge(to_table(rows), ["k"]).drop_columns([SEQUENCE])
    )


# -- keys ----------------------------------------------------------------------------------------


@given(
    version_rows(keys=st.tuples(st.integers(0, 2), st.sampled_from(["p", "q", "pq", ""]))),
    st.booleans(),
    st.sampled_from(["dedupe", "partial"]),
)
def test_multi_column_keys(rows, keep, engine_name):
    for row in rows:
        row["k1"], row["k2"] = row.pop("k")
    schema = pa.schema([("k1", pa.int32()), ("k2", pa.string()), *list(SCHEMA)[1:]])
    table = to_table(rows, schema)
    key = ["k1", "k2"]
    if engine_name == "dedupe":
        expected = model_deduplicate(rows, key, None, keep)
        merged = Deduplicate().merge(table, key, None, keep)
    else:
        expected = model_partial_update(rows, key, None, keep)
        merged = PartialUpdate().merge(table, key, None, keep)
    assert rows_of(merged) == [{c: r[c] for c in schema.names} for r in expected]


KEY_TYPES = {
    "int8": (pa.int8(), lambda i: i - 3),
    "int32": (pa.int32(), lambda i: -(10**6) + i * 997),
    "uint64": (pa.uint64(), lambda i: 2**63 + i),
    "int64": (pa.int64(), lambda i: -(2**62) + i),
    "string": (pa.string(), lambda i: "k" * (i % 3) + str(i)),
    "fixed-width string": (pa.string(), lambda i: f"{i:04d}"),
    "large_string": (pa.large_string(), lambda i: f"é{i}"),
    "string_view": (pa.string_view(), lambda i: f"v{i}"),
    "binary": (pa.binary(), lambda i: bytes([255 - i, 0, i])),
    "fixed_size_binary": (pa.binary(2), lambda i: bytes([200 - i, i])),
    "date32": (pa.date32(), lambda i: dt.date(1969, 12, 25) + dt.timedelta(days=i)),
    "timestamp": (
        pa.timestamp("us", tz="UTC"),
        lambda i: dt.datetime(2024, 1, 1, i, tzinfo=dt.UTC),
    ),
    "decimal": (pa.decimal128(6, 2), lambda i: decimal.Decimal(i) / 4 - 1),
    "bool": (pa.bool_(), lambda i: i % 2 == 0),
}


@pytest.mark.parametrize("type_name", list(KEY_TYPES))
@given(rows=version_rows(keys=st.integers(0, 6)), keep=st.booleans())
@settings(max_examples=12)
def test_key_types(type_name, rows, keep):
    key_type, value_of = KEY_TYPES[type_name]
    for row in rows:
        row["k"] = value_of(row["k"])
    schema = SCHEMA.set(0, pa.field("k", key_type))
    table = to_table(rows, schema)
    expected = sorted(
        model_partial_update(rows, ["k"], None, keep),
        key=lambda r: r["k"].encode() if isinstance(r["k"], str) else r["k"],
    )
    assert rows_of(PartialUpdate().merge(table, ["k"], None, keep)) == expected
    dedup = rows_of(Deduplicate().merge(table, ["k"], None, keep))
    assert [r["k"] for r in dedup] == [
        r["k"]
        for r in sorted(
            model_deduplicate(rows, ["k"], None, keep),
            key=lambda r: r["k"].encode() if isinstance(r["k"], str) else r["k"],
        )
    ]
    assert rows_of(FirstRow().merge(table, ["k"])) == sorted(
        model_first_row(rows, ["k"], None),
        key=lambda r: r["k"].encode() if isinstance(r["k"], str) else r["k"],
    )


@pytest.mark.parametrize(
    "seq_type, values",
    [
        (pa.string(), ["b", None, "a", "b"]),
        (pa.float64(), [0.5, None, -1.0, 0.5]),
        (pa.timestamp("ms"), [2, None, 1, 2]),
        (
            pa.decimal128(5, 1),
            [decimal.Decimal("2.0"), None, decimal.Decimal("1.0"), decimal.Decimal("2.0")],
        ),
    ],
)
def test_sequence_field_types(seq_type, values):
    table = pa.table(
        {
            "k": [1, 1, 1, 1],
            "v": ["first", "null-seq", "smallest", "last-tie"],
            "u": pa.array(values, seq_type),
            ROW_KIND: pa.array([0, 0, 0, 0], pa.int8()),
            SEQUENCE: [10, 20, 30, 5],
        }
    )
    # Highest sequence value wins; ties go to the larger _seq; nulls are the oldest.
    assert Deduplicate().merge(table, ["k"], "u")["v"].to_pylist() == ["first"]
    assert FirstRow().merge(table, ["k"], "u")["v"].to_pylist() == ["null-seq"]


# -- write path, fast paths, sorting -----------------------------------------------------------


@given(version_rows(), st.sampled_from(["dedupe", "partial", "first"]))
def test_dedupe_within_write_keeps_input_order(rows, engine_name):
    engine = {"dedupe": Deduplicate(), "partial": PartialUpdate(), "first": FirstRow()}[engine_name]
    batch = to_table(rows).drop_columns([SEQUENCE])
    written = dedupe_within_write(batch, ["k"], engine)
    positioned = [{**row, SEQUENCE: i} for i, row in enumerate(rows)]
    model = {
        "dedupe": lambda: model_deduplicate(positioned, ["k"], None, True),
        "partial": lambda: model_partial_update(positioned, ["k"], None, True),
        "first": lambda: model_first_row(positioned, ["k"], None),
    }[engine_name]()
    assert written.schema == batch.schema
    assert rows_of(written) == [{c: r[c] for c in batch.column_names} for r in model]
    assert written["k"].to_pylist() == sorted(set(written["k"].to_pylist()))


def test_dedupe_within_write_without_row_kinds():
    batch = pa.table({"id": ["b", "a", "b"], "v": [1, 2, 3]})
    assert dedupe_within_write(batch, ["id"]).to_pydict() == {"id": ["a", "b"], "v": [2, 3]}


def test_one_sorted_run_is_returned_without_copying():
    table = to_table([{"k": i, "a": i, SEQUENCE: i, ROW_KIND: 0} for i in range(100)])
    for engine in (Deduplicate(), PartialUpdate(), FirstRow(), Aggregation({"a": "sum"})):
        assert engine.merge(table, ["k"]) is table


def test_one_run_drops_its_tombstones_unless_kept():
    rows = [{"k": i, "a": i, SEQUENCE: i, ROW_KIND: 3 if i % 3 == 0 else 0} for i in range(9)]
    table = to_table(rows)
    assert Deduplicate().merge(table, ["k"])["k"].to_pylist() == [1, 2, 4, 5, 7, 8]
    kept = Deduplicate().merge(table, ["k"], keep_retractions=True)
    assert kept[ROW_KIND].to_pylist() == [r[ROW_KIND] for r in rows]


def test_update_before_as_newest_version_becomes_a_tombstone():
    table = to_table(
        [
            {"k": 1, "a": 1, SEQUENCE: 1, ROW_KIND: 0},
            {"k": 1, "a": 1, SEQUENCE: 2, ROW_KIND: 1},
        ]
    )
    merged = Deduplicate().merge(table, ["k"], keep_retractions=True)
    assert merged[ROW_KIND].to_pylist() == [RowKind.DELETE]
    assert Deduplicate().merge(table, ["k"]).num_rows == 0


def test_empty_input():
    table = SCHEMA.empty_table()
    for engine in (Deduplicate(), PartialUpdate(), FirstRow(), Aggregation({"a": "sum"})):
        assert engine.merge(table, ["k"]).schema == SCHEMA
        assert engine.merge(table, ["k"]).num_rows == 0


def test_sort_by_key_is_stable():
    table = pa.table({"k": ["b", "a", "b", "a"], "i": [0, 1, 2, 3]})
    assert sort_by_key(table, ["k"])["i"].to_pylist() == [1, 3, 0, 2]
    ints = pa.table({"k": [2, 1, 2, 1], "i": [0, 1, 2, 3]})
    assert sort_by_key(ints, ["k"])["i"].to_pylist() == [1, 3, 0, 2]


def test_listagg_and_count_by_example():
    table = pa.table(
        {
            "k": [1, 1, 1, 2],
            "tags": ["a", None, "c", None],
            "n": [1, 1, None, 1],
            ROW_KIND: pa.array([0, 2, 2, 0], pa.int8()),
            SEQUENCE: [3, 1, 2, 4],
        }
    )
    merged = Aggregation({"tags": "listagg", "n": "count"}).merge(table, ["k"])
    assert merged.select(["k", "tags", "n"]).to_pylist() == [
        {"k": 1, "tags": "c,a", "n": 2},
        {"k": 2, "tags": None, "n": 1},
    ]


def test_aggregation_remove_record_on_delete():
    table = pa.table(
        {
            "k": [1, 1, 1, 2, 2],
            "n": [5, 5, 2, 1, 1],
            ROW_KIND: pa.array([0, 3, 0, 0, 3], pa.int8()),
            SEQUENCE: [1, 2, 3, 4, 5],
        }
    )
    engine = Aggregation({"n": "sum"}, remove_record_on_delete=True)
    assert engine.merge(table, ["k"]).select(["k", "n"]).to_pylist() == [{"k": 1, "n": 2}]
    # Without the option a delete only subtracts, as in Paimon.
    assert Aggregation({"n": "sum"}).merge(table, ["k"]).select(["k", "n"]).to_pylist() == [
        {"k": 1, "n": 2},
        {"k": 2, "n": 0},
    ]


def test_sum_keeps_the_column_type():
    table = pa.table(
        {
            "k": [1, 1],
            "n": pa.array([100, 27], pa.int8()),
            "d": pa.array([decimal.Decimal("1.25"), decimal.Decimal("2.50")], pa.decimal128(5, 2)),
            ROW_KIND: pa.array([0, 0], pa.int8()),
            SEQUENCE: [1, 2],
        }
    )
    merged = Aggregation({"n": "sum", "d": "sum"}).merge(table, ["k"])
    assert merged.schema == table.schema
    assert merged.select(["n", "d"]).to_pylist() == [{"n": 127, "d": decimal.Decimal("3.75")}]
    overflow = table.set_column(1, "n", pa.array([100, 28], pa.int8()))
    with pytest.raises(ValidationError, match="'n' does not fit its type int8"):
        Aggregation({"n": "sum"}).merge(overflow, ["k"])


def test_min_max_of_temporal_and_decimal_columns():
    table = pa.table(
        {
            "k": [1, 1, 1],
            "day": pa.array([dt.date(2024, 5, 1), None, dt.date(2023, 1, 1)]),
            "amount": pa.array(
                [decimal.Decimal("1.5"), decimal.Decimal("-2.5"), None], pa.decimal128(4, 1)
            ),
            ROW_KIND: pa.array([0, 0, 0], pa.int8()),
            SEQUENCE: [1, 2, 3],
        }
    )
    low = Aggregation({"day": "min", "amount": "min"}).merge(table, ["k"])
    high = Aggregation({"day": "max", "amount": "max"}).merge(table, ["k"])
    assert low.select(["day", "amount"]).to_pylist() == [
        {"day": dt.date(2023, 1, 1), "amount": decimal.Decimal("-2.5")}
    ]
    assert high.select(["day", "amount"]).to_pylist() == [
        {"day": dt.date(2024, 5, 1), "amount": decimal.Decimal("1.5")}
    ]


# -- options and errors --------------------------------------------------------------------------


def test_engine_from_options():
    schema = SCHEMA
    assert engine_from_options("deduplicate", schema, ["k"]) == Deduplicate()
    assert engine_from_options("first-row", schema, ["k"]) == FirstRow()
    assert engine_from_options("partial-update", schema, ["k"], {"ignore-delete": "true"}) == (
        PartialUpdate(ignore_delete=True)
    )
    engine = engine_from_options(
        "aggregation",
        schema,
        ["k"],
        {
            "fields.a.aggregate-function": "sum",
            "fields.s.aggregate-function": "listagg",
            "fields.s.ignore-retract": "true",
            "fields.default-aggregate-function": "last_value",
            "aggregation.remove-record-on-delete": True,
            "bucket": "4",
        },
    )
    assert engine == Aggregation({"a": "sum", "s": "listagg"}, "last_value", frozenset({"s"}), True)


def test_unknown_engine_lists_the_valid_ones():
    valid = "deduplicate, partial-update, aggregation, first-row"
    with pytest.raises(ValidationError, match=valid):
        engine_from_options("dedup", SCHEMA, ["k"])


@pytest.mark.parametrize(
    "functions, error, message",
    [
        ({"s": "sum"}, SchemaMismatch, "'sum' cannot aggregate column 's' of type string"),
        ({"a": "listagg"}, SchemaMismatch, "'listagg' cannot aggregate column 'a' of type int64"),
        ({"f": "bool_or"}, SchemaMismatch, "column 'f' of type double"),
        ({"f": "count"}, SchemaMismatch, "'count' cannot aggregate column 'f'"),
        ({"a": "median"}, ValidationError, "Unknown aggregate function 'median'.*valid"),
        ({"k": "sum"}, ValidationError, "'k' is part of the primary key"),
        ({"nope": "sum"}, ColumnNotFound, "'nope'"),
    ],
)
def test_invalid_aggregations(functions, error, message):
    with pytest.raises(error, match=message):
        validate_aggregations(SCHEMA, ["k"], functions)
    options = {f"fields.{c}.aggregate-function": f for c, f in functions.items()}
    with pytest.raises(error, match=message):
        engine_from_options("aggregation", SCHEMA, ["k"], options)


def test_default_function_is_checked_against_every_column():
    with pytest.raises(SchemaMismatch, match="column 's'"):
        engine_from_options(
            "aggregation", SCHEMA, ["k"], {"fields.default-aggregate-function": "sum"}
        )


def test_bad_flag_value():
    with pytest.raises(ValidationError, match="'ignore-delete' must be 'true' or 'false'"):
        engine_from_options("partial-update", SCHEMA, ["k"], {"ignore-delete": "yes"})


def test_retraction_into_a_function_that_cannot_retract():
    table = to_table(
        [
            {"k": 1, "a": 3, SEQUENCE: 1, ROW_KIND: 0},
            {"k": 1, "a": 3, SEQUENCE: 2, ROW_KIND: 1},
        ]
    )
    with pytest.raises(ValidationError, match="'max' of column 'a' cannot retract"):
        Aggregation({"a": "max"}).merge(table, ["k"])
    merged = Aggregation({"a": "max"}, ignore_retract=frozenset({"a"})).merge(table, ["k"])
    assert merged["a"].to_pylist() == [3]


def test_null_key_is_rejected():
    table = to_table([{"k": None, SEQUENCE: 1, ROW_KIND: 0}])
    with pytest.raises(ValidationError, match="'k' is part of the primary key and may not be null"):
        Deduplicate().merge(table, ["k"])


def test_missing_columns_are_named():
    table = to_table([{"k": 1, SEQUENCE: 1, ROW_KIND: 0}])
    with pytest.raises(ValidationError, match="'_seq'"):
        Deduplicate().merge(table.drop_columns([SEQUENCE]), ["k"])
    with pytest.raises(ColumnNotFound, match="'id'"):
        Deduplicate().merge(table, ["id"])
    with pytest.raises(ColumnNotFound, match="Sequence field 'when'"):
        Deduplicate().merge(pa.concat_tables([table, table]), ["k"], "when")


def test_bad_row_kind_values():
    table = to_table([{"k": 1, SEQUENCE: 1, ROW_KIND: 7}])
    with pytest.raises(ValidationError, match="outside 0..4"):
        Deduplicate().merge(table, ["k"])


def test_engines_are_hashable_values():
    assert hash(Deduplicate()) == hash(Deduplicate())
    assert Aggregation({"a": "sum"}) == Aggregation({"a": "sum"})
    assert hash(Aggregation({"a": "sum"})) == hash(Aggregation({"a": "max"}))
    with pytest.raises(ValidationError, match="Unknown aggregate function 'avg'"):
        Aggregation({"a": "avg"})


def test_aggregation_without_resets_reads_a_restart_as_an_addition():
    # Found by test_aggregation_matches_model: one restart row kept its kind in a partial merge
    # while several were turned into +U.
    rows = [{"k": 0, "a": None, "f": None, "s": None, "flag": None, "ts": None,
             ROW_KIND: RowKind.RESTART.value, SEQUENCE: 0}]
    engine = Aggregation(default_function="last_non_null_value")
    merged = engine.merge(to_table(rows), ["k"], None, True)
    assert merged[ROW_KIND].to_pylist() == [RowKind.UPDATE_AFTER.value]


def test_newer_versions_win_in_any_input_order():
    newer_first = pa.table({"id": [1, 1], "_seq": pa.array([2, 1], pa.int64())})
    assert Deduplicate().merge(newer_first, ["id"])["_seq"].to_pylist() == [2]
    assert FirstRow().merge(newer_first, ["id"])["_seq"].to_pylist() == [1]


def test_count_of_a_single_null_version_is_zero_like_a_merged_one():
    """A null counts as 0 whether the key has one version or several (found by hypothesis:
    compacting newer runs first changed a null count into 0)."""
    engine = Aggregation({"n": "count"})
    kinds = pa.array([0, 0, 0], pa.int8())
    table = pa.table({"k": [0, 0, 1], "n": pa.array([None, None, None], pa.int64()),
                      "_row_kind": kinds, "_seq": [10, 20, 0]})
    assert engine.merge(table, ["k"])["n"].to_pylist() == [0, 0]
    assert engine.merge(table.slice(2), ["k"])["n"].to_pylist() == [0]
    assert engine.merge(table.slice(0, 1), ["k"])["n"].to_pylist() == [0]
