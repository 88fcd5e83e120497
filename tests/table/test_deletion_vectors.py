"""Merge-on-write primary-key tables (``deletion_vectors=True``): every write leaves one live
row per key, older versions marked deleted; reads merge nothing.

The reference is the same history written to a merge-on-read table of the same engine: the
two must hold the same rows at every snapshot."""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import timedelta

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrowlake as al
from arrowlake.errors import DataFileError, ValidationError
from arrowlake.table.maintenance import vector_compaction
from arrowlake.table.writes import merge_into
from arrowlake.table.writes import on_write as merge_on_write
from tests.conftest import METASTORES, make_lake

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("p", pa.string()),
                    ("v", pa.int64()), ("s", pa.int64())])
KINDS = ["+I", "-U", "+U", "-D"]

ENGINES = {
    "deduplicate": {},
    "deduplicate-seq": {"sequence_field": "s"},
    "deduplicate-ignore-delete": {"ignore_delete": True},
    "first-row": {"merge_engine": "first-row"},
    "first-row-seq": {"merge_engine": "first-row", "sequence_field": "s"},
    "partial-update": {"merge_engine": "partial-update"},
    "aggregation": {"merge_engine": "aggregation",
                    "aggregations": {"v": "sum", "s": "last_value"},
                    "properties": {"aggregation.remove-record-on-delete": "true"}},
}

row = st.tuples(st.integers(0, 12), st.sampled_from(["a", "b"]),
                st.one_of(st.none(), st.integers(-5, 5)), st.integers(0, 6))
op = st.one_of(
    st.tuples(st.just("upsert"), st.lists(row, min_size=1, max_size=8)),
    st.tuples(st.just("changes"), st.lists(st.tuples(row, st.sampled_from(KINDS)),
                                           min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, 12)),
    st.tuples(st.just("compact"), st.booleans()),
    st.tuples(st.just("merge"), st.lists(row, min_size=1, max_size=6)),
    st.tuples(st.just("evolve"), st.just(None)),
    # Live rows written back as they are: no change for a deduplicating table.
    st.tuples(st.just("again"), st.lists(st.integers(0, 12), min_size=1, max_size=4)),
    # Deleting by a value column: the keys are found by reading the live rows.
    st.tuples(st.just("delete_where"), st.integers(-5, 5)),
    # Replacing the whole table (a partition of a partitioned one).
    st.tuples(st.just("overwrite"), st.lists(row, min_size=0, max_size=6)),
)


def _rows(rows):
    ids, ps, vs, ss = zip(*rows, strict=True)
    return {"id": list(ids), "p": list(ps), "v": list(vs), "s": list(ss)}


def _apply(table: al.Table, operation) -> None:
    name, arg = operation
    if name == "upsert":
        table.upsert(_rows(arg))
    elif name == "changes":
        data = _rows([r for r, _ in arg])
        data["op"] = [k for _, k in arg]
        table.write_changes(data, row_kind="op")
    elif name == "compact":
        table.compact(full=arg)
    elif name == "merge":
        # Keys repeat in generated rows: MERGE INTO takes one source row per key.
        on = ["id", "p"] if table.partition_by else ["id"]
        unique = list({(r[0], r[1]) if table.partition_by else r[0]: r for r in arg}.values())
        (table.merge(pa.table(_rows(unique)), on=on)
         .when_matched_update(set={"v": "source.v"}, where="source.s >= target.s")
         .when_not_matched_insert().execute())
    elif name == "again":
        live = table.to_arrow()
        live = live.filter(pa.compute.is_in(live["id"], pa.array(arg, pa.int64())))
        if live.num_rows:
            table.upsert(live)
    elif name == "delete_where":
        table.delete(al.col("v") > arg)
    elif name == "overwrite":
        # One row per key; a partitioned table's partition p = 'a' only.
        where = "p = 'a'" if table.partition_by else None
        chosen = [r for r in arg if where is None or r[1] == "a"]
        unique = list({r[0]: r for r in chosen}.values())
        data = pa.table(_rows(unique), schema=SCHEMA) if unique else SCHEMA.empty_table()
        table.overwrite(data, filter=where)
    elif name == "evolve":
        if "w" not in table.schema.names:
            table.add_column("w", pa.string())
    else:
        table.delete(al.col("id") <= arg)


def _state(table: al.Table, **at) -> list[dict]:
    rows = table.scan(**at).to_arrow()
    return sorted(rows.to_pylist(), key=lambda r: (r["id"], r["p"]))


def _deletes_allowed(engine: str) -> bool:
    return engine not in ("first-row", "first-row-seq", "deduplicate-ignore-delete")


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=1, max_size=6), buckets=st.integers(1, 8),
       partitioned=st.booleans())
