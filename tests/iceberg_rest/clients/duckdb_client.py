"""Reads tables through the REST catalog with DuckDB's iceberg extension (ATTACH).

Usage: python duckdb_client.py PLAN.json. Queries are {name, sql}; SQL names tables as
lake.<namespace>.<table>. Answers go to OUT/<name>.arrow or OUT/<name>.error.txt; the tables
DuckDB lists to listing.json.
"""

import glob
import json
import site
import sys
import traceback
from pathlib import Path

import duckdb
import pyarrow as pa


def extension(name: str) -> str:
    for root in site.getsitepackages():
        found = glob.glob(f"{root}/duckdb_extension_{name}/extensions/*/{name}.duckdb_extension")
        if found:
            return found[0]
    raise SystemExit(f"duckdb-extension-{name} is not installed")


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    out = Path(plan["out"])
    con = duckdb.connect()
    for name in ("httpfs", "avro", "iceberg"):
        con.execute(f"LOAD '{extension(name)}'")
    con.execute(f"CREATE SECRET lake_token (TYPE iceberg, TOKEN '{plan['token']}')")
    con.execute(f"ATTACH '{plan.get('warehouse', 'arrowlake')}' AS lake "
                f"(TYPE iceberg, ENDPOINT '{plan['uri']}', SECRET lake_token)")
    tables = con.execute("SELECT database, schema, name FROM (SHOW ALL TABLES) "
                         "WHERE database = 'lake' ORDER BY 2, 3").fetchall()
    (out / "listing.json").write_text(json.dumps({"tables": [list(t) for t in tables]}))
    for query in plan["queries"]:
        try:
            result = con.execute(query["sql"]).fetch_arrow_table()
            with pa.OSFile(str(out / f"{query['name']}.arrow"), "wb") as sink, \
                    pa.ipc.new_file(sink, result.schema) as writer:
                writer.write_table(result)
        except Exception as exc:
            (out / f"{query['name']}.error.txt").write_text(
                f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")


if __name__ == "__main__":
    main()
