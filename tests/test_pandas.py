"""pandas in and out: from_pandas with every schema form, splits_num, faithful dtypes."""

from __future__ import annotations

from decimal import Decimal

import pandas as pd
import pyarrow as pa
import pytest

from arrowlake.errors import SchemaMismatch


@pytest.fixture
def frame() -> pd.DataFrame:
    return pd.DataFrame({
        "id": pd.array([1, 2, None, 4], dtype="Int64"),
        "name": ["a", "b", None, "d"],
        "tier": pd.Categorical(["gold", "silver", "gold", None]),
        "at": pd.to_datetime(["2026-11-01 10:00", "2026-11-02 11:00", None,
                              "2026-11-04 12:00"]).tz_localize("Europe/Berlin"),
        "price": [Decimal("1.10"), Decimal("2.20"), None, Decimal("4.40")],
        "ok": pd.array([True, None, False, True], dtype="boolean"),
        "x": [0.5, 1.5, float("nan"), 3.5],
    })


def test_round_trip_dtypes(lake, frame):
    t = lake.from_pandas("n.frame", frame, splits_num=2)
    back = t.to_pandas().sort_values("x", na_position="last").reset_index(drop=True)
    expected = frame.sort_values("x", na_position="last").reset_index(drop=True)
    assert str(back["id"].dtype) == "Int64"
    assert isinstance(back["tier"].dtype, pd.CategoricalDtype)
    assert str(back["at"].dtype) == "datetime64[ns, Europe/Berlin]" or "Europe/Berlin" in str(
        back["at"].dtype)
    assert str(back["ok"].dtype) == "boolean"
    pd.testing.assert_series_equal(back["id"], expected["id"])
    assert back["tier"].tolist()[:3] == expected["tier"].tolist()[:3]
    assert back["price"].tolist()[:2] == [Decimal("1.10"), Decimal("2.20")]
    assert back["name"].tolist()[:2] == ["a", "b"]


def test_splits_num_controls_file_count(lake):
    df = pd.DataFrame({"a": range(1000), "b": [str(i) for i in range(1000)]})
    t = lake.from_pandas("n.split", df, splits_num=4)
    assert t.files().num_rows == 4
    assert t.count() == 1000
    t1 = lake.from_pandas("n.one", df, splits_num=1)
    assert t1.files().num_rows == 1


def test_schema_forms(lake):
    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    full = lake.from_pandas("n.full", df, schema=pa.schema([("a", pa.int32()),
                                                            ("b", pa.large_string())]))
    assert full.schema.field("a").type == pa.int32()
    names = lake.from_pandas("n.names", df, schema=["k", "v"])
    assert names.schema.names == ["k", "v"]
    assert names.to_arrow().sort_by("k")["v"].to_pylist() == ["x", "y"]
    types = lake.from_pandas("n.types", df, schema=[pa.int16(), pa.string()])
    assert types.schema.types == [pa.int16(), pa.string()]
    with pytest.raises(SchemaMismatch):
        lake.from_pandas("n.bad", df, schema=["only_one"])
    assert "n.bad" not in lake.tables()


def test_inferred_string_types_are_normalized(lake):
    df = pd.DataFrame({"s": ["a", "b"]})  # pandas may hand Arrow large_string
    t = lake.from_pandas("n.s", df)
    assert t.schema.field("s").type == pa.string()


def test_scan_to_pandas_with_filter(lake, frame):
    t = lake.from_pandas("n.f", frame, partition_by=None or [])
    df = t.scan(filter="x > 1", columns=["id", "x"]).to_pandas()
    assert sorted(df["x"].tolist()) == [1.5, 3.5]
    assert str(df["id"].dtype) == "Int64"


def test_from_pandas_with_partitions(lake):
    df = pd.DataFrame({"day": ["d1", "d2", "d1", "d2"], "v": [1, 2, 3, 4]})
    t = lake.from_pandas("n.parts", df, splits_num=1, partition_by=["day"])
    assert t.files().num_rows == 2
    assert t.scan(filter="day = 'd1'").to_pandas()["v"].sort_values().tolist() == [1, 3]


def test_from_pandas_primary_key_table(lake):
    df = pd.DataFrame({"id": [1, 2, 1], "v": ["a", "b", "c"]})
    t = lake.from_pandas("n.pk", df, primary_key=["id"], buckets=2)
    assert t.to_pandas().sort_values("id")["v"].tolist() == ["c", "b"]


# -- item 14: types given by the user are converted to, overflow checked --------------------


def test_item14_issue_example_float64_to_int32_and_float32(sqlite_lake):
    pdf = pd.DataFrame({"a": [1.0, 2.0, float("nan")], "b": ["x", "y", None],
                        "c": [0.5, 1e3, 2.25]})
    t = sqlite_lake.from_pandas("n.t", pdf, schema=[pa.int32(), pa.large_string(), pa.float32()])
    assert t.schema.types == [pa.int32(), pa.string(), pa.float32()]
    rows = t.to_arrow().sort_by("c").to_pydict()
    # NaN from pandas is a null, as pa.Array.from_pandas makes it
    assert rows == {"a": [1, None, 2], "b": ["x", None, "y"], "c": [0.5, 2.25, 1000.0]}


