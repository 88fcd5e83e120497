"""A table's health: what maintenance is there for, measured on the current snapshot.

Files and bytes, runs per bucket (merge-on-read primary-key tables: runs a read merges;
deletion-vector tables: files; other tables: files per partition), the deleted fraction of
deletion-vector tables, small files, snapshots and their age, the consumers and how far they
lag, the last maintenance action of each kind, and whether the table has an Iceberg view
(:mod:`arrowlake.iceberg`) and what of it is published. A handful of indexed metastore
queries, no data file is read.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.io.writer import WriteOptions
from arrowlake.table.options.maintenance import maintenance_policy

if TYPE_CHECKING:
    from arrowlake.table.state import TableState

#: A file smaller than this fraction of ``write.target-file-size`` counts as small.
SMALL_FILE_FRACTION = 0.25


@dataclass(frozen=True)
class ConsumerLag:
    """A stream consumer and how far behind the table it is."""

    consumer: str
    next_snapshot: int  # the first snapshot it has not processed
    snapshots_behind: int  # retained snapshots from next_snapshot to the current one
    committed_at: datetime  # when it last recorded progress
    #: Seconds since the oldest snapshot it has not processed was committed (0 when caught up).
    lag_seconds: float


@dataclass(frozen=True)
class MaintenanceAction:
    """The last maintenance action of one kind (compact, expire, orphans) on the table."""

    action: str
    at: datetime
    detail: dict[str, Any]


@dataclass(frozen=True)
class IcebergStatus:
    """Whether the table has an Iceberg view, and what of it is published."""

    view: bool  # whether it can be published (see arrowlake.iceberg.view)
    reason: str | None  # why not, and how to change that
    published_snapshot: int | None  # the snapshot its current published metadata describes
    current: bool  # whether that metadata describes the table as it is now
    publish_on_maintain: bool  # iceberg.publish: arrowlake maintain keeps it current


@dataclass(frozen=True)
class TableHealth:
    """What :meth:`Table.health` reports (see the module doc)."""

    table: str
    snapshot_id: int | None
    compaction_mode: str | None  # primary-key tables: inline, deferred or off
    files: int
    bytes: int
    rows: int  # live rows (deleted rows of deletion-vector tables not counted)
    buckets: int  # non-empty buckets (partitions of tables without a primary key)
    runs_max: int  # the most runs (files) one bucket holds
    runs_mean: float
    deleted_fraction: float | None  # deletion-vector tables: deleted / stored rows
    small_files: int
    small_file_bytes: int  # the size under which a file counts as small
    snapshots: int
    oldest_snapshot_age_seconds: float | None
    newest_snapshot_age_seconds: float | None
    consumers: list[ConsumerLag] = field(default_factory=list)
    maintenance: list[MaintenanceAction] = field(default_factory=list)  # newest first
    bucket_leases: int = 0  # buckets a maintenance service is compacting right now
    iceberg: IcebergStatus | None = None  # None: arrowlake.iceberg was not imported

    @property
    def last_maintenance(self) -> MaintenanceAction | None:
        return self.maintenance[0] if self.maintenance else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (times as ISO-8601 strings)."""
        value = asdict(self)
        for entry in value["consumers"]:
            entry["committed_at"] = entry["committed_at"].isoformat()
        for entry in value["maintenance"]:
            entry["at"] = entry["at"].isoformat()
        return value


def _runs_per_bucket(files: pa.Table, by_sequence: bool) -> pa.Array:
    """Runs per (partition, bucket): files sharing a sequence range are one run when
    ``by_sequence`` (merge-on-read primary-key tables), else every file is one."""
    if files.num_rows == 0:
        return pa.array([], pa.int64())
    keys = files.select(["partition_id", "bucket"])
    if by_sequence:
        # A file without a sequence range is a run of its own (keyed by its negated id).
        own = pc.negate(files.column("file_id"))
        keys = keys.append_column("lo", pc.coalesce(files.column("seq_min"), own)) \
            .append_column("hi", pc.coalesce(files.column("seq_max"), own))
        keys = keys.group_by(["partition_id", "bucket", "lo", "hi"]).aggregate([])
    else:
        keys = keys.append_column("file_id", files.column("file_id"))
    counted = keys.group_by(["partition_id", "bucket"]).aggregate(
        [(keys.column_names[-1], "count")])
    return counted.column(counted.num_columns - 1).combine_chunks()


def _age(now: float, ms: Any) -> float | None:
    return None if ms is None else max(0.0, now - ms.timestamp())


def table_health(table: TableState, iceberg: IcebergStatus | None = None) -> TableHealth:
    """The table's health; ``iceberg``: its Iceberg view's status, when known (the facade asks
    :mod:`arrowlake.iceberg`, a layer above)."""
    table.refresh()
    rec = table.record
    store = table.metastore
    snapshot = table.current_snapshot_id
    files = store.live_files(rec.table_id, snapshot)
    now = time.time()
    total_rows = int(pc.sum(files.column("row_count")).as_py() or 0)
    deleted_fraction = None
    deleted = 0
    if rec.deletion_vectors:
        deleted = sum(v.cardinality for v in store.live_vectors(rec.table_id, snapshot).values())
        deleted_fraction = deleted / total_rows if total_rows else 0.0
    runs = _runs_per_bucket(files, bool(rec.primary_key) and not rec.deletion_vectors)
    target = WriteOptions.from_properties(rec.properties).target_file_bytes
    small = int(target * SMALL_FILE_FRACTION)
    snaps = store.snapshots(rec.table_id).select(["snapshot_id", "committed_at"])
    committed = snaps.column("committed_at").to_pylist()
    ids = snaps.column("snapshot_id").to_pylist()
    current = snapshot or 0
    consumers = []
    for c in store.consumers(rec.table_id).to_pylist():
        first = bisect.bisect_left(ids, c["next_snapshot"])  # ids are ascending
        pending = len(ids) - first if c["next_snapshot"] <= current else 0
        lag = _age(now, committed[first]) if pending else 0.0
        consumers.append(ConsumerLag(c["consumer"], int(c["next_snapshot"]), pending,
                                     c["committed_at"], lag or 0.0))
    actions = [MaintenanceAction(a["action"], datetime.fromtimestamp(a["at"] / 1000, UTC),
                                 a["detail"]) for a in store.maintenance_actions(rec.table_id)]
    return TableHealth(
        table=rec.full_name, snapshot_id=snapshot,
        compaction_mode=maintenance_policy(rec.properties).compaction_mode
        if rec.primary_key else None,
        files=files.num_rows, bytes=int(pc.sum(files.column("file_size")).as_py() or 0),
        rows=total_rows - deleted, buckets=len(runs),
        runs_max=int(pc.max(runs).as_py() or 0) if len(runs) else 0,
        runs_mean=float(pc.mean(runs).as_py() or 0.0) if len(runs) else 0.0,
        deleted_fraction=deleted_fraction,
        small_files=int(pc.sum(pc.less(files.column("file_size"), small)).as_py() or 0),
        small_file_bytes=small, snapshots=len(ids),
        oldest_snapshot_age_seconds=_age(now, committed[0]) if committed else None,
        newest_snapshot_age_seconds=_age(now, committed[-1]) if committed else None,
        consumers=consumers, maintenance=actions,
        bucket_leases=len(store.bucket_leases(rec.table_id)),
        iceberg=iceberg)
