"""The two-phase write: stages written apart, committed once (no Spark needed)."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.errors import CommitConflict, ValidationError
from arrowlake.table import staged as staged_module
from arrowlake.table.staged import (
    StagedWrite,
    commit_staged,
    discard_staged,
    stage,
    write_target,
)
from tests.conftest import make_lake, stored_paths

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


@pytest.fixture(params=["sqlite", "postgres"])
def any_lake(request, tmp_path):
    lake = make_lake(request.param, tmp_path, request)
    yield lake
    lake.close()


def roundtrip(obj):
    return pickle.loads(pickle.dumps(obj))


def test_stages_commit_as_one_snapshot(any_lake):
    t = any_lake.create_table("s.t", SCHEMA, partition_by=["v"])
    # The driver keeps its target (and registration) until it commits.
    driver = write_target(t.state)
    driver = write_target(t.state)
    target = roundtrip(driver)
    parts = [roundtrip(stage(target, {"id": [i, i + 10], "v": ["a", "b"]}, order=i))
             for i in range(3)]
    result = commit_staged(t.state, parts)
    assert result.snapshot_id == 1 and result.added_rows == 6
    assert sorted(t.to_arrow().column("id").to_pylist()) == [0, 1, 2, 10, 11, 12]


@pytest.mark.parametrize("vectors", [False, True], ids=["merge-on-read", "deletion-vectors"])
@pytest.mark.parametrize("engine", ["deduplicate", "first-row"])
def test_a_key_written_by_two_stages_resolves_by_stage_order(any_lake, engine, vectors):
    t = any_lake.create_table("s.k", SCHEMA, primary_key=["id"], buckets=2,
                              merge_engine=engine, deletion_vectors=vectors)
    if vectors:  # keys already live: the stages' versions settle against them on commit
        t.upsert({"id": [2, 9], "v": ["old", "old"]})
    target = write_target(t.state)
    late = stage(target, {"id": [1, 2, 5], "v": ["late", "late", "late"]}, "upsert", order=1)
    early = stage(target, {"id": [1, 3], "v": ["early", "early"]}, "upsert", order=0)
    other = stage(target, {"id": [9], "v": ["x"]}, "upsert", order=2)
    commit_staged(t.state, [late, other, early], "upsert")  # any order of messages
    rows = t.to_arrow().sort_by("id")
    got = dict(zip(*rows.to_pydict().values(), strict=True))
    assert len(got) == rows.num_rows  # no key live twice
    winner = "late" if engine == "deduplicate" else "early"
    kept = "old" if vectors and engine == "first-row" else None
    assert got == {1: winner, 2: kept or "late", 3: "early", 5: "late", 9: kept or "x"}
    # The runs the settlement replaced (with deletion vectors: every staged run) are gone;
    # only files the metastore knows remain.
    committed = {t._storage.join(t.location, p)
                 for p in t._metastore.all_file_paths(t._record.table_id)}
    assert stored_paths(t) == committed


@pytest.mark.parametrize("key_type", [pa.int64(), pa.string()])
def test_stages_with_apart_key_ranges_are_committed_without_reading_them(sqlite_lake,
                                                                          monkeypatch, key_type):
    schema = pa.schema([("id", key_type), ("v", pa.string())])
    t = sqlite_lake.create_table("s.k", schema, primary_key=["id"], buckets=1,
                                 deletion_vectors=False)
    target = write_target(t.state)

    def rows(ids):  # strings zero-padded, so that they order as the numbers do
        keys = [f"{i:04d}" for i in ids] if key_type == pa.string() else ids
        return pa.table({"id": pa.array(keys, key_type), "v": ["x"] * len(ids)})

    reads = []
    real = staged_module._read_run
    monkeypatch.setattr(staged_module, "_read_run",
                        lambda table, f, columns: reads.append(f.path) or real(table, f, columns))
    apart = [stage(target, rows([10 * i + 1, 10 * i + 2]), "upsert", order=i) for i in range(3)]
    commit_staged(t.state, apart, "upsert")
    assert reads == []  # the stored key ranges showed that no key can repeat
    assert len(t.files()) == 3 and t.count() == 6
    # Ranges that interleave must be read to tell; these keys still differ: runs kept.
    woven = [stage(target, rows([100, 104]), "upsert", order=0),
             stage(target, rows([102, 106]), "upsert", order=1)]
    commit_staged(t.state, woven, "upsert")
    assert len(reads) == 2 and len(t.files()) == 5 and t.count() == 10
    # A repeated key is settled into one run.
    repeated = [stage(target, rows([200, 201]), "upsert", order=0),
                stage(target, rows([201, 202]), "upsert", order=1)]
    commit_staged(t.state, repeated, "upsert")
    assert len(t.files()) == 6 and t.count() == 13


def test_changes_and_overwrite_stages(any_lake):
    t = any_lake.create_table("s.k", SCHEMA, primary_key=["id"], buckets=2)
    t.upsert({"id": [1, 2], "v": ["a", "b"]})
    target = write_target(t.state)
    s = stage(target, {"id": [1, 3], "v": ["a", "c"], "op": ["-D", "+I"]}, "changes")
    commit_staged(t.state, [s], "changes")
    assert t.to_arrow().sort_by("id").to_pydict() == {"id": [2, 3], "v": ["b", "c"]}
    s = stage(target, {"id": [7], "v": ["z"]}, "overwrite")
    commit_staged(t.state, [s], "overwrite")
    assert t.to_arrow().to_pydict() == {"id": [7], "v": ["z"]}


@pytest.mark.parametrize("vectors", [False, True], ids=["merge-on-read", "deletion-vectors"])
def test_change_stages_committed_as_an_overwrite_leave_only_live_rows(sqlite_lake, vectors):
    """A pipeline's first batch: change rows (retractions among them, keys in two stages)
    replace the table. With deletion vectors, readers take every stored row as live, so the
    retractions must not be stored as rows."""
    t = sqlite_lake.create_table("s.k", SCHEMA, primary_key=["id"], buckets=2,
                                 deletion_vectors=vectors)
    t.upsert({"id": [1, 2, 8], "v": ["old"] * 3})
    target = write_target(t.state)
    first = stage(target, {"id": [1, 3, 4, 5], "v": ["a", "c", "d", "e"],
                           "op": ["+I", "+I", "+I", "-D"]}, "changes", order=0)
    second = stage(target, {"id": [3, 4, 6], "v": ["c", "d2", "f"], "op": ["-D", "+U", "-D"]},
                   "changes", order=1)
    commit_staged(t.state, [first, second], "overwrite")
    assert t.to_arrow().sort_by("id").to_pydict() == {"id": [1, 4], "v": ["a", "d2"]}
    assert t.count() == 2
    committed = {t._storage.join(t.location, p)
                 for p in t._metastore.all_file_paths(t._record.table_id)}
    assert stored_paths(t) == committed  # the runs rewritten without retractions are gone


@pytest.mark.parametrize("vectors", [False, True], ids=["merge-on-read", "deletion-vectors"])
def test_deletes_of_an_overwrite_with_a_sequence_field_hide_older_versions(sqlite_lake,
                                                                         vectors):
    """With a sequence field a delete must keep hiding versions written later with an older
    sequence value: merge-on-read keeps the retraction as a row, deletion vectors as a
    tombstone, also when change rows replace the table."""
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("s", pa.int64())])
    t = sqlite_lake.create_table("s.q", schema, primary_key=["id"], buckets=2,
                                 sequence_field="s", deletion_vectors=vectors)
    target = write_target(t.state)
    batch = stage(target, {"id": [1, 2, 3], "v": ["a", "b", "c"], "s": [5, 5, 5],
                           "op": ["+I", "-D", "-D"]}, "changes", order=0)
    commit_staged(t.state, [batch], "overwrite")
    assert t.to_arrow().to_pydict() == {"id": [1], "v": ["a"], "s": [5]}
    t.upsert({"id": [2, 3], "v": ["late", "new"], "s": [4, 6]})  # 2 older than its delete
    assert t.to_arrow().sort_by("id").to_pydict() == {"id": [1, 3], "v": ["a", "new"],
                                                      "s": [5, 6]}


def test_a_failed_commit_deletes_every_staged_file(sqlite_lake, monkeypatch):
    t = sqlite_lake.create_table("s.t", SCHEMA)
    t.append({"id": [0], "v": ["x"]})
    before = stored_paths(t)
    target = write_target(t.state)
    parts = [stage(target, {"id": [i], "v": ["y"]}, order=i) for i in range(2)]
    assert len(stored_paths(t)) == len(before) + 2

    def fail(*args, **kwargs):
        raise CommitConflict("forced")

    monkeypatch.setattr(t._metastore, "commit", fail)
    with pytest.raises(CommitConflict):
        commit_staged(t.state, parts)
    monkeypatch.undo()
    assert stored_paths(t) == before
    assert t.to_arrow().to_pydict() == {"id": [0], "v": ["x"]}


def test_discarded_stages_leave_nothing_behind(sqlite_lake):
    t = sqlite_lake.create_table("s.t", SCHEMA)
    target = write_target(t.state)
    parts = [stage(target, {"id": [1], "v": ["y"]}), None, StagedWrite((), 0)]
    discard_staged(target, parts)
    assert stored_paths(t) == set()
    assert t.current_snapshot_id is None


def test_modes_a_table_cannot_take_fail_before_writing(sqlite_lake):
    t = sqlite_lake.create_table("s.t", SCHEMA)
    k = sqlite_lake.create_table("s.k", SCHEMA, primary_key=["id"], partition_by=[])
    with pytest.raises(ValidationError, match="needs a table with a primary key"):
        stage(write_target(t.state), {"id": [1], "v": ["a"]}, "upsert")
    with pytest.raises(ValidationError, match="only filter on partition columns"):
        stage(write_target(k.state), {"id": [1], "v": ["a"]}, "overwrite",
              replace_where=al.col("v") == "a")
    with pytest.raises(ValidationError, match="do not match"):
        stage(write_target(t.state), {"id": [1], "v": ["a"]}, "overwrite",
              replace_where=al.col("v") == "b")
    assert stored_paths(t) == set()


def test_staged_upsert_into_a_lookup_table_writes_its_changelog(sqlite_lake):
    t = sqlite_lake.create_table("s.l", SCHEMA, primary_key=["id"], buckets=2,
                                 deletion_vectors=False,
                                 changelog_producer="lookup")
    t.upsert({"id": [1, 2], "v": ["a", "b"]})
    start = t.current_snapshot_id
    target = write_target(t.state)
    parts = [stage(target, {"id": [1], "v": ["a2"]}, "upsert", order=0),
             stage(target, {"id": [2, 3], "v": ["b", "c"]}, "upsert", order=1)]
    commit_staged(t.state, parts, "upsert")
    stream = t.stream(start=start + 1, include_row_kind=True, catch_up_threshold=None,
                      stop_at_latest=True)
    with stream:
        rows = [r for change in stream for r in change.to_arrow().to_pylist()]
    # Key 2 was written with its current value: no change; key 1 changed, key 3 is new.
    assert sorted((r["_row_kind"], r["id"], r["v"]) for r in rows) == [
        ("+I", 3, "c"), ("+U", 1, "a2"), ("-U", 1, "a")]


def test_staged_upsert_into_an_input_changelog_table_is_refused(sqlite_lake):
    t = sqlite_lake.create_table("s.i", SCHEMA, primary_key=["id"],
                                 changelog_producer="input")
    with pytest.raises(ValidationError, match="changelog_producer 'input'"):
        stage(write_target(t.state), {"id": [1], "v": ["a"]}, "upsert")
    assert t.current_snapshot_id is None
