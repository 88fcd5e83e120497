"""Lake transactions and consistent cuts across tables.

``lake.transaction()`` gathers writes to several tables and commits them in one metastore
transaction: every table's new snapshot lands, or none does. Each write is planned when it is
made, on its table's snapshot as of the transaction's start: its files are written then, and
its change (what the commit records and checks) waits for the commit. Reads inside see every
table as of the start, without the transaction's own writes. The commit checks each written
table's change by the rules of a single write; a conflict a write may get past (a delete that
finds new matches, a merge-on-write upsert whose lookups went stale) plans that change again on
the newer snapshot and tries again; anything else fails the whole transaction with
:class:`~arrowlake.errors.CommitConflict`, and every file it wrote is deleted.

Isolation is snapshot isolation: only the tables the transaction writes are checked, so two
transactions that each read the table the other writes can both commit (write skew).

``lake.snapshot()`` reads every table's current snapshot in one query: a cut that a lake
transaction's commit is either wholly before or wholly after.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import pyarrow as pa

from arrowlake.errors import ValidationError
from arrowlake.expressions import Expr, to_arrow, to_expression
from arrowlake.metastore.inflight import WriteRegistration, writing_under
from arrowlake.table.maintenance.after_write import compact_after_write
from arrowlake.table.options.primary_key import require_primary_key
from arrowlake.table.staged import StagedWrite, WriteMode, staged_change, stages_registration
from arrowlake.table.state import TableState
from arrowlake.table.table import Table
from arrowlake.table.writes import keyed, plain
from arrowlake.table.writes.change import Change, FilesChange, Planned, commit_together
from arrowlake.table.writes.commit import WriteResult
from arrowlake.table.writes.merge_into import MergeBuilder, MergeResult, merge_result

if TYPE_CHECKING:
    import pandas as pd

    from arrowlake.scan.scan import Scan

_R = TypeVar("_R")


class Pending(Generic[_R]):
    """The result of a write made inside a transaction: known once the transaction commits
    (``result``), or never, when it aborts."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._value: _R | None = None
        self._state = "pending"

    @property
    def done(self) -> bool:
        return self._state == "committed"

    @property
    def result(self) -> _R:
        if self._state == "pending":
            raise ValidationError(
                f"The {self._what} is committed when its transaction is: read its result "
                "after the `with lake.transaction()` block (or tx.commit())")
        if self._state == "aborted":
            raise ValidationError(f"The {self._what} was not committed: its transaction "
                                  "aborted")
        assert self._value is not None
        return self._value

    def _set(self, value: _R) -> None:
        self._value, self._state = value, "committed"

    def _abort(self) -> None:
        self._state = "aborted"

    def __repr__(self) -> str:
        return f"<Pending {self._what}: {self._value if self.done else self._state}>"


class _Entry:
    """One table's write of a transaction: its change, planned, and who waits for it."""

    def __init__(self, table: Table, planned: Planned) -> None:
        self.table = table
        self.planned = planned
        self.waiting: list[tuple[Pending[Any], Callable[[WriteResult], Any]]] = []


