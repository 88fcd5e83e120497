"""The commands of the ``arrowlake`` command line, one function each.

Every command takes the parsed arguments, an open lake and an :class:`Output`, and returns the
process exit code. Commands compute one JSON-friendly value and print it either as JSON or as
text for people, so both forms always carry the same information.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TextIO

import pyarrow as pa

from arrowlake import flight
from arrowlake.cli.formats import FileReader, detect_format, expand_paths, write_file
from arrowlake.cli.output import (
    MAX_CELL_WIDTH,
    format_fields,
    format_table,
    write_json,
)
from arrowlake.cli.progress import ProgressBar
from arrowlake.errors import TableNotFound, ValidationError
from arrowlake.lake import Lake
from arrowlake.schema import describe
from arrowlake.table.table import Table
from arrowlake.units import human_size, parse_duration_seconds


def parse_duration(text: str) -> timedelta:
    """A duration in the syntax of :mod:`arrowlake.units` (``7d``, ``12h``, ``30 min``, ``1w``,
    ``500 ms``, ``3600``, ``1h30m``) as a timedelta.

    >>> parse_duration("1h30m")
    datetime.timedelta(seconds=5400)
    """
    try:
        return timedelta(seconds=parse_duration_seconds(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    except OverflowError:
        raise argparse.ArgumentTypeError(f"{text!r} is too long a duration") from None


def split_list(text: str) -> list[str]:
    """``"a, b"`` as ``["a", "b"]``."""
    return [part.strip() for part in text.split(",") if part.strip()]


@dataclass
class Output:
    """Where a command prints, and how."""

    stdout: TextIO
    stderr: TextIO
    json: bool

    def emit(self, value: Any, text: str) -> None:
        """Print ``value`` as JSON, or ``text`` for people."""
        if self.json:
            write_json(value, self.stdout)
        elif text:
            self.stdout.write(text.rstrip("\n") + "\n")

    def progress_enabled(self, flag: bool | None) -> bool:
        """``--progress``/``--no-progress`` when given, else only when stderr is a terminal."""
        if flag is not None:
            return flag
        isatty = getattr(self.stderr, "isatty", None)
        return bool(isatty and isatty())


def _arrow_rows(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()


# -- tables ------------------------------------------------------------------------------------


def cmd_tables(args: argparse.Namespace, lake: Lake, out: Output) -> int:
    names = sorted(lake.tables(args.namespace))
    rows = [dict(zip(("namespace", "table"), n.split(".", 1), strict=True)) for n in names]
    text = format_table(rows, ["namespace", "table"]) if rows else "(no tables)"
    out.emit(names, text)
    return 0


# -- show --------------------------------------------------------------------------------------


def _snapshot_info(table: Table) -> dict[str, Any] | None:
    current = table.current_snapshot_id
    if current is None:
        return None
    for row in reversed(table.history()):
        if row["snapshot_id"] == current:
            return {k: row[k] for k in ("snapshot_id", "parent_id", "kind", "committed_at",
                                        "total_rows", "total_files")}
    return {"snapshot_id": current}


def _buckets(table: Table) -> int | None:
    # Table has no public ``buckets`` yet; the record carries it.
    value = getattr(table, "buckets", None)
    if value is None:
        value = table._record.buckets
    return int(value) if value else None


def cmd_show(args: argparse.Namespace, lake: Lake, out: Output) -> int:
    table = lake.table(args.table)
    schema = describe(table.schema)
    info: dict[str, Any] = {
        "name": table.name,
        "location": table.location,
        "schema": schema,
        "partition_by": table.partition_by,
        "primary_key": table.primary_key,
        "buckets": _buckets(table),
        "properties": table.properties,
        "current_snapshot": _snapshot_info(table),
    }
    lines = [format_fields([("table", info["name"]), ("location", info["location"])]), "",
             "schema:",
             format_table([{"id": f["id"], "name": f["name"], "type": f["type"],
                            "nullable": f["nullable"]} for f in schema],
                          ["id", "name", "type", "nullable"]), ""]
    layout = [("partition by", ", ".join(info["partition_by"]) or "(none)")]
    if info["primary_key"]:
        layout.append(("primary key", ", ".join(info["primary_key"])))
    if info["buckets"]:
        layout.append(("buckets", info["buckets"]))
    lines += [format_fields(layout), ""]
    lines.append("properties:" + ("" if info["properties"] else " (none)"))
    lines += [f"  {k} = {v}" for k, v in sorted(info["properties"].items())]
    lines.append("")
    snap = info["current_snapshot"]
    if snap is None:
        lines.append("snapshot: (none, the table is empty)")
    else:
        lines.append("snapshot:")
        lines += ["  " + line for line in format_fields([
            ("id", snap.get("snapshot_id")), ("kind", snap.get("kind")),
            ("committed at", snap.get("committed_at")), ("total rows", snap.get("total_rows")),
            ("total files", snap.get("total_files"))]).splitlines()]
    out.emit(info, "\n".join(lines))
    return 0


# -- snapshots and files -----------------------------------------------------------------------

_SNAPSHOT_TEXT_COLUMNS = ["snapshot_id", "parent_id", "kind", "committed_at", "added_files",
                          "removed_files", "added_rows", "removed_rows", "total_files",
                          "total_rows"]


def cmd_snapshots(args: argparse.Namespace, lake: Lake, out: Output) -> int:
    history = lake.table(args.table).history()
    text = format_table(history, _SNAPSHOT_TEXT_COLUMNS) if history else "(no snapshots)"
    out.emit(history, text)
    return 0


def cmd_files(args: argparse.Namespace, lake: Lake, out: Output) -> int:
    table = lake.table(args.table)
    files = table.files()
    names = set(files.column_names)
    rows = []
    for f in _arrow_rows(files.select([c for c in ("path", "partition", "bucket", "row_count",
                                                   "file_size", "added_snapshot")
                                       if c in names])):
        row = {"path": f["path"], "partition": f.get("partition"), "rows": f["row_count"],
               "size": f["file_size"], "added_snapshot": f["added_snapshot"]}
        if "bucket" in f:
            row["bucket"] = f["bucket"]
        rows.append(row)
    prefix = table.location.rstrip("/") + "/"
    shown = [{**r, "path": r["path"].removeprefix(prefix),
              "partition": ", ".join(f"{k}={v}" for k, v in (r["partition"] or {}).items()),
              "size": human_size(r["size"])} for r in rows]
    columns = ["path"] + (["partition"] if "partition" in names else []) + \
        (["bucket"] if "bucket" in names else []) + ["rows", "size"]
    text = (f"{format_table(shown, columns)}\n\n{len(rows)} files under {table.location}"
            if rows else "(no files)")
    out.emit(rows, text)
    return 0


# -- head --------------------------------------------------------------------------------------


def cmd_head(args: argparse.Namespace, lake: Lake, out: Output) -> int:
    if args.n < 0:
        raise ValidationError(f"-n must be 0 or more, got {args.n}")
    table = lake.table(args.table)
    scan = table.scan(filter=args.filter, columns=args.columns, limit=args.n)
    data = scan.to_arrow()
    if data.num_rows > args.n:  # a limit is a hint to some readers; never print more
        data = data.slice(0, args.n)
    rows = _arrow_rows(data)
    text = format_table(rows, scan.schema.names, max_width=MAX_CELL_WIDTH) if rows else "(no rows)"
    out.emit(rows, text)
    return 0


# -- import ------------------------------------------------------------------------------------


def _create_schema(schema: pa.Schema) -> pa.Schema:
    """A file's schema as a new table's: no file metadata, all-empty columns as strings."""
    fields = [pa.field(f.name, pa.string()) if pa.types.is_null(f.type) else f for f in schema]
    return pa.schema(fields)


def cmd_import(args: argparse.Namespace, lake: Lake, out: Output) -> int:
    paths = expand_paths(args.files, args.format)
    formats = [detect_format(p, args.format) for p in paths]
    partition_by = split_list(args.partition_by) if args.partition_by else []
    created = False
    try:
        table: Table | None = lake.table(args.table)
    except TableNotFound as exc:
        if not args.create:
            raise TableNotFound(f"{exc} (pass --create to create it from the first file's "
                                "schema)") from None
        table = None
    if table is not None and partition_by and partition_by != table.partition_by:
        raise ValidationError(
            f"Table {table.name} exists, partitioned by {table.partition_by or 'nothing'}; "
            "--partition-by only applies when --create creates the table")

    hint = table.schema if table is not None else None
    first = FileReader(paths[0], formats[0], hint=hint, delimiter=args.delimiter)
    try:
        if table is None:
            table = lake.create_table(args.table, _create_schema(first.schema),
                                      partition_by=partition_by)
            created = True
        target: Table = table
        total = sum(os.path.getsize(p) for p in paths)
        counts = {"rows": 0}
        bar = ProgressBar(out.stderr, total, label=f"importing into {target.name}",
                          enabled=out.progress_enabled(args.progress))

        def batches() -> Iterator[pa.RecordBatch]:
            done = 0
            for i, (path, fmt) in enumerate(zip(paths, formats, strict=True)):
                reader = first if i == 0 else FileReader(path, fmt, hint=target.schema,
                                                         delimiter=args.delimiter)
                with reader:
                    for batch in reader:
                        counts["rows"] += batch.num_rows
                        bar.set(done + reader.position())
                        yield batch
                done += reader.size
                bar.set(done)

        with bar:
            stream = batches()
            head = next(stream, None)
            result = None if head is None else target.append(itertools.chain([head], stream))
    except BaseException:
        first.close()
        if created:
            lake.drop_table(args.table, purge=True)
        raise
    value = {
        "table": target.name,
        "created": created,
        "files": paths,
        "rows": counts["rows"],
        "snapshot_id": result.snapshot_id if result else None,
        "data_files": result.added_files if result else 0,
    }
    text = (f"{'Created' if created else 'Imported into'} {target.name}: {counts['rows']:,} rows "
            f"from {len(paths)} file{'s' if len(paths) != 1 else ''}")
    text += (f" (snapshot {value['snapshot_id']}, {value['data_files']} data files)"
             if value["snapshot_id"] is not None else " (nothing to commit)")
    out.emit(value, text)
    return 0


# -- export ------------------------------------------------------------------------------------


def cmd_export(args: argparse.Namespace, lake: Lake, out: Output) -> int:
    fmt = detect_format(args.file, args.format)
    table = lake.table(args.table)
    scan = table.scan(filter=args.filter, columns=args.columns)
    enabled = out.progress_enabled(args.progress)
    total = scan.count() if enabled else None
    bar = ProgressBar(out.stderr, total, label=f"exporting {table.name}", unit="rows",
                      enabled=enabled)

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in scan.to_batches():
            bar.advance(batch.num_rows)
            yield batch

    with bar:
        rows = write_file(args.file, fmt, scan.schema, batches())
    value = {"table": table.name, "file": args.file, "format": fmt, "rows": rows,
             "snapshot_id": scan.snapshot_id}
    out.emit(value, f"Exported {rows:,} rows of {table.name} to {args.file} ({fmt})")
    return 0


# -- maintenance -------------------------------------------------------------------------------


# expire, orphans, compact, status and maintain: see arrowlake.cli.maintain


def stdout_is_closed_pipe() -> None:
    """After a broken pipe (``arrowlake head t | head -1``), stop Python complaining at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


# -- serve -------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace, lake: Lake, out: Output) -> int:
    """Serve the lake over Arrow Flight until SIGTERM/SIGINT; prints the location first."""
    tokens = flight.read_tokens(args.token_file) if args.token_file else None
    flight.serve(lake, args.host, args.port, tokens=tokens, tls_cert=args.tls_cert,
                 tls_key=args.tls_key, out=out.stdout,
                 shutdown_timeout=args.shutdown_timeout.total_seconds())
    return 0
