"""Spark 4.1 with Iceberg's runtime (1.12) reads published metadata by path, row for row as
``table.scan()``: an append table at every snapshot (by id, timestamp and tag), and a
deletion-vector table after upserts and a delete, whose vectors Spark applies itself."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyarrow import ipc

from tests import client_envs
from tests.iceberg.helpers import assert_same_rows

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("spark_read.py")
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64()),
                    ("day", pa.date32())])


def _rows(ids: np.ndarray, tag: str) -> pa.Table:
    return pa.table({"id": ids, "name": [f"{tag}{i}" if i % 7 else None for i in ids],
                     "score": [float("nan") if i % 11 == 0 else i / 3 for i in ids],
                     "day": [date(2026, 11, 1) + timedelta(days=int(i % 3)) for i in ids]},
                    SCHEMA)


def _spark(requests: list[dict], tmp_path: Path) -> list:
    try:
        python = client_envs.client_python("spark41")
    except client_envs.ClientEnvError as exc:
        pytest.skip(f"The PySpark 4.1 environment could not be built: {exc}")
    for i, r in enumerate(requests):
        r["out"] = str(tmp_path / f"{i}.arrow")
    spec = tmp_path / "requests.json"
    spec.write_text(json.dumps({"package": client_envs.ICEBERG_SPARK_RUNTIME,
                                "requests": requests}))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(python), str(SCRIPT), str(spec)], capture_output=True,
                          text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    out = []
    for r in requests:
        error = Path(r["out"] + ".error")
        if error.exists():
            out.append(AssertionError(json.loads(error.read_text())["error"]))
        else:
            with ipc.open_file(r["out"]) as f:
                out.append(f.read_all())
    return out


def test_spark_reads_published_metadata_by_path(sqlite_lake, tmp_path):
    events = sqlite_lake.create_table("shop.events", SCHEMA, partition_by=["day"])
    events.append(_rows(np.arange(60), "a"))
    events.create_tag("first")
    events.append(_rows(np.arange(60, 90), "b"))
    events.delete("id < 10")
    history = events.history()
    users = sqlite_lake.create_table("crm.users", SCHEMA, primary_key=["id"], buckets=2,
                                     deletion_vectors=True,
                                     properties={"compaction.mode": "off"})
    rng = np.random.default_rng(5)
    users.upsert(_rows(np.arange(20_000), "u"))
    users.upsert(_rows(rng.choice(22_000, 5_000, replace=False), "v"))
    users.delete("id >= 500 and id < 900")
    e_loc, u_loc = events.iceberg_metadata_location(), users.iceberg_metadata_location()
    at = history[1]["committed_at"]
    requests = [{"metadata": e_loc}, {"metadata": u_loc},
                *({"metadata": e_loc, "snapshot_id": h["snapshot_id"]} for h in history),
                {"metadata": e_loc, "timestamp_ms": int(at.timestamp() * 1000)},
                {"metadata": e_loc, "ref": "first"},
                {"metadata": e_loc, "sql": "day = DATE'2026-11-02' AND id > 30"}]
    got = iter(_spark(requests, tmp_path))
    assert_same_rows(events.scan().to_arrow(), next(got), ["id"], "spark events")
    assert_same_rows(users.scan().to_arrow(), next(got), ["id"], "spark users")
    for h in history:
        assert_same_rows(events.scan(snapshot=h["snapshot_id"]).to_arrow(), next(got), ["id"],
                         f"spark snapshot {h['snapshot_id']}")
    assert_same_rows(events.scan(as_of=at).to_arrow(), next(got), ["id"], "spark as of")
    assert_same_rows(events.scan(tag="first").to_arrow(), next(got), ["id"], "spark tag")
    assert_same_rows(events.scan("day = '2026-11-02' and id > 30").to_arrow(), next(got),
                     ["id"], "spark filtered")
