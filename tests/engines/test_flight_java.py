"""The Java example (examples/java, Arrow Java 19) against ``arrowlake serve``: built with
Maven (offline once ~/.m2 holds its dependencies), run with and without the JVM flag that
Arrow Java needs for puts on Java 17.

Slow: the build takes about 30 s with a warm Maven cache (the first one downloads the
dependencies from Maven Central), the run about 5 s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import arrowlake as al
from tests.engines.conftest import fill_append_table
from tests.engines.test_flight import TOKEN, Server

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "java"
ADD_OPENS = "--add-opens=java.base/java.nio=ALL-UNNAMED"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("mvn") is None or shutil.which("java") is None,
                       reason="needs Java 17+ and Maven"),
]


@pytest.fixture(scope="module")
def example_jar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example's jar, built in a copy of its folder (the checkout stays clean)."""
    folder = tmp_path_factory.mktemp("java") / "example"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("target"))
    build = ["mvn", "-q", "-B", "package"]
    done = subprocess.run([*build, "-o"], cwd=folder, capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:  # the first build: Maven fetches what ~/.m2 lacks
        done = subprocess.run(build, cwd=folder, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return folder / "target" / "arrowlake-flight-example.jar"


@pytest.fixture(scope="module")
def java_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Server]]:
    lake_dir = tmp_path_factory.mktemp("java_lake") / "lake"
    with al.connect(lake_dir) as lake:
        fill_append_table(lake)
        # what the Java program puts: nullable fields, no field ids
        lake.create_table("people", pa.schema([("id", pa.int64()), ("name", pa.string())]))
    tokens = lake_dir.parent / "tokens.txt"
    tokens.write_text(f"{TOKEN}\n")
    server = Server(lake_dir, "--token-file", str(tokens))
    yield lake_dir, server
    assert server.stop() == 0


def _run(jar: Path, server: Server, *jvm: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["java", *jvm, "-jar", str(jar), server.location, "shop.events", "x >= 100", "people"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "ARROWLAKE_TOKEN": TOKEN})


def test_the_java_example_reads_puts_and_sees_the_error_codes(example_jar, java_served):
    lake_dir, server = java_served
    done = _run(example_jar, server, ADD_OPENS)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    with al.connect(lake_dir) as lake:
        expected = lake.table("shop.events").scan(filter="x >= 100", columns=["id"]).to_arrow()
    read = dict(part.split("=") for part in lines[0].removeprefix("read ").split())
    assert int(read["rows"]) == expected.num_rows > 0
    assert int(read["id_sum"]) == int(np.sum(expected["id"].to_numpy()))
    assert int(read["endpoints"]) >= 8  # read on 4 threads
    put = json.loads(lines[1].removeprefix("put "))
    retry = json.loads(lines[2].removeprefix("retry "))
    assert (put["rows"], put["duplicate"], put["table"]) == (3, False, "default.people")
    assert (retry["rows"], retry["duplicate"]) == (0, True)
    assert retry["snapshot_id"] == put["snapshot_id"]
    errors = {line.split()[1]: line.split(maxsplit=4)[2:] for line in lines[3:]}
    assert errors["missing-table"][:2] == ["NOT_FOUND", "TableNotFound"]
    assert errors["missing-table"][2].startswith("TableNotFound: Table 'shop.no_such_table'")
    assert errors["bad-filter"][:2] == ["INVALID_ARGUMENT", "FilterSyntaxError"]
    assert errors["unknown-column"][:2] == ["INVALID_ARGUMENT", "ColumnNotFound"]  # get_schema
    assert errors["wrong-schema"][:2] == ["INVALID_ARGUMENT", "SchemaMismatch"]
    assert "Traceback" not in done.stdout  # the program prints the message up to ". Detail: "
    with al.connect(lake_dir) as lake:
        people = lake.table("people").to_arrow().sort_by("id")
    assert people.to_pydict() == {"id": [1, 2, 3], "name": ["ada", "grace", "edsger"]}

    # Without the flag (the README says so), Java 17 reads but cannot put.
    done = _run(example_jar, server)
    assert done.returncode != 0
    assert done.stdout.startswith("read endpoints=")
    assert "CANCELLED: Failed to stream message" in done.stderr
    with al.connect(lake_dir) as lake:
        assert lake.table("people").count() == 3
