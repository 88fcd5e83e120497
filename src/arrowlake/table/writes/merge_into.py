"""MERGE INTO for primary-key tables, executed as merge-on-read writes.

The source is joined to the current rows of the keys it names; clauses apply in the order given,
and for each source row the first clause whose condition holds wins (SQL MERGE). Only changed
keys are written: updates and inserts as new versions, deletes as tombstones, all in one commit.
Conditions and values refer to ``source.<col>`` and ``target.<col>``; an unqualified name means
the source column.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.errors import ColumnNotFound, ValidationError
from arrowlake.expressions import (
    AlwaysTrue,
    Column,
    Expr,
    Literal,
    col,
    evaluate,
    referenced_columns,
    rename_columns,
    to_expression,
)
from arrowlake.merge import ROW_KIND, RowKind
from arrowlake.metastore.inflight import registered_write
from arrowlake.schema import conform
from arrowlake.table.keys.lookup import key_range_filter, literal_keys
from arrowlake.table.options.primary_key import require_primary_key
from arrowlake.table.writes.change import Change, Decision, commit
from arrowlake.table.writes.commit import WriteResult
from arrowlake.table.writes.inputs import batch_stream
from arrowlake.table.writes.keyed import (
    check_deletes_supported,
    check_sequence_values,
    conflict_on_touched_keys,
    rows_change,
    scan_at,
    with_kinds,
)

if TYPE_CHECKING:
    from arrowlake.table.state import TableState


@dataclass(frozen=True)
class MergeResult:
    """What a merge committed."""

    snapshot_id: int | None
    inserted: int
    updated: int
    deleted: int
    unchanged: int  # source rows no clause applied to


@dataclass(frozen=True)
class _Clause:
    matched: bool
    action: str  # "update" | "delete" | "insert"
    where: Expr
    values: Mapping[str, Any] | None


def _qualify(expr: Expr, source_names: Sequence[str]) -> Expr:
    mapping = {c: f"source.{c}" for c in referenced_columns(expr)
               if not c.startswith(("source.", "target.")) and c in source_names}
    return rename_columns(expr, mapping) if mapping else expr


@dataclass(frozen=True)
class MergeBuilder:
    """Built by :meth:`Table.merge`; every ``when_*`` returns a new builder."""

    table: TableState
    source: pa.Table
    on: tuple[str, ...]
    clauses: tuple[_Clause, ...] = ()
    # What follows the merge's commit (the facade's compaction of the buckets it touched).
    after_commit: Callable[[TableState, WriteResult], WriteResult] | None = None

    @classmethod
    def start(cls, table: TableState, source: Any, on: str | Sequence[str], *,
              after_commit: Callable[[TableState, WriteResult], WriteResult] | None = None
              ) -> MergeBuilder:
        require_primary_key(table, "merge()")
        keys = (on,) if isinstance(on, str) else tuple(on)
        if set(keys) != set(table.record.primary_key):
            raise ValidationError(
                f"merge(on={list(keys)}) must name the primary key "
                f"{list(table.record.primary_key)}")
        schema, batches = batch_stream(source)
        src = pa.Table.from_batches(list(batches), schema=schema)
        missing = [k for k in keys if k not in src.column_names]
        if missing:
            raise ValidationError(f"The merge source lacks the key columns {missing}")
        return cls(table, _conformed_source(table, src), keys, after_commit=after_commit)

    def _add(self, clause: _Clause) -> MergeBuilder:
        return replace(self, clauses=(*self.clauses, clause))

    def _where(self, where: Expr | str | None) -> Expr:
        return _qualify(to_expression(where), self.source.column_names)

    def _check_columns(self, values: Mapping[str, Any] | None, what: str) -> None:
        if values is None:
            return
        names = self.table.schema.names
        unknown = [c for c in values if c not in names]
        if unknown:
            raise ColumnNotFound(
                f"{what} names columns table '{self.table.name}' does not have: {unknown}; "
                f"its columns are {', '.join(names)}")

    def when_matched_update(self, set: Mapping[str, Any] | None = None,
                            where: Expr | str | None = None) -> MergeBuilder:
        """Update matched rows: ``set`` maps columns to ``"source.x"``/``"target.x"``,
        ``al.col(...)``, ``al.lit(...)`` or plain values; without ``set`` every column comes
        from the source."""
        self._check_columns(set, "when_matched_update(set=...)")
        return self._add(_Clause(True, "update", self._where(where), set))

    def when_matched_delete(self, where: Expr | str | None = None) -> MergeBuilder:
        """Delete matched rows (refused where the merge engine does not remove deleted keys,
        see :func:`~arrowlake.table.writes.keyed.check_deletes_supported`)."""
        check_deletes_supported(self.table, "merge().when_matched_delete()")
        return self._add(_Clause(True, "delete", self._where(where), None))

    def when_not_matched_insert(self, values: Mapping[str, Any] | None = None,
                                where: Expr | str | None = None) -> MergeBuilder:
        self._check_columns(values, "when_not_matched_insert(values=...)")
        return self._add(_Clause(False, "insert", self._where(where), values))

    # -- execution -----------------------------------------------------------------------------

    def _joined(self, base: int | None) -> pa.Table:
        table = self.table
        src = self.source
        dupes = src.group_by(list(self.on)).aggregate([([], "count_all")])
        many = pc.sum(pc.greater(dupes.column("count_all"), 1)).as_py() or 0
        if many:
            raise ValidationError(
                f"{many} keys appear more than once in the merge source; each target row may "
                "be matched by one source row only")
        first = self.on[0]
        keys = pc.unique(src.column(first))
        literals = literal_keys(keys)
        if literals is not None:
            target = scan_at(table, base, col(first).isin(literals))
        else:  # keys a filter literal cannot hold (years past 9999): their range, then Arrow
            target = scan_at(table, base, key_range_filter(first, keys))
            target = target.filter(pc.is_in(target.column(first), value_set=keys))
        left = src.rename_columns([f"source.{c}" for c in src.column_names])
        right = target.rename_columns([f"target.{c}" for c in target.column_names])
        right = right.append_column("target.__matched", pa.array(
            np.ones(right.num_rows, dtype=bool)))
        left = left.append_column("source.__row", pa.array(np.arange(left.num_rows)))
        joined = left.join(right, keys=[f"source.{k}" for k in self.on],
                           right_keys=[f"target.{k}" for k in self.on],
                           join_type="left outer", coalesce_keys=False, use_threads=False)
        return joined.sort_by("source.__row")

    def _value(self, joined: pa.Table, spec: Any, column: str) -> pa.ChunkedArray | pa.Array:
        if isinstance(spec, str) and spec.startswith(("source.", "target.")):
            spec = Column(spec)
        if isinstance(spec, Column):
            if spec.name not in joined.column_names:
                raise ValidationError(
                    f"Merge value for '{column}' refers to unknown column '{spec.name}'")
            return joined.column(spec.name)
        if isinstance(spec, Literal):
            spec = spec.value
        return pa.array([spec] * joined.num_rows)

    def _rows(self, joined: pa.Table, mask: np.ndarray, values: Mapping[str, Any] | None,
              default_prefix: str) -> pa.Table:
        schema = self.table.schema
        picked = joined.filter(pa.array(mask))
        arrays = []
        for field in schema:
            if values is not None and field.name in values:
                arr = self._value(picked, values[field.name], field.name)
            elif values is None and f"source.{field.name}" in picked.column_names:
                arr = picked.column(f"source.{field.name}")
            elif f"{default_prefix}.{field.name}" in picked.column_names:
                arr = picked.column(f"{default_prefix}.{field.name}")
            elif field.name in self.on:
                arr = picked.column(f"source.{field.name}")
            else:
                arr = pa.nulls(picked.num_rows, field.type)
            arrays.append(arr)
        out = pa.table(arrays, names=schema.names)
        return pa.Table.from_batches(
            [conform(b, schema, where="merge result") for b in out.to_batches()], schema=schema)

    def execute(self) -> MergeResult:
        """Plan the merge on the current snapshot and commit it.

        The commit fails inside its transaction when a run committed after that snapshot may
        hold one of the source's keys (what the clauses decided on may have changed); the merge
        is then planned again on the newer snapshot, up to a few times, before it fails with
        :class:`~arrowlake.errors.CommitConflict` leaving the table unchanged.
        """
        table = self.table
        with registered_write(table.metastore, table.record.table_id, "merge"):
            change, counts = self.change()
            result = commit(change)
            if self.after_commit is not None:
                result = self.after_commit(table, result)
        return merge_result(result, counts)

    def change(self) -> tuple[Change, dict[str, int]]:
        """The merge as a change of its table, decided on the snapshot it is planned on (and
        again on each newer one a conflict makes it plan on), and the counts of its last
        decision (inserted, updated, deleted, unchanged), filled in as it decides."""
        if not self.clauses:
            raise ValidationError("A merge needs at least one when_* clause")
        self.table.refresh()
        counts = {"insert": 0, "update": 0, "delete": 0, "unchanged": 0}

        def decide(base: int | None) -> Decision | None:
            return self._decide(base, counts)

        return rows_change(self.table, "merge", decide, decides=True), counts

    def _decide(self, base: int | None, out: dict[str, int]) -> Decision | None:
        table = self.table
        joined = self._joined(base)
        n = joined.num_rows
        matched = pc.fill_null(joined.column("target.__matched"), False).to_numpy(
            zero_copy_only=False).astype(bool)
        assigned = np.zeros(n, dtype=bool)
        parts: list[pa.Table] = []
        counts = {"insert": 0, "update": 0, "delete": 0}
        for clause in self.clauses:
            applicable = (matched if clause.matched else ~matched) & ~assigned
            if not isinstance(clause.where, AlwaysTrue) and applicable.any():
                cond = evaluate(clause.where, joined)
                cond_np = pc.fill_null(cond, False).to_numpy(zero_copy_only=False).astype(bool)
                applicable &= cond_np
            if not applicable.any():
                continue
            assigned |= applicable
            counts[clause.action] += int(applicable.sum())
            if clause.action == "delete":
                rows = self._rows(joined, applicable, {}, "target")
                parts.append(with_kinds(rows, RowKind.DELETE))
            elif clause.action == "update":
                rows = self._rows(joined, applicable, clause.values, "target")
                parts.append(with_kinds(rows, RowKind.UPDATE_AFTER))
            else:
                rows = self._rows(joined, applicable, clause.values, "source")
                parts.append(with_kinds(rows, RowKind.INSERT))
        out.update(counts, unchanged=n - int(assigned.sum()))
        if not parts:
            return None
        rows = pa.concat_tables(parts)
        assert ROW_KIND in rows.column_names
        check_sequence_values(table, rows)
        # Every source key was decided on (matched or not): a new version of any may change
        # the outcome, so all of them are checked against commits landing meanwhile.
        return Decision(rows, dict(counts), conflict_on_touched_keys(table, self.source, base))


def merge_result(result: WriteResult, counts: dict[str, int]) -> MergeResult:
    """What a merge did, once its change committed (``result``) with these ``counts`` (rows
    the clauses chose, even where the engine then changed nothing: a ``first-row`` update)."""
    return MergeResult(result.snapshot_id, counts["insert"], counts["update"],
                       counts["delete"], counts["unchanged"])


def _conformed_source(table: TableState, src: pa.Table) -> pa.Table:
    """The source with the columns the table also has cast to the table's types (safely:
    a value that does not fit raises :class:`SchemaMismatch` naming the column)."""
    shared = [c for c in src.column_names if c in table.schema.names]
    schema = pa.schema([table.schema.field(c) for c in shared])
    cast = pa.Table.from_batches(
        [conform(b, schema, where="merge source") for b in src.select(shared).to_batches()],
        schema=schema)
    for name in shared:
        src = src.set_column(src.column_names.index(name), schema.field(name),
                             cast.column(name))
    return src
