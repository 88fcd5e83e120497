"""Maintenance: expiring old snapshots and removing files no snapshot references."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from arrowlake.errors import ValidationError
from arrowlake.io.storage import FileInfo, Storage, is_within, normalize_location
from arrowlake.metastore.holders import holder_alive
from arrowlake.metastore.inflight import write_id_of
from arrowlake.metastore.records import epoch_ms, now_ms
from arrowlake.metastore.store import Metastore
from arrowlake.table.changelogs import producers as changelog
from arrowlake.table.options.maintenance import parse_duration, warn_unsafe_orphan_age
from arrowlake.table.options.primary_key import changelog_producer

if TYPE_CHECKING:
    from arrowlake.table.state import TableState


@dataclass(frozen=True)
class ExpireResult:
    expired_snapshots: list[int]
    deleted_files: list[str]
    #: Snapshots that would have expired but were kept for a stream consumer, per consumer.
    kept_for_consumers: dict[str, list[int]] = field(default_factory=dict)
    #: Consumers dropped for being idle longer than the table's ``consumer.expiration``.
    expired_consumers: list[str] = field(default_factory=list)


def _consumer_holds(table: TableState, candidates: list[int]) -> tuple[dict[str, list[int]],
                                                                 list[str]]:
    """Per unexpired consumer, the candidate snapshots it still needs; and the consumers
    expired now for idling longer than ``consumer.expiration``.

    A consumer resuming at snapshot N reads the files snapshots N, N+1, ... added and removed,
    and catch-up compares against snapshot N - 1: it needs every snapshot from N - 1 on.
    """
    table_id = table.record.table_id
    expired: list[str] = []
    limit = table.record.properties.get("consumer.expiration")
    if limit is not None:
        seconds = parse_duration("consumer.expiration", limit)
        expired = table.metastore.expire_consumers(
            table_id, int((time.time() - seconds) * 1000))
    consumers = table.metastore.consumers(table_id).to_pylist()
    holds = {c["consumer"]: [s for s in candidates if s >= c["next_snapshot"] - 1]
             for c in consumers}
    return {c: held for c, held in holds.items() if held}, expired


@dataclass(frozen=True)
class OrphanResult:
    files: list[str]  # orphan files found (and deleted unless dry_run)
    bytes: int
    dry_run: bool


def _cutoff_ms(older_than: datetime | timedelta | None) -> int | None:
    if older_than is None:
        return None
    if isinstance(older_than, timedelta):
        return int((time.time() - older_than.total_seconds()) * 1000)
    if isinstance(older_than, datetime):
        return epoch_ms(older_than, "older_than")
    raise ValidationError(
        f"older_than must be a datetime or timedelta, got {type(older_than).__name__}")


#: Files deleted per call to the storage when progress is reported.
DELETE_CHUNK = 200


def delete_reporting(storage: Storage, paths: list[str], sizes: list[int] | None,
                     progress: Callable[[int, int], None] | None) -> None:
    """Delete ``paths``; with ``progress``, in chunks, calling ``progress(done, total)`` (in
    bytes when ``sizes`` are given, else in files) after each."""
    if progress is None:
        storage.delete(paths)
        return
    weights = sizes if sizes is not None else [1] * len(paths)
    total = sum(weights)
    done = 0
    progress(0, total)
    for start in range(0, len(paths), DELETE_CHUNK):
        storage.delete(paths[start:start + DELETE_CHUNK])
        done += sum(weights[start:start + DELETE_CHUNK])
        progress(done, total)


def expire_snapshots(table: TableState, older_than: datetime | timedelta | None = None,
                     retain_last: int = 1, *,
                     progress: Callable[[int, int], None] | None = None) -> ExpireResult:
    """Remove snapshots committed before ``older_than``, keeping at least the ``retain_last``
    newest (and always the current and tagged ones), then delete files only they referenced
    (``progress(files deleted, files to delete)`` is called as they go, if given).
    """
    if retain_last < 1:
        raise ValidationError("retain_last must be at least 1: the current snapshot stays")
    table.refresh()
    snaps = table.metastore.snapshots(table.record.table_id)
    if snaps.num_rows == 0:
        return ExpireResult([], [])
    candidates = snaps.slice(0, max(0, snaps.num_rows - retain_last))
    cutoff = _cutoff_ms(older_than)
    if cutoff is not None:
        committed = pc.cast(pc.cast(candidates.column("committed_at"), "timestamp[ms]"), "int64")
        candidates = candidates.filter(pc.less(committed, cutoff))
    protected = set(table.metastore.tags(table.record.table_id).values())
    protected.add(table.current_snapshot_id or -1)
    if changelog_producer(table) == "full-compaction":
        # The next full compaction's changelog is the difference from this one's state.
        protected.add(changelog.last_full_compaction(table) or -1)
    ids = [s for s in candidates.column("snapshot_id").to_pylist() if s not in protected]
    kept, expired_consumers = _consumer_holds(table, ids)
    for held in kept.values():
        protected.update(held)
    expire = [s for s in ids if s not in protected]
    paths = table.metastore.expire_snapshots(table.record.table_id, expire)
    # The published Iceberg view's files that only expired snapshots used (arrowlake.iceberg).
    paths += table.metastore.expire_iceberg(table.record.table_id)
    storage = table.storage
    absolute = [storage.join(table.record.location, p) for p in paths]
    delete_reporting(storage, absolute, None, progress)
    return ExpireResult(expire, absolute, kept, expired_consumers)


#: Files SQLite keeps next to its database file.
_SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")


def metastore_files(metastore: Metastore) -> set[str]:
    """The metastore's own files on local disk (an SQLite database and its journals)."""
    database = metastore.database_file()
    if database is None:
        return set()
    path = normalize_location(database)
    return {path + suffix for suffix in _SQLITE_SUFFIXES}


