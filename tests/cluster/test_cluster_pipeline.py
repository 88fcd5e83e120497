"""A Spark Declarative Pipeline on the standalone cluster: one ``spark-pipelines run`` whose
Spark runs its executors on the cluster's workers, with an ``@dp.table(format="arrowlake")``
streaming table reading an arrowlake table of the PostgreSQL + S3 lake named by
``ARROWLAKE_LAKE`` / ``ARROWLAKE_WAREHOUSE`` / ``ARROWLAKE_STORAGE_OPTIONS``.

``spark-pipelines`` (PySpark 4.3) always runs its Python through Spark Connect: its launcher
(``org.apache.spark.deploy.SparkPipelines``) hands spark-submit ``--remote local`` unless
given ``--remote``. So it refuses ``--master`` and ``--conf spark.master=...`` ("Remote cannot
be specified with master and/or deploy mode"), and a spec's ``configuration: spark.master``
is overwritten by the Connect URL when PySpark starts its in-process Connect server
(``pyspark/sql/connect/session.py``, ``_start_connect_server``): the pipeline would run in
local mode. What does reach the cluster: ``--remote spark://host:port`` with the environment
variable ``SPARK_API_MODE=connect``, under which PySpark takes a remote URL that is not
``sc://`` as the master of the in-process Connect server it starts (without the variable the
URL is refused as a Connect URL, ``INVALID_CONNECT_URL``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
import pytest

from tests.cluster.harness import JAVA_OPTS, PYTHONPATH, SPARK_HOME
from tests.conftest import sorted_rows
from tests.services import one_spark_pipelines_run

#: Slow: spark-pipelines on the standalone cluster, over a minute.
pytestmark = pytest.mark.slow

SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.string()), ("amount", pa.float64())])
SPEC = """name: arrowlake-on-the-cluster
storage: {storage}
configuration:
  spark.sql.shuffle.partitions: "2"
  spark.sql.session.timeZone: UTC
libraries:
  - glob:
      include: transformations/**
"""
#: The pipeline: one streaming table (lands as the arrowlake table default.cluster_doubled).
FLOWS = '''
from pyspark import pipelines as dp
from pyspark.sql import functions as F


@dp.table(format="arrowlake")
def cluster_doubled():
    return (spark.readStream.format("arrowlake").load("c.pipeline_events")
            .select("id", "day", (F.col("amount") * 2).alias("amount")))
'''


def spark_pipelines() -> str:
    beside = Path(sys.executable).parent / "spark-pipelines"
    return str(beside) if beside.exists() else shutil.which("spark-pipelines") or \
        str(SPARK_HOME / "bin" / "spark-pipelines")


def project(base: Path) -> Path:
    (base / "transformations").mkdir(parents=True)
    (base / "transformations" / "flows.py").write_text(FLOWS)
    spec = base / "spark-pipeline.yml"
    spec.write_text(SPEC.format(storage=(base / "storage").as_uri()))
    return spec


def run_pipelines(spec: Path, spark_args: list[str], env: dict[str, str],
                  timeout: float = 300) -> subprocess.CompletedProcess:
    # Nothing of the test process's own choice of master or API mode.
    base = {k: v for k, v in os.environ.items()
            if k not in ("MASTER", "SPARK_REMOTE", "SPARK_API_MODE", "SPARK_CONNECT_MODE")}
    with one_spark_pipelines_run():
        return subprocess.run([spark_pipelines(), *spark_args, "run", "--spec", str(spec)],
                              cwd=spec.parent, env={**base, **env}, capture_output=True,
                              text=True, timeout=timeout)


def lake_env(cluster_lake: dict) -> dict[str, str]:
    """The default lake of the pipeline's processes, and the arrowlake under test."""
    return {"ARROWLAKE_LAKE": cluster_lake["uri"],
            "ARROWLAKE_WAREHOUSE": cluster_lake["warehouse"],
            "ARROWLAKE_STORAGE_OPTIONS": json.dumps(cluster_lake["storage"]),
            "PYTHONPATH": PYTHONPATH, "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_HOME": str(SPARK_HOME)}


def master_apps(nodes) -> list[dict]:
    """Every application the cluster's master knows (running or completed)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{nodes.ui_port}/json/", timeout=10) as resp:
        state = json.loads(resp.read())
    return [*state.get("activeapps", []), *state.get("completedapps", [])]


def test_spark_pipelines_refuses_a_master(tmp_path):
    """``--master`` (or ``--conf spark.master``) next to the ``--remote local`` the launcher
    adds: refused before any Spark starts (so no master needs to listen there); and
    ``--remote spark://...`` without ``SPARK_API_MODE=connect`` is taken as a Connect URL."""
    spec = project(tmp_path / "pipeline")
    env = {"PYTHONPATH": PYTHONPATH, "PYSPARK_PYTHON": sys.executable,
           "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1"}
    master = "spark://127.0.0.1:7077"
    for args, error in ((["--master", master], "Remote cannot be specified with master"),
                        (["--conf", f"spark.master={master}"],
                         "Remote cannot be specified with master"),
                        (["--remote", master], "INVALID_CONNECT_URL")):
        done = run_pipelines(spec, args, env, timeout=120)
        assert done.returncode != 0, args
        assert error in done.stdout + done.stderr, args


def test_a_declarative_pipeline_runs_on_the_cluster(cluster, cluster_lake, pg_s3_lake,
                                                    tmp_path):
    source = pg_s3_lake.create_table("c.pipeline_events", SCHEMA)
    rows = [{"id": i, "day": f"2026-11-0{1 + i % 3}", "amount": float(i)} for i in range(20)]
    source.append(pa.Table.from_pylist(rows[:12], schema=SCHEMA))
    source.append(pa.Table.from_pylist(rows[12:], schema=SCHEMA))
    name = f"arrowlake-pipeline-{os.getpid()}-{time.monotonic_ns()}"
    conf = {"spark.app.name": name, "spark.ui.enabled": "false",
            "spark.driver.memory": "512m", "spark.executor.memory": "512m",
            "spark.executor.cores": "1", "spark.cores.max": "2",
            "spark.driver.extraJavaOptions": JAVA_OPTS,
            "spark.executor.extraJavaOptions": JAVA_OPTS,
            "spark.executorEnv.PYTHONPATH": PYTHONPATH, "spark.pyspark.python": sys.executable}
    args = ["--remote", cluster.nodes.url]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    spec = project(tmp_path / "pipeline")
    done = run_pipelines(spec, args, {**lake_env(cluster_lake), "SPARK_API_MODE": "connect"})
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-8000:]}"

    # The dataset landed as default.<name> in the lake, every row of the source doubled.
    got = pg_s3_lake.table("default.cluster_doubled")
    assert sorted_rows(got.to_arrow(), "id") == [
        {**r, "amount": 2 * r["amount"]} for r in rows]
    # Its Spark was an application of the cluster's master, with executors on each worker
    # (the master may start another when one exits, as it did once on a loaded machine),
    # and they ran the pipeline's tasks.
    apps = [a for a in master_apps(cluster.nodes) if a["name"] == name]
    assert len(apps) == 1
    per_worker = [[p.read_text(errors="replace") for p in (work / apps[0]["id"]).glob("*/stderr")]
                  for work in cluster.nodes.work_dirs]
    assert len(per_worker) == 2 and all(per_worker), [len(logs) for logs in per_worker]
    assert any("Running task" in log for logs in per_worker for log in logs)
