"""One standalone Spark cluster (a master and two worker JVMs) and its driver process for the
whole run, and a lake on the session's PostgreSQL and S3 servers whose URL and storage options
carry secrets the tests look for where they must not be."""

from __future__ import annotations

import json
import os

import pytest

import arrowlake as al

pytest.importorskip("pyspark", reason="the spark extra is not installed")

#: Credentials only this lake uses (the servers take any), to find wherever they leak.
PG_PASSWORD = "pg-pass-7c1f9e"
S3_KEY_ID = "AKIACLUSTER7C1F9E"
S3_SECRET = "s3-secret-7c1f9e-d41d8cd9"
SECRETS = (PG_PASSWORD, S3_KEY_ID, S3_SECRET)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    from tests.cluster.harness import Cluster, Driver

    base = tmp_path_factory.mktemp("spark-cluster")
    nodes = driver = None
    try:
        nodes = Cluster(base)
        driver = Driver(nodes)  # while the workers start
        nodes.wait_for_workers(2)
        driver.wait_for_executors(2)
    except BaseException:
        for started in (driver, nodes):
            if started is not None:
                started.stop()
        raise  # a cluster that cannot start fails the tests: never a silent skip
    driver.nodes = nodes
    yield driver
    driver.stop()
    nodes.stop()


@pytest.fixture(scope="session")
def cluster_lake(pg_server, s3_server) -> dict:
    """Where the cluster's tests keep tables: PostgreSQL metastore, files on S3; as the jobs
    take it (``uri``, ``warehouse``, ``storage``, data source ``options``)."""
    uri = pg_server.create_database().replace(
        f"{pg_server.user}@", f"{pg_server.user}:{PG_PASSWORD}@")
    bucket = s3_server.create_bucket(f"cluster-{os.getpid()}")
    storage = {**s3_server.storage_options(), "access_key_id": S3_KEY_ID,
               "secret_access_key": S3_SECRET}
    warehouse = f"s3://{bucket}/warehouse"
    return {"uri": uri, "warehouse": warehouse, "storage": storage,
            "options": {"lake": uri, "warehouse": warehouse,
                        "storageOptions": json.dumps(storage)}}


@pytest.fixture
def pg_s3_lake(cluster_lake):
    lake = al.connect(cluster_lake["uri"], warehouse=cluster_lake["warehouse"],
                      storage_options=cluster_lake["storage"])
    yield lake
    lake.close()