def own_files(storage: Storage, location: str, metastore: Metastore,
              table_id: int | None) -> list[FileInfo]:
    """The files under ``location`` that are the table's own to delete: not below the location
    of any other table (``table_id`` is the table itself; None when it is no longer listed) and
    not the metastore's. A table whose location holds another's (set by an older version, which
    did not check locations) must never delete that table's files."""
    return keep_own(storage.list_files(location), location, metastore, table_id)


def keep_own(listed: list[FileInfo], location: str, metastore: Metastore,
             table_id: int | None) -> list[FileInfo]:
    """The files of ``listed`` (found under ``location``) that :func:`own_files` keeps."""
    others = [loc for tid, _, loc in metastore.table_locations()
              if tid != table_id and is_within(loc, location)]
    reserved = metastore_files(metastore)
    if not others and not reserved:
        return listed
    return [f for f in listed if f.path not in reserved
            and not any(is_within(f.path, other) for other in others)]


def check_older_than(older_than: timedelta) -> None:
    if not isinstance(older_than, timedelta):
        raise ValidationError(
            f"older_than must be a timedelta (how old a file must be to count as an orphan), "
            f"got {older_than!r}; timedelta(0) takes every unreferenced file")
    if older_than < timedelta(0):
        raise ValidationError(f"older_than cannot be negative, got {older_than}")
    warn_unsafe_orphan_age(older_than, "older_than")


def orphans_of(table: TableState, listed: list[FileInfo], older_than: timedelta, *,
               dry_run: bool = False) -> list[FileInfo]:
    """The files of ``listed`` (the table's own, listed just before) that no snapshot
    references, that no write in flight may still commit, and that are older than
    ``older_than``.

    Order matters (see metastore/inflight.py): the listing came first; then registrations
    whose holder is gone or whose lease ran out are revoked (a commit of theirs now fails),
    and the live ones read; then the references. A file in the listing was written after its
    write registered, so that write is either still registered now, or committed (and its files
    referenced by the time they are read), or revoked or ended without a commit. With
    ``dry_run`` nothing is revoked: dead registrations are only left out of the protected set.
    """
    metastore = table.metastore
    storage = table.storage
    location = table.record.location
    if dry_run or metastore.read_only:
        writes = [w for w in metastore.live_writes()
                  if w["expires_at"] >= now_ms() and holder_alive(_Row(w)) is not False]
    else:
        metastore.revoke_dead_writes()
        writes = metastore.live_writes()
    in_flight = {w["write_id"] for w in writes}
    referenced = {storage.join(location, p)
                  for p in metastore.all_file_paths(table.record.table_id)}
    cutoff = time.time() * 1000 - older_than.total_seconds() * 1000
    return [f for f in listed if f.path not in referenced
            and write_id_of(f.path) not in in_flight
            and (f.mtime_ms is None or f.mtime_ms < cutoff)]


class _Row:
    """A registration as :func:`holder_alive` reads it."""

    def __init__(self, row: dict[str, Any]) -> None:
        self.host, self.pid = row["host"], row["pid"]


def remove_orphan_files(table: TableState, older_than: timedelta = timedelta(days=1),
                        dry_run: bool = True, *,
                        progress: Callable[[int, int], None] | None = None) -> OrphanResult:
    """Files under the table's location that no snapshot references, that no write in flight
    may still commit, and that are older than ``older_than``; deleted unless ``dry_run``,
    calling ``progress(bytes deleted, bytes to delete)`` as they go, if given.

    arrowlake's writes register in the metastore before they write a file and name their files
    after the registration, so a write in progress keeps its files whatever ``older_than`` is
    (see :func:`orphans_of`). The age still guards files of writers that do not register;
    below one hour it is unsafe for those, and :class:`~arrowlake.errors.UnsafeOrphanAge` is
    warned.
    """
    check_older_than(older_than)
    table.refresh()
    storage = table.storage
    # list before reading references (see orphans_of)
    listed = own_files(storage, table.record.location, table.metastore,
                       table.record.table_id)
    orphans = orphans_of(table, listed, older_than, dry_run=dry_run)
    orphans.sort(key=lambda f: f.path)
    paths = [f.path for f in orphans]
    if not dry_run:
        delete_reporting(storage, paths, [f.size for f in orphans], progress)
    return OrphanResult(paths, sum(f.size for f in orphans), dry_run)
