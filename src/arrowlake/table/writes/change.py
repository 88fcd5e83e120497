"""Plan, then commit: every write is a :class:`Change` of one table, committed alone by
:func:`commit` or with other tables' changes by :func:`commit_together` (a lake transaction).

A change plans on a snapshot: it writes the files that depend on that snapshot (deleting
those an earlier plan wrote for an older one) and describes its commit as a
:class:`~arrowlake.metastore.records.SnapshotChange`, with the checks the commit makes if other
commits landed since (``on_rebase``, the vectors it extends, the files it removes). Files that
do not depend on the snapshot (an append's, the runs of an upsert) are written once, before.

A conflict the change may get past (``replans_on``: a delete finding new matches, a
merge-on-write upsert finding its vectors extended) plans it again on the newer snapshot, up
to ``attempts`` times; a merge-on-write change that keeps being overtaken plans inside the
commit, holding the table (``hold_after``). Whatever way a change does not commit, every file
it wrote is deleted.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from arrowlake.errors import CommitConflict
from arrowlake.metastore.records import CommitResult, SnapshotChange, TableConflict
from arrowlake.metastore.store import NewFile
from arrowlake.table.state import TableState
from arrowlake.table.writes.commit import WriteResult, write_result


class Change(ABC):
    """One table's write, planned on a snapshot and committed by :func:`commit` or
    :func:`commit_together`."""

    #: Errors after which the change is planned again on the newer snapshot.
    replans_on: tuple[type[CommitConflict], ...] = ()
    #: How many plans a commit makes at most.
    attempts: int = 1
    #: After this many plans, plan inside the commit, holding the table (None: never).
    hold_after: int | None = None

    def __init__(self, state: TableState, kind: str, commit_id: str | None = None) -> None:
        self.state = state
        self.kind = kind
        self.commit_id = commit_id

    @abstractmethod
    def plan(self, base: int | None) -> SnapshotChange | None:
        """Plan on snapshot ``base`` (None: the table has none yet): write what depends on it
        and describe the commit; None when the write changes nothing."""

    @abstractmethod
    def finish(self, commit: CommitResult) -> WriteResult:
        """The write's result, once its commit landed."""

    @abstractmethod
    def discard(self) -> None:
        """Delete every file the change wrote: it will not be committed."""

    def landed(self, commit: CommitResult) -> WriteResult:
        """After the commit: a duplicate's files are deleted; otherwise :meth:`finish`."""
        if commit.duplicate:
            self.discard()
            return WriteResult(commit.snapshot_id, self.kind, attempts=commit.attempts,
                               duplicate=True)
        return self.finish(commit)

    def empty(self) -> WriteResult:
        """The result of a write that changes nothing (no snapshot)."""
        self.discard()
        return WriteResult(None, self.kind)

    def should_plan_again(self, exc: CommitConflict, attempt: int) -> bool:
        """Whether, after ``attempt`` plans, conflict ``exc`` is one to plan again for."""
        return isinstance(exc, self.replans_on) and attempt < self.attempts

    def gave_up(self, exc: CommitConflict) -> CommitConflict:
        """The error once every attempt met a conflict (``exc``, the last one)."""
        return exc


@dataclass(frozen=True)
class Decision:
    """What a primary-key write commits, decided on one snapshot: its rows (table schema and
    ``_row_kind``), what its snapshot's summary records, the check its commit makes of the
    commits landing after that snapshot (a delete's or merge's: did what it read change?), and
    the rows it reports as added and removed, where they differ from what it wrote (a delete
    reports the keys it removed)."""

    rows: pa.Table
    summary: dict[str, Any] = field(default_factory=dict)
    on_rebase: Callable[[pa.Table], None] | None = None
    reported: tuple[int, int] | None = None


#: Decides a primary-key write's rows on a snapshot (None: nothing to write).
Decide = Callable[[int | None], Decision | None]


def commit(change: Change) -> WriteResult:
    """Plan ``change`` on the table's current snapshot and commit it; plan again after a
    conflict it may get past. The table is unchanged by it unless this returns a snapshot."""
    state = change.state
    metastore = state.metastore
    attempt = 0
    try:
        while True:
            attempt += 1
            try:
                if change.hold_after is not None and attempt > change.hold_after \
                        and metastore.can_hold:
                    landed = metastore.commit_holding(state.table_id, change.plan)
                else:
                    state.refresh()
                    base = state.record.current_snapshot_id
                    planned = change.plan(base)
                    landed = None if planned is None else \
                        metastore.commit(state.table_id, base, planned)
                break
            except CommitConflict as exc:
                if change.should_plan_again(exc, attempt):
                    continue
                if isinstance(exc, change.replans_on):
                    raise change.gave_up(exc) from exc
                raise
    except BaseException:
        change.discard()
        raise
    # Landed (or nothing to commit): from here on no file of it is deleted, whatever happens.
    return change.empty() if landed is None else change.landed(landed)


