"""A lake on S3 (moto) through the catalog: each load's ``config`` tells clients the endpoint,
region and path style, and the access key only when the operator asks for it; pyiceberg,
DuckDB and Spark 4.1 read it with that."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

import arrowlake as al
from arrowlake.iceberg_rest import CatalogSettings, RunningCatalog, s3_table_config
from tests import client_envs
from tests.conftest import s3_warehouse
from tests.iceberg_rest.conftest import (
    DUCKDB_ENV,
    EVENTS_SCHEMA,
    TOKEN,
    USERS_SCHEMA,
    _events,
    _users,
    assert_same_rows,
    run_client,
)

pytestmark = [pytest.mark.slow, pytest.mark.s3]

ICEBERG_VERSION = client_envs.ICEBERG_SPARK_RUNTIME.rsplit(":", 1)[1]


@pytest.fixture(scope="module")
def s3_lake(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[al.Lake, dict[str, Any]]]:
    warehouse, options = s3_warehouse(request)
    meta = tmp_path_factory.mktemp("s3-meta")
    lake = al.connect(f"sqlite:///{meta}/meta.db", warehouse=warehouse, storage_options=options)
    lake.create_namespace("shop")
    events = lake.create_table("shop.events", EVENTS_SCHEMA, partition_by=["region"])
    events.append(_events(0, 200))
    events.append(_events(200, 100))
    events.delete("region = 'eu' and id < 100")
    users = lake.create_table("shop.users", USERS_SCHEMA, primary_key=["id", "region"])
    users.upsert(_users(range(0, 300), 1))
    users.upsert(_users(range(150, 400), 2))
    users.delete("id >= 390")
    yield lake, options
    lake.close()


def _serve(lake: al.Lake, options: dict[str, Any], vend: bool) -> RunningCatalog:
    settings = CatalogSettings(table_config=s3_table_config(options, credentials=vend,
                                                            environ={}))
    return RunningCatalog(lake, port=0, tokens=[TOKEN], settings=settings, shutdown_timeout=5)


def test_the_load_config_names_the_endpoint_and_credentials_only_when_vended(s3_lake):
    lake, options = s3_lake
    for vend in (False, True):
        with _serve(lake, options, vend) as running:
            body = requests.get(running.url + "/v1/namespaces/shop/tables/users", timeout=60,
                                headers={"Authorization": f"Bearer {TOKEN}"}).json()
        config = body["config"]
        assert config["s3.endpoint"] == options["endpoint"]
        assert config["s3.path-style-access"] == "true"
        assert config["s3.region"] == options["region"]
        assert ("s3.access-key-id" in config) is vend
        assert ("s3.secret-access-key" in config) is vend
        assert body["metadata-location"].startswith("s3://")


@pytest.mark.parametrize("vend", [True, False], ids=["vended", "own-credentials"])
def test_pyiceberg_reads_an_s3_lake_row_for_row(s3_lake, vend, tmp_path):
    lake, options = s3_lake
    properties = {} if vend else {"s3.access-key-id": options["access_key_id"],
                                  "s3.secret-access-key": options["secret_access_key"]}
    queries = [{"name": "events", "table": "shop.events"},
               {"name": "users", "table": "shop.users"}]
    with _serve(lake, options, vend) as running:
        run = run_client("iceberg-clients", "pyiceberg_client.py",
                         {"uri": running.url, "token": TOKEN, "properties": properties,
                          "queries": queries}, tmp_path)
    assert_same_rows(run.table("events"), lake.table("shop.events").to_arrow(), ["id"])
    assert_same_rows(run.table("users"), lake.table("shop.users").to_arrow(),
                     ["id", "region"])


def test_duckdb_reads_an_s3_lake_with_vended_credentials(s3_lake, tmp_path):
    lake, options = s3_lake
    queries = [{"name": "events", "sql": "SELECT * FROM lake.shop.events"},
               {"name": "users", "sql": "SELECT * FROM lake.shop.users"}]
    with _serve(lake, options, True) as running:
        run = run_client(DUCKDB_ENV, "duckdb_client.py",
                         {"uri": running.url, "token": TOKEN, "queries": queries}, tmp_path)
    assert_same_rows(run.table("events"), lake.table("shop.events").to_arrow(), ["id"])
    assert_same_rows(run.table("users"), lake.table("shop.users").to_arrow(),
                     ["id", "region"])


def test_spark_reads_an_s3_lake_with_vended_credentials(s3_lake, tmp_path):
    # Iceberg's S3FileIO needs the AWS SDK, which Iceberg ships as its aws-bundle.
    lake, options = s3_lake
    package = (f"{client_envs.ICEBERG_SPARK_RUNTIME},"
               f"org.apache.iceberg:iceberg-aws-bundle:{ICEBERG_VERSION}")
    queries = [{"name": "events", "sql": "SELECT * FROM lake.shop.events"},
               {"name": "users", "sql": "SELECT * FROM lake.shop.users"}]
    with _serve(lake, options, True) as running:
        run = run_client("spark41", "spark_client.py",
                         {"uri": running.url, "token": TOKEN, "package": package,
                          "queries": queries}, tmp_path)
    assert_same_rows(run.table("events"), lake.table("shop.events").to_arrow(), ["id"])
    assert_same_rows(run.table("users"), lake.table("shop.users").to_arrow(),
                     ["id", "region"])
