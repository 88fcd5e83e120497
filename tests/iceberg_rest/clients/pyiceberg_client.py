"""Reads tables through the REST catalog with pyiceberg (run in the iceberg-clients env).

Usage: python pyiceberg_client.py PLAN.json. The plan names the catalog (uri, token, optional
properties), the namespaces to list, and queries {name, table, snapshot | tag}; each answer is
written to OUT/<name>.arrow, or the error to OUT/<name>.error.txt; listings to listing.json.
"""

import json
import sys
import traceback
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog.rest import RestCatalog


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    out = Path(plan["out"])
    catalog = RestCatalog("lake", uri=plan["uri"], token=plan["token"],
                          **plan.get("properties", {}))
    listing = {
        "namespaces": [list(ns) for ns in catalog.list_namespaces()],
        "tables": {ns: [list(ident) for ident in catalog.list_tables(ns)]
                   for ns in plan.get("namespaces", [])},
        "exists": {name: catalog.table_exists(name) for name in plan.get("exists", [])},
    }
    (out / "listing.json").write_text(json.dumps(listing))
    for query in plan["queries"]:
        try:
            table = catalog.load_table(query["table"])
            snapshot_id = query.get("snapshot")
            if query.get("tag"):
                snapshot_id = table.snapshot_by_name(query["tag"]).snapshot_id
            scan = table.scan(snapshot_id=snapshot_id,
                              row_filter=query.get("filter", "True"))
            result = scan.to_arrow()
            with pa.OSFile(str(out / f"{query['name']}.arrow"), "wb") as sink, \
                    pa.ipc.new_file(sink, result.schema) as writer:
                writer.write_table(result)
        except Exception as exc:
            (out / f"{query['name']}.error.txt").write_text(
                f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")


if __name__ == "__main__":
    main()
