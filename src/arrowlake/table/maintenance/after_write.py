"""Compacting after a write, where the table's ``compaction.mode`` is ``inline``.

A write commits first; the compaction its commit made due follows as a commit of its own.
Writes inside a lake transaction never compact: the facade calls this after a single write
only. The write has landed by then, so nothing here raises: a failing compaction is logged
and left to the next write or ``compact()``.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from arrowlake.table.maintenance.compaction import compact_if_needed
from arrowlake.table.maintenance.vector_compaction import compact_vectors
from arrowlake.table.options.compaction import compaction_options
from arrowlake.table.options.maintenance import compaction_mode
from arrowlake.table.state import TableState
from arrowlake.table.writes.commit import WriteResult

_log = logging.getLogger("arrowlake.table")


def compact_after_write(table: TableState, result: WriteResult) -> WriteResult:
    """``result`` with the compaction of the buckets the write touched that it made due
    (within the write's budget); ``result`` itself when nothing was due, the write committed
    nothing or was a duplicate, or the table is not compacted inline."""
    if result.snapshot_id is None or result.duplicate or \
            compaction_mode(table.record.properties) != "inline":
        return result
    try:
        if table.record.deletion_vectors:
            if not result.buckets:
                return result
            options = compaction_options(table.record.properties)
            compacted = compact_vectors(table, touched=result.buckets,
                                        budget=int(options.write_budget * result.added_bytes))
            if not (compacted.snapshot_id or compacted.dropped):
                return result
            return replace(result, compaction=compacted)
        if not result.written:
            return result
        return replace(result, compaction=compact_if_needed(table, result.written))
    except Exception as exc:  # the write landed: it must not look failed to the caller
        _log.warning("Snapshot %s of %s committed, but compacting after it failed (the next "
                     "write or compact() retries): %s", result.snapshot_id, table.name, exc)
        return result