@pytest.mark.parametrize(("values", "typ", "bad", "why"), [
    ([1.0, 1.5, 2.0], pa.int32(), "1.5", "not a whole number"),
    ([1.0, 3e10, 2.0], pa.int32(), "30000000000.0", "out of the range of int32"),
    ([1.0, 1e40, 2.0], pa.float32(), "1e+40", "out of the range of float"),
    ([1.0, 1.555, 2.0], pa.decimal128(10, 2), "1.555", "lose digits"),
])
def test_item14_values_that_do_not_fit_name_column_type_and_value(sqlite_lake, values, typ,
                                                                    bad, why):
    pdf = pd.DataFrame({"k": [1, 2, 3], "v": values})
    for schema in ([pa.int64(), typ], pa.schema([("k", pa.int64()), ("v", typ)])):
        with pytest.raises(SchemaMismatch) as err:
            sqlite_lake.from_pandas("n.bad", pdf, schema=schema)
        message = str(err.value)
        assert "Column 'v'" in message and str(typ) in message
        assert bad in message and why in message
    assert sqlite_lake.tables() == []


def test_item14_nullable_int64_overflowing_int32(sqlite_lake):
    pdf = pd.DataFrame({"v": pd.array([1, None, 2**40], dtype="Int64")})
    with pytest.raises(SchemaMismatch, match=r"'v'.*int32.*1099511627776"):
        sqlite_lake.from_pandas("n.bad", pdf, schema=[pa.int32()])
    t = sqlite_lake.from_pandas("n.ok", pdf.iloc[:2], schema=[pa.int32()])
    assert t.to_arrow().column("v").to_pylist() == [1, None]
    assert str(t.to_pandas()["v"].dtype) == "Int64"


def test_item14_realistic_frame_with_a_full_schema(sqlite_lake):
    berlin = pd.to_datetime(["2026-11-01 10:00:00.123", "2026-11-02 11:00:00.000", None]) \
        .tz_localize("Europe/Berlin")
    pdf = pd.DataFrame({
        "tier": pd.Categorical(["gold", "silver", None]),
        "name": pd.array(["a", None, "c"], dtype="string[pyarrow]"),
        "n": pd.array([7, None, 9], dtype="Int64"),
        "at": berlin,
        "at_s": pd.Series(berlin).astype("datetime64[s, Europe/Berlin]"),
        "score": [1.0, float("nan"), 3.0],
    })
    schema = pa.schema([
        ("tier", pa.large_string()), ("name", pa.string()), ("n", pa.int16()),
        ("at", pa.timestamp("ms", tz="UTC")), ("at_s", pa.timestamp("us", tz="UTC")),
        ("score", pa.int8()),
    ])
    t = sqlite_lake.from_pandas("n.full", pdf, schema=schema, splits_num=1)
    assert [f.type for f in t.schema] == [pa.large_string(), pa.string(), pa.int16(),
                                           pa.timestamp("ms", tz="UTC"),
                                           pa.timestamp("us", tz="UTC"), pa.int8()]
    got = t.to_arrow().sort_by("tier").to_pydict()
    assert got["tier"] == ["gold", "silver", None]
    assert got["name"] == ["a", None, "c"]
    assert got["n"] == [7, None, 9]
    assert got["score"] == [1, None, 3]
    at = t.to_arrow().sort_by("tier").column("at").to_pylist()
    assert at[0] == berlin[0].tz_convert("UTC").to_pydatetime()
    assert at[2] is None
    # nanoseconds do not fit milliseconds: the value is named, nothing is created
    fine = pdf.assign(at=pd.Series(berlin) + pd.Timedelta(1, "ns"))
    with pytest.raises(SchemaMismatch, match=r"Column 'at'.*timestamp\[ms, tz=UTC\]"):
        sqlite_lake.from_pandas("n.fine", fine, schema=schema)
    assert "n.fine" not in sqlite_lake.tables()


def test_item14_primary_key_table_with_given_types(sqlite_lake):
    pdf = pd.DataFrame({"id": [1.0, 2.0, 1.0], "v": [0.25, 0.5, 0.75]})
    t = sqlite_lake.from_pandas("n.pk", pdf, schema=[pa.int32(), pa.float32()],
                                primary_key=["id"], buckets=2)
    assert t.to_arrow().sort_by("id").to_pydict() == {"id": [1, 2], "v": [0.75, 0.5]}


def test_item14_full_schema_matches_columns_by_name(sqlite_lake):
    pdf = pd.DataFrame({"b": ["x", "y"], "a": [1.0, 2.0]})
    schema = pa.schema([("a", pa.int32()), ("b", pa.string()), ("c", pa.float32())])
    t = sqlite_lake.from_pandas("n.order", pdf, schema=schema)
    assert t.schema.types == [pa.int32(), pa.string(), pa.float32()]
    assert t.to_arrow().sort_by("a").to_pydict() == {"a": [1, 2], "b": ["x", "y"],
                                                     "c": [None, None]}
