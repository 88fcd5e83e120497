"""What an executor's Python worker imports to read a split.

The driver side is planned here exactly as PySpark plans it (``write_read_func_and_partitions``
pickles the read function with the reader and the source, then the partitions); a fresh Python
process then does what a worker forked by PySpark's daemon does: unpickles both, reads the
partition's Arrow batches. Its ``sys.modules`` is the check: no JVM, no timing, nothing to flake.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import arrowlake as al

pytest.importorskip("pyspark")

from pyspark.serializers import CPickleSerializer, read_int
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.worker.plan_data_source_read import (
    write_read_func_and_partitions,
)

from arrowlake.spark.stream import ArrowlakeDataSource

#: What a worker reading splits must never import (the driver's metastore, other engines).
NEVER = ("sqlalchemy", "polars", "duckdb", "torch", "dask")

SRC = str(Path(al.__file__).resolve().parent.parent)

#: The worker: PySpark's daemon has imported pyspark.worker before it forks one; the partition
#: arrives as an Arrow stream of one binary value, as the JVM sends it.
WORKER = """
import importlib.abc, json, sys
class NoPandas(importlib.abc.MetaPathFinder):  # as if pandas were not installed
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] == "pandas":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
if sys.argv[1] == "no-pandas":
    sys.meta_path.insert(0, NoPandas())
import pyspark.worker
from pyspark.worker_util import pickleSer
import pyarrow as pa
rows = []
for prefix in sys.argv[2:]:
    with open(prefix + ".command", "rb") as f:
        read, _ = pickleSer.loads(f.read())
    with pa.ipc.open_stream(prefix + ".partition") as stream:
        rows.append(sum(b.num_rows for b in read(iter(list(stream)))))
print(json.dumps({"rows": rows, "modules": sorted(sys.modules)}))
"""


def plan_read(lake_path: Path, table: str, tmp_path: Path, stream: bool = False,
              **options: str) -> Path:
    """Plan a read of ``table`` as the driver's planning worker does; the first partition and
    the pickled read function land in files under ``tmp_path`` (their common prefix)."""
    source = ArrowlakeDataSource(CaseInsensitiveDict(
        {"lake": str(lake_path), "path": table, **options}))
    schema = source.schema()
    out = io.BytesIO()
    reader = source.streamReader(schema) if stream else source.reader(schema)
    write_read_func_and_partitions(out, reader=reader, data_source=source, schema=schema,
                                   max_arrow_batch_size=10_000, binary_as_bytes=True)
    planned = io.BytesIO(out.getvalue())
    command = planned.read(read_int(planned))
    if stream:
        start = reader.initialOffset()
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        partition = CPickleSerializer().dumps(reader.partitions(start, end)[0])
    else:
        assert read_int(planned) >= 1
        partition = planned.read(read_int(planned))
    prefix = tmp_path / f"{table.replace('.', '_')}_{'stream' if stream else 'batch'}"
    prefix.with_suffix(".command").write_bytes(command)
    batch = pa.record_batch({"partition": pa.array([partition], pa.binary())})
    with pa.ipc.new_stream(prefix.with_suffix(".partition"), batch.schema) as writer:
        writer.write_batch(batch)
    return prefix


def run_worker(prefixes: list[Path], pandas: bool = True) -> dict:
    """A fresh worker reading each planned partition in turn: rows read, modules imported."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", WORKER, "pandas" if pandas else "no-pandas",
         *map(str, prefixes)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def imports(modules: list[str], roots: tuple[str, ...]) -> list[str]:
    return sorted({m.partition(".")[0] for m in modules} & set(roots))


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("worker-startup")
    lake = al.connect(root / "lake")
    schema = pa.schema([("id", pa.int64()), ("day", pa.string()), ("amount", pa.float64())])
    log = lake.create_table("shop.log", schema, partition_by=["day"])
    log.append(pa.table({"id": range(100), "day": ["d1", "d2"] * 50,
                         "amount": [float(i) for i in range(100)]}, schema))
    users = lake.create_table("shop.users", schema, primary_key=["id"], buckets=1,
                              deletion_vectors=False)
    users.upsert(pa.table({"id": range(100), "day": ["d1"] * 100,
                           "amount": [1.0] * 100}, schema))
    users.upsert(pa.table({"id": range(50), "day": ["d2"] * 50, "amount": [2.0] * 50},
                          schema))
    return {
        "append, filter option": plan_read(root / "lake", "shop.log", root,
                                           filter="day = 'd1' and amount >= 10"),
        "primary key, merged on read": plan_read(root / "lake", "shop.users", root),
        "stream": plan_read(root / "lake", "shop.users", root, stream=True,
                            includeRowKind="true"),
    }


EXPECTED_ROWS = {"append, filter option": 45, "primary key, merged on read": 100,
                 "stream": 100}


def test_a_worker_reads_splits_without_the_metastore_or_other_engines(planned):
    found = run_worker([planned[case] for case in EXPECTED_ROWS])
    assert found["rows"] == list(EXPECTED_ROWS.values())
    assert imports(found["modules"], NEVER) == []
    assert "arrowlake.metastore" not in found["modules"]
    assert "arrowlake.lake" not in found["modules"]
    probe = subprocess.run([sys.executable, "-c", "import sys, pyarrow.dataset; "
                            "print('pandas' in sys.modules)"],
                           capture_output=True, text=True, check=True)
    if probe.stdout.strip() == "False":  # see the next test
        assert imports(found["modules"], ("pandas",)) == []


def test_a_worker_reads_splits_without_pandas(planned):
    """pyarrow 26 imports pandas when ``pyarrow.dataset`` (the split reader's engine) is
    imported: its module init calls ``pa.scalar``, which probes for pandas. A worker never
    needs pandas, though: with pandas unimportable it reads the same rows. (Should pyarrow
    stop importing it, the test above requires that the worker does not either.)"""
    found = run_worker([planned[case] for case in EXPECTED_ROWS], pandas=False)
    assert found["rows"] == list(EXPECTED_ROWS.values())
    assert imports(found["modules"], ("pandas",)) == []


def test_the_registration_module_and_the_package_import_nothing_of_the_driver():
    code = ("import sys, arrowlake, pyspark_arrowlake; "
            "print(' '.join(sorted(sys.modules)))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, check=True)
    modules = done.stdout.split()
    assert imports(modules, NEVER) == []
    assert "arrowlake.metastore" not in modules
