"""The maintenance commands: ``maintain`` (the service), ``status`` (tables' health),
``compact``, ``expire`` and ``orphans`` (one table, with a progress bar on a terminal)."""

from __future__ import annotations

import argparse
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from arrowlake.cli.commands import Output, parse_duration
from arrowlake.cli.output import dumps, format_table
from arrowlake.cli.progress import ProgressBar
from arrowlake.lake import Lake
from arrowlake.maintenance import Action
from arrowlake.table.maintenance import compaction, vector_compaction
from arrowlake.table.maintenance.compaction import CompactionResult
from arrowlake.table.maintenance.health import TableHealth
from arrowlake.table.maintenance.housekeeping import expire_snapshots, remove_orphan_files
from arrowlake.table.options.primary_key import require_primary_key
from arrowlake.table.table import Table
from arrowlake.units import human_size

Command = Callable[[argparse.Namespace, Lake, Output], int]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``50M``, ``1.5G``, ``200KiB`` or a number of bytes."""
    match = _SIZE.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: use a positive number of bytes, optionally with a unit "
            "(K, M, G, T), like 50M")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def add_parsers(add: Callable[[str, Command, str], argparse.ArgumentParser]) -> None:
    p = add("maintain", cmd_maintain,
            "look after the lake's tables: compact deferred tables, expire snapshots and "
            "remove orphan files by each table's properties; woken by commits, one line per "
            "action, until SIGTERM or Ctrl-C (which let the action in progress finish)")
    p.add_argument("tables", nargs="*", metavar="TABLE",
                   help="only these tables (default: every table, those created later too)")
    p.add_argument("--once", action="store_true",
                   help="look after every table once and exit (for cron)")
    p.add_argument("--max-concurrent", type=_positive, default=1, metavar="N",
                   help="work on at most N tables at once (default: 1)")
    p.add_argument("--bytes-per-second", type=parse_size, metavar="SIZE",
                   help="compaction reads and writes at most this much per second on average, "
                        "e.g. 50M (default: no limit)")
    p.add_argument("--interval", type=parse_duration, default=parse_duration("1m"),
                   metavar="DURATION",
                   help="expire a table's snapshots at most this often (default: 1m)")
    p.add_argument("--orphans-every", type=parse_duration, default=parse_duration("1h"),
                   metavar="DURATION",
                   help="look for a table's orphan files at most this often (default: 1h)")

    p = add("status", cmd_status,
            "per table: files, runs per bucket, deleted fraction, small files, snapshots, "
            "consumers' lag, the last maintenance, and whether it has an Iceberg view (and "
            "why not)")
    p.add_argument("tables", nargs="*", metavar="TABLE", help="only these tables")

    p = add("compact", cmd_compact,
            "compact a primary-key table's buckets (one commit per chunk of buckets)")
    p.add_argument("table", metavar="TABLE")
    p.add_argument("--full", action="store_true",
                   help="merge every bucket's runs into one (default: the usual picking)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar on stderr (default: when stderr is a terminal)")


# -- maintain ---------------------------------------------------------------------------------


def cmd_maintain(args: argparse.Namespace, lake: Lake, out: Output) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}

    def show(action: Action) -> None:
        text = dumps(action.to_dict()) if out.json else action.line()
        out.stdout.write(text + "\n")
        out.stdout.flush()

    try:
        lake.maintain(args.tables or None, once=args.once, max_concurrent=args.max_concurrent,
                      bytes_per_second=args.bytes_per_second,
                      interval=args.interval.total_seconds(),
                      orphans_every=args.orphans_every.total_seconds(), on_action=show,
                      stop=stop)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0


# -- status -----------------------------------------------------------------------------------


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _status_row(health: TableHealth) -> dict[str, Any]:
    last = health.last_maintenance
    lag = max((c.lag_seconds for c in health.consumers), default=None)
    return {
        "table": health.table,
        "mode": health.compaction_mode or "-",
        "files": health.files,
        "size": human_size(health.bytes),
        "runs max/mean": f"{health.runs_max}/{health.runs_mean:.1f}",
        "deleted": "-" if health.deleted_fraction is None else f"{health.deleted_fraction:.0%}",
        "small": health.small_files,
        "snapshots": health.snapshots,
        "oldest": _ago(health.oldest_snapshot_age_seconds),
        "consumers": len(health.consumers),
        "max lag": _ago(lag),
        "last maintenance": "-" if last is None else
        f"{last.action} {_ago(time.time() - last.at.timestamp())} ago",
        "iceberg": _iceberg_cell(health),
    }


def _iceberg_cell(health: TableHealth) -> str:
    """Whether the table has an Iceberg view and what of it is published: ``current``, ``at
    N`` (an older snapshot), ``on demand`` (nothing yet), ``no`` (the reason is printed below
    the table)."""
    status = health.iceberg
    if status is None:
        return "-"
    if not status.view:
        return "no"
    if status.published_snapshot is None and not status.current:
        return "on demand"
    return "current" if status.current else f"at {status.published_snapshot}"


def cmd_status(args: argparse.Namespace, lake: Lake, out: Output) -> int:
    names = args.tables or sorted(lake.tables())
    healths = [lake.table(name).health() for name in names]
    rows = [_status_row(h) for h in healths]
    text = format_table(rows, list(rows[0])) if rows else "(no tables)"
    reasons = [f"{h.table}: {h.iceberg.reason}" for h in healths
               if h.iceberg is not None and h.iceberg.reason]
    if reasons:
        text += "\n\nNo Iceberg view:\n" + "\n".join(reasons)
    out.emit([h.to_dict() for h in healths], text)
    return 0


# -- compact, expire, orphans -------------------------------------------------------------------


def _bucket_chunks(table: Table, limit: int) -> Iterator[tuple[list[int], int]]:
    """The table's bucket numbers in chunks of about ``limit`` bytes of live files, with each
    chunk's bytes."""
    rec = table._record
    files = table._metastore.live_files(rec.table_id, table.current_snapshot_id)
    by_bucket = files.group_by("bucket").aggregate([("file_size", "sum")])
    sizes = dict(zip(by_bucket.column("bucket").to_pylist(),
                     by_bucket.column("file_size_sum").to_pylist(), strict=True))
    chunk: list[int] = []
    total = 0
    for bucket in sorted(sizes, key=lambda b: b or 0):
        if chunk and total + sizes[bucket] > limit:
            yield chunk, total
            chunk, total = [], 0
        chunk.append(bucket or 0)
        total += sizes[bucket]
    if chunk:
        yield chunk, total


