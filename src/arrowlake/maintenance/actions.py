"""The maintenance service's actions on one table: compacting its due buckets under leases,
expiring snapshots by its policy, removing orphan files. Each returns what it did as an
:class:`Action` (one line of the service's output), or None when there was nothing to do.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from arrowlake.metastore.inflight import registered_write
from arrowlake.metastore.streams import LeaseHolder
from arrowlake.streaming import leases
from arrowlake.table.maintenance import compaction, vector_compaction
from arrowlake.table.maintenance.compaction import CompactionResult, DueBucket
from arrowlake.table.maintenance.housekeeping import expire_snapshots, remove_orphan_files
from arrowlake.table.options.maintenance import maintenance_policy
from arrowlake.table.table import Table
from arrowlake.units import human_size

#: A compaction commits its buckets in chunks of about this many input bytes (or fewer: the
#: bytes-per-second budget), so that a bucket's lease is held only while it is compacted and a
#: SIGTERM waits for one chunk at most.
CHUNK_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Action:
    """One maintenance action the service took (one output line)."""

    table: str
    action: str  # compact, expire, orphans or iceberg (Iceberg metadata published)
    at: str  # ISO-8601 UTC, when it finished
    seconds: float
    snapshot_id: int | None = None  # the snapshot it committed (compact)
    buckets: list[int] = field(default_factory=list)
    read_bytes: int = 0
    written_bytes: int = 0
    removed_files: int = 0
    added_files: int = 0
    dropped: bool = False  # a compaction that lost a race with another commit (no change)
    expired_snapshots: int = 0
    deleted_files: int = 0
    deleted_bytes: int = 0
    kept_for_consumers: int = 0  # snapshots that would have expired but a consumer needs
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """The action for people, on one line."""
        head = f"{self.at}  {self.action:<8} {self.table}"
        if self.error is not None:
            return f"{head}  failed: {self.error}"
        if self.action == "compact":
            what = (f"buckets {','.join(map(str, self.buckets))}: {self.removed_files} files "
                    f"-> {self.added_files}, read {human_size(self.read_bytes)}, wrote "
                    f"{human_size(self.written_bytes)}")
            what += ", dropped (lost a race; retried later)" if self.dropped else \
                f", snapshot {self.snapshot_id}"
        elif self.action == "iceberg":
            what = f"published Iceberg metadata of snapshot {self.snapshot_id}"
        elif self.action == "expire":
            what = (f"{self.expired_snapshots} snapshots, {self.deleted_files} files")
            if self.kept_for_consumers:
                what += f", {self.kept_for_consumers} kept for consumers"
        else:
            what = f"{self.deleted_files} orphan files, {human_size(self.deleted_bytes)}"
        return f"{head}  {what}  ({self.seconds:.2f} s)"




def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class ByteBudget:
    """At most ``rate`` bytes per second on average, across every thread that charges it
    (None: no limit). Work is charged after it is done; the next piece of work waits until
    the bytes charged so far fit the rate."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self._free_at = time.monotonic()
        self._lock = threading.Lock()

    def wait(self, stop: threading.Event) -> bool:
        """Wait until the budget allows more work; False when ``stop`` was set meanwhile."""
        if self.rate is None:
            return not stop.is_set()
        with self._lock:
            delay = self._free_at - time.monotonic()
        return not stop.wait(delay) if delay > 0 else not stop.is_set()

    def charge(self, n: int) -> None:
        if self.rate is None or n <= 0:
            return
        with self._lock:
            self._free_at = max(self._free_at, time.monotonic()) + n / self.rate

    @property
    def chunk(self) -> int:
        """How many input bytes one compaction commit should take."""
        return CHUNK_BYTES if self.rate is None else max(1, min(CHUNK_BYTES, int(self.rate)))


class BucketLeases:
    """This service's leases on buckets (see :mod:`arrowlake.metastore.maintenance`): taken
    before a bucket is compacted, given up after; renewed by a thread while held, and taken
    over by another service once this process is gone (at once on this machine, elsewhere
    when the lease expires)."""

    def __init__(self, lease_seconds: float = 60.0) -> None:
        self.seconds = lease_seconds
        self.holder = LeaseHolder(uuid.uuid4().hex, leases.HOST, os.getpid())

    @property
    def ms(self) -> int:
        return int(self.seconds * 1000)

    def take(self, table: Table, buckets: Sequence[int]) -> list[int]:
        return table.state.metastore.acquire_bucket_leases(
            table.state.record.table_id, buckets, self.holder, self.ms, leases.holder_alive)

    def give_up(self, table: Table, buckets: Sequence[int]) -> None:
        state = table.state
        state.metastore.release_bucket_leases(self.holder, state.record.table_id, buckets)


