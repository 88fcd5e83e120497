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
  :data:`~arrowlake.table.changelogs.files.AFTER_COLUMN`). The lookup starts while the write's
  runs are still being encoded (it needs their rows, not their files:
  :func:`~arrowlake.table.changelogs.lookup.finish_with_lookup`), and an error deletes the runs
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

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.metastore.store import NewFile
from arrowlake.scan.scan import Scan
from arrowlake.table.changelogs.files import (
    diff,
    write_changelog,
)

if TYPE_CHECKING:
    from arrowlake.table.state import TableState

#: A full compaction's summary entry ``changelog``: the next one's reference state.
FULL_COMPACTION_DIFF = "full-compaction-diff"


def last_full_compaction(table: TableState, at_or_before: int | None = None) -> int | None:
    """The snapshot of the table's last full compaction that wrote a changelog (at or before
    snapshot ``at_or_before``, when given), if any."""
    snaps = table.metastore.snapshots(table.record.table_id)
    hits = snaps.filter(pc.match_substring(snaps.column("summary"),
                                           f'"changelog": "{FULL_COMPACTION_DIFF}"'))
    if at_or_before is not None:
        hits = hits.filter(pc.less_equal(hits.column("snapshot_id"), at_or_before))
    return None if hits.num_rows == 0 else int(hits.column("snapshot_id")[-1].as_py())


def full_compaction_changelog(table: TableState, base: int) -> tuple[list[NewFile], dict[str, str]]:
    """For ``compact(full=True)`` of a ``full-compaction`` table: changelog files with the
    difference between the merged table at the last full compaction and at ``base``, and the
    summary entry marking this snapshot as the new reference."""
    key = list(table.record.primary_key)
    previous = last_full_compaction(table)

    def merged(snapshot: int) -> pa.Table:  # in the current schema (columns added since)
        return Scan.create(table.view(snapshot, current_schema=True), None, None, None,
                           table.merge_spec()).to_arrow()

    after = merged(base)
    before = merged(previous) if previous is not None else after.schema.empty_table()
    changes = diff(before, after, key)
    files = write_changelog(table, changes) if changes.num_rows else []
    return files, {"changelog": FULL_COMPACTION_DIFF}
