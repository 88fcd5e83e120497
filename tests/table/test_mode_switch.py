"""A primary-key table's mode: deletion vectors by default, merge-on-read on request, and
switching an existing table (``set_properties(**{"deletion-vectors.enabled": ...})``) where no
bucket needs a merge. Writes that race a switch never commit in the other mode, and time
travel reads every snapshot in the mode it was written in."""

from __future__ import annotations

import threading

import pandas as pd
import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import CommitConflict, ValidationError
from tests.conftest import METASTORES, make_lake

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.int64())])
DV = "deletion-vectors.enabled"


def _rows(ids, v):
    return {"id": list(ids), "v": [v] * len(ids)}


def _state(table: al.Table, **at) -> list[dict]:
    return table.scan(**at).to_arrow().sort_by("id").to_pylist()


def test_new_primary_key_tables_get_deletion_vectors_unless_they_say_otherwise(tmp_path):
    lake = al.connect(tmp_path / "lake")
    created = {
        "default": lake.create_table("s.a", SCHEMA, primary_key=["id"]),
        "lookup": lake.create_table("s.b", SCHEMA, primary_key=["id"],
                                    changelog_producer="lookup"),
        "off": lake.create_table("s.c", SCHEMA, primary_key=["id"], deletion_vectors=False),
        "off-property": lake.create_table("s.d", SCHEMA, primary_key=["id"],
                                          properties={DV: "false"}),
        "input": lake.create_table("s.e", SCHEMA, primary_key=["id"],
                                   changelog_producer="input"),
        "full-compaction": lake.create_table("s.f", SCHEMA, primary_key=["id"],
                                             changelog_producer="full-compaction"),
        "pandas": lake.from_pandas("s.g", pd.DataFrame({"id": [1, 2], "v": [3, 4]}),
                                   primary_key=["id"]),
    }
    modes = {name: t.properties[DV] for name, t in created.items()}
    assert modes == {"default": "true", "lookup": "true", "off": "false", "off-property": "false",
                     "input": "true", "full-compaction": "true", "pandas": "true"}
    assert created["pandas"].to_pandas().sort_values("id")["v"].tolist() == [3, 4]
    plain = lake.create_table("s.plain", SCHEMA)
    assert DV not in plain.properties
    with pytest.raises(ValidationError, match="disagree"):
        lake.create_table("s.x", SCHEMA, primary_key=["id"], deletion_vectors=True,
                          properties={DV: "false"})
    with pytest.raises(ValidationError, match="written by mode switches only"):
        lake.create_table("s.y", SCHEMA, primary_key=["id"],
                          properties={"deletion-vectors.switches": "[]"})
    assert not lake.table_exists("s.x") and not lake.table_exists("s.y")
    lake.close()


@pytest.mark.parametrize("engine", [{}, {"merge_engine": "aggregation",
                                         "aggregations": {"v": "sum"}}],
                         ids=["deduplicate", "aggregation"])
def test_switching_needs_a_compacted_table_and_time_travel_reads_each_mode(tmp_path, engine):
    """On and off again: each switch is refused until ``compact(full=True)``; every snapshot
    reads as it did when it was current (aggregation would double-count a misread run)."""
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.t", SCHEMA, primary_key=["id"], buckets=2, deletion_vectors=False,
                          properties={"compaction.mode": "off",
                                      "aggregation.remove-record-on-delete": "true"}
                          if engine else {"compaction.mode": "off"}, **engine)
    seen: dict[int, list[dict]] = {}

    def write(step) -> None:
        step()
        seen[t.current_snapshot_id] = _state(t)

    write(lambda: t.upsert(_rows(range(8), 1)))
    write(lambda: t.upsert(_rows(range(4, 12), 2)))
    write(lambda: t.delete("id = 5"))
    with pytest.raises(ValidationError, match=r"compact\(full=True\).*arrowlake compact"):
        t.set_properties(**{DV: "true"})
    assert t.properties[DV] == "false"
    write(lambda: t.compact(full=True))
    t.set_properties(**{DV: "TRUE"})
    assert t._record.deletion_vectors and t.properties[DV] == "true"
    write(lambda: t.upsert(_rows(range(2, 6), 3)))
    assert t._metastore.live_vectors(t._record.table_id, t.current_snapshot_id)
    write(lambda: t.delete("id = 7"))
    with pytest.raises(ValidationError, match="turn deletion vectors off"):
        t.set_properties(**{DV: "false"})
    write(lambda: t.compact(full=True))
    t.set_properties(**{DV: "false"})
    assert not t._record.deletion_vectors
    write(lambda: t.upsert(_rows([0, 3, 20], 4)))
    write(lambda: t.upsert(_rows([3], 5)))
    assert len(t.files().filter(pa.compute.equal(t.files()["bucket"], 1))) >= 1
    for snapshot, rows in seen.items():
        assert _state(t, snapshot=snapshot) == rows, snapshot
    assert t.count() == len(seen[t.current_snapshot_id])
    lake.close()