def _chunks(due: list[DueBucket], limit: int) -> Iterator[list[DueBucket]]:
    """The due buckets (grouped by bucket number: a lease covers every partition's files of
    a bucket) in chunks of about ``limit`` input bytes, the most runs first."""
    by_bucket: dict[int, list[DueBucket]] = {}
    for d in due:
        by_bucket.setdefault(d.bucket or 0, []).append(d)
    chunk: list[DueBucket] = []
    size = 0
    for group in by_bucket.values():
        group_bytes = sum(d.bytes for d in group)
        if chunk and size + group_bytes > limit:
            yield chunk
            chunk, size = [], 0
        chunk += group
        size += group_bytes
    if chunk:
        yield chunk


#: A deletion-vector compaction whose inputs a write changed meanwhile is dropped (see
#: :mod:`arrowlake.table.maintenance.vector_compaction`); it is tried again at once this many times.
VECTOR_RETRIES = 3


def compact_due(table: Table, holds: BucketLeases, budget: ByteBudget,
                stop: threading.Event, emit: Callable[[Action], None]) -> None:
    """Compact the table's due buckets (a deferred table's: see :mod:`table.compaction` and
    :mod:`table.vector_compaction` for when a bucket is due), a chunk at a time, each chunk's
    buckets leased first; buckets another service holds are left to it. Stops between chunks
    once ``stop`` is set.

    With deletion vectors a chunk is one bucket: a write that deletes rows of a file being
    rewritten makes the rewrite void, so the shorter each one, the likelier it lands beside
    a busy writer; a voided one is retried at once (:data:`VECTOR_RETRIES` times)."""
    vectors = table.state.record.deletion_vectors
    due = vector_compaction.due_vector_buckets(table.state) if vectors else \
        compaction.due_buckets(table.state)
    for chunk in _chunks(due, 1 if vectors else budget.chunk):
        if not budget.wait(stop):
            return
        numbers = sorted({d.bucket or 0 for d in chunk})
        taken = holds.take(table, numbers)
        if not taken:
            continue
        try:
            with registered_write(table.state.metastore, table.state.record.table_id, "maintain"):
                _compact_chunk(table, chunk, taken, vectors, budget, stop, emit)
        finally:
            holds.give_up(table, taken)


def _compact_chunk(table: Table, chunk: list[DueBucket], taken: list[int], vectors: bool,
                   budget: ByteBudget, stop: threading.Event,
                   emit: Callable[[Action], None]) -> None:
    """One chunk of due buckets (leased), retried at once while a vector rewrite is voided."""
    for _ in range(VECTOR_RETRIES + 1 if vectors else 1):
        started = time.monotonic()
        if vectors:
            result = vector_compaction.compact_vectors(table.state, touched=taken,
                                                       background=True)
        else:
            result = compaction.compact(table.state, only=[
                (d.partition_id, d.bucket) for d in chunk if (d.bucket or 0) in taken])
        budget.charge(result.removed_bytes + result.added_bytes)
        if result.snapshot_id is not None or result.dropped:
            emit(_compacted(table, result, taken, time.monotonic() - started))
        if not result.dropped or stop.is_set():
            break




def _compacted(table: Table, result: CompactionResult, buckets: list[int],
               seconds: float) -> Action:
    return Action(table.name, "compact", _now(), seconds, result.snapshot_id, buckets,
                  result.removed_bytes, result.added_bytes, result.removed_files,
                  result.added_files, result.dropped)


def expire_by_policy(table: Table) -> Action | None:
    """Expire the snapshots the table's ``snapshot.retain-last`` and ``snapshot.max-age``
    allow (never a tagged one, the current one, or one a consumer still needs)."""
    policy = maintenance_policy(table.state.record.properties)
    if not policy.expires:
        return None
    started = time.monotonic()
    result = expire_snapshots(
        table.state, None if policy.max_age is None else timedelta(seconds=policy.max_age),
        policy.retain_last or 1)
    if not result.expired_snapshots:
        return None
    kept = len({s for held in result.kept_for_consumers.values() for s in held})
    return Action(table.name, "expire", _now(), time.monotonic() - started,
                  expired_snapshots=len(result.expired_snapshots),
                  deleted_files=len(result.deleted_files), kept_for_consumers=kept)


def remove_orphans_by_policy(table: Table) -> Action | None:
    """Delete the files under the table no snapshot references that are older than its
    ``orphan.min-age`` (default 1 d: a write in progress has files it has not committed)."""
    policy = maintenance_policy(table.state.record.properties)
    started = time.monotonic()
    result = remove_orphan_files(table.state, timedelta(seconds=policy.orphan_min_age),
                                 dry_run=False)
    if not result.files:
        return None
    return Action(table.name, "orphans", _now(), time.monotonic() - started,
                  deleted_files=len(result.files), deleted_bytes=result.bytes)
