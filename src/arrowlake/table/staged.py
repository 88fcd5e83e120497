"""Two-phase writes: workers write data files, one process commits them all at once.

Engines that write from many processes (Spark executors, Dask workers, Flight handlers) call
:func:`stage` where the data is, with a :class:`WriteTarget` the committing process made by
:func:`write_target` (it is picklable and holds everything writing needs: no metastore access
happens while staging). Each call returns a picklable :class:`StagedWrite`: the files it wrote.
The committing process then calls :func:`commit_staged` once with all of them: one snapshot,
one metastore transaction. If the commit fails, or the job is abandoned
(:func:`discard_staged`), the staged files are deleted; files of workers that died before
reporting are left to ``remove_orphan_files``.

:func:`write_target` registers the write in flight (metastore/inflight.py) in the process
that makes it, which renews the registration while it lives; workers name every file they
write after it, so orphan removal never takes them however long the job runs, and the commit
fails if the registration was revoked (the committing process died or stalled past its
lease). The registration ends when the target is finished (:meth:`WriteTarget.finish`) or
collected; a streaming query's target lives as long as the query, one commit per batch.

Primary-key tables: each stage writes one sorted run per bucket its rows hit, and every run of
a commit gets the commit's sequence number. Versions of one key written by two stages of the
same commit would then tie, so :func:`commit_staged` settles them: the rule is that stages
apply in the order of ``StagedWrite.order`` (a Spark job passes the task's partition id), as
if their rows had been written one after the other in one call. Buckets where no key appears
in two stages (the usual case: upserted keys are unique, or the input was repartitioned by
bucket) are committed as written, without reading them back when the stages' recorded key ranges
do not meet; the runs of a bucket where keys do repeat are merged into one
run before the commit, with the table's merge engine and in stage order.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from arrowlake.errors import ValidationError
from arrowlake.expressions import AlwaysTrue, Expr, referenced_columns, to_arrow
from arrowlake.io.storage import Storage
from arrowlake.io.writer import write_batches
from arrowlake.merge.runs import KIND_COLUMN, key_bounds_compare, key_range
from arrowlake.merge.versions import is_retraction
from arrowlake.metastore.inflight import WriteRegistration, writing_under
from arrowlake.metastore.store import Metastore, NewFile, TableRecord
from arrowlake.table.keys import runs as sorted_runs
from arrowlake.table.maintenance.after_write import compact_after_write
from arrowlake.table.options.primary_key import sequence_field
from arrowlake.table.state import TableState
from arrowlake.table.writes import keyed as pk
from arrowlake.table.writes.change import Change, FilesChange, commit
from arrowlake.table.writes.commit import WriteResult
from arrowlake.table.writes.inputs import conformed
from arrowlake.table.writes.on_write import write_tombstones
from arrowlake.table.writes.plain import RewriteChange

#: ``append`` adds rows (an upsert on a primary-key table); ``upsert`` and ``changes`` need a
#: primary key; ``overwrite`` replaces the table, or the rows ``replace_where`` selects.
WriteMode = Literal["append", "upsert", "changes", "overwrite"]
WRITE_MODES = ("append", "upsert", "changes", "overwrite")


class WriteTarget(TableState):
    """A table as a writer needs it, detached from the metastore (picklable): its record,
    storage and schema, so :func:`stage` and the library's file writers take it as the table.
    ``write_id`` is the write's registration; only the process that made the target holds it.
    """

    def __init__(self, record: TableRecord, storage: Storage, schema: pa.Schema,
                 write_id: str | None = None,
                 registration: WriteRegistration | None = None) -> None:
        super().__init__(None, record, storage=storage, schema=schema)
        self.write_id = write_id
        self._registration = registration

    def writing(self) -> AbstractContextManager[None]:
        """Inside, files written (by a task, in any process) belong to this write."""
        return writing_under(self.write_id)

    def finish(self, metastore: Metastore | None = None) -> None:
        """End the write's registration (its files are committed or discarded). A process
        that holds only a pickled copy (the commit of a detached write) passes the metastore."""
        if self._registration is not None:
            self._registration.end()
        elif metastore is not None and self.write_id is not None:
            metastore.end_write(self.write_id)

    def __getstate__(self) -> dict[str, object]:
        # The registration stays with the process holding it.
        return {**super().__getstate__(), "write_id": self.write_id}

    def __setstate__(self, state: dict[str, object]) -> None:
        super().__setstate__(state)
        self.write_id = state["write_id"]  # type: ignore[assignment]
        self._registration = None


def write_target(table: TableState, kind: str = "staged", *,
                 detached_lease: float | None = None) -> WriteTarget:
    """The table's current definition, to hand to workers, and the write's registration
    (``kind`` names the writer: spark, dask, flight, ...). With ``detached_lease`` (seconds)
    the registration is held by no process and lasts that long after it was made or last
    committed under (see :class:`~arrowlake.metastore.inflight.WriteRegistration`): for
    writers whose commit runs in another process than the one that made the target."""
    table.check_write()
    table.refresh()
    registration = WriteRegistration(table.metastore, table.record.table_id, kind,
                                     detached_lease=detached_lease)
    return WriteTarget(table.record, table.storage, table.schema, registration.write_id,
                       registration)


@dataclass(frozen=True)
class StagedWrite:
    """Files one worker wrote and has not committed (picklable)."""

    files: tuple[NewFile, ...]
    rows: int  # input rows written
    order: int = 0  # stages of a commit apply in this order (see the module docstring)
    write_id: str | None = None  # the registration the files were written under


def check_mode(target: TableState, mode: str, replace_where: Expr | None) -> None:
    """Refuse a mode or filter the table cannot take, before anything is written."""
    rec = target.record
    if mode not in WRITE_MODES:
        raise ValidationError(f"Unknown write mode {mode!r}; use one of {', '.join(WRITE_MODES)}")
    if mode in ("upsert", "changes") and not rec.primary_key:
        raise ValidationError(
            f"Write mode {mode!r} needs a table with a primary key; '{rec.full_name}' has none. "
            "Use 'append' or 'overwrite'")
    if (mode in ("upsert", "changes")
            and rec.properties.get("changelog-producer", "none") == "input"):
        # Workers fold repeated keys as they write runs, so the rows as given are gone by the
        # time the driver commits.
        raise ValidationError(
            f"Table '{rec.full_name}' has changelog_producer 'input', which records the input "
            "rows exactly as given; engine writes (Spark, Dask) cannot keep them yet. Write "
            "through Table.upsert()/write_changes() in one process, or use 'lookup'")
    if replace_where is not None and not isinstance(replace_where, AlwaysTrue):
        if mode != "overwrite":
            raise ValidationError("replace_where (replaceWhere) is only for overwrites")
        to_arrow(replace_where, target.schema)
        outside = referenced_columns(replace_where) - set(rec.partition_by)
        if rec.primary_key and outside:
            raise ValidationError(
                f"An overwrite of primary-key table '{rec.full_name}' may only filter on "
                f"partition columns ({', '.join(rec.partition_by) or 'none'}); the filter uses "
                f"{sorted(outside)}")


def stage(target: WriteTarget, data: Any, mode: WriteMode = "append", *,
          replace_where: Expr | None = None, row_kind: str = "op", order: int = 0
          ) -> StagedWrite:
    """Write ``data`` (anything :meth:`Table.append` takes) as uncommitted files.

    With ``mode="overwrite"`` and ``replace_where``, every row must match the filter. With
    ``mode="changes"``, column ``row_kind`` holds each row's kind (``+I -U +U -D`` or 0-3).
    On an error the files written so far are deleted.
    """
    check_mode(target, mode, replace_where)
    with writing_under(target.write_id):
        files, rows = _stage(target, data, mode, replace_where, row_kind)
    return StagedWrite(tuple(files), rows, order, target.write_id)


def _stage(target: WriteTarget, data: Any, mode: WriteMode, replace_where: Expr | None,
           row_kind: str) -> tuple[list[NewFile], int]:
    rec = target.record
    table = target
    check = None if replace_where is None or isinstance(replace_where, AlwaysTrue) \
        else replace_where
    if not rec.primary_key:
        files = write_batches(table.file_target(),
                              conformed(data, target.schema, check=check),
                              rec.partition_by)
        return files, sum(f.row_count for f in files)
    if mode == "changes":
        rows = pk.change_rows(table, data, row_kind)
    else:
        batches = list(conformed(data, target.schema, check=check))
        plain = pa.Table.from_batches(batches, schema=target.schema) if batches \
            else target.schema.empty_table()
        rows = pk.with_kinds(plain, pk.RowKind.INSERT)
    pk.check_sequence_values(table, rows)
    files = sorted_runs.write_runs(table, rows) if rows.num_rows else []
    return files, rows.num_rows


def discard_staged(target: TableState, staged: Sequence[StagedWrite | None]) -> None:
    """Delete the files of stages that will not be committed (an aborted job)."""
    storage, location = target.storage, target.record.location
    storage.delete([storage.join(location, f.path) for s in staged if s is not None
                    for f in s.files])


def commit_staged(table: TableState, staged: Sequence[StagedWrite], mode: WriteMode = "append", *,
                  replace_where: Expr | None = None, commit_id: str | None = None
                  ) -> WriteResult:
    """Commit every stage's files as one snapshot; on failure delete them all. Then compact
    the buckets it touched, where the table compacts inline.

    ``mode`` and ``replace_where`` must be those the stages were written with. Files the
    commit itself writes (runs settled, rows looked up) belong to the stages' registration, and
    the commit fails if that was revoked.
    """
    with writing_under(stages_registration(table, staged)):
        result = commit(staged_change(table, staged, mode, replace_where=replace_where,
                                      commit_id=commit_id))
        return compact_after_write(table, result)


def stages_registration(table: TableState, staged: Sequence[StagedWrite]) -> str | None:
    """The registration the stages were written under (one target's); ValidationError, with
    the stages' files deleted, when they come from several."""
    registrations = {s.write_id for s in staged if s.files}
    if len(registrations) > 1:
        discard_staged(table, staged)
        raise ValidationError(
            "The stages to commit were written for different write targets; commit the stages "
            "of each write_target() on their own. Their files were deleted")
    return registrations.pop() if registrations else None


def staged_change(table: TableState, staged: Sequence[StagedWrite], mode: WriteMode = "append",
                  *, replace_where: Expr | None = None, commit_id: str | None = None) -> Change:
    """The stages' files as one change of ``table`` (to commit alone or in a transaction);
    the stages' files are deleted if it cannot be made."""
    ordered = sorted(staged, key=lambda s: s.order)
    try:
        table.refresh()
        check_mode(table, mode, replace_where)
        expr: Expr = replace_where if replace_where is not None else AlwaysTrue()
        rec = table.record
        if not rec.primary_key:
            files = [f for s in ordered for f in s.files]
            if mode == "overwrite":
                return RewriteChange(table, "overwrite", expr, files, commit_id=commit_id)
            return FilesChange(table, "append", files, commit_id=commit_id)
        kind = "changes" if mode == "changes" else "upsert"
        if rec.deletion_vectors and mode != "overwrite":
            return _rows_of_stages(table, ordered, kind, commit_id)
        files = _settle_repeated_keys(table, ordered)
        graves: list[NewFile] = []
        if rec.deletion_vectors:  # an overwrite (other modes returned above)
            files, graves = _live_rows_only(table, files)
        if mode == "overwrite":
            return pk.OverwriteChange(table, files, expr,
                                      added_rows=sum(s.rows for s in ordered),
                                      commit_id=commit_id, tombstones=graves)
        # A lookup changelog reads the written runs itself; only 'input' (refused above) needs
        # the rows as given.
        return pk.RunsChange(table, kind, None, runs=files, commit_id=commit_id)
    except BaseException:
        discard_staged(table, ordered)
        raise


def _rows_of_stages(table: TableState, staged: Sequence[StagedWrite], kind: str,
                    commit_id: str | None) -> Change:
    """Stages into a merge-on-write table: their rows, read back in stage order (later stages
    win a repeated key), go through the table's lookup and vectors like any write; the staged
    runs are deleted once read."""
    try:
        runs = [_read_run(table, f, None) for s in staged for f in s.files]
        rows = pa.concat_tables(runs) if runs else \
            pk.with_kinds(table.schema.empty_table(), pk.RowKind.INSERT)
        rows = rows.rename_columns([pk.ROW_KIND if c == KIND_COLUMN else c
                                    for c in rows.column_names])
        return pk.fixed_rows(table, rows, kind, commit_id=commit_id)
    finally:
        discard_staged(table, staged)


def _settle_repeated_keys(table: TableState, staged: Sequence[StagedWrite]) -> list[NewFile]:
    """The stages' runs, with the runs of every bucket where one key was written by several
    stages merged into one run (stages in order); see the module docstring."""
    by_bucket: dict[tuple[str | None, int | None], list[tuple[int, NewFile]]] = {}
    for n, s in enumerate(staged):
        for f in s.files:
            by_bucket.setdefault((f.partition_path, f.bucket), []).append((n, f))
    key = list(table.record.primary_key)
    out: list[NewFile] = []
    replaced: list[NewFile] = []
    for runs in by_bucket.values():
        if len({n for n, _ in runs}) < 2 or not _keys_repeat(table, runs, key):
            out.extend(f for _, f in runs)
            continue
        # Stages are in order and each stage's runs of one bucket hold unique keys: reading
        # them in sequence gives the versions in the order the merge engine resolves.
        rows = pa.concat_tables([_read_run(table, f, None) for _, f in runs])
        rows = rows.rename_columns([pk.ROW_KIND if c == KIND_COLUMN else c
                                    for c in rows.column_names])
        out.extend(sorted_runs.write_runs(table, rows))
        replaced.extend(f for _, f in runs)
    if replaced:
        discard_staged(table, [StagedWrite(tuple(replaced), 0)])
    return out


def _live_rows_only(table: TableState, files: list[NewFile]) -> tuple[list[NewFile], list[NewFile]]:
    """``files`` (settled runs: one version per key) with their retractions left out, for an
    overwrite of a table with deletion vectors, whose readers take every row of a file as live
    (merge-on-read drops them when it merges), and the tombstone files of those retractions
    when the table has a sequence field (a version written later with an older sequence value
    must stay deleted, as merge-on-read's retraction rows keep it). A run holding retractions
    is rewritten without them; the others are kept as written."""
    out: list[NewFile] = []
    retractions: list[pa.Table] = []
    keep_graves = sequence_field(table) is not None
    for file in files:
        kinds = _read_run(table, file, [KIND_COLUMN]).column(KIND_COLUMN).to_numpy()
        dropped = is_retraction(kinds)
        if not dropped.any():
            out.append(file)
            continue
        rows = _read_run(table, file, None)
        rows = rows.rename_columns([pk.ROW_KIND if c == KIND_COLUMN else c
                                    for c in rows.column_names])
        if keep_graves:
            retractions.append(rows.filter(pa.array(dropped)))
        rows = rows.filter(pa.array(~dropped))
        discard_staged(table, [StagedWrite((file,), 0)])
        if rows.num_rows:
            out.extend(sorted_runs.write_runs(table, rows))
    graves = write_tombstones(table, pa.concat_tables(retractions)) if retractions else []
    return out, graves


def _read_run(table: TableState, file: NewFile, columns: list[str] | None) -> pa.Table:
    storage = table.storage
    path = storage.fs_path(storage.join(table.record.location, file.path))
    return pq.read_table(path, filesystem=storage.filesystem(), columns=columns)


def _keys_repeat(table: TableState, runs: Sequence[tuple[int, NewFile]], key: list[str]) -> bool:
    """Whether a key of one bucket was written by two stages. Decided from the runs' stored key
    ranges when they show that no two stages' ranges meet; otherwise the runs' keys are read."""
    if _ranges_apart(table, runs, key):
        return False
    keys = pa.concat_tables([_read_run(table, f, key) for _, f in runs])
    return keys.group_by(key).aggregate([]).num_rows != keys.num_rows


def _ranges_apart(table: TableState, runs: Sequence[tuple[int, NewFile]], key: list[str]) -> bool:
    """Whether the key ranges of runs from different stages are disjoint, from the ranges the
    stages recorded (one step per run: a bucket has a run per stage that wrote to it)."""
    schema = table.schema
    if not key_bounds_compare([schema.field(k).type for k in key]):
        return False
    ranges = []
    for stage, f in runs:
        bounds = key_range(f.key_min, f.key_max)
        if bounds is None:
            return False
        ranges.append((bounds[0], bounds[1], stage))
    ranges.sort(key=lambda r: r[0])
    reach, reach_stage = ranges[0][1], ranges[0][2]
    for lo, hi, stage in ranges[1:]:
        if lo <= reach and stage != reach_stage:
            return False
        if hi > reach:
            reach, reach_stage = hi, stage
    return True
