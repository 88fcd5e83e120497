"""``arrowlake iceberg``: publish tables' Iceberg v3 metadata and print where it is.

    arrowlake --lake ./lake iceberg crm.users
    arrowlake --lake ./lake iceberg crm.users --snapshot 42
    # duckdb: SELECT * FROM iceberg_scan('<that path>')

Only what is not published yet is written (see :mod:`arrowlake.iceberg`); a table without an
Iceberg view is an error saying why.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from arrowlake.cli.commands import Output
from arrowlake.cli.output import format_table
from arrowlake.iceberg import publish
from arrowlake.lake import Lake

Command = Callable[[argparse.Namespace, Lake, Output], int]


def add_parser(add: Callable[[str, Command, str], argparse.ArgumentParser]) -> None:
    p = add("iceberg", cmd_iceberg,
            "publish tables' Iceberg v3 metadata (what is not published yet) and print where "
            "it is: Spark, Trino, DuckDB and pyiceberg read a table from that file")
    p.add_argument("tables", nargs="+", metavar="TABLE")
    p.add_argument("--snapshot", type=int, metavar="ID",
                   help="as of this snapshot (default: the current one)")


def cmd_iceberg(args: argparse.Namespace, lake: Lake, out: Output) -> int:
    rows: list[dict[str, Any]] = []
    for name in args.tables:
        table = lake.table(name)
        found = publish(table, args.snapshot)
        rows.append({"table": table.name, "snapshot_id": found.snapshot_id,
                     "metadata_location": found.metadata_location})
    if len(rows) == 1:
        out.emit(rows[0], str(rows[0]["metadata_location"]))
    else:
        out.emit(rows, format_table(rows, ["table", "snapshot_id", "metadata_location"]))
    return 0
