"""Read published Iceberg metadata with pyiceberg and DuckDB, in their own environment.

Run by the tests with the ``iceberg-clients`` environment's Python (tests/client_envs.py),
where arrowlake is not installed: ``python client_read.py REQUESTS.json``. Each request names
an engine, a metadata file, optionally a snapshot (id, timestamp or ref name) and a filter,
and where to write the rows read (Arrow IPC), or the error, as ``{"error": ...}`` in
``<out>.error``. ``"engine": "manifests"`` writes, as JSON, the manifests each snapshot's
manifest list names, with their entries (as pyiceberg reads them). ``"storage"`` holds
pyiceberg's file IO properties, ``"duckdb"`` statements DuckDB runs first (S3 secrets).
"""

from __future__ import annotations

import glob
import json
import os
import sys
import traceback
from datetime import UTC, datetime

import pyarrow as pa
from pyarrow import ipc


def duckdb_connection(statements: list[str]):
    import importlib

    import duckdb

    con = duckdb.connect()
    # The extensions come from PyPI (duckdb-extension-*), not from DuckDB's server: loaded
    # by their path. httpfs (for S3) only where the environment has it.
    for name in ("avro", "iceberg", "httpfs"):
        try:
            module = importlib.import_module(f"duckdb_extension_{name}")
        except ImportError:
            continue
        folder = os.path.dirname(module.__file__)
        (path,) = glob.glob(os.path.join(folder, "extensions", "*", "*.duckdb_extension"))
        con.execute(f"LOAD '{path}'")
    for statement in statements:  # e.g. CREATE SECRET for S3
        con.execute(statement)
    return con


def read_duckdb(con, request: dict) -> pa.Table:
    options = ""
    if request.get("snapshot_id") is not None:
        options = f", snapshot_from_id => {int(request['snapshot_id'])}"
    elif request.get("timestamp_ms") is not None:
        at = datetime.fromtimestamp(request["timestamp_ms"] / 1000, UTC).replace(tzinfo=None)
        options = f", snapshot_from_timestamp => TIMESTAMP '{at.isoformat(sep=' ')}'"
    where = f" WHERE {request['sql']}" if request.get("sql") else ""
    query = f"SELECT * FROM iceberg_scan('{request['metadata']}'{options}){where}"
    return con.execute(query).fetch_arrow_table()


def pyiceberg_table(request: dict, storage: dict[str, str]):
    from pyiceberg.table import StaticTable

    return StaticTable.from_metadata(request["metadata"], properties=storage)


def read_pyiceberg(request: dict, storage: dict[str, str]) -> pa.Table:
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.expressions.parser import parse

    table = pyiceberg_table(request, storage)
    snapshot_id = request.get("snapshot_id")
    if request.get("timestamp_ms") is not None:
        found = table.snapshot_as_of_timestamp(request["timestamp_ms"])
        if found is None:
            raise LookupError(f"no snapshot as of {request['timestamp_ms']}")
        snapshot_id = found.snapshot_id
    if request.get("ref") is not None:
        found = table.snapshot_by_name(request["ref"])
        if found is None:
            raise LookupError(f"no ref {request['ref']}")
        snapshot_id = found.snapshot_id
    row_filter = parse(request["pyiceberg_filter"]) if request.get("pyiceberg_filter") \
        else AlwaysTrue()
    return table.scan(row_filter=row_filter, snapshot_id=snapshot_id).to_arrow()


def manifests(request: dict, storage: dict[str, str], con) -> dict:
    """The manifests of every snapshot as pyiceberg lists them; v3 fields pyiceberg 0.12 does
    not read (``first_row_id``) from DuckDB's Avro reader."""
    table = pyiceberg_table(request, storage)
    out = {}
    for snapshot in table.metadata.snapshots:
        listed = []
        for m in snapshot.manifests(table.io):
            row_ids = dict(con.execute(
                "SELECT data_file.file_path, data_file.first_row_id "
                f"FROM read_avro('{m.manifest_path}')").fetchall())
            entries = [{"status": int(e.status), "path": e.data_file.file_path,
                        "content": int(e.data_file.content),
                        "format": str(e.data_file.file_format),
                        "records": e.data_file.record_count,
                        "first_row_id": row_ids[e.data_file.file_path]}
                       for e in m.fetch_manifest_entry(table.io, discard_deleted=False)]
            listed.append({"path": m.manifest_path, "content": int(m.content),
                           "added_snapshot": m.added_snapshot_id, "entries": entries})
        out[str(snapshot.snapshot_id)] = listed
    return out


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    storage = spec.get("storage", {})
    con = None
    for request in spec["requests"]:
        out = request["out"]
        try:
            if request["engine"] in ("manifests", "duckdb") and con is None:
                con = duckdb_connection(spec.get("duckdb", []))
            if request["engine"] == "manifests":
                with open(out, "w") as f:
                    json.dump(manifests(request, storage, con), f)
                continue
            if request["engine"] == "duckdb":
                rows = read_duckdb(con, request)
            else:
                rows = read_pyiceberg(request, storage)
            with ipc.new_file(out, rows.schema) as writer:
                writer.write_table(rows)
        except Exception as exc:  # reported to the test, which decides
            with open(out + ".error", "w") as f:
                json.dump({"error": f"{type(exc).__name__}: {exc}",
                           "trace": traceback.format_exc()}, f)


if __name__ == "__main__":
    main()
