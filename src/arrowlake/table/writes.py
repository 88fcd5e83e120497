"""Writes to tables without a primary key: append, overwrite and delete.

Each write puts its data files in place first, then commits them in one metastore transaction.
A failure anywhere before the commit deletes the files it wrote; the table is unchanged.
Deletes and overwrites remove whole files where statistics prove every row matches, rewrite the
files that match in part, and re-plan on a newer snapshot when another commit got in first.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.errors import CommitConflict, ValidationError
from arrowlake.expressions import AlwaysTrue, Expr, evaluate, may_match, referenced_columns
from arrowlake.io.storage import discard_after_failure
from arrowlake.io.writer import FileTarget, WriteOptions, write_batches
from arrowlake.metastore.store import CommitResult, NewFile, SnapshotChange
from arrowlake.scan.planning import file_stats, file_tasks, fully_matching, make_splits, plan_files
from arrowlake.scan.read import read_split_table
from arrowlake.schema import conform
from arrowlake.table.inputs import batch_stream

if TYPE_CHECKING:
    from arrowlake.table.compaction import CompactionResult
    from arrowlake.table.table import Table


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
    # tables, see arrowlake.table.compaction); None when no bucket it touched was due.
    compaction: CompactionResult | None = None
    # Merge-on-write primary-key tables: rows whose live version this write replaced (their
    # positions marked deleted, the new version written); ``removed_rows`` counts every
    # position it marked, deleted keys included.
    replaced: int = 0
    # Merge-on-write writes: the buckets they wrote to and the bytes of the files they added
    # (what their compaction budget is measured against).
    buckets: tuple[int, ...] = ()
    added_bytes: int = 0


def conformed(table: Table, data: Any, schema: pa.Schema, *, check: Expr | None = None,
              where: str = "input") -> Iterator[pa.RecordBatch]:
    """``data`` as batches in the table schema; with ``check``, every row must match it."""
    _, batches = batch_stream(data)
    for n, batch in enumerate(batches):
        batch = conform(batch, schema, where=f"{where} (batch {n})")
        if check is not None and batch.num_rows:
            ok = evaluate(check, batch)
            bad = batch.num_rows - int(pc.sum(ok).as_py() or 0)
            if bad:
                raise ValidationError(
                    f"{bad} rows of batch {n} do not match the overwrite filter {check}: an "
                    "overwrite with a filter may only write rows the filter selects")
        yield batch


def file_target(table: Table) -> FileTarget:
    rec = table._record
    return FileTarget(
        storage=table._storage, location=rec.location, schema=table.schema,
        schema_id=rec.current_schema_id,
        options=WriteOptions.from_properties(rec.properties),
    )


def _result(kind: str, commit: CommitResult, add: Sequence[NewFile], removed_files: int,
            removed_rows: int) -> WriteResult:
    return WriteResult(commit.snapshot_id, kind, len(add), removed_files,
                       sum(f.row_count for f in add), removed_rows, commit.attempts,
                       commit.duplicate)


def _discard(table: Table, files: Sequence[NewFile]) -> None:
    """Delete files written for a commit that did not happen. Called while the write's error
    propagates, a failure to delete is attached to that error rather than replacing it."""
    storage = table._storage
    discard_after_failure(storage, [storage.join(table._record.location, f.path) for f in files])


def commit_files(table: Table, kind: str, base: int | None, add: list[NewFile],
                 remove: Sequence[int] = (), removed_rows: int = 0, *,
                 commit_id: str | None = None, on_rebase: Any = None,
                 summary: dict[str, Any] | None = None,
                 deletion_vectors: bool | None = None) -> WriteResult:
    """Commit written files; delete them again if the commit does not happen.
    ``deletion_vectors``: the mode of a primary-key table the files were written for (see
    :class:`~arrowlake.metastore.records.SnapshotChange`)."""
    change = SnapshotChange(kind=kind, schema_id=table._record.current_schema_id, add=add,
                            remove=remove, removed_rows=removed_rows, commit_id=commit_id,
                            summary=summary or {}, on_rebase=on_rebase,
                            deletion_vectors=deletion_vectors)
    try:
        result = table._metastore.commit(table._record.table_id, base, change)
    except BaseException:
        _discard(table, add)
        raise
    if result.duplicate:
        _discard(table, add)
        return WriteResult(result.snapshot_id, kind, attempts=result.attempts, duplicate=True)
    return _result(kind, result, add, len(remove), removed_rows)


def append(table: Table, data: Any, *, commit_id: str | None = None) -> WriteResult:
    table.refresh()
    base = table.current_snapshot_id
    target = file_target(table)
    files = write_batches(target, conformed(table, data, target.schema),
                          table._record.partition_by)
    if not files:
        return WriteResult(None, "append")
    return commit_files(table, "append", base, files, commit_id=commit_id)


def append_parts(table: Table, parts: Sequence[Any], *, commit_id: str | None = None
                 ) -> WriteResult:
    """Append each of ``parts`` as its own file(s), all in one snapshot."""
    table.refresh()
    base = table.current_snapshot_id
    target = file_target(table)
    files: list[NewFile] = []
    try:
        for part in parts:
            files += write_batches(target, conformed(table, part, target.schema),
                                   table._record.partition_by)
    except BaseException:
        _discard(table, files)
        raise
    if not files:
        return WriteResult(None, "append")
    return commit_files(table, "append", base, files, commit_id=commit_id)


@dataclass(frozen=True)
class _Removal:
    remove: list[int]
    removed_rows: int  # rows that matched the filter
    removed_file_rows: int  # rows of the removed files (the matched ones plus the rewritten)
    rewritten: list[NewFile]


def _plan_removal(table: Table, snapshot_id: int | None, expr: Expr) -> _Removal:
    """Which files a delete of ``expr`` removes, and the rewritten remainder of partial ones."""
    view = table._view(snapshot_id, current_schema=True)
    files = plan_files(view, expr)
    if files.num_rows == 0:
        return _Removal([], 0, 0, [])
    full = pc.fill_null(fully_matching(view, files, expr), False)
    whole = files.filter(full)
    partial = files.filter(pc.invert(full))
    remove = whole.column("file_id").to_pylist()
    removed_rows = int(pc.sum(whole.column("row_count")).as_py() or 0)
    removed_file_rows = removed_rows
    rewritten: list[NewFile] = []
    if partial.num_rows:
        target = file_target(table)
        try:
            for task in file_tasks(view, partial):
                split = make_splits(view, [task], columns=view.schema.names, expr=AlwaysTrue(),
                                    target_bytes=1 << 62)[0]
                data = read_split_table(split)
                hit = evaluate(expr, data)
                matched = int(pc.sum(hit).as_py() or 0)
                if matched == 0:
                    continue
                remove.append(task.file_id)
                removed_rows += matched
                removed_file_rows += task.row_count
                keep = data.filter(pc.invert(hit))
                if keep.num_rows:
                    rewritten += write_batches(target, keep.to_batches(),
                                               table._record.partition_by)
        except BaseException:
            _discard(table, rewritten)
            raise
    return _Removal(remove, removed_rows, removed_file_rows, rewritten)


def _conflict_on_new_matches(table: Table, expr: Expr) -> Any:
    """An ``on_rebase`` check: fail if files committed meanwhile may hold matching rows."""

    def check(added: pa.Table) -> None:
        if added.num_rows == 0:
            return
        if isinstance(expr, AlwaysTrue):
            hits = added.num_rows
        else:
            view = table._view(None, current_schema=True)
            cols = [c for c in sorted(referenced_columns(expr)) if c in view.schema.names]
            stats = file_stats(added, view.schema, cols)
            hits = int(pc.sum(pc.fill_null(may_match(expr, stats, view.schema), True))
                       .as_py() or 0)
        if hits:
            raise CommitConflict(
                f"{hits} files committed meanwhile may hold rows this write must replace")

    return check


def rewrite(table: Table, kind: str, expr: Expr, add: list[NewFile], *,
            commit_id: str | None = None, retries: int = 5) -> WriteResult:
    """Commit ``add`` while removing every row matching ``expr`` (delete and overwrite)."""
    try:
        for attempt in range(retries):
            table.refresh()
            base = table.current_snapshot_id
            removal = _plan_removal(table, base, expr)
            if not add and not removal.remove:
                return WriteResult(None, kind)
            change = SnapshotChange(
                kind=kind, schema_id=table._record.current_schema_id,
                add=add + removal.rewritten, remove=removal.remove,
                removed_rows=removal.removed_file_rows, commit_id=commit_id,
                summary={"deleted_rows": removal.removed_rows,
                         "rewritten_files": len(removal.rewritten),
                         # For change streams: the removed files' rows matching the filter are
                         # exactly the rows removed; the rewritten files carry rows over.
                         "filter": "" if isinstance(expr, AlwaysTrue) else str(expr),
                         "rewritten_paths": [f.path for f in removal.rewritten]},
                on_rebase=_conflict_on_new_matches(table, expr))
            try:
                result = table._metastore.commit(table._record.table_id, base, change)
            except CommitConflict:
                _discard(table, removal.rewritten)
                if attempt == retries - 1:
                    raise
                continue
            except BaseException:
                _discard(table, removal.rewritten)
                raise
            if result.duplicate:
                _discard(table, add + removal.rewritten)
                return WriteResult(result.snapshot_id, kind, attempts=result.attempts,
                                   duplicate=True)
            return _result(kind, result, add, len(removal.remove), removal.removed_rows)
    except BaseException:
        _discard(table, add)
        raise
    raise AssertionError("unreachable")


def overwrite(table: Table, data: Any, expr: Expr, *, commit_id: str | None = None) -> WriteResult:
    table.refresh()
    target = file_target(table)
    check = None if isinstance(expr, AlwaysTrue) else expr
    files = write_batches(target, conformed(table, data, target.schema, check=check),
                          table._record.partition_by)
    return rewrite(table, "overwrite", expr, files, commit_id=commit_id)


def delete(table: Table, expr: Expr, *, commit_id: str | None = None) -> WriteResult:
    return rewrite(table, "delete", expr, [], commit_id=commit_id)