#: How often a lake transaction plans a change again after it met a conflict it may get past.
TRANSACTION_ATTEMPTS = 10


@dataclass
class Planned:
    """A change planned on ``base``: what its commit records (None: it changes nothing)."""

    change: Change
    base: int | None
    snapshot_change: SnapshotChange | None

    @classmethod
    def on(cls, change: Change, base: int | None) -> Planned:
        """Plan ``change`` on ``base`` (deleting its files if that fails)."""
        try:
            return cls(change, base, change.plan(base))
        except BaseException:
            change.discard()
            raise


def commit_together(planned: Sequence[Planned], *, transaction_id: str,
                    commit_id: str | None = None) -> list[WriteResult]:
    """Commit the ``planned`` changes of different tables in one metastore transaction: all
    land, or none does and every file they wrote is deleted. A change that meets a conflict
    it may get past is planned again on its table's newer snapshot and the transaction tried
    again; any other conflict, or too many, fails it with :class:`CommitConflict` naming the
    table."""
    changes = [(p.change, p.base) for p in planned]
    bases = [p.base for p in planned]
    snapshot_changes = [p.snapshot_change for p in planned]
    try:
        live = [i for i, p in enumerate(snapshot_changes) if p is not None]
        results = _commit_planned(changes, live, bases, snapshot_changes, transaction_id,
                                  commit_id) if live else []
    except BaseException:
        for change, _ in changes:
            change.discard()
        raise
    # Landed: from here on no file of it is deleted, whatever happens.
    by_index = dict(zip(live, results, strict=True))
    return [change.landed(by_index[i]) if i in by_index else change.empty()
            for i, (change, _) in enumerate(changes)]


def _commit_planned(changes: Sequence[tuple[Change, int | None]], live: list[int],
                    bases: list[int | None], planned: list[SnapshotChange | None],
                    transaction_id: str, commit_id: str | None) -> list[CommitResult]:
    metastore = changes[0][0].state.metastore
    for attempt in range(1, TRANSACTION_ATTEMPTS + 1):
        entries = []
        for i in live:
            change = planned[i]
            assert change is not None
            entries.append((changes[i][0].state.table_id, bases[i], change))
        try:
            return metastore.commit_many(entries, transaction_id=transaction_id,
                                         commit_id=commit_id)
        except TableConflict as exc:
            i = next(i for i in live if changes[i][0].state.table_id == exc.table_id)
            change_i = changes[i][0]
            if not change_i.should_plan_again(exc.cause, attempt) or \
                    attempt == TRANSACTION_ATTEMPTS:
                raise CommitConflict(
                    f"The transaction could not commit its {change_i.kind} of table "
                    f"'{change_i.state.name}': {exc.cause}. Nothing of it was committed and "
                    "every table is unchanged; run the transaction again") from exc.cause
            change_i.state.refresh()
            bases[i] = change_i.state.record.current_snapshot_id
            replanned = change_i.plan(bases[i])
            if replanned is None:
                live.remove(i)
                if not live:
                    return []
            planned[i] = replanned
    raise AssertionError("unreachable")


class FilesChange(Change):
    """Files written already, committed as they are (appends; runs of a merge-on-read table
    whose producer needs no changelog)."""

    def __init__(self, state: TableState, kind: str, files: Sequence[NewFile], *,
                 commit_id: str | None = None, summary: dict[str, object] | None = None,
                 deletion_vectors: bool | None = None) -> None:
        super().__init__(state, kind, commit_id)
        self.files = list(files)
        self.summary = dict(summary or {})
        self.deletion_vectors = deletion_vectors

    def plan(self, base: int | None) -> SnapshotChange | None:
        if not self.files:
            return None
        return SnapshotChange(kind=self.kind, schema_id=self.state.record.current_schema_id,
                              add=self.files, commit_id=self.commit_id,
                              summary=self.summary, deletion_vectors=self.deletion_vectors)

    def finish(self, commit: CommitResult) -> WriteResult:
        return write_result(self.kind, commit, self.files, 0, 0)

    def discard(self) -> None:
        self.state.discard(self.files)
        self.files = []
