"""Switching a primary-key table between merge-on-read and deletion vectors, through
``table.set_properties(**{"deletion-vectors.enabled": "true"})`` (or ``"false"``).

A switch changes how later writes settle versions, never the files already written, so it is
allowed only on a snapshot that both modes read alike:

- **on** (to deletion vectors): no bucket needs a merge. Each bucket holds one run, or runs of
  disjoint keys, of additions only (no deletes or restarts left to apply): what
  ``compact(full=True)`` leaves.
- **off** (to merge-on-read): no row is deleted by a deletion vector and no tombstone is live,
  so every key has exactly one row: what ``compact(full=True)`` leaves in that mode. (Files
  written with deletion vectors have no row kinds; merge-on-read reads their rows as inserts.)

Otherwise the switch is a :class:`ValidationError` saying to compact first. The check runs on
one snapshot and the switch is recorded only if no commit landed since (else it is checked
again). A write planned in the old mode fails at its commit (``SnapshotChange.
deletion_vectors``), so no snapshot of one mode lands in a table of the other. Each switch is
recorded with the last snapshot before it (:data:`MODE_SWITCHES_PROPERTY`), so time travel
reads every snapshot in the mode it was written in (:meth:`TableRecord.as_of`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from arrowlake.errors import CommitConflict, ValidationError
from arrowlake.metastore.records import (
    DELETION_VECTORS_PROPERTY,
    MODE_SWITCHES_PROPERTY,
    deletion_vectors_on,
    mode_switches,
)
from arrowlake.scan.planning import file_tasks
from arrowlake.scan.read import bucket_groups, needs_merge
from arrowlake.table.options.primary_key import sequence_field

if TYPE_CHECKING:
    from arrowlake.table.state import TableState

#: How often a switch is checked again when commits keep landing while it is checked.
ATTEMPTS = 5


class TableMoved(CommitConflict):
    """A commit landed between the switch's check and its recording: check again."""


def requested_mode(table: TableState, given: Mapping[str, str]) -> bool | None:
    """The mode ``given`` properties ask for (None: they do not name it). Refuses setting the
    switch history by hand and a value other than true/false."""
    if MODE_SWITCHES_PROPERTY in given:
        raise ValidationError(
            f"Property '{MODE_SWITCHES_PROPERTY}' records the table's mode switches and is "
            f"written by them only; set '{DELETION_VECTORS_PROPERTY}' to switch the mode")
    if DELETION_VECTORS_PROPERTY not in given:
        return None
    value = str(given[DELETION_VECTORS_PROPERTY]).strip().lower()
    if value not in ("true", "false"):
        raise ValidationError(f"Property '{DELETION_VECTORS_PROPERTY}' must be 'true' or "
                              f"'false', not {given[DELETION_VECTORS_PROPERTY]!r}")
    if not table.record.primary_key:
        raise ValidationError(f"Property '{DELETION_VECTORS_PROPERTY}' needs a table with a "
                              "primary key (other tables have one row per write anyway)")
    return value == "true"


def check_switchable(table: TableState, snapshot_id: int | None, to_vectors: bool) -> None:
    """Refuse switching ``table`` at ``snapshot_id`` (read in its current mode) where the two
    modes would read it differently."""
    if snapshot_id is None:
        return
    ms, tid = table.metastore, table.record.table_id
    how = (f"run table.compact(full=True) (or `arrowlake compact {table.name} --full`) "
           "first, then set the property again")
    if to_vectors:
        view = table.view(snapshot_id, current_schema=True)
        groups = bucket_groups(file_tasks(view, ms.live_files(tid, snapshot_id)))
        unmerged = sum(needs_merge(g) for g in groups)
        if unmerged:
            kept = (" (with a sequence_field, compaction keeps deleted keys as retractions so "
                    "that older versions arriving later stay deleted: if it leaves some, the "
                    "table cannot switch; create a new table and copy the rows)"
                    if sequence_field(table) else "")
            raise ValidationError(
                f"Cannot turn deletion vectors on for table '{table.name}': {unmerged} of its "
                f"{len(groups)} buckets hold runs that still need a merge (keys in several "
                f"runs, or deletes not yet applied); {how}{kept}")
        return
    vectors = sum(1 for v in ms.live_vectors(tid, snapshot_id).values() if v.cardinality)
    if vectors:
        raise ValidationError(
            f"Cannot turn deletion vectors off for table '{table.name}': {vectors} of its "
            f"files have rows deleted by a deletion vector, which merge-on-read cannot read; "
            f"{how}")
    tombstones = ms.live_files(tid, snapshot_id, content="tombstone").num_rows
    if tombstones:
        raise ValidationError(
            f"Cannot turn deletion vectors off for table '{table.name}': it holds {tombstones} "
            "tombstone files (deleted keys of a table with a sequence_field, kept so that older "
            "versions arriving later stay deleted), which merge-on-read has no place for. "
            "Create a new table with deletion_vectors=False and copy the rows into it")


def recorded_switch(current: Mapping[str, str], last_snapshot_id: int, to_vectors: bool
                    ) -> dict[str, str]:
    """The property changes recording a switch to ``to_vectors`` from ``last_snapshot_id`` on
    (the snapshot it was checked on: nothing is committed meanwhile); nothing when the table is
    in that mode already."""
    if deletion_vectors_on(current) == to_vectors:
        return {}
    switches = [[after, "true" if on else "false"] for after, on in mode_switches(current)]
    switches.append([last_snapshot_id, "true" if to_vectors else "false"])
    return {MODE_SWITCHES_PROPERTY: json.dumps(switches)}
