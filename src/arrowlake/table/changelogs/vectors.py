"""Changelog producers on merge-on-write (deletion-vector) tables.

A snapshot of such a table is exact without changelog files: streams read the rows at the
positions it deleted and the rows of the files it added (:mod:`arrowlake.streaming.vector_changes`),
so the producer ``none`` writes none. ``lookup`` writes that same change at write time, with the
before-images its lookup read (``on_write._lookup_changelog``), so that streams read it instead
of decoding the old files. The other two mean what they mean on merge-on-read tables
(:mod:`arrowlake.table.changelogs.producers`):

- ``input``: every write commits, as changelog files, the rows exactly as given, with their row
  kinds, duplicates and retractions (:func:`commit_with_changelog`). The engine does not filter
  them: a version a ``sequence_field`` makes older than the live one, a retraction that
  ``ignore-delete`` drops, a ``first-row`` version of a live key are all in the changelog. A
  write that changes no row still commits a snapshot holding its input, as the run a
  merge-on-read table writes for it would.
- ``full-compaction``: writes commit no changelog (streams skip them). ``compact(full=True)``
  commits, with its rewrite, the net change between the table as the previous full compaction
  left it and as this one leaves it (:func:`full_compaction_changelog`): per key ``-U`` old /
  ``+U`` new where a value changed, ``-D`` with the old row, ``+I`` for a new key, nothing for a
  key unchanged or both inserted and deleted in between. The engine's semantics are in the two
  states compared: a version dropped by its ``sequence_field`` or a retraction dropped by
  ``ignore-delete`` never shows.

The net change is :func:`~arrowlake.table.changelogs.net_change.net_change`: only the
partitions and buckets whose rows may differ are read, at both snapshots, with no merge.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from arrowlake.metastore.records import StaleVectors
from arrowlake.metastore.store import NewFile
from arrowlake.table.changelogs.files import write_changelog
from arrowlake.table.changelogs.net_change import net_change
from arrowlake.table.changelogs.producers import (
    FULL_COMPACTION_DIFF,
    last_full_compaction,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from arrowlake.table.state import TableState

def full_compaction_changelog(table: TableState, base: int) -> tuple[list[NewFile], dict[str, str]]:
    """For ``compact(full=True)`` of a ``full-compaction`` table with deletion vectors: the
    changelog files of the net change from the last full compaction to ``base``, and the
    summary entry that makes the compaction the next one's reference."""
    changes = net_change(table, last_full_compaction(table), base)
    files = write_changelog(table, changes) if changes.num_rows else []
    return files, {"changelog": FULL_COMPACTION_DIFF}


def refuse_rebase(base: int) -> Callable[[pa.Table], None]:
    """An ``on_rebase`` for a full compaction with a changelog: its change holds for ``base``
    only, so any commit landing first makes it compute the change again."""

    def check(added: pa.Table) -> None:
        raise StaleVectors(
            f"Commits landed after snapshot {base}, which this full compaction's changelog "
            "was computed on", [])

    return check
