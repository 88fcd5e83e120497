"""pyiceberg 0.12 and DuckDB 1.5.5 read the lake through the catalog, row for row as
``table.scan()`` does: appends, deletes, upserts on a composite key, identity partitions, schema
evolution, time travel by snapshot and by tag. Each client runs once, in its own environment
without arrowlake, over every query of this module.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from arrowlake.errors import NoIcebergView
from arrowlake.iceberg import publish
from tests.iceberg_rest.conftest import (
    DUCKDB_ENV,
    TOKEN,
    ClientRun,
    LakeFixture,
    assert_same_rows,
    run_client,
)

KEYS = {"shop.events": ["id"], "crm.users": ["id", "region"], "crm.evolving": ["id"]}

# name -> (table, snapshot mark or None for the current one, tag, filter)
PYICEBERG_QUERIES: dict[str, tuple[str, str | None, str | None, str | None]] = {
    "events_now": ("shop.events", None, None, None),
    "events_1": ("shop.events", "events_1", None, None),
    "events_3": ("shop.events", "events_3", None, None),
    "events_us": ("shop.events", None, None, "region == 'us'"),
    "users_now": ("crm.users", None, None, None),
    "users_1": ("crm.users", "users_1", None, None),
    "users_tag": ("crm.users", None, "v2", None),
    "users_eu": ("crm.users", None, None, "region == 'eu'"),
    "evo_now": ("crm.evolving", None, None, None),
    "evo_1": ("crm.evolving", "evo_1", None, None),
    "legacy": ("crm.legacy", None, None, None),
    "missing": ("crm.nope", None, None, None),
}


def _expected(lake_fx: LakeFixture, table: str, mark: str | None, tag: str | None,
              filter: str | None) -> pa.Table:
    t = lake_fx.lake.table(table)
    snapshot = lake_fx.marks[mark] if mark else None
    text = filter.replace("==", "=") if filter else None
    return t.scan(text, snapshot=snapshot, tag=tag).to_arrow()


@pytest.fixture(scope="module")
def pyiceberg_run(lake_fx: LakeFixture, catalog_url: str,
                  tmp_path_factory: pytest.TempPathFactory) -> ClientRun:
    queries = []
    for name, (table, mark, tag, filter) in PYICEBERG_QUERIES.items():
        query: dict[str, object] = {"name": name, "table": table}
        if mark:
            query["snapshot"] = lake_fx.marks[mark]
        if tag:
            query["tag"] = tag
        if filter:
            query["filter"] = filter
        queries.append(query)
    plan = {"uri": catalog_url, "token": TOKEN, "namespaces": ["crm", "shop", "empty_ns"],
            "exists": ["crm.users", "crm.nope"], "queries": queries}
    return run_client("iceberg-clients", "pyiceberg_client.py", plan,
                      tmp_path_factory.mktemp("pyiceberg"))


@pytest.mark.parametrize("name", [n for n in PYICEBERG_QUERIES if n not in ("legacy",
                                                                            "missing")])
def test_pyiceberg_reads_row_for_row(pyiceberg_run: ClientRun, lake_fx: LakeFixture,
                                     name: str):
    table, mark, tag, filter = PYICEBERG_QUERIES[name]
    expected = _expected(lake_fx, table, mark, tag, filter)
    assert expected.num_rows > 0
    assert_same_rows(pyiceberg_run.table(name), expected, KEYS[table])


def test_pyiceberg_time_travel_sees_older_rows_and_schemas(pyiceberg_run: ClientRun):
    # The checks above compare with arrowlake; these make sure time travel was not a no-op.
    assert pyiceberg_run.table("events_1").num_rows == 300
    assert pyiceberg_run.table("events_3").num_rows == 600
    assert pyiceberg_run.table("events_now").num_rows < 600
    assert pyiceberg_run.table("evo_1").column_names == ["id", "a", "b"]
    assert pyiceberg_run.table("evo_1").schema.field("a").type == pa.int32()
    assert pyiceberg_run.table("evo_now").column_names == ["id", "a", "label"]
    assert pyiceberg_run.table("evo_now").schema.field("a").type == pa.int64()


def test_pyiceberg_lists_and_checks_through_the_catalog(pyiceberg_run: ClientRun):
    listing = pyiceberg_run.listing
    assert listing["namespaces"] == [["crm"], ["empty_ns"], ["shop"]]
    assert listing["tables"] == {"crm": [["crm", "evolving"], ["crm", "legacy"],
                                         ["crm", "users"]],
                                 "shop": [["shop", "events"]], "empty_ns": []}
    assert listing["exists"] == {"crm.users": True, "crm.nope": False}


def test_pyiceberg_is_told_why_a_table_has_no_view_and_what_is_missing(
        pyiceberg_run: ClientRun, lake_fx: LakeFixture):
    with pytest.raises(NoIcebergView) as raised:
        publish(lake_fx.lake.table("crm.legacy"))
    assert str(raised.value) in pyiceberg_run.error("legacy")
    assert "NoSuchTableError" in pyiceberg_run.error("missing")
    assert "crm.nope" in pyiceberg_run.error("missing")


# -- DuckDB --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def duckdb_run(lake_fx: LakeFixture, catalog_url: str,
               tmp_path_factory: pytest.TempPathFactory) -> ClientRun:
    marks = lake_fx.marks
    queries = [
        {"name": "events_now", "sql": "SELECT * FROM lake.shop.events"},
        {"name": "events_1", "sql": "SELECT * FROM lake.shop.events "
                                    f"AT (VERSION => {marks['events_1']})"},
        {"name": "users_now", "sql": "SELECT * FROM lake.crm.users"},
        {"name": "users_2", "sql": f"SELECT * FROM lake.crm.users AT (VERSION => "
                                   f"{marks['users_2']})"},
        {"name": "users_eu", "sql": "SELECT * FROM lake.crm.users WHERE region = 'eu'"},
        {"name": "evo_now", "sql": "SELECT * FROM lake.crm.evolving"},
        {"name": "legacy", "sql": "SELECT * FROM lake.crm.legacy"},
    ]
    plan = {"uri": catalog_url, "token": TOKEN, "queries": queries}
    return run_client(DUCKDB_ENV, "duckdb_client.py", plan, tmp_path_factory.mktemp("duckdb"))


@pytest.mark.parametrize(("name", "table", "mark", "filter"), [
    ("events_now", "shop.events", None, None),
    ("events_1", "shop.events", "events_1", None),
    ("users_now", "crm.users", None, None),
    ("users_2", "crm.users", "users_2", None),
    ("users_eu", "crm.users", None, "region = 'eu'"),
    ("evo_now", "crm.evolving", None, None),
])
def test_duckdb_attaches_the_catalog_and_reads_row_for_row(
        duckdb_run: ClientRun, lake_fx: LakeFixture, name: str, table: str,
        mark: str | None, filter: str | None):
    expected = _expected(lake_fx, table, mark, None, filter)
    assert expected.num_rows > 0
    assert_same_rows(duckdb_run.table(name), expected, KEYS[table])


def test_duckdb_lists_the_tables(duckdb_run: ClientRun):
    assert duckdb_run.listing["tables"] == [
        ["lake", "crm", "evolving"], ["lake", "crm", "legacy"], ["lake", "crm", "users"],
        ["lake", "shop", "events"]]
    assert "merge" in duckdb_run.error("legacy").lower()


def test_the_client_scripts_exist():
    # A renamed script would make every test above fail with a confusing error.
    for script in ("pyiceberg_client.py", "duckdb_client.py", "spark_client.py"):
        assert (Path(__file__).parent / "clients" / script).is_file()