class Transaction:
    """Writes to several tables committed at once; made by :meth:`arrowlake.Lake.transaction`.

    >>> with lake.transaction() as tx:                       # doctest: +SKIP
    ...     tx.table("shop.orders").append(orders)
    ...     tx.table("shop.lines").upsert(lines)
    """

    def __init__(self, open_table: Callable[[str], Table], heads: Mapping[int, int | None],
                 registration: WriteRegistration, *, commit_id: str | None = None) -> None:
        self.id = uuid.uuid4().hex
        self.commit_id = commit_id
        self._open = open_table
        self._heads = dict(heads)  # every table's snapshot at the start
        self._registration = registration
        self._tables: dict[str, TransactionTable] = {}
        self._entries: dict[int, _Entry] = {}
        self._state = "open"

    # -- tables --------------------------------------------------------------------------------

    def table(self, name: str) -> TransactionTable:
        """The table ``name`` inside the transaction: reads as of the transaction's start,
        writes committed with the transaction."""
        self._check_open()
        if name not in self._tables:
            table = self._open(name)
            table_id = table.state.table_id
            if table_id not in self._heads:  # created after the transaction started
                self._heads[table_id] = None
            self._tables[name] = TransactionTable(self, table, self._heads[table_id])
        return self._tables[name]

    @property
    def write_id(self) -> str:
        """The transaction's registration of writes in flight: files written for it by other
        processes (a Spark job's tasks) carry it, and it is checked when it commits."""
        return self._registration.write_id

    @property
    def snapshot_ids(self) -> dict[str, int | None]:
        """The snapshot each table used in the transaction was at when it started."""
        return {name: t.snapshot_id for name, t in self._tables.items()}

    # -- writes --------------------------------------------------------------------------------

    def _submit(self, table: Table, make: Callable[[], Change], what: str,
                then: Callable[[WriteResult], _R], *, commit_id: str | None = None
                ) -> Pending[_R]:
        self._check_open()
        if commit_id is not None:
            raise ValidationError(
                f"A {what} inside a transaction takes no commit_id of its own: give "
                "lake.transaction(commit_id=...), which makes the whole transaction idempotent")
        state = table.state
        state.check_write()
        pending: Pending[_R] = Pending(f"{what} of {table.name}")
        base = self._heads.get(state.table_id)
        with writing_under(self._registration.write_id):
            change = make()
            entry = self._entries.get(state.table_id)
            if entry is None:
                entry = _Entry(table, Planned.on(change, base))
                self._entries[state.table_id] = entry
            elif isinstance(change, FilesChange) and change.kind == "append" and \
                    isinstance(entry.planned.change, FilesChange) and \
                    entry.planned.change.kind == "append":
                # Appends to one table are one change: their files commit together.
                earlier = entry.planned.change
                earlier.files += change.files
                entry.planned = Planned.on(earlier, base)
            else:
                change.discard()
                raise ValidationError(
                    f"This transaction writes table '{table.name}' already: a transaction "
                    "makes one write per table (appends excepted, which it joins). Combine the "
                    "rows into one write (an upsert or write_changes of all of them), or use "
                    "a transaction per write")
        entry.waiting.append((pending, then))
        return pending

    # -- ending --------------------------------------------------------------------------------

    def commit(self) -> dict[str, WriteResult]:
        """Commit every write made in the transaction in one metastore transaction (or none,
        raising :class:`~arrowlake.errors.CommitConflict` with every file deleted); then
        compact the written tables that compact inline. The result of each table's write,
        by table name."""
        self._check_open()
        self._state = "committing"
        entries = list(self._entries.values())
        try:
            with writing_under(self._registration.write_id):
                results = commit_together([e.planned for e in entries], transaction_id=self.id,
                                          commit_id=self.commit_id)
        except BaseException:
            self._state = "aborted"
            for entry in entries:
                for pending, _ in entry.waiting:
                    pending._abort()
            self._registration.end()
            raise
        self._state = "committed"
        out: dict[str, WriteResult] = {}
        with writing_under(self._registration.write_id):
            for entry, result in zip(entries, results, strict=True):
                if result.snapshot_id is not None and not result.duplicate:
                    # A write committed in a transaction compacts after it, not inside it.
                    result = compact_after_write(entry.table.state, result)
                for pending, then in entry.waiting:
                    pending._set(then(result))
                out[entry.table.name] = result
        self._registration.end()
        return out

    def abort(self) -> None:
        """Give up every write of the transaction: nothing is committed, every file it wrote
        is deleted."""
        if self._state != "open":
            return
        self._state = "aborted"
        try:
            for entry in self._entries.values():
                entry.planned.change.discard()
                for pending, _ in entry.waiting:
                    pending._abort()
        finally:
            self._registration.end()

    def _check_open(self) -> None:
        if self._state != "open":
            raise ValidationError(f"The transaction is {self._state}: start a new one")

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is None:
            self.commit()
        else:
            self.abort()

    def __repr__(self) -> str:
        return f"<arrowlake.Transaction {self.id} {self._state}: {len(self._entries)} tables>"


