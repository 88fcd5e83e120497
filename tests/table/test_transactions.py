"""Lake transactions: several tables' writes committed at once, and consistent cuts."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
import threading
import warnings
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import CommitConflict, UnsafeOrphanAge, ValidationError
from arrowlake.metastore.inflight import write_id_of
from tests.conftest import make_lake, stored_paths

ORDERS = pa.schema([("id", pa.int64()), ("v", pa.string())])
LINES = pa.schema([("id", pa.int64()), ("q", pa.int64())])


@pytest.fixture(params=["sqlite", "postgres"])
def tx_lake(request: pytest.FixtureRequest, tmp_path: Path):
    lake = make_lake(request.param, tmp_path, request)
    yield lake
    lake.close()


def orders(ids: list[int], v: str = "x") -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [v] * len(ids)})


def lines(ids: list[int], q: int = 1) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "q": pa.array([q] * len(ids), pa.int64())})


def tables(lake: al.Lake) -> tuple[al.Table, al.Table, al.Table]:
    return (lake.create_table("shop.orders", ORDERS),
            lake.create_table("shop.lines", LINES, primary_key=["id"], buckets=2),
            lake.create_table("shop.mor", LINES, primary_key=["id"], buckets=2,
                              deletion_vectors=False, changelog_producer="lookup"))


def ids(table) -> list[int]:
    return sorted(table.to_arrow().column("id").to_pylist())


def test_every_table_commits_at_once_with_one_transaction_id(tx_lake: al.Lake) -> None:
    o, li, m = tables(tx_lake)
    o.append(orders([0]))
    with tx_lake.transaction() as tx:
        first = tx.table("shop.orders").append(orders([1, 2]))
        second = tx.table("shop.orders").append(orders([3]))  # joined to the first
        up = tx.table("shop.lines").upsert(lines([1, 2]))
        mor = tx.table("shop.mor").upsert(lines([1, 2]))
        # Reads inside see the start, without the transaction's own writes.
        assert ids(tx.table("shop.orders")) == [0]
        assert tx.table("shop.lines").count() == 0
        with pytest.raises(ValidationError, match="committed when its transaction is"):
            _ = up.result
    assert first.result.snapshot_id == second.result.snapshot_id == 2
    assert first.result.added_rows == 3
    assert up.result.snapshot_id == mor.result.snapshot_id == 1
    assert ids(o) == [0, 1, 2, 3] and ids(li) == [1, 2] and ids(m) == [1, 2]
    tx_ids = {t.snapshots().column("transaction_id").to_pylist()[-1] for t in (o, li, m)}
    assert len(tx_ids) == 1 and None not in tx_ids
    assert o.snapshots().column("transaction_id").to_pylist()[0] is None  # a write alone
    # A consumer of both tables sees which changes one transaction made.
    with li.stream(start="earliest", stop_at_latest=True) as stream:
        assert [c.transaction_id for c in stream] == list(tx_ids)
    assert tx_lake.metastore.live_writes() == []


def test_an_exception_aborts_and_deletes_every_file(tx_lake: al.Lake) -> None:
    o, li, _ = tables(tx_lake)
    o.append(orders([0]))
    before = {t.name: stored_paths(t) for t in (o, li)}
    with pytest.raises(RuntimeError, match="boom"), tx_lake.transaction() as tx:
        pending = tx.table("shop.orders").append(orders([1]))
        tx.table("shop.lines").upsert(lines([1]))
        assert stored_paths(o) != before[o.name]  # written already
        raise RuntimeError("boom")
    assert {t.name: stored_paths(t) for t in (o, li)} == before
    assert ids(o) == [0] and li.current_snapshot_id is None
    with pytest.raises(ValidationError, match="aborted"):
        _ = pending.result
    assert tx_lake.metastore.live_writes() == []


def test_a_conflict_it_cannot_get_past_fails_the_whole_transaction(tx_lake: al.Lake) -> None:
    """The merge-on-read table is switched to deletion vectors while the transaction is open:
    its upsert, planned in the old mode, cannot commit; neither does the other table's."""
    o, _, m = tables(tx_lake)
    m.upsert(lines([1]))
    tx = tx_lake.transaction()
    tx.table("shop.orders").append(orders([1]))
    tx.table("shop.mor").upsert(lines([2]))
    m.compact(full=True)
    m.set_properties(**{"deletion-vectors.enabled": "true"})
    paths = {t.name: stored_paths(t) for t in (o, m)}
    with pytest.raises(CommitConflict, match="shop.mor"):
        tx.commit()
    assert o.current_snapshot_id is None and ids(m) == [1]
    # Every file the transaction wrote is gone; nothing else is.
    for t in (o, m):
        assert not any(write_id_of(p) == tx._registration.write_id for p in stored_paths(t))
        assert stored_paths(t) <= paths[t.name]


def test_a_conflict_it_can_get_past_plans_that_table_again(tx_lake: al.Lake) -> None:
    """A delete planned at the transaction's start, and an append of a matching row landing
    before the commit: as a single delete would, it plans again and deletes that row too."""
    o, li, _ = tables(tx_lake)
    o.append(orders([1, 2]))
    with tx_lake.transaction() as tx:
        tx.table("shop.orders").delete("id = 2")
        tx.table("shop.lines").upsert(lines([7]))
        tx_lake.table("shop.orders").append(orders([2, 3]))  # another writer
    assert ids(o) == [1, 3] and ids(li) == [7]