def test_merge_on_write_equals_merge_on_read(tmp_path_factory, engine, ops, buckets,
                                              partitioned):
    lake = al.connect(tmp_path_factory.mktemp("dv"))
    options = dict(ENGINES[engine])
    properties = options.pop("properties", {})
    key = ["id", "p"] if partitioned else ["id"]
    made = {
        mode: lake.create_table(
            f"s.{mode}", SCHEMA, primary_key=key, buckets=buckets,
            partition_by=["p"] if partitioned else [], deletion_vectors=(mode == "dv"),
            properties=dict(properties), **options)
        for mode in ("dv", "mor")}
    dv_table, mor_table = made["dv"], made["mor"]
    seen: dict[int, list[dict]] = {}  # snapshot of the merge-on-write table -> its rows
    for operation in ops:
        if operation[0] in ("delete", "delete_where") and not _deletes_allowed(engine):
            continue
        for table in (dv_table, mor_table):
            _apply(table, operation)
        expected = _state(mor_table)
        assert _state(dv_table) == expected
        assert dv_table.count() == len(expected)
        # A filter on a value column, pushed into the files' reads.
        assert _state(dv_table, filter="v >= 0") == _state(mor_table, filter="v >= 0")
        assert dv_table.scan("v >= 0").count() == len(_state(mor_table, filter="v >= 0"))
        if dv_table.current_snapshot_id is not None:
            seen[dv_table.current_snapshot_id] = expected
    # Time travel: every snapshot of the merge-on-write table holds the rows the
    # merge-on-read table held at the same point of the history (a schema change since
    # then does not change what an old snapshot reads: columns added later read as null).
    for snapshot, expected in seen.items():
        rows = _state(dv_table, snapshot=snapshot)
        assert [{k: v for k, v in r.items() if k in SCHEMA.names} for r in rows] == \
            [{k: v for k, v in r.items() if k in SCHEMA.names} for r in expected], snapshot
        assert dv_table.scan(snapshot=snapshot).count() == len(expected)
    # DuckDB reads the files itself, minus the deleted positions.
    final = _state(dv_table)
    got = dv_table.scan().to_duckdb().to_arrow_table()
    assert sorted(got.to_pylist(), key=lambda r: (r["id"], r["p"])) == final
    assert not _keys_live_twice(dv_table, key)
    assert _replayed(dv_table, key) == _state(dv_table)
    lake.close()


COLUMNS = list(SCHEMA.names)  # streams read these (a column "evolve" adds comes and goes)


def _changes(stream: al.Stream, *, commit: bool = False) -> list[tuple[str, Counter]]:
    """Per change with rows: its kind and its rows (with ``_row_kind``) as a multiset."""
    out = []
    for change in stream:
        rows = change.to_arrow().to_pylist()
        if rows:
            out.append((change.kind, Counter(tuple(r.values()) for r in rows)))
        if commit:
            stream.commit(change.snapshot_id)
    return out


@pytest.mark.parametrize("producer", ["input", "full-compaction", "lookup"])
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(engine=st.sampled_from(list(ENGINES)), ops=st.lists(op, min_size=1, max_size=6),
       buckets=st.integers(1, 3), partitioned=st.booleans(), cut=st.integers(0, 6))
def test_input_and_full_compaction_producers_stream_as_on_merge_on_read(
        tmp_path_factory, producer, engine, ops, buckets, partitioned, cut):
    """Both modes fed the same history stream the same changes, read by one stream, by a
    consumer stopped after ``cut`` operations and resumed from its committed progress, and by
    a catch-up over the whole history."""
    lake = al.connect(tmp_path_factory.mktemp("dv-log"))
    options = dict(ENGINES[engine])
    properties = options.pop("properties", {})
    key = ["id", "p"] if partitioned else ["id"]
    ops = [o for o in ops if o[0] not in ("delete", "delete_where") or _deletes_allowed(engine)]
    if producer == "full-compaction":
        ops.append(("compact", True))
    read = {}
    for mode in ("dv", "mor"):
        table = lake.create_table(
            f"s.{mode}", SCHEMA, primary_key=key, buckets=buckets,
            partition_by=["p"] if partitioned else [], deletion_vectors=(mode == "dv"),
            changelog_producer=producer, properties=dict(properties), **options)
        opened = {"include_row_kind": True, "columns": COLUMNS, "stop_at_latest": True}
        for operation in ops[:cut]:
            _apply(table, operation)
        with table.stream(consumer="c", start="earliest", catch_up_threshold=None,
                          **opened) as consumer:
            consumed = _changes(consumer, commit=True)
        for operation in ops[cut:]:
            _apply(table, operation)
        with table.stream(consumer="c", start="earliest", catch_up_threshold=None,
                          **opened) as consumer:
            consumed += _changes(consumer, commit=True)
        with table.stream(start="earliest", catch_up_threshold=None, **opened) as stream:
            changes = _changes(stream)
        assert consumed == changes
        with table.stream(start="earliest", catch_up_threshold=1, **opened) as stream:
            # A write that changes nothing commits no snapshot on a deletion-vector table
            # (merge-on-read writes a run), so catch-up may start in one mode only: the
            # rows it delivers, not how they are cut into changes, must agree.
            caught_up = sum((rows for _, rows in _changes(stream)), Counter())
        read[mode] = changes, caught_up
        if producer == "full-compaction":
            # The history ends with a full compaction: its changes rebuild the table.
            assert all(kind == "compact" for kind, _ in changes)
            assert _rebuilt(changes) == Counter(
                tuple(r[c] for c in COLUMNS) for r in table.to_arrow().to_pylist())
    (dv_changes, dv_caught_up), (mor_changes, mor_caught_up) = read["dv"], read["mor"]
    assert dv_caught_up == mor_caught_up
    # An overwrite that leaves every row as it was is no change with deletion vectors.
    mor_changes = [(kind, rows) for kind, rows in mor_changes
                   if kind != "overwrite" or _net(rows) != (Counter(), Counter())]
    assert [kind for kind, _ in dv_changes] == [kind for kind, _ in mor_changes]
    for (kind, dv_rows), (_, mor_rows) in zip(dv_changes, mor_changes, strict=True):
        if kind == "overwrite":
            # An overwrite streams what it replaced: merge-on-read retracts the partitions'
            # rows and inserts the new ones, deletion vectors pair them by key (-U/+U, and
            # nothing for a row written again as it was). Both leave the same rows.
            assert _net(dv_rows) == _net(mor_rows)
        else:
            assert dv_rows == mor_rows
    lake.close()