class _PinnedReads:
    """Reads of one table at one snapshot (None: before its first commit, no rows)."""

    _table: Table
    snapshot_id: int | None

    @property
    def name(self) -> str:
        return self._table.name

    @property
    def schema(self) -> pa.Schema:
        """The table's schema as of the snapshot."""
        return self.scan().schema

    def scan(self, filter: Expr | str | None = None, columns: Sequence[str] | None = None, *,
             limit: int | None = None) -> Scan:
        """A scan of the table at the pinned snapshot (see :meth:`Table.scan`)."""
        return self._table.scan_at(self.snapshot_id, filter, columns, limit=limit)

    def to_arrow(self) -> pa.Table:
        return self.scan().to_arrow()

    def to_pandas(self, **kwargs: Any) -> pd.DataFrame:
        return self.scan().to_pandas(**kwargs)

    def count(self) -> int:
        return self.scan().count()

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.scan().__arrow_c_stream__(requested_schema)


class TransactionTable(_PinnedReads):
    """A table inside a transaction (:meth:`Transaction.table`). Its reads see the table as of
    the transaction's start; its writes return :class:`Pending` results, filled in by the
    commit. One write per table per transaction (appends are joined)."""

    def __init__(self, tx: Transaction, table: Table, snapshot_id: int | None) -> None:
        self._tx = tx
        self._table = table
        self.snapshot_id = snapshot_id

    @property
    def state(self) -> TableState:
        """The table's state, for writers built on arrowlake's internals (staged writes)."""
        return self._table.state

    def append(self, data: Any, *, commit_id: str | None = None) -> Pending[WriteResult]:
        """Add rows (an upsert on a primary-key table, as :meth:`Table.append`)."""
        state = self._table.state
        if state.record.primary_key:
            return self.upsert(data, commit_id=commit_id)
        return self._tx._submit(self._table, lambda: plain.append_change(state, data),
                                "append", _same, commit_id=commit_id)

    def upsert(self, data: Any, *, commit_id: str | None = None) -> Pending[WriteResult]:
        state = self._table.state
        return self._tx._submit(self._table, lambda: keyed.upsert_change(state, data),
                                "upsert", _same, commit_id=commit_id)

    def write_changes(self, data: Any, row_kind: str = "op", *,
                      commit_id: str | None = None) -> Pending[WriteResult]:
        state = self._table.state
        return self._tx._submit(
            self._table, lambda: keyed.changes_change(state, data, row_kind), "write_changes",
            _same, commit_id=commit_id)

    def overwrite(self, data: Any, filter: Expr | str | None = None, *,
                  commit_id: str | None = None) -> Pending[WriteResult]:
        state = self._table.state
        expr = to_expression(filter)
        if state.record.primary_key:
            return self._tx._submit(
                self._table, lambda: keyed.overwrite_change(state, data, expr), "overwrite",
                _same, commit_id=commit_id)
        return self._tx._submit(self._table, lambda: plain.overwrite_change(state, data, expr),
                                "overwrite", _same, commit_id=commit_id)

    def delete(self, filter: Expr | str, *, commit_id: str | None = None
               ) -> Pending[WriteResult]:
        state = self._table.state
        expr = to_expression(filter)
        state.refresh()
        to_arrow(expr, state.schema)  # validate before touching anything
        if state.record.primary_key:
            return self._tx._submit(self._table, lambda: keyed.delete_change(state, expr),
                                    "delete", _same, commit_id=commit_id)
        return self._tx._submit(self._table, lambda: plain.RewriteChange(
            state, "delete", expr, []), "delete", _same, commit_id=commit_id)

    def merge(self, source: Any, on: str | Sequence[str]) -> TransactionMerge:
        """A MERGE INTO committed with the transaction; finish with ``.execute()``."""
        state = self._table.state
        require_primary_key(state, "merge()")
        return TransactionMerge(self, MergeBuilder.start(state, source, on))

    def write_staged(self, staged: Sequence[StagedWrite], mode: WriteMode = "append", *,
                     replace_where: Expr | None = None) -> Pending[WriteResult]:
        """Commit files that workers wrote (:func:`arrowlake.table.staged.stage`) with the
        transaction; they must come from one ``write_target`` of this table."""
        state = self._table.state
        stages_registration(state, staged)
        return self._tx._submit(
            self._table, lambda: staged_change(state, staged, mode, replace_where=replace_where),
            f"write of {mode}", _same)

    def __repr__(self) -> str:
        return f"<TransactionTable {self.name} at snapshot {self.snapshot_id}>"


