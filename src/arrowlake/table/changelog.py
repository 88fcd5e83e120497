"""Changelog producers of primary-key tables: changelog files written with each commit.

The table property ``changelog-producer`` (``create_table(..., changelog_producer=...)``)
decides what change streams read for a snapshot of a primary-key table:

- ``none`` (default): no changelog files; streams read the runs as written.
- ``input``: the input rows exactly as given to ``upsert``/``write_changes``/``merge``/
  ``delete`` (duplicates and ``-U`` rows included, before the write merged repeated keys),
  one changelog file per partition and bucket, in input order.
- ``lookup``: exact changes with before-images, computed at write time. The versions of the keys a
  write touches are read (the new runs whole; of the committed runs only the touched buckets'
  rows whose key the write touches, files and row groups outside the written key range pruned)
  and merged by the table's engine without and with the new runs; the two are compared per
  key, vectorized: ``+I`` new key, ``-U`` old / ``+U`` new row where any value
  changed, ``-D`` with the deleted row's values, nothing where no value changed. Both merges use
  the table's merge engine, so every engine is exact (partial-update and aggregation emit the
  merged row). Where a key's merged row is its newest version, the changelog copies no row
  that the write's runs hold (format 2, see
  :data:`~arrowlake.table.changelog_files.AFTER_COLUMN`). The lookup starts while the write's
  runs are still being encoded (it needs their rows, not their files:
  :func:`~arrowlake.table.lookup_changelog.finish_with_lookup`), and an error deletes the runs
  and the changelog files alike.
  A commit that lands first never fails the write: inside the commit's transaction, only the
  keys that such commits also wrote are looked up again on top of them (a compaction changes
  no value and nothing here; an overwrite, every key), see :func:`commit_runs`.

- ``full-compaction``: writes yield nothing; ``compact(full=True)`` commits the difference
  between the merged table at the previous full compaction and now (``+I``, ``-U``/``+U``,
  ``-D``), see :func:`full_compaction_changelog`.

Changelog files are recorded with the commit (``SnapshotChange.changelog``): read by their
snapshot only, never part of a scan, and deleted when that snapshot expires.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.errors import ValidationError
from arrowlake.metastore.store import NewFile, SnapshotChange
from arrowlake.scan.scan import Scan
from arrowlake.table.changelog_files import (
    REFERENCING_FORMAT,
    REFERENCING_SUMMARY,
    diff,
    write_changelog,
)
from arrowlake.table.lookup_changelog import LookupChangelog, lookup_files, rebase
from arrowlake.table.writes import WriteResult, _discard, _result, commit_files

if TYPE_CHECKING:
    from arrowlake.table.table import Table

PRODUCERS = ("none", "input", "lookup", "full-compaction")
#: A full compaction's summary entry ``changelog``: the next one's reference state.
FULL_COMPACTION_DIFF = "full-compaction-diff"


def changelog_producer(table: Table) -> str:
    return table._record.properties.get("changelog-producer", "none")


def check_producer(value: object, primary_key: Sequence[str]) -> str:
    if value not in PRODUCERS:
        raise ValidationError(
            f"Unknown changelog_producer {value!r}; valid ones are {', '.join(PRODUCERS)}")
    if value != "none" and not primary_key:
        raise ValidationError(
            "changelog_producer needs a primary-key table: append tables' streams are exact "
            "without one")
    return str(value)


def last_full_compaction(table: Table, at_or_before: int | None = None) -> int | None:
    """The snapshot of the table's last full compaction that wrote a changelog (at or before
    snapshot ``at_or_before``, when given), if any."""
    snaps = table._metastore.snapshots(table._record.table_id)
    hits = snaps.filter(pc.match_substring(snaps.column("summary"),
                                           f'"changelog": "{FULL_COMPACTION_DIFF}"'))
    if at_or_before is not None:
        hits = hits.filter(pc.less_equal(hits.column("snapshot_id"), at_or_before))
    return None if hits.num_rows == 0 else int(hits.column("snapshot_id")[-1].as_py())


def full_compaction_changelog(table: Table, base: int) -> tuple[list[NewFile], dict[str, str]]:
    """For ``compact(full=True)`` of a ``full-compaction`` table: changelog files with the
    difference between the merged table at the last full compaction and at ``base``, and the
    summary entry marking this snapshot as the new reference."""
    key = list(table._record.primary_key)
    previous = last_full_compaction(table)

    def merged(snapshot: int) -> pa.Table:  # in the current schema (columns added since)
        return Scan.create(table._view(snapshot, current_schema=True), None, None, None,
                           table._merge_spec()).to_arrow()

    after = merged(base)
    before = merged(previous) if previous is not None else after.schema.empty_table()
    changes = diff(before, after, key)
    files = write_changelog(table, changes) if changes.num_rows else []
    return files, {"changelog": FULL_COMPACTION_DIFF}


# -- committing -------------------------------------------------------------------------------


def commit_runs(table: Table, kind: str, base: int | None, runs: list[NewFile],
                rows: pa.Table, *, commit_id: str | None = None,
                summary: dict[str, Any] | None = None,
                on_rebase: Callable[[pa.Table], None] | None = None,
                lookup_changelog: LookupChangelog | None = None) -> WriteResult:
    """Commit written runs with the changelog the table's producer asks for. ``on_rebase`` is
    the write's own conflict check; its CommitConflict reaches the caller unchanged.
    ``lookup_changelog``: a ``lookup`` table's changelog of ``runs`` on ``base``, already
    written (:func:`~arrowlake.table.lookup_changelog.finish_with_lookup`); computed here when
    not given.

    A lookup changelog never makes the commit conflict. When commits landed after the snapshot
    it was computed on, the commit's transaction (which holds the table, so nothing else lands
    meanwhile) brings it up to date before recording it (:func:`rebase`): only the keys those
    commits also wrote are looked up again, so the work redone is bounded by what they wrote and
    contention can delay a write but never fail it."""
    producer = changelog_producer(table)
    if producer == "none":
        return commit_files(table, kind, base, runs, commit_id=commit_id, summary=summary,
                            on_rebase=on_rebase, deletion_vectors=False)
    if producer == "full-compaction":
        # Only full compactions write a changelog: streams skip this snapshot.
        return commit_files(table, kind, base, runs, commit_id=commit_id,
                            summary={**(summary or {}), "changelog": producer},
                            on_rebase=on_rebase, deletion_vectors=False)
    state: LookupChangelog | None = None
    try:
        if producer == "input":
            changelog = write_changelog(table, rows) if rows.num_rows else []
        else:
            state = lookup_changelog if lookup_changelog is not None \
                else lookup_files(table, base, runs)
            changelog = state.files
    except BaseException:
        _discard(table, runs)  # the changelog's own files are deleted already
        raise
    # Streams read only the changelog of a snapshot that says it has one (possibly empty: a
    # lookup that found no value changed), never its runs.
    noted = {**(summary or {}), "changelog": producer}
    if state is not None and state.format2:
        noted[REFERENCING_SUMMARY] = REFERENCING_FORMAT

    def rebased(added: pa.Table) -> None:
        # The write's own check sees every commit since its base.
        if on_rebase is not None:
            on_rebase(added)
        if state is not None and rebase(table, state, added):
            # The transaction records the change's changelog and summary after this check:
            # they are brought up to date in place.
            changelog[:] = state.files
            if state.format2:
                noted[REFERENCING_SUMMARY] = REFERENCING_FORMAT
            else:
                noted.pop(REFERENCING_SUMMARY, None)

    change = SnapshotChange(kind=kind, schema_id=table._record.current_schema_id, add=runs,
                            commit_id=commit_id, summary=noted, on_rebase=rebased,
                            changelog=changelog, deletion_vectors=False)
    try:
        result = table._metastore.commit(table._record.table_id, base, change)
    except BaseException:
        _discard(table, [*(state.files if state is not None else changelog), *runs])
        raise
    if result.duplicate:
        _discard(table, [*changelog, *runs])
        return WriteResult(result.snapshot_id, kind, attempts=result.attempts, duplicate=True)
    return _result(kind, result, runs, 0, 0)
