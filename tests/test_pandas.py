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
