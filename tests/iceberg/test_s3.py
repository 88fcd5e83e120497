"""A lake on S3 (the moto server): its published metadata names s3:// files, and pyiceberg and
DuckDB (with httpfs) read it there, row for row."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import arrowlake as al
from tests import client_envs
from tests.conftest import s3_warehouse
from tests.iceberg.helpers import ENGINES, Read, assert_same_rows, read_all

pytestmark = [pytest.mark.slow, pytest.mark.s3]

#: DuckDB reads S3 through httpfs, which the shared clients' environment lacks (the REST
#: catalog's tests build the same one).
HTTPFS_ENV = "iceberg-clients-httpfs"
client_envs.ENVIRONMENTS.setdefault(HTTPFS_ENV, [
    *client_envs.ENVIRONMENTS["iceberg-clients"],
    f"duckdb-extension-httpfs=={client_envs.DUCKDB_ICEBERG}",
])

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])


def _rows(ids: np.ndarray, tag: str) -> pa.Table:
    return pa.table({"id": ids, "name": [f"{tag}{i}" for i in ids],
                     "score": [float(i % 13) if i % 9 else None for i in ids]}, SCHEMA)


def test_published_metadata_on_s3_reads_row_exact(request, tmp_path):
    try:
        python = client_envs.client_python(HTTPFS_ENV)
    except client_envs.ClientEnvError as exc:
        pytest.skip(f"The clients' environment with httpfs could not be built: {exc}")
    warehouse, options = s3_warehouse(request)
    server = request.getfixturevalue("s3_server")
    lake = al.connect(f"sqlite:///{tmp_path}/meta.db", warehouse=warehouse,
                      storage_options=options)
    users = lake.create_table("crm.users", SCHEMA, primary_key=["id"], buckets=2,
                              deletion_vectors=True, properties={"compaction.mode": "off"})
    rng = np.random.default_rng(3)
    users.upsert(_rows(np.arange(10_000), "a"))
    users.upsert(_rows(rng.choice(12_000, 3_000, replace=False), "b"))
    users.delete("id >= 100 and id < 300")
    events = lake.create_table("shop.events", SCHEMA, partition_by=["name"])
    events.append(_rows(np.arange(50) % 5, "e"))
    locations = [users.iceberg_metadata_location(), events.iceberg_metadata_location()]
    assert all(loc.startswith("s3://") for loc in locations)
    storage = {"s3.endpoint": server.endpoint, "s3.region": server.region,
               "s3.access-key-id": server.access_key_id,
               "s3.secret-access-key": server.secret_access_key}
    secret = (f"CREATE SECRET s3 (TYPE s3, KEY_ID '{server.access_key_id}', "
              f"SECRET '{server.secret_access_key}', REGION '{server.region}', "
              f"ENDPOINT '{server.host}:{server.port}', URL_STYLE 'path', USE_SSL false)")
    reads = [Read(engine, loc) for loc in locations for engine in ENGINES]
    got = iter(read_all(python, reads, tmp_path, storage=storage, duckdb=[secret]))
    for table, keys in ((users, ["id"]), (events, ["id", "name"])):
        for engine in ENGINES:
            assert_same_rows(table.scan().to_arrow(), next(got), keys,
                             f"{engine} {table.name}")
    lake.close()
