"""Item 3 of the defects issue: a lost reply to COMMIT must not make the retry commit twice."""

from __future__ import annotations

import pyarrow as pa
import pytest
import sqlalchemy.exc as sx

import arrowlake.metastore.store as store
from tests.conftest import METASTORES, make_lake


def _lose_first_commit_reply(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the first commit reach the database and then fail as if its reply was lost."""
    real = store.Metastore._commit_once
    lost: list[int] = []

    def lost_ack(self, conn, *args):
        out = real(self, conn, *args)
        if not lost:
            lost.append(out[0])
            conn.commit()
            raise sx.OperationalError("COMMIT", {}, OSError("connection reset by peer"))
        return out

    monkeypatch.setattr(store.Metastore, "_commit_once", lost_ack)
    return lost


@pytest.mark.parametrize("kind", METASTORES)
def test_item3_lost_commit_reply_does_not_store_an_append_twice(kind, tmp_path, request,
                                                                monkeypatch):
    lake = make_lake(kind, tmp_path, request)
    t = lake.create_table("t", pa.schema([("id", pa.int64())]))
    lost = _lose_first_commit_reply(monkeypatch)
    result = t.append({"id": [1, 2]})
    assert lost == [1]
    assert (result.snapshot_id, result.duplicate, result.added_rows) == (1, False, 2)
    assert result.attempts == 2
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 2]  # its file was kept
    assert t.snapshots().num_rows == 1
    lake.close()


@pytest.mark.parametrize("kind", METASTORES)
def test_item3_lost_reply_with_a_commit_id_is_a_success_and_a_resend_a_duplicate(
        kind, tmp_path, request, monkeypatch):
    lake = make_lake(kind, tmp_path, request)
    t = lake.create_table("t", pa.schema([("id", pa.int64())]))
    _lose_first_commit_reply(monkeypatch)
    first = t.append({"id": [1]}, commit_id="batch-1")
    assert (first.snapshot_id, first.duplicate, first.added_files) == (1, False, 1)
    again = t.append({"id": [1]}, commit_id="batch-1")  # the user resends the same batch
    assert (again.snapshot_id, again.duplicate) == (1, True)
    assert t.to_arrow().column("id").to_pylist() == [1]
    assert len(t.files()) == 1
    lake.close()


@pytest.mark.parametrize("kind", METASTORES)
def test_item3_lost_reply_of_a_delete_is_not_reported_as_a_conflict(kind, tmp_path, request,
                                                                    monkeypatch):
    lake = make_lake(kind, tmp_path, request)
    t = lake.create_table("t", pa.schema([("id", pa.int64())]))
    t.append({"id": [1, 2, 3]})
    _lose_first_commit_reply(monkeypatch)
    # Without the token the retry would find its files already removed: CommitConflict.
    result = t.delete("id = 2")
    assert (result.snapshot_id, result.removed_rows) == (2, 1)
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 3]
    assert t.snapshots().num_rows == 2
    lake.close()
