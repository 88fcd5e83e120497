"""Committing what writes planned: the result of a write, and the commit of written files.

A write plans first (its files written, the change described as data) and commits second;
this module holds the second step and what it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from arrowlake.metastore.store import CommitResult, NewFile, SnapshotChange
from arrowlake.table.state import TableState


@dataclass(frozen=True)
class CompactionResult:
    """What a compaction committed. ``snapshot_id`` is None when there was nothing to do, or
    when the compaction lost a race with another commit (``dropped``)."""

    snapshot_id: int | None
    buckets: int = 0
    removed_files: int = 0
    added_files: int = 0
    dropped: bool = False
    removed_bytes: int = 0  # the runs merged (what was read)
    added_bytes: int = 0  # the runs written in their place (what was rewritten)


@dataclass(frozen=True)
class WriteResult:
    """What a write committed. ``snapshot_id`` is None when there was nothing to commit."""

    snapshot_id: int | None
    kind: str
    added_files: int = 0
    removed_files: int = 0
    added_rows: int = 0
    removed_rows: int = 0
    attempts: int = 0
    duplicate: bool = False  # the commit id had been committed before; nothing new was written
    # The compaction this write triggered and committed after its own snapshot (primary-key
    # tables, see arrowlake.table.maintenance.compaction); None when no bucket it touched was due.
    compaction: CompactionResult | None = None
    # Merge-on-write primary-key tables: rows whose live version this write replaced (their
    # positions marked deleted, the new version written); ``removed_rows`` counts every
    # position it marked, deleted keys included.
    replaced: int = 0
    # Merge-on-write writes: the buckets they wrote to and the bytes of the files they added
    # (what their compaction budget is measured against).
    buckets: tuple[int, ...] = ()
    added_bytes: int = 0
    # Merge-on-read primary-key writes: the runs they added, whose buckets a compaction after
    # the commit looks at.
    written: tuple[NewFile, ...] = field(default=(), repr=False, compare=False)


def write_result(kind: str, commit: CommitResult, add: Sequence[NewFile], removed_files: int,
            removed_rows: int) -> WriteResult:
    return WriteResult(commit.snapshot_id, kind, len(add), removed_files,
                       sum(f.row_count for f in add), removed_rows, commit.attempts,
                       commit.duplicate)


def commit_files(table: TableState, kind: str, base: int | None, add: list[NewFile],
                 remove: Sequence[int] = (), removed_rows: int = 0, *,
                 commit_id: str | None = None, on_rebase: Any = None,
                 summary: dict[str, Any] | None = None,
                 deletion_vectors: bool | None = None) -> WriteResult:
    """Commit written files; delete them again if the commit does not happen.
    ``deletion_vectors``: the mode of a primary-key table the files were written for (see
    :class:`~arrowlake.metastore.records.SnapshotChange`)."""
    change = SnapshotChange(kind=kind, schema_id=table.record.current_schema_id, add=add,
                            remove=remove, removed_rows=removed_rows, commit_id=commit_id,
                            summary=summary or {}, on_rebase=on_rebase,
                            deletion_vectors=deletion_vectors)
    try:
        result = table.metastore.commit(table.record.table_id, base, change)
    except BaseException:
        table.discard(add)
        raise
    if result.duplicate:
        table.discard(add)
        return WriteResult(result.snapshot_id, kind, attempts=result.attempts, duplicate=True)
    return write_result(kind, result, add, len(remove), removed_rows)