def _net(change: Counter) -> tuple[Counter, Counter]:
    """The rows a change takes away and adds, rows both taken away and added cancelled."""
    gone: Counter = Counter()
    new: Counter = Counter()
    for row, n in change.items():
        (gone if row[-1] in ("-U", "-D") else new)[row[:-1]] += n
    return gone - new, new - gone


def _rebuilt(changes: list[tuple[str, Counter]]) -> Counter:
    """The rows the changes leave, each retraction (-U, -D) taking away a row that is there."""
    rows: Counter = Counter()
    for _, change in changes:
        for kind in ("-U", "-D", "+U", "+I"):
            for row, n in change.items():
                if row[-1] != kind:
                    continue
                if kind.startswith("-"):
                    assert rows[row[:-1]] >= n, (kind, row)
                    rows[row[:-1]] -= n
                else:
                    rows[row[:-1]] += n
    return +rows


def _replayed(table: al.Table, key: list[str]) -> list[dict]:
    """The table rebuilt from its change stream: each -U/-D must retract the row its key held,
    each +I/+U add one to a key without a row."""
    rows: dict[tuple, dict] = {}
    with table.stream(start="earliest", stop_at_latest=True, include_row_kind=True) as changes:
        for change in changes:
            for r in change.to_arrow().to_pylist():
                kind = r.pop("_row_kind")
                k = tuple(r[c] for c in key)
                if kind in ("-U", "-D"):
                    assert rows.pop(k) == r, (change.snapshot_id, kind, r)
                else:
                    assert k not in rows, (change.snapshot_id, kind, r)
                    rows[k] = r
    return sorted(rows.values(), key=lambda r: (r["id"], r["p"]))


def _keys_live_twice(table: al.Table, key: list[str]) -> bool:
    rows = table.to_arrow()
    return rows.group_by(key).aggregate([([], "count_all")]).filter(
        pa.compute.greater(pa.compute.field("count_all"), 1)).num_rows > 0


def _dv_table(lake: al.Lake, name: str = "s.u", **options) -> al.Table:
    return lake.create_table(name, SCHEMA, primary_key=["id"], buckets=2,
                             deletion_vectors=True, **options)