def test_commit_id_makes_the_whole_transaction_idempotent(tx_lake: al.Lake) -> None:
    o, li, _ = tables(tx_lake)
    for _ in range(2):
        with tx_lake.transaction(commit_id="batch-7") as tx:
            a = tx.table("shop.orders").append(orders([1]))
            b = tx.table("shop.lines").upsert(lines([1]))
    assert a.result.duplicate and b.result.duplicate and a.result.added_rows == 0
    assert ids(o) == [1] and ids(li) == [1]
    assert len(o.snapshots()) == len(li.snapshots()) == 1
    with tx_lake.transaction() as tx, \
            pytest.raises(ValidationError, match="no commit_id of its own"):
        tx.table("shop.orders").append(orders([2]), commit_id="mine")


def test_one_write_per_table(tx_lake: al.Lake) -> None:
    tables(tx_lake)
    with tx_lake.transaction() as tx:
        tx.table("shop.lines").upsert(lines([1]))
        with pytest.raises(ValidationError, match="writes table 'shop.lines' already"):
            tx.table("shop.lines").delete("id = 1")
    assert ids(tx_lake.table("shop.lines")) == [1]


def test_merge_and_overwrite_in_a_transaction(tx_lake: al.Lake) -> None:
    o, li, _ = tables(tx_lake)
    o.append(orders([1, 2]))
    li.upsert(lines([1, 2], q=5))
    with tx_lake.transaction() as tx:
        merged = (tx.table("shop.lines").merge(lines([2, 3], q=9), on="id")
                  .when_matched_update(set={"q": "source.q"}).when_not_matched_insert()
                  .execute())
        tx.table("shop.orders").overwrite(orders([2], "new"), filter="id = 2")
    assert (merged.result.inserted, merged.result.updated) == (1, 1)
    assert {r["id"]: r["q"] for r in li.to_arrow().to_pylist()} == {1: 5, 2: 9, 3: 9}
    assert {r["id"]: r["v"] for r in o.to_arrow().to_pylist()} == {1: "x", 2: "new"}


def test_files_of_an_open_transaction_are_safe_from_orphan_removal(tx_lake: al.Lake) -> None:
    o, li, _ = tables(tx_lake)
    with tx_lake.transaction() as tx:
        tx.table("shop.orders").append(orders([1]))
        tx.table("shop.lines").upsert(lines([1]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnsafeOrphanAge)
            for t in (o, li):
                assert t.remove_orphan_files(timedelta(0), dry_run=False).files == []
    assert ids(o) == [1] and ids(li) == [1]


def test_inline_compaction_follows_the_commit(tx_lake: al.Lake) -> None:
    li = tx_lake.create_table("shop.lines", LINES, primary_key=["id"], buckets=1,
                              deletion_vectors=False, properties={"compaction.max-runs": "1"})
    li.upsert(lines([1]))
    with tx_lake.transaction() as tx:
        up = tx.table("shop.lines").upsert(lines([2]))
    assert up.result.compaction is not None and up.result.compaction.snapshot_id == 3
    assert li.snapshots().column("kind").to_pylist() == ["upsert", "upsert", "compact"]
    assert li.snapshots().column("transaction_id").to_pylist()[2] is None


def test_a_lake_snapshot_never_sees_half_a_transaction(tx_lake: al.Lake) -> None:
    tables(tx_lake)
    stop, cuts = threading.Event(), []

    def writer() -> None:
        for n in range(15):
            with tx_lake.transaction() as tx:
                tx.table("shop.orders").append(orders([n]))
                tx.table("shop.lines").upsert(lines([n]))
        stop.set()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while not stop.is_set():
            snap = tx_lake.snapshot()
            cuts.append((snap.table("shop.orders").count(), snap.table("shop.lines").count()))
    finally:
        thread.join()
    assert cuts and all(a == b for a, b in cuts)
    assert len({a for a, _ in cuts}) > 1  # the cuts did move while the writer wrote


def test_a_pinned_table_reads_everywhere(tx_lake: al.Lake, tmp_path: Path) -> None:
    o, _, _ = tables(tx_lake)
    o.append(orders([1]))
    snap = tx_lake.snapshot()
    o.append(orders([2]))
    pinned = snap.table("shop.orders")
    assert pinned.snapshot_id == 1 and ids(pinned) == [1]
    assert ids(tx_lake.snapshot().table("shop.orders")) == [1, 2]
    # Splits planned from the pin are read in another process.
    (tmp_path / "splits").write_bytes(pickle.dumps(pinned.scan().plan()))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import pickle, sys
        splits = pickle.loads(open(sys.argv[1], "rb").read())
        print(sorted(i for s in splits for i in s.to_arrow().column("id").to_pylist()))
    """), str(tmp_path / "splits")], check=True, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[1]"
    later = tx_lake.create_table("shop.later", ORDERS)
    with pytest.raises(ValidationError, match="created after"):
        snap.table(later.name)


def test_write_skew_is_possible(tx_lake: al.Lake) -> None:
    """Snapshot isolation checks only the tables a transaction writes (README,
    "Transactions"): two transactions, each reading the table the other writes, both commit."""
    o, li, _ = tables(tx_lake)
    first, second = tx_lake.transaction(), tx_lake.transaction()
    if first.table("shop.lines").count() == 0:
        first.table("shop.orders").append(orders([1]))
    if second.table("shop.orders").count() == 0:
        second.table("shop.lines").upsert(lines([1]))
    first.commit()
    second.commit()
    assert ids(o) == [1] and ids(li) == [1]
