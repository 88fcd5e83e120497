"""Writes to tables without a primary key: append, overwrite and delete.

Each write puts its data files in place first, then commits them in one metastore transaction.
A failure anywhere before the commit deletes the files it wrote; the table is unchanged.
Deletes and overwrites remove whole files where statistics prove every row matches, rewrite the
files that match in part, and re-plan on a newer snapshot when another commit got in first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.errors import CommitConflict
from arrowlake.expressions import AlwaysTrue, Expr, evaluate, may_match, referenced_columns
from arrowlake.io.writer import write_batches
from arrowlake.metastore.records import CommitResult
from arrowlake.metastore.store import NewFile, SnapshotChange
from arrowlake.scan.planning import file_stats, file_tasks, fully_matching, make_splits, plan_files
from arrowlake.scan.read import read_split_table
from arrowlake.table.writes.change import Change, FilesChange, commit
from arrowlake.table.writes.commit import WriteResult, write_result
from arrowlake.table.writes.inputs import conformed

if TYPE_CHECKING:
    from arrowlake.table.state import TableState


def append_change(table: TableState, data: Any, *, commit_id: str | None = None
                  ) -> FilesChange:
    """Plan an append: ``data`` written as files, to be committed."""
    table.refresh()
    target = table.file_target()
    files = write_batches(target, conformed(data, target.schema), table.record.partition_by)
    return FilesChange(table, "append", files, commit_id=commit_id)


def append(table: TableState, data: Any, *, commit_id: str | None = None) -> WriteResult:
    return commit(append_change(table, data, commit_id=commit_id))


def append_parts(table: TableState, parts: Sequence[Any], *, commit_id: str | None = None
                 ) -> WriteResult:
    """Append each of ``parts`` as its own file(s), all in one snapshot."""
    table.refresh()
    target = table.file_target()
    files: list[NewFile] = []
    try:
        for part in parts:
            files += write_batches(target, conformed(part, target.schema),
                                   table.record.partition_by)
    except BaseException:
        table.discard(files)
        raise
    return commit(FilesChange(table, "append", files, commit_id=commit_id))


@dataclass(frozen=True)
class _Removal:
    remove: list[int]
    removed_rows: int  # rows that matched the filter
    removed_file_rows: int  # rows of the removed files (the matched ones plus the rewritten)
    rewritten: list[NewFile]


def _plan_removal(table: TableState, snapshot_id: int | None, expr: Expr) -> _Removal:
    """Which files a delete of ``expr`` removes, and the rewritten remainder of partial ones."""
    view = table.view(snapshot_id, current_schema=True)
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
        target = table.file_target()
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
                                               table.record.partition_by)
        except BaseException:
            table.discard(rewritten)
            raise
    return _Removal(remove, removed_rows, removed_file_rows, rewritten)


def conflict_on_new_matches(table: TableState, expr: Expr) -> Any:
    """An ``on_rebase`` check: fail if files committed meanwhile may hold matching rows."""

    def check(added: pa.Table) -> None:
        if added.num_rows == 0:
            return
        if isinstance(expr, AlwaysTrue):
            hits = added.num_rows
        else:
            view = table.view(None, current_schema=True)
            cols = [c for c in sorted(referenced_columns(expr)) if c in view.schema.names]
            stats = file_stats(added, view.schema, cols)
            hits = int(pc.sum(pc.fill_null(may_match(expr, stats, view.schema), True))
                       .as_py() or 0)
        if hits:
            raise CommitConflict(
                f"{hits} files committed meanwhile may hold rows this write must replace")

    return check


class RewriteChange(Change):
    """Files ``add`` (written already) committed while every row matching ``expr`` is removed:
    whole files where statistics prove every row matches, the rest of the others rewritten. A
    commit that lands first and may hold matching rows makes it plan again."""

    replans_on = (CommitConflict,)
    attempts = 5

    def __init__(self, table: TableState, kind: str, expr: Expr, add: Sequence[NewFile], *,
                 commit_id: str | None = None) -> None:
        super().__init__(table, kind, commit_id)
        self.expr = expr
        self.add = list(add)
        self.removal = _Removal([], 0, 0, [])

    def plan(self, base: int | None) -> SnapshotChange | None:
        table, expr = self.state, self.expr
        table.discard(self.removal.rewritten)  # an earlier plan's, for an older snapshot
        self.removal = _Removal([], 0, 0, [])
        self.removal = removal = _plan_removal(table, base, expr)
        if not self.add and not removal.remove:
            return None
        return SnapshotChange(
            kind=self.kind, schema_id=table.record.current_schema_id,
            add=self.add + removal.rewritten, remove=removal.remove,
            removed_rows=removal.removed_file_rows, commit_id=self.commit_id,
            summary={"deleted_rows": removal.removed_rows,
                     "rewritten_files": len(removal.rewritten),
                     # For change streams: the removed files' rows matching the filter are
                     # exactly the rows removed; the rewritten files carry rows over.
                     "filter": "" if isinstance(expr, AlwaysTrue) else str(expr),
                     "rewritten_paths": [f.path for f in removal.rewritten]},
            on_rebase=conflict_on_new_matches(table, expr))

    def finish(self, commit: CommitResult) -> WriteResult:
        return write_result(self.kind, commit, self.add, len(self.removal.remove),
                            self.removal.removed_rows)

    def discard(self) -> None:
        self.state.discard([*self.add, *self.removal.rewritten])
        self.add, self.removal = [], _Removal([], 0, 0, [])


def overwrite_change(table: TableState, data: Any, expr: Expr, *,
                     commit_id: str | None = None) -> RewriteChange:
    """Plan an overwrite: ``data`` (every row matching ``expr``) written, to replace the rows
    matching ``expr``."""
    table.refresh()
    target = table.file_target()
    check = None if isinstance(expr, AlwaysTrue) else expr
    files = write_batches(target, conformed(data, target.schema, check=check),
                          table.record.partition_by)
    return RewriteChange(table, "overwrite", expr, files, commit_id=commit_id)


def overwrite(table: TableState, data: Any, expr: Expr, *, commit_id: str | None = None
              ) -> WriteResult:
    return commit(overwrite_change(table, data, expr, commit_id=commit_id))


def delete(table: TableState, expr: Expr, *, commit_id: str | None = None) -> WriteResult:
    return commit(RewriteChange(table, "delete", expr, [], commit_id=commit_id))


def rewrite(table: TableState, kind: str, expr: Expr, add: list[NewFile], *,
            commit_id: str | None = None) -> WriteResult:
    """Commit ``add`` while removing every row matching ``expr`` (delete and overwrite)."""
    return commit(RewriteChange(table, kind, expr, add, commit_id=commit_id))