def test_switching_an_empty_table_and_setting_the_same_mode(tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.t", SCHEMA, primary_key=["id"])
    t.set_properties(**{DV: "true"})  # already on: nothing recorded
    assert "deletion-vectors.switches" not in t.properties
    t.set_properties(**{DV: "false"})
    assert not t._record.deletion_vectors
    t.upsert(_rows(range(3), 1))
    t.upsert(_rows(range(2), 2))
    assert _state(t) == [{"id": 0, "v": 2}, {"id": 1, "v": 2}, {"id": 2, "v": 1}]
    with pytest.raises(ValidationError, match="written by them only"):
        t.set_properties(**{"deletion-vectors.switches": "[]"})
    with pytest.raises(ValidationError, match="must be 'true' or 'false'"):
        t.set_properties(**{DV: "maybe"})
    plain = lake.create_table("s.plain", SCHEMA)
    with pytest.raises(ValidationError, match="primary key"):
        plain.set_properties(**{DV: "true"})
    lake.close()


@pytest.fixture(params=METASTORES)
def metastore_lake(request, tmp_path):
    lake = make_lake(request.param, tmp_path, request)
    yield lake
    lake.close()


def _paused_writer(lake: al.Lake, name: str, write):
    """Runs ``write(table)`` in a thread on a connection of its own; its first commit waits
    until released, so the test can switch the table between its planning and its commit."""
    table = al.connect(lake.metastore.url, warehouse=lake.warehouse).table(name)
    planned, release = threading.Event(), threading.Event()
    outcome: list[object] = []
    real_commit = table._metastore.commit

    def commit(*args, **kwargs):
        if not planned.is_set():
            planned.set()
            assert release.wait(60)
        return real_commit(*args, **kwargs)

    table._metastore.commit = commit  # type: ignore[method-assign]

    def run() -> None:
        try:
            outcome.append(write(table))
        except Exception as exc:  # the test asserts what it was
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert planned.wait(60)
    return table, release, thread, outcome


@pytest.mark.parametrize("to_vectors", [True, False], ids=["on", "off"])
def test_a_write_planned_in_the_old_mode_never_commits_in_the_new_one(metastore_lake,
                                                                      to_vectors):
    lake = metastore_lake
    t = lake.create_table("s.t", SCHEMA, primary_key=["id"], buckets=2,
                          deletion_vectors=not to_vectors)
    t.upsert(_rows(range(10), 1))
    t.compact(full=True)
    before = _state(t)
    writer, release, thread, outcome = _paused_writer(
        lake, "s.t", lambda w: w.upsert(_rows(range(5, 15), 2)))
    t.set_properties(**{DV: "true" if to_vectors else "false"})
    switched = t.current_snapshot_id
    release.set()
    thread.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], CommitConflict), outcome
    assert "mode was switched" in str(outcome[0])
    assert t.current_snapshot_id == switched and _state(t) == before
    # Tried again, the write is planned in the new mode and lands.
    writer.refresh().upsert(_rows(range(5, 15), 2))
    assert _state(t) == [*before[:5], *[{"id": i, "v": 2} for i in range(5, 15)]]
    assert t.count() == 15
    for _, rows in [(s, _state(t, snapshot=s)) for s in (switched, t.current_snapshot_id)]:
        assert len({r["id"] for r in rows}) == len(rows)


def test_a_switch_checks_again_when_a_write_lands_during_its_check(tmp_path, monkeypatch):
    """A write commits runs after the switch checked the table: the switch sees the table
    moved, checks again, and refuses (the new run needs a merge)."""
    from arrowlake.table.maintenance import mode_switch

    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.t", SCHEMA, primary_key=["id"], buckets=1, deletion_vectors=False)
    t.upsert(_rows(range(10), 1))
    t.compact(full=True)
    other = al.connect(tmp_path / "lake").table("s.t")
    real = mode_switch.check_switchable
    calls = []

    def check_then_write(table, snapshot, to_vectors):
        real(table, snapshot, to_vectors)
        calls.append(snapshot)
        if len(calls) == 1:
            other.upsert(_rows(range(3), 2))

    monkeypatch.setattr(mode_switch, "check_switchable", check_then_write)
    with pytest.raises(ValidationError, match="need a merge"):
        t.set_properties(**{DV: "true"})
    assert len(calls) == 1  # the second check raised
    assert not t.refresh()._record.deletion_vectors
    assert _state(t)[:3] == [{"id": i, "v": 2} for i in range(3)]
    lake.close()


def test_a_stream_does_not_read_across_a_switch_and_resumes_when_reopened(tmp_path):
    from arrowlake.errors import ModeSwitched

    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.t", SCHEMA, primary_key=["id"], buckets=1, deletion_vectors=False)
    t.upsert(_rows(range(4), 1))

    def read(stream) -> list[tuple]:
        out = []
        for change in stream:
            rows = change.to_arrow()
            out += sorted(zip(rows["id"].to_pylist(), rows["v"].to_pylist(),
                              rows["_row_kind"].to_pylist(), strict=True))
            stream.commit(change.snapshot_id)
        return out

    options = dict(consumer="c", start="earliest", stop_at_latest=True, include_row_kind=True,
                   catch_up_threshold=None)
    with t.stream(**options) as stream:
        assert read(stream) == [(i, 1, "+I") for i in range(4)]
        t.set_properties(**{DV: "true"})
        t.upsert(_rows([1], 2))
        t.delete("id = 3")
        with pytest.raises(ModeSwitched, match="Reopen the stream"):
            read(stream)
    with t.stream(**options) as stream:
        assert read(stream) == [(1, 1, "-U"), (1, 2, "+U"), (3, 1, "-D")]
    lake.close()