def _same(result: WriteResult) -> WriteResult:
    return result


class TransactionMerge:
    """A MERGE INTO inside a transaction: the clauses of :class:`MergeBuilder`, then
    ``execute()`` plans it with the transaction's other writes."""

    def __init__(self, table: TransactionTable, builder: MergeBuilder) -> None:
        self._table = table
        self._builder = builder

    def when_matched_update(self, set: Mapping[str, Any] | None = None,
                            where: Expr | str | None = None) -> TransactionMerge:
        return TransactionMerge(self._table, self._builder.when_matched_update(set, where))

    def when_matched_delete(self, where: Expr | str | None = None) -> TransactionMerge:
        return TransactionMerge(self._table, self._builder.when_matched_delete(where))

    def when_not_matched_insert(self, values: Mapping[str, Any] | None = None,
                                where: Expr | str | None = None) -> TransactionMerge:
        return TransactionMerge(self._table, self._builder.when_not_matched_insert(values, where))

    def execute(self) -> Pending[MergeResult]:
        made: dict[str, dict[str, int]] = {}

        def make() -> Change:
            change, counts = self._builder.change()
            made["counts"] = counts
            return change

        return self._table._tx._submit(self._table._table, make, "merge",
                                       lambda result: merge_result(result, made["counts"]))


class LakeSnapshot:
    """Every table of a lake as of one moment (:meth:`arrowlake.Lake.snapshot`): the snapshot
    each table was at when the cut was taken, in one query, so that a lake transaction's
    writes are either all in it or none."""

    def __init__(self, open_table: Callable[[str], Table], heads: Mapping[int, int | None],
                 taken_at: datetime) -> None:
        self._open = open_table
        self._heads = dict(heads)
        self.taken_at = taken_at

    def table(self, name: str) -> SnapshotTable:
        """Table ``name`` as of the cut (no rows if it had none; refused if created after)."""
        table = self._open(name)
        table_id = table.state.table_id
        if table_id not in self._heads:
            raise ValidationError(
                f"Table '{name}' was created after this lake snapshot was taken "
                f"({self.taken_at.isoformat()}): it has no state in it")
        return SnapshotTable(table, self._heads[table_id])

    def __repr__(self) -> str:
        return f"<arrowlake.LakeSnapshot of {len(self._heads)} tables at {self.taken_at}>"


class SnapshotTable(_PinnedReads):
    """A table pinned at one snapshot (read-only): every read of :class:`Table` at
    ``snapshot_id``, including ``scan().plan()`` splits for other processes; for Spark,
    ``arrowlake.spark.read(..., snapshot=t.snapshot_id)``."""

    def __init__(self, table: Table, snapshot_id: int | None) -> None:
        self._table = table
        self.snapshot_id = snapshot_id

    @property
    def table(self) -> Table:
        """The table itself (current, writable)."""
        return self._table

    def __repr__(self) -> str:
        return f"<SnapshotTable {self.name} at snapshot {self.snapshot_id}>"
