"""Spark 4.1 with Iceberg's runtime reads the lake through the catalog, as the README shows.

``SELECT``, ``SHOW TABLES``, ``VERSION AS OF`` (a snapshot id or a tag) and ``TIMESTAMP AS OF``
answer row for row as ``table.scan()``; a merge-on-read table is refused with the reason; every
write Spark tries (INSERT, DELETE, CREATE, DROP) is refused and leaves the lake as it was. One
Spark session (PySpark 4.1.4 in its own environment) runs every query of this module.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from arrowlake.errors import NoIcebergView
from arrowlake.iceberg import publish
from tests import client_envs
from tests.iceberg_rest.conftest import (
    TOKEN,
    ClientRun,
    LakeFixture,
    assert_same_rows,
    run_client,
)

pytestmark = pytest.mark.slow

KEYS = {"shop.events": ["id"], "crm.users": ["id", "region"], "crm.evolving": ["id"]}


def _files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file() and p.suffix in (".parquet", ".avro")
            and "metadata" not in p.parts}


@pytest.fixture(scope="module")
def spark_run(lake_fx: LakeFixture, catalog_url: str,
              tmp_path_factory: pytest.TempPathFactory) -> tuple[ClientRun, dict[str, Any]]:
    marks, times = lake_fx.marks, lake_fx.times
    at = times["users_1"].astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    lake = lake_fx.lake
    before = {"tables": {ns: lake.tables(ns) for ns in lake.namespaces()},
              "snapshots": {t: lake.table(t).current_snapshot_id
                            for t in ("shop.events", "crm.users")},
              "files": _files(lake_fx.path)}
    queries = [
        ("namespaces", "SHOW NAMESPACES IN lake"),
        ("tables", "SHOW TABLES IN lake.crm"),
        ("events_now", "SELECT * FROM lake.shop.events"),
        ("events_1", f"SELECT * FROM lake.shop.events VERSION AS OF {marks['events_1']}"),
        ("events_filtered", "SELECT * FROM lake.shop.events WHERE region = 'us' "
                            "AND day = DATE'2026-11-02'"),
        ("users_now", "SELECT * FROM lake.crm.users"),
        ("users_1", f"SELECT * FROM lake.crm.users VERSION AS OF {marks['users_1']}"),
        ("users_tag", "SELECT * FROM lake.crm.users VERSION AS OF 'v2'"),
        ("users_at", f"SELECT * FROM lake.crm.users TIMESTAMP AS OF '{at}'"),
        ("users_tiers", "SELECT tier, count(*) AS n FROM lake.crm.users GROUP BY tier"),
        ("evo_now", "SELECT * FROM lake.crm.evolving"),
        ("evo_1", f"SELECT * FROM lake.crm.evolving VERSION AS OF {marks['evo_1']}"),
        ("legacy", "SELECT * FROM lake.crm.legacy"),
        ("insert", "INSERT INTO lake.shop.events SELECT * FROM lake.shop.events LIMIT 3"),
        ("delete", "DELETE FROM lake.crm.users WHERE id = 1"),
        ("create", "CREATE TABLE lake.crm.fresh (id BIGINT) USING iceberg"),
        ("drop", "DROP TABLE lake.crm.users"),
        ("after_writes", "SELECT count(*) AS n FROM lake.crm.users"),
        # A second catalog loading only referenced snapshots (snapshots=refs), which fetches
        # the others (snapshots=all) when time travel needs them.
        ("refs_now", "SELECT * FROM refs.crm.users"),
        ("refs_1", f"SELECT * FROM refs.crm.users VERSION AS OF {marks['users_1']}"),
    ]
    refs = "spark.sql.catalog.refs"
    plan = {"uri": catalog_url, "token": TOKEN, "package": client_envs.ICEBERG_SPARK_RUNTIME,
            "conf": {refs: "org.apache.iceberg.spark.SparkCatalog", f"{refs}.type": "rest",
                     f"{refs}.uri": catalog_url, f"{refs}.token": TOKEN,
                     f"{refs}.snapshot-loading-mode": "refs"},
            "queries": [{"name": n, "sql": q} for n, q in queries]}
    run = run_client("spark41", "spark_client.py", plan, tmp_path_factory.mktemp("spark"))
    return run, before


READS = [
    ("events_now", "shop.events", None, None, None),
    ("events_1", "shop.events", "events_1", None, None),
    ("events_filtered", "shop.events", None, None, "region = 'us' and day = '2026-11-02'"),
    ("users_now", "crm.users", None, None, None),
    ("users_1", "crm.users", "users_1", None, None),
    ("users_tag", "crm.users", None, "v2", None),
    ("users_at", "crm.users", "users_1", None, None),
    ("evo_now", "crm.evolving", None, None, None),
    ("evo_1", "crm.evolving", "evo_1", None, None),
    ("refs_now", "crm.users", None, None, None),
    ("refs_1", "crm.users", "users_1", None, None),
]


def check_reads(run: ClientRun, lake_fx: LakeFixture, name: str, table: str,
                mark: str | None, tag: str | None, filter: str | None) -> None:
    snapshot = lake_fx.marks[mark] if mark else None
    expected = lake_fx.lake.table(table).scan(filter, snapshot=snapshot, tag=tag).to_arrow()
    assert expected.num_rows > 0
    assert_same_rows(run.table(name), expected, KEYS[table])


def check_lists_and_aggregates(run: ClientRun, lake_fx: LakeFixture) -> None:
    assert run.table("namespaces").column(0).to_pylist() == ["crm", "empty_ns", "shop"]
    assert sorted(run.table("tables").column("tableName").to_pylist()) == [
        "evolving", "legacy", "users"]
    users = lake_fx.lake.table("crm.users").to_arrow()
    expected = users.group_by("tier").aggregate([("id", "count")]).rename_columns(["tier", "n"])
    assert_same_rows(run.table("users_tiers"),
                     expected.cast(pa.schema([("tier", pa.int32()), ("n", pa.int64())])),
                     ["tier"])


def check_merge_on_read_refused_with_the_reason(run: ClientRun, lake_fx: LakeFixture) -> None:
    with pytest.raises(NoIcebergView) as raised:
        publish(lake_fx.lake.table("crm.legacy"))
    assert str(raised.value) in run.error("legacy")


def check_write_refused(run: ClientRun, lake_fx: LakeFixture, before: dict[str, Any],
                        write: str) -> None:
    message = run.error(write)
    assert "read-only" in message and "format('arrowlake')" in message, message
    lake = lake_fx.lake
    assert {ns: lake.tables(ns) for ns in lake.namespaces()} == before["tables"]
    assert {t: lake.table(t).current_snapshot_id
            for t in ("shop.events", "crm.users")} == before["snapshots"]
    assert run.table("after_writes").column("n").to_pylist() == [
        lake.table("crm.users").count()]


@pytest.mark.timeout(900)
def test_spark_through_the_catalog(spark_run, lake_fx: LakeFixture):
    """Every check of the module against one Spark session's answers. One test, because under
    pytest-xdist every worker that ran a test of this module would start its own Spark."""
    run, before = spark_run
    checks: list[tuple[str, Callable[[], None]]] = [
        (f"read {case[0]}", functools.partial(check_reads, run, lake_fx, *case))
        for case in READS]
    checks += [
        ("SHOW and GROUP BY", functools.partial(check_lists_and_aggregates, run, lake_fx)),
        ("merge-on-read refused", functools.partial(
            check_merge_on_read_refused_with_the_reason, run, lake_fx)),
    ]
    checks += [(f"{write} refused", functools.partial(check_write_refused, run, lake_fx,
                                                      before, write))
               for write in ("insert", "delete", "create", "drop")]
    checks.append(("no data files left by the refused writes",
                   lambda: _check_no_files_left(lake_fx, before)))
    failures = []
    for what, check in checks:
        try:
            check()
        except AssertionError as exc:
            failures.append(f"{what}: {str(exc)[:2000]}")
    assert not failures, "\n\n".join(failures)


def _check_no_files_left(lake_fx: LakeFixture, before: dict[str, Any]) -> None:
    assert _files(lake_fx.path) == before["files"]