def _one_commit(table: Table, full: bool) -> bool:
    """Whether the compaction must be one commit: a full compaction whose changelog is the
    difference from the previous full compaction."""
    return full and table._record.properties.get("changelog-producer") == "full-compaction"


def cmd_compact(args: argparse.Namespace, lake: Lake, out: Output) -> int:
    table = lake.table(args.table)
    require_primary_key(table.state, "compact")
    table._check_write()
    enabled = out.progress_enabled(args.progress)
    results: list[CompactionResult] = []
    if _one_commit(table, args.full):
        results.append(table.compact(full=True))
    else:
        chunks = list(_bucket_chunks(table, compaction_chunk_bytes()))
        total = sum(size for _, size in chunks)
        with ProgressBar(out.stderr, total, label=f"compact {table.name}",
                         enabled=enabled) as bar:
            for buckets, size in chunks:
                if table._record.deletion_vectors:
                    results.append(vector_compaction.compact_vectors(
                        table.state, full=args.full, touched=buckets))
                else:
                    pairs = _pairs(table, buckets)
                    results.append(compaction.compact(table.state, full=args.full, only=pairs))
                bar.advance(size)
    done = [r for r in results if r.snapshot_id is not None]
    read = sum(r.removed_bytes for r in done)
    written = sum(r.added_bytes for r in done)
    value: dict[str, Any] = {"table": table.name, "snapshots": [r.snapshot_id for r in done],
             "buckets": sum(r.buckets for r in done),
             "removed_files": sum(r.removed_files for r in done),
             "added_files": sum(r.added_files for r in done),
             "read_bytes": read, "written_bytes": written,
             "dropped": sum(r.dropped for r in results)}
    if not done:
        text = f"Nothing to compact in {table.name}"
    else:
        text = (f"Compacted {value['buckets']} buckets of {table.name}: "
                f"{value['removed_files']} files -> {value['added_files']} "
                f"({human_size(read)} read, {human_size(written)} written) in {len(done)} "
                "snapshots")
    if value["dropped"]:
        text += f"\n{value['dropped']} chunks lost a race with another commit: run it again"
    out.emit(value, text)
    return 0


def compaction_chunk_bytes() -> int:
    """Bytes of live files per commit of ``arrowlake compact``."""
    return 256 * 1024 * 1024


def _pairs(table: Table, buckets: list[int]) -> list[tuple[int | None, int | None]]:
    """The ``(partition_id, bucket)`` pairs of the table's live files in ``buckets``."""
    rec = table._record
    files = table._metastore.live_files(rec.table_id, table.current_snapshot_id,
                                        buckets=buckets)
    return sorted(set(zip(files.column("partition_id").to_pylist(),
                          files.column("bucket").to_pylist(), strict=True)),
                  key=lambda p: (p[0] or 0, p[1] or 0))


def _bar(out: Output, flag: bool | None, label: str, unit: str
         ) -> tuple[ProgressBar, Callable[[int, int], None]]:
    bar = ProgressBar(out.stderr, None, label=label, unit=unit,
                      enabled=out.progress_enabled(flag))

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.set(done)

    return bar, progress


def cmd_expire(args: argparse.Namespace, lake: Lake, out: Output) -> int:
    table = lake.table(args.table)
    bar, progress = _bar(out, args.progress, f"expire {table.name}", "files")
    with bar:
        result = expire_snapshots(table.state, args.older_than, args.retain_last, progress=progress)
    value = {"table": table.name, "expired_snapshots": result.expired_snapshots,
             "deleted_files": result.deleted_files}
    n = len(result.expired_snapshots)
    text = f"Expired {n} snapshot{'s' if n != 1 else ''} of {table.name}"
    if n:
        text += f": {', '.join(map(str, result.expired_snapshots))}"
    text += f"\nDeleted {len(result.deleted_files)} files no snapshot needs any more"
    out.emit(value, text)
    return 0


def cmd_orphans(args: argparse.Namespace, lake: Lake, out: Output) -> int:
    table = lake.table(args.table)
    bar, progress = _bar(out, args.progress, f"orphans {table.name}", "bytes")
    with bar:
        result = remove_orphan_files(table.state, args.older_than, not args.delete,
                                     progress=progress)
    value = {"table": table.name, "files": result.files, "bytes": result.bytes,
             "dry_run": result.dry_run}
    n = len(result.files)
    lines = list(result.files)
    if result.dry_run:
        lines.append(f"{n} orphan file{'s' if n != 1 else ''} ({human_size(result.bytes)})"
                     + (", not deleted: pass --delete to remove them" if n else ""))
    else:
        lines.append(f"Deleted {n} orphan file{'s' if n != 1 else ''} "
                     f"({human_size(result.bytes)})")
    out.emit(value, "\n".join(lines))
    return 0