def test_an_upsert_marks_the_replaced_rows_and_reads_merge_nothing(tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = _dv_table(lake)
    first = t.upsert({"id": [1, 2, 3], "p": ["a"] * 3, "v": [1, 2, 3], "s": [0] * 3})
    assert (first.replaced, first.removed_rows, first.added_rows) == (0, 0, 3)
    second = t.upsert({"id": [2, 4], "p": ["b", "b"], "v": [20, 40], "s": [1, 1]})
    assert (second.replaced, second.removed_rows, second.added_rows) == (1, 1, 2)
    assert _state(t) == [
        {"id": 1, "p": "a", "v": 1, "s": 0}, {"id": 2, "p": "b", "v": 20, "s": 1},
        {"id": 3, "p": "a", "v": 3, "s": 0}, {"id": 4, "p": "b", "v": 40, "s": 1}]
    # Any column prunes and filters: each key has one live row.
    assert t.scan(filter="v = 20").to_arrow().column("id").to_pylist() == [2]
    assert t.scan(filter="v > 2").count() == 3
    assert all(split.merge is None for split in t.scan().plan())
    deleted = t.delete("id = 3")
    assert (deleted.removed_rows, deleted.added_files) == (1, 0)
    assert [r["id"] for r in _state(t)] == [1, 2, 4]
    assert _state(t, snapshot=1) == [{"id": i, "p": "a", "v": i, "s": 0} for i in (1, 2, 3)]
    # Live rows per snapshot; the compactions the writes triggered (files with a third of
    # their rows deleted) change no count.
    history = t.snapshots().to_pydict()
    assert [n for n, k in zip(history["total_rows"], history["kind"], strict=True)
            if k != "compact"] == [3, 4, 3]
    assert all(history["total_rows"][i] == history["total_rows"][i - 1]
               for i, k in enumerate(history["kind"]) if k == "compact")
    lake.close()


def test_count_reads_no_file(tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = _dv_table(lake)
    t.upsert({"id": list(range(100)), "p": ["a"] * 100, "v": list(range(100)), "s": [0] * 100})
    t.upsert({"id": list(range(0, 100, 3)), "p": ["b"] * 34, "v": [0] * 34, "s": [1] * 34})
    expected = t.count()
    for path in t.files().column("path").to_pylist():
        (tmp_path / "lake").joinpath(t.location.split("lake/", 1)[-1], path).unlink()
    assert expected == 100
    assert t.count() == 100  # metadata only: the files are gone
    lake.close()


def test_large_vectors_live_in_puffin_files_and_expire_with_their_snapshots(tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = _dv_table(lake)
    n = 50_000
    t.upsert({"id": list(range(n)), "p": ["a"] * n, "v": list(range(n)), "s": [0] * n})
    replaced = list(range(0, n, 7))  # spread over the whole file: a vector of many KiB
    t.upsert({"id": replaced, "p": ["b"] * len(replaced), "v": [-1] * len(replaced),
              "s": [1] * len(replaced)})
    vectors = t._metastore.live_vectors(t._record.table_id, t.current_snapshot_id)
    assert {v.puffin_path is not None for v in vectors.values()} == {True}
    assert sum(v.cardinality for v in vectors.values()) == len(replaced)
    assert t.count() == n
    rows = t.scan(filter="p = 'b'").to_arrow()
    assert sorted(rows.column("id").to_pylist()) == replaced
    assert t.scan(filter="v = -1").count() == len(replaced)
    puffins = sorted((tmp_path / "lake").rglob("*.puffin"))
    assert len(puffins) == 1
    assert t.remove_orphan_files(older_than=timedelta(0), dry_run=True).files == []
    # More rows of the first file replaced: its vector grows into a new Puffin file, and the
    # first one, read only by the older snapshot, goes when that snapshot expires.
    more = list(range(1, n, 7))
    t.upsert({"id": more, "p": ["c"] * len(more), "v": [-2] * len(more), "s": [2] * len(more)})
    assert len(list((tmp_path / "lake").rglob("*.puffin"))) == 2
    assert t.scan(filter="v = -1").count() == len(replaced)
    assert t.scan(filter="v = -2").count() == len(more)
    t.expire_snapshots(retain_last=1)
    left = list((tmp_path / "lake").rglob("*.puffin"))
    assert len(left) == 1 and left[0] != puffins[0]
    assert t.scan(filter="v = -2").count() == len(more)
    assert t.count() == n
    lake.close()


def test_a_damaged_vector_is_a_data_file_error(tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = _dv_table(lake)
    n = 20_000
    t.upsert({"id": list(range(n)), "p": ["a"] * n, "v": [0] * n, "s": [0] * n})
    t.upsert({"id": list(range(0, n, 5)), "p": ["b"] * (n // 5), "v": [1] * (n // 5),
              "s": [1] * (n // 5)})
    [puffin_file] = list((tmp_path / "lake").rglob("*.puffin"))
    data = bytearray(puffin_file.read_bytes())
    data[20] ^= 0xFF
    puffin_file.write_bytes(bytes(data))
    with pytest.raises(DataFileError, match="Deletion vector"):
        t.to_arrow()
    lake.close()


def test_deletion_vectors_option_is_checked(tmp_path):
    lake = al.connect(tmp_path / "lake")
    with pytest.raises(ValidationError, match="with a primary key"):
        lake.create_table("s.plain", SCHEMA, properties={"deletion-vectors.enabled": "true"})
    with pytest.raises(ValidationError, match="must be 'true' or 'false'"):
        lake.create_table("s.bad", SCHEMA, primary_key=["id"],
                          properties={"deletion-vectors.enabled": "yes"})
    with pytest.raises(ValidationError, match="True or False"):
        lake.create_table("s.x", SCHEMA, primary_key=["id"], deletion_vectors="on")
    assert not any(lake.table_exists(n) for n in ("s.plain", "s.bad", "s.x"))
    lake.close()


def test_compaction_bounds_files_and_drops_deleted_rows(tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = _dv_table(lake, properties={"compaction.max-runs": "3"})
    n = 2_000
    t.upsert({"id": list(range(n)), "p": ["a"] * n, "v": [0] * n, "s": [0] * n})
    for round_ in range(1, 9):
        keys = list(range(round_, n, 9))
        result = t.upsert({"id": keys, "p": ["b"] * len(keys), "v": [round_] * len(keys),
                           "s": [round_] * len(keys)})
        files = t.files()
        per_bucket = files.group_by("bucket").aggregate([([], "count_all")])
        assert max(per_bucket.column("count_all").to_pylist()) <= 4, round_
        assert t.count() == n
    assert result.snapshot_id is not None
    expected = _state(t)
    done = t.compact(full=True)
    assert done.snapshot_id is not None and done.removed_files > done.added_files
    assert _state(t) == expected and t.count() == n
    assert t.files().num_rows == 2  # one file per bucket
    assert t._metastore.live_vectors(t._record.table_id, t.current_snapshot_id) == {}
    assert t.compact(full=True).snapshot_id is None  # nothing left to do
    lake.close()


def test_a_compaction_writes_the_same_files_whichever_bucket_is_sorted_first(tmp_path,
                                                                           monkeypatch):
    """Buckets are rewritten two at a time and share one choice of dictionary columns: the
    first pick's, not the first one done, so that two equal tables compacted alike hold files
    of equal sizes. Picks go the most files first, then the fewest live bytes: partition
    v=0 (``p`` repeats: it would dictionary-encode ``p``) is the first, v=1 (``p`` all
    distinct: it would not) the second. One table's compaction holds the first pick back,
    the other's the second."""
    def filled(name: str) -> al.Table:
        t = lake.create_table(name, SCHEMA, primary_key=["v", "id"], partition_by=["v"],
                              buckets=1, deletion_vectors=True,
                              properties={"compaction.mode": "off"})
        for round_ in range(3):
            n, m = 3000, 1000
            t.upsert({"id": list(range(n)), "p": [f"r{round_}-{i % 3}" for i in range(n)],
                      "v": [0] * n, "s": [round_] * n})
            t.upsert({"id": list(range(m)), "p": [f"x{round_}-{i}" for i in range(m)],
                      "v": [1] * m, "s": [round_] * m})
        return t

    def compacted_holding(t: al.Table, partition: str) -> list[tuple[int, int]]:
        real = vector_compaction._read_pick
        held = []

        def read(table, view, pick):
            if pick.files[0].partition_values == partition:
                held.append(pick)
                time.sleep(0.3)  # the other pick is read, sorted and started meanwhile
            return real(table, view, pick)

        monkeypatch.setattr(vector_compaction, "_read_pick", read)
        assert t.compact(full=True).buckets == 2
        monkeypatch.undo()
        assert len(held) == 1
        files = t.files()
        return sorted(zip(files["row_count"].to_pylist(), files["file_size"].to_pylist(),
                          strict=True))

    lake = al.connect(tmp_path / "lake")
    first_held, second_held = filled("s.first"), filled("s.second")
    assert compacted_holding(first_held, "[0]") == compacted_holding(second_held, "[1]")
    assert _state(first_held) == _state(second_held)
    lake.close()


@pytest.mark.parametrize("races", [1, 2])
def test_writes_racing_a_compaction_do_not_void_it(tmp_path, monkeypatch, races):
    """Another writer replaces and deletes rows of the files being compacted after the
    compaction read them (once, or again after its first catch-up): the compaction drops those
    rows from its output and commits; the writer's rows stay, no key is live twice."""
    lake = al.connect(tmp_path / "lake")
    t = _dv_table(lake, properties={"compaction.mode": "off"})
    n = 600
    t.upsert({"id": list(range(n)), "p": ["a"] * n, "v": [0] * n, "s": [0] * n})
    for round_ in (1, 2):
        keys = list(range(round_, n, 7))
        t.upsert({"id": keys, "p": ["b"] * len(keys), "v": [round_] * len(keys),
                  "s": [0] * len(keys)})
    other = al.connect(tmp_path / "lake").table("s.u")
    raced = []

    def race() -> None:
        if len(raced) < races:
            step = len(raced)
            raced.append(step)
            keys = list(range(step * 50, step * 50 + 40))
            other.upsert({"id": keys, "p": ["c"] * 40, "v": [100 + step] * 40, "s": [0] * 40})
            other.delete(f"id = {500 + step}")

    # After the outputs are first written, and after each rewrite a catch-up makes.
    first, again = vector_compaction._rewrite, vector_compaction._write_output

    def rewrite_then_race(*args):
        outputs = first(*args)
        race()
        return outputs

    def write_then_race(*args):
        again(*args)
        race()

    monkeypatch.setattr(vector_compaction, "_rewrite", rewrite_then_race)
    monkeypatch.setattr(vector_compaction, "_write_output", write_then_race)
    done = t.compact(full=True)
    monkeypatch.undo()
    assert len(raced) == races
    assert done.snapshot_id is not None and not done.dropped
    rows = _state(t)
    assert len({r["id"] for r in rows}) == len(rows) == n - races == t.count()
    for step in range(races):
        assert all(r["v"] == 100 + step for r in rows if step * 50 <= r["id"] < step * 50 + 40)
        assert 500 + step not in {r["id"] for r in rows}
    # The outputs hold none of the raced rows: no vector was needed to hide them.
    compacted = t.files().filter(pa.compute.equal(t.files()["added_snapshot"], done.snapshot_id))
    assert t._metastore.live_vectors(t._record.table_id, t.current_snapshot_id,
                                     compacted["file_id"].to_pylist()) == {}
    lake.close()


def test_a_lookup_changelog_table_streams_before_images(tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = _dv_table(lake, changelog_producer="lookup")
    t.upsert({"id": [1, 2], "p": ["a", "a"], "v": [1, 2], "s": [0, 0]})
    t.upsert({"id": [2, 3], "p": ["b", "b"], "v": [20, 3], "s": [1, 1]})
    t.delete("id = 1")
    with t.stream(start="earliest", stop_at_latest=True, include_row_kind=True,
                  columns=["id", "v"]) as changes:
        order = ["-D", "-U", "+U", "+I"]
        seen = [sorted(c.to_arrow().to_pylist(),
                       key=lambda r: (r["id"], order.index(r["_row_kind"])))
                for c in changes]
    assert seen == [
        [{"id": 1, "v": 1, "_row_kind": "+I"}, {"id": 2, "v": 2, "_row_kind": "+I"}],
        [{"id": 2, "v": 2, "_row_kind": "-U"}, {"id": 2, "v": 20, "_row_kind": "+U"},
         {"id": 3, "v": 3, "_row_kind": "+I"}],
        [{"id": 1, "v": 1, "_row_kind": "-D"}]]
    lake.close()


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(engine=st.sampled_from(list(ENGINES)), ops=st.lists(op, min_size=1, max_size=7),
       buckets=st.integers(1, 3), partitioned=st.booleans())
def test_the_lookup_producer_writes_the_change_streams_derive_from_vectors(
        tmp_path_factory, engine, ops, buckets, partitioned):
    """``lookup`` on a deletion-vector table writes each write's change (before-images
    included) as changelog files at write time; ``none`` leaves streams to derive it from the
    snapshot's vectors and new files. Fed the same history, every change must be the same
    rows, in the same order per key; and each lookup write that changed rows must have
    written them (a stream of it reads no old data file)."""
    lake = al.connect(tmp_path_factory.mktemp("dv-lookup"))
    options = dict(ENGINES[engine])
    properties = options.pop("properties", {})
    key = ["id", "p"] if partitioned else ["id"]
    ops = [o for o in ops if o[0] not in ("delete", "delete_where") or _deletes_allowed(engine)]
    streamed = {}
    for producer in ("none", "lookup"):
        table = lake.create_table(
            f"s.{producer.replace('-', '_')}", SCHEMA, primary_key=key, buckets=buckets,
            partition_by=["p"] if partitioned else [], deletion_vectors=True,
            changelog_producer=producer, properties=dict(properties), **options)
        for operation in ops:
            _apply(table, operation)
        out = []
        with table.stream(start="earliest", catch_up_threshold=None, stop_at_latest=True,
                          include_row_kind=True, columns=COLUMNS) as stream:
            for change in stream:
                rows = change.to_arrow().to_pylist()
                if not rows:
                    continue  # a write that changed nothing: no change, or an empty one
                per_key: dict[tuple, list[str]] = {}
                for r in rows:
                    per_key.setdefault((r["id"], r["p"]), []).append(r["_row_kind"])
                out.append((change.snapshot_id, change.kind,
                            Counter(tuple(r.values()) for r in rows), per_key))
        streamed[producer] = out
        if producer == "lookup":
            history = table.snapshots()
            logged = {sid for sid, summary in zip(history.column("snapshot_id").to_pylist(),
                                                  history.column("summary").to_pylist(),
                                                  strict=True)
                      if _summary(summary).get("changelog") == "lookup"}
            ms, tid = lake.metastore, table._record.table_id
            for sid, kind, _, _ in out:
                if sid in logged:
                    added, _ = ms.files_changed(tid, sid - 1, sid)
                    assert "changelog" in added.column("content").to_pylist(), (sid, kind)
                else:  # only writes that do not look their keys up leave it to the vectors
                    assert kind in ("overwrite", "compact"), (sid, kind)
    assert [(k, rows, order) for _, k, rows, order in streamed["none"]] == \
        [(k, rows, order) for _, k, rows, order in streamed["lookup"]]
    lake.close()


def _summary(summary: object) -> dict:
    return json.loads(summary) if isinstance(summary, str) else dict(summary or {})


def test_a_write_landing_during_a_full_compaction_is_in_its_changelog(tmp_path, monkeypatch):
    lake = al.connect(tmp_path / "lake")
    t = _dv_table(lake, changelog_producer="full-compaction")
    t.upsert({"id": [1, 2], "p": ["a", "a"], "v": [1, 2], "s": [0, 0]})
    t.upsert({"id": [1], "p": ["a"], "v": [10], "s": [1]})
    computed = vector_compaction.full_compaction_changelog
    bases = []

    def racing(table, base):
        out = computed(table, base)
        if not bases:  # another writer commits before this compaction does
            lake.table("s.u").upsert({"id": [3], "p": ["a"], "v": [3], "s": [0]})
        bases.append(base)
        return out

    monkeypatch.setattr(vector_compaction, "full_compaction_changelog", racing)
    assert t.compact(full=True).snapshot_id is not None
    assert len(bases) == 2 and bases[1] == bases[0] + 1  # computed again on the new snapshot
    monkeypatch.undo()
    t.upsert({"id": [4], "p": ["a"], "v": [4], "s": [0]})
    t.compact(full=True)
    with t.stream(start="earliest", stop_at_latest=True, include_row_kind=True,
                  columns=["id", "v"]) as changes:
        seen = [sorted((r["id"], r["v"], r["_row_kind"]) for r in c.to_arrow().to_pylist())
                for c in changes]
    # The racing write is in the first full compaction's change, and only there.
    assert seen == [[(1, 10, "+I"), (2, 2, "+I"), (3, 3, "+I")], [(4, 4, "+I")]]
    assert t.remove_orphan_files(timedelta(0)).files == []  # the first attempt's changelog
    lake.close()


def test_an_overwrite_of_a_partition_streams_its_live_rows_retracted(tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.p", SCHEMA, primary_key=["id", "p"], partition_by=["p"],
                          buckets=2, deletion_vectors=True)
    t.upsert({"id": [1, 2, 3], "p": ["a", "a", "b"], "v": [1, 2, 3], "s": [0, 0, 0]})
    t.upsert({"id": [2], "p": ["a"], "v": [20], "s": [1]})  # a vector on partition a's file
    result = t.overwrite({"id": [2, 4], "p": ["a", "a"], "v": [200, 4], "s": [2, 2]},
                         filter="p = 'a'")
    assert result.removed_rows == 2  # the live rows 1 and 2, not the replaced version of 2
    assert t.count() == 3
    assert t.snapshots().column("total_rows").to_pylist()[-1] == 3
    with t.stream(start=result.snapshot_id, stop_at_latest=True, include_row_kind=True,
                  columns=["id", "v"]) as changes:
        [change] = list(changes)
    order = ["-D", "-U", "+U", "+I"]
    rows = sorted(change.to_arrow().to_pylist(),
                  key=lambda r: (r["id"], order.index(r["_row_kind"])))
    assert rows == [{"id": 1, "v": 1, "_row_kind": "-D"}, {"id": 2, "v": 20, "_row_kind": "-U"},
                    {"id": 2, "v": 200, "_row_kind": "+U"}, {"id": 4, "v": 4, "_row_kind": "+I"}]
    lake.close()


def test_positions_stay_right_when_row_groups_are_skipped(tmp_path):
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.rg", SCHEMA, primary_key=["id"], buckets=1, deletion_vectors=True,
                          properties={"write.row-group-rows": "100",
                                      "compaction.max-runs": "100",
                                      "deletion-vectors.rewrite-threshold": "1"})
    n = 1_000
    t.upsert({"id": list(range(n)), "p": ["a"] * n, "v": list(range(n)), "s": [0] * n})
    gone = [5, 150, 151, 420, 777, 999]
    t.upsert({"id": gone, "p": ["b"] * len(gone), "v": [-1] * len(gone), "s": [1] * len(gone)})
    [split] = t.scan().plan()
    assert any(f.deletes is not None for f in split.files)
    for where, expected in (("id >= 400", [i for i in range(400, n)]),
                            ("id >= 140 and id < 160", list(range(140, 160))),
                            ("v >= 700", list(range(700, n)))):
        rows = t.scan(filter=where).to_arrow().to_pylist()
        want = [{"id": i, "p": "b" if i in gone else "a", "v": -1 if i in gone else i,
                 "s": 1 if i in gone else 0} for i in expected]
        if where == "v >= 700":
            want = [r for r in want if r["v"] >= 700]
        assert sorted(rows, key=lambda r: r["id"]) == want, where
        assert t.scan(filter=where).count() == len(want)
    # Row groups kept apart from each other, and a projection without the filter's column.
    rows = t.scan(filter="id < 160 or id > 940", columns=["v"]).to_arrow()
    assert rows.column_names == ["v"]
    assert sorted(rows["v"].to_pylist()) == sorted(
        -1 if i in gone else i for i in [*range(160), *range(941, n)])
    lake.close()


@pytest.mark.parametrize("kind", METASTORES)
@pytest.mark.parametrize("options", [{}, {"sequence_field": "s"}], ids=["blind", "looked-up"])
def test_a_write_others_keep_overtaking_holds_the_table_and_lands(tmp_path, monkeypatch,
                                                                  request, options, kind):
    """Another writer commits to the same bucket right before each of this write's commits:
    after a few lookups made stale that way, the write plans and commits holding the table."""

    lake = make_lake(kind, tmp_path, request)
    t = _dv_table(lake, **options)
    t.upsert({"id": [1, 2], "p": ["a", "a"], "v": [1, 2], "s": [0, 0]})
    second = al.connect(tmp_path / "lake") if kind == "sqlite" else \
        al.connect(lake.metastore.url, warehouse=str(tmp_path / "warehouse"))
    other = second.table("s.u")
    real_commit, real_hold = lake.metastore.commit, lake.metastore.commit_holding
    races, held = [], []

    def commit(table_id, base, change):
        if change.kind == "upsert":
            races.append(base)
            other.upsert({"id": [1, 2], "p": ["b", "b"], "v": [len(races)] * 2,
                          "s": [len(races)] * 2})
        return real_commit(table_id, base, change)

    def hold(table_id, prepare):
        held.append(table_id)
        return real_hold(table_id, prepare)

    monkeypatch.setattr(lake.metastore, "commit", commit)
    monkeypatch.setattr(lake.metastore, "commit_holding", hold)
    result = t.upsert({"id": [1, 2], "p": ["c", "c"], "v": [10, 20], "s": [9, 9]})
    monkeypatch.undo()
    assert result.snapshot_id is not None
    assert len(races) == merge_on_write.FREE_ATTEMPTS and len(held) == 1
    assert _state(t) == [{"id": 1, "p": "c", "v": 10, "s": 9}, {"id": 2, "p": "c", "v": 20, "s": 9}]
    assert not _keys_live_twice(t, ["id"])
    second.close()
    lake.close()


@pytest.mark.parametrize("kind", METASTORES)
def test_a_merge_retried_on_a_newer_snapshot_checks_the_commits_since_its_decision(
        tmp_path, monkeypatch, request, kind):
    """A merge decided on snapshot B; a commit to its bucket made its lookups stale, and
    before it looked them up again another writer deleted a key it had found matched. Its
    retry plans on the newest snapshot, so its commit sees no commit landing first: the
    delete must still send it back to decide again (key 1 is inserted, as in the serial
    order), not commit 'key 1 unchanged' and leave it deleted."""
    lake = make_lake(kind, tmp_path, request)
    t = lake.create_table("s.m", SCHEMA, primary_key=["id"], buckets=1, deletion_vectors=True)
    t.upsert({"id": [1], "p": ["a"], "v": [1], "s": [10]})
    second = al.connect(tmp_path / "lake") if kind == "sqlite" else \
        al.connect(lake.metastore.url, warehouse=str(tmp_path / "warehouse"))
    other = second.table("s.m")
    real_commit = lake.metastore.commit
    calls = []

    def commit(table_id, base, change):
        calls.append(base)
        if len(calls) == 1:
            # Lands first in the merge's bucket, without touching its keys: stale lookups.
            other.upsert({"id": [9], "p": ["x"], "v": [9], "s": [0]})
            try:
                return real_commit(table_id, base, change)
            finally:
                other.delete("id = 1")  # lands before the merge looks its keys up again
        return real_commit(table_id, base, change)

    monkeypatch.setattr(lake.metastore, "commit", commit)
    result = (t.merge(pa.table({"id": [1, 2], "p": ["m", "m"], "v": [5, 6], "s": [5, 5]}),
                      on="id")
              .when_matched_update(where="source.s > target.s")
              .when_not_matched_insert().execute())
    monkeypatch.undo()
    assert len(calls) >= 2
    assert (result.inserted, result.updated) == (2, 0)
    assert _state(t) == [{"id": 1, "p": "m", "v": 5, "s": 5}, {"id": 2, "p": "m", "v": 6, "s": 5},
                         {"id": 9, "p": "x", "v": 9, "s": 0}]
    second.close()
    lake.close()


def test_files_with_deleted_rows_read_every_type_back_exactly(tmp_path):
    """Files with a vector are read through Parquet's reader rather than the dataset scan:
    every type (timezones, times, durations, decimals, lists, dictionary-encoded strings,
    nulls) comes back as a plain read gives it, with the filter and projection applied, after
    a rename too."""
    import numpy as np
    import pyarrow.compute as pc

    from tests.table.test_writes import ENCODED_TYPES, _encoded_rows

    n = 3_000
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), *ENCODED_TYPES])
    rows = _encoded_rows(n)
    rows = pa.table([pa.array(np.arange(n)), *rows.columns], schema=schema)
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.types", schema, primary_key=["id"], buckets=1,
                          deletion_vectors=True,
                          properties={"write.row-group-rows": "500",
                                      "deletion-vectors.rewrite-threshold": "1"})
    t.upsert(rows)
    # New versions of every 7th id, from the last rows' values; their strings come as pandas
    # and Polars hand them over.
    ids = np.arange(0, n, 7)
    changed = rows.take(pa.array(n - 1 - ids)).set_column(0, "id", pa.array(ids))
    changed = changed.set_column(changed.schema.get_field_index("ls"), "ls",
                                 changed["ls"].cast(pa.string_view()))
    changed = changed.set_column(changed.schema.get_field_index("few"), "few",
                                 changed["few"].dictionary_encode())
    t.upsert(changed)
    [split] = t.scan().plan()
    assert sum(f.deletes is not None for f in split.files) == 1
    keep = pc.invert(pc.is_in(rows["id"], value_set=pa.array(ids)))
    expected = pa.concat_tables([rows.filter(keep), changed.cast(schema)]).sort_by("id")

    assert t.to_arrow().sort_by("id").equals(expected)
    where = "i64 >= 0 and f64 < 0.5"
    want = expected.filter(pc.and_(pc.greater_equal(expected["i64"], 0),
                                   pc.less(expected["f64"], 0.5)))
    got = t.scan(filter=where, columns=["id", "ts", "dec", "tags", "few"]).to_arrow()
    assert got.sort_by("id").equals(want.select(["id", "ts", "dec", "tags", "few"]))
    assert t.scan(filter=where).count() == want.num_rows
    # Read under a new name: the projection maps the file's column to it.
    t.rename_column("dur", "duration")
    got = t.scan(filter="id < 100", columns=["id", "duration"]).to_arrow().sort_by("id")
    assert got["duration"].equals(expected.filter(pc.less(expected["id"], 100))["dur"])
    lake.close()


@pytest.mark.parametrize("vectors", [True, False], ids=["deletion-vectors", "merge-on-read"])
def test_a_merge_decided_on_the_empty_table_checks_the_first_commits(tmp_path, monkeypatch,
                                                                      vectors):
    """A merge decided on a table with no snapshot yet ("insert key 1"); another writer's
    upsert of key 1 landed before the merge committed. The merge must be sent back to decide
    again (key 1 matched, its condition false: unchanged), as in the serial order, not insert
    over the other writer's row. Before, its commit took the snapshot current at commit time
    as the one it had decided on, and checked nothing."""
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.m", SCHEMA, primary_key=["id"], buckets=1,
                          deletion_vectors=vectors)
    other = al.connect(tmp_path / "lake").table("s.m")
    real = merge_into.MergeBuilder._decide
    raced = []

    def decide_then_race(builder, base, out):
        decision = real(builder, base, out)
        if not raced:  # between the merge's decision and its commit
            raced.append(base)
            other.upsert({"id": [1], "p": ["o"], "v": [1], "s": [10]})
        return decision

    monkeypatch.setattr(merge_into.MergeBuilder, "_decide", decide_then_race)
    result = (t.merge(pa.table({"id": [1], "p": ["m"], "v": [5], "s": [5]}), on="id")
              .when_matched_update(where="source.s > target.s")
              .when_not_matched_insert().execute())
    monkeypatch.undo()
    assert raced == [None]
    assert (result.inserted, result.updated, result.unchanged) == (0, 0, 1)
    assert _state(t) == [{"id": 1, "p": "o", "v": 1, "s": 10}]
    lake.close()


def test_lookup_before_images_follow_field_ids_not_names(tmp_path):
    """A column dropped and added again under its old name and type is a new column: rows
    written before hold no value of it. The ``lookup`` writer takes before-images from the
    files it keeps decoded; those must read it as null, as the files themselves do (by field
    id), and stream what ``none`` derives from the vectors."""
    lake = al.connect(tmp_path / "lake")
    seen = {}
    for producer in ("none", "lookup"):
        t = _dv_table(lake, f"s.{producer}", changelog_producer=producer)
        t.upsert({"id": [1, 2], "p": ["a", "a"], "v": [10, 20], "s": [0, 0]})
        t.drop_column("v")
        t.add_column("v", pa.int64())
        t.upsert({"id": [1], "p": ["b"], "v": [11], "s": [1]})
        with t.stream(start="earliest", stop_at_latest=True, include_row_kind=True,
                      catch_up_threshold=None, columns=["id", "p", "v"]) as changes:
            seen[producer] = [c.to_arrow().to_pylist() for c in changes][-1]
    assert seen["lookup"] == seen["none"] == [
        {"id": 1, "p": "a", "v": None, "_row_kind": "-U"},
        {"id": 1, "p": "b", "v": 11, "_row_kind": "+U"}]
    lake.close()
