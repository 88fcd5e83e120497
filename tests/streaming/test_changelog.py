"""Changelog producers on scripted histories for every merge engine, and lookup against a model."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrowlake as al
from arrowlake.errors import ValidationError
from tests.conftest import METASTORES, make_lake


def changes(t: al.Table, **kw) -> list[tuple[str, list[tuple]]]:
    """Per change: its kind and its rows as tuples ``(*values, row_kind)`` in stream order."""
    kw.setdefault("start", "earliest")
    stream = t.stream(include_row_kind=True, catch_up_threshold=None, stop_at_latest=True, **kw)
    return [(c.kind, [tuple(r.values()) for r in c.to_arrow().to_pylist()]) for c in stream]


def by_key(history: list[tuple[str, list[tuple]]]) -> list[tuple[str, list[tuple]]]:
    """Rows of each change ordered by key, keeping each key's rows in stream order."""
    return [(kind, sorted(rows, key=lambda r: r[0])) for kind, rows in history]


SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.string())])


def _dedupe_history(t: al.Table) -> None:
    t.upsert({"k": [1, 2, 1], "v": ["a", "b", "a2"]})
    t.upsert({"k": [1, 3, 2], "v": ["A", "c", "b"]})  # 2 written again, unchanged
    t.compact(full=True)
    t.delete("k = 2")
    t.write_changes({"k": [3, 3, 4], "v": ["c", "C", "d"], "op": ["-U", "+U", "+I"]})
    t.write_changes({"k": [4], "v": ["d"], "op": ["-D"]})


EXPECTED_DEDUPE = {
    "none": [
        ("upsert", [(1, "a2", "+I"), (2, "b", "+I")]),
        ("upsert", [(1, "A", "+I"), (2, "b", "+I"), (3, "c", "+I")]),
        ("delete", [(2, "b", "-D")]),
        ("changes", [(3, "C", "+U"), (4, "d", "+I")]),
        ("changes", [(4, "d", "-D")]),
    ],
    "input": [
        ("upsert", [(1, "a", "+I"), (1, "a2", "+I"), (2, "b", "+I")]),
        ("upsert", [(1, "A", "+I"), (2, "b", "+I"), (3, "c", "+I")]),
        ("delete", [(2, "b", "-D")]),
        ("changes", [(3, "c", "-U"), (3, "C", "+U"), (4, "d", "+I")]),
        ("changes", [(4, "d", "-D")]),
    ],
    "lookup": [
        ("upsert", [(1, "a2", "+I"), (2, "b", "+I")]),
        ("upsert", [(1, "a2", "-U"), (1, "A", "+U"), (3, "c", "+I")]),
        ("delete", [(2, "b", "-D")]),
        ("changes", [(3, "c", "-U"), (3, "C", "+U"), (4, "d", "+I")]),
        ("changes", [(4, "d", "-D")]),
    ],
}


@pytest.mark.parametrize("kind", METASTORES)
@pytest.mark.parametrize("producer", ["none", "input", "lookup"])
def test_deduplicate_history_per_producer(kind, producer, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    t = lake.create_table("s.t", SCHEMA, deletion_vectors=False, primary_key=["k"], buckets=2,
                          changelog_producer=producer)
    assert t.properties["changelog-producer"] == producer
    _dedupe_history(t)
    assert by_key(changes(t)) == EXPECTED_DEDUPE[producer]
    lake.close()


def test_partial_update_lookup_emits_the_merged_row(sqlite_lake):
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), ("a", pa.int64()),
                        ("b", pa.int64())])
    for producer, expected in {
        "none": [("upsert", [(1, 1, None, "+I")]), ("upsert", [(1, None, 2, "+I")]),
                 ("upsert", [(1, 1, None, "+I")])],
        "lookup": [("upsert", [(1, 1, None, "+I")]),
                   ("upsert", [(1, 1, None, "-U"), (1, 1, 2, "+U")])],
    }.items():
        t = sqlite_lake.create_table(f"s.p_{producer}", schema, primary_key=["k"], buckets=1,
                                     deletion_vectors=False,
                                     merge_engine="partial-update",
                                     changelog_producer=producer)
        t.upsert({"k": [1], "a": [1], "b": [None]})
        t.upsert({"k": [1], "a": [None], "b": [2]})
        t.upsert({"k": [1], "a": [1], "b": [None]})  # changes no merged value
        t.compact(full=True)
        assert changes(t) == expected, producer
        assert t.to_arrow().to_pylist() == [{"k": 1, "a": 1, "b": 2}]


def test_aggregation_lookup_emits_the_aggregated_row(sqlite_lake):
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), ("n", pa.int64())])
    for producer, expected in {
        # The runs as stored: a write folds its rows per key, a retraction into a negation.
        "none": [("upsert", [(1, 5, "+I")]), ("upsert", [(1, 3, "+I"), (2, 1, "+I")]),
                 ("changes", [(1, -3, "+U")]), ("upsert", [(1, 0, "+I")])],
        "input": [("upsert", [(1, 2, "+I"), (1, 3, "+I")]),
                  ("upsert", [(1, 3, "+I"), (2, 1, "+I")]),
                  ("changes", [(1, 3, "-U")]), ("upsert", [(1, 0, "+I")])],
        "lookup": [("upsert", [(1, 5, "+I")]),
                   ("upsert", [(1, 5, "-U"), (1, 8, "+U"), (2, 1, "+I")]),
                   ("changes", [(1, 8, "-U"), (1, 5, "+U")])],
    }.items():
        t = sqlite_lake.create_table(f"s.a_{producer}", schema, primary_key=["k"], buckets=1,
                                     deletion_vectors=False,
                                     merge_engine="aggregation",
                                     aggregations={"n": "sum"}, changelog_producer=producer)
        t.upsert({"k": [1, 1], "n": [2, 3]})
        t.upsert({"k": [1, 2], "n": [3, 1]})
        t.write_changes({"k": [1], "n": [3], "op": ["-U"]})  # retract 3
        t.upsert({"k": [1], "n": [0]})  # adds nothing
        t.compact(full=True)
        assert by_key(changes(t)) == expected, producer
        assert t.to_arrow().sort_by("k").to_pylist() == [{"k": 1, "n": 5}, {"k": 2, "n": 1}]


def test_first_row_lookup_ignores_later_versions(sqlite_lake):
    for producer, expected in {
        "none": [("upsert", [(1, "a", "+I")]), ("upsert", [(1, "b", "+I"), (2, "x", "+I")])],
        "lookup": [("upsert", [(1, "a", "+I")]), ("upsert", [(2, "x", "+I")])],
    }.items():
        t = sqlite_lake.create_table(f"s.f_{producer}", SCHEMA, primary_key=["k"], buckets=2,
                                     deletion_vectors=False,
                                     merge_engine="first-row", changelog_producer=producer)
        t.upsert({"k": [1], "v": ["a"]})
        t.upsert({"k": [1, 2], "v": ["b", "x"]})
        t.compact(full=True)
        assert by_key(changes(t)) == expected, producer


def test_changelog_files_are_not_data_and_expire_with_their_snapshot(sqlite_lake):
    t = sqlite_lake.create_table("s.t", SCHEMA, primary_key=["k"], buckets=2,
                                 deletion_vectors=False,
                                 changelog_producer="lookup")
    t.upsert({"k": [1, 2], "v": ["a", "b"]})
    t.upsert({"k": [1], "v": ["c"]})
    assert t.files().num_rows == 3  # runs only
    assert t.count() == 2
    assert sorted(t.to_arrow().column("v").to_pylist()) == ["b", "c"]
    stored = set(t._metastore.all_file_paths(t._record.table_id))
    # Inserts are read from the runs (format 2): only the update wrote a changelog file.
    assert sum(p.startswith("changelog/") for p in stored) == 1
    t.compact(full=True)
    result = t.expire_snapshots(retain_last=1)
    assert sum("/changelog/" in p for p in result.deleted_files) == 1
    with pytest.raises(ValidationError, match="changelog_producer"):
        sqlite_lake.create_table("s.bad", SCHEMA, primary_key=["k"], changelog_producer="x",
                                 deletion_vectors=False)
    with pytest.raises(ValidationError, match="primary"):
        sqlite_lake.create_table("s.bad", SCHEMA, changelog_producer="lookup")


# -- lookup against a model --------------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("upsert"), st.lists(st.tuples(st.integers(0, 7),
                                                        st.sampled_from("abc")),
                                              min_size=1, max_size=6)),
        st.tuples(st.just("delete"), st.lists(st.integers(0, 7), min_size=1, max_size=3)),
        st.tuples(st.just("compact"), st.just(None)),
    ),
    min_size=1, max_size=7)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=ops)
def test_lookup_matches_a_model_over_random_histories(tmp_path_factory, history):
    lake = al.connect(tmp_path_factory.mktemp("lookup"))
    t = lake.create_table("s.t", SCHEMA, deletion_vectors=False, primary_key=["k"], buckets=3,
                          changelog_producer="lookup")
    state: dict[int, str] = {}
    expected: list[list[tuple]] = []
    for op, arg in history:
        if op == "upsert":
            t.upsert({"k": [k for k, _ in arg], "v": [v for _, v in arg]})
            new = dict(state)
            new.update(dict(arg))
        elif op == "delete":
            t.delete(al.col("k").isin(arg))
            new = {k: v for k, v in state.items() if k not in arg}
        else:
            t.compact(full=True)
            continue
        rows: list[tuple] = []
        for k in sorted(set(state) | set(new)):
            if k not in new:
                rows.append((k, state[k], "-D"))
            elif k not in state:
                rows.append((k, new[k], "+I"))
            elif state[k] != new[k]:
                rows += [(k, state[k], "-U"), (k, new[k], "+U")]
        if rows or op == "upsert":
            expected.append(rows)
        state = new
    got = [rows for kind, rows in by_key(changes(t)) if kind != "compact"]
    assert [r for r in got if r] == [r for r in expected if r]
    lake.close()


merge_ops = st.lists(
    st.one_of(
        st.tuples(st.just("upsert"), st.lists(
            st.tuples(st.integers(0, 5), st.one_of(st.none(), st.integers(-3, 3)),
                      st.one_of(st.none(), st.integers(-3, 3))), min_size=1, max_size=5)),
        st.tuples(st.just("compact"), st.just(None)),
    ),
    min_size=1, max_size=6)


@pytest.mark.parametrize("engine", ["partial-update", "aggregation"])
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=merge_ops)
def test_lookup_matches_a_model_for_merging_engines(tmp_path_factory, engine, history):
    """Partial-update (non-null values overwrite) and aggregation (sums; a null adds
    nothing) emit the merged row after each write, before-images included."""
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), ("a", pa.int64()),
                        ("b", pa.int64())])
    lake = al.connect(tmp_path_factory.mktemp("lookup-merge"))
    options = {"aggregations": {"a": "sum", "b": "sum"}} if engine == "aggregation" else {}
    t = lake.create_table("s.t", schema, primary_key=["k"], buckets=2, merge_engine=engine,
                          changelog_producer="lookup", **options)
    state: dict[int, tuple] = {}
    expected: list[list[tuple]] = []

    def combine(old, new):
        if engine == "partial-update":
            return tuple(n if n is not None else o for o, n in zip(old, new, strict=True))
        return tuple(o if n is None else n if o is None else o + n
                     for o, n in zip(old, new, strict=True))

    for op, arg in history:
        if op == "compact":
            t.compact(full=True)
            continue
        t.upsert({"k": [r[0] for r in arg], "a": [r[1] for r in arg], "b": [r[2] for r in arg]})
        new = dict(state)
        for k, a, b in arg:
            new[k] = combine(new[k], (a, b)) if k in new else (a, b)
        rows: list[tuple] = []
        for k in sorted(new):
            if k not in state:
                rows.append((k, *new[k], "+I"))
            elif state[k] != new[k]:
                rows += [(k, *state[k], "-U"), (k, *new[k], "+U")]
        expected.append(rows)
        state = new
    got = [rows for kind, rows in by_key(changes(t)) if kind != "compact"]
    assert [r for r in got if r] == [r for r in expected if r]
    assert sorted(tuple(r.values()) for r in t.to_arrow().to_pylist()) == \
        sorted((k, *v) for k, v in state.items())
    lake.close()


@pytest.mark.parametrize("kind", METASTORES)
def test_full_compaction_producer_emits_the_difference_between_full_compactions(
        kind, tmp_path, request):
    lake = make_lake(kind, tmp_path, request)
    t = lake.create_table("s.t", SCHEMA, primary_key=["k"], buckets=2,
                          changelog_producer="full-compaction")
    t.upsert({"k": [1, 2], "v": ["a", "b"]})
    t.compact(full=True)
    first = t.current_snapshot_id
    t.upsert({"k": [1], "v": ["A"]})
    t.delete("k = 2")
    t.upsert({"k": [3], "v": ["c"]})
    t.upsert({"k": [3, 4], "v": ["c2", "d"]})
    t.delete("k = 4")  # inserted and deleted between compactions: nothing
    t.compact(full=True)
    assert t.compact(full=True).snapshot_id is None  # nothing changed since
    assert by_key(changes(t)) == [
        ("compact", [(1, "a", "+I"), (2, "b", "+I")]),
        ("compact", [(1, "a", "-U"), (1, "A", "+U"), (2, "b", "-D"), (3, "c2", "+I")]),
    ]
    # The reference state of the next full compaction survives expiry.
    t.upsert({"k": [5], "v": ["e"]})
    reference = t.current_snapshot_id - 1
    result = t.expire_snapshots(retain_last=1)
    assert first in result.expired_snapshots and reference not in result.expired_snapshots
    t.compact(full=True)
    assert by_key(changes(t, start=reference + 1)) == [("compact", [(5, "e", "+I")])]
    lake.close()


@pytest.mark.parametrize("vectors", [False, True])
def test_a_write_landing_during_a_full_compaction_is_in_its_changelog(vectors, tmp_path,
                                                                     monkeypatch):
    """The full compaction's change is computed on one snapshot: a commit landing before the
    compaction commits makes it compute the change again, or that write would fall between
    two full compactions' changes and never be streamed."""
    from arrowlake.table.changelogs import producers as changelog
    from arrowlake.table.maintenance import vector_compaction

    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.t", SCHEMA, primary_key=["k"], buckets=2,
                          deletion_vectors=vectors, changelog_producer="full-compaction")
    t.upsert({"k": [1, 2], "v": ["a", "b"]})
    t.upsert({"k": [1], "v": ["A"]})
    owner, name = (vector_compaction, "full_compaction_changelog") if vectors else \
        (changelog, "full_compaction_changelog")
    computed = getattr(owner, name)
    bases = []

    def racing(table, base):
        out = computed(table, base)
        if not bases:  # another writer commits before this compaction does
            lake.table("s.t").upsert({"k": [3], "v": ["c"]})
        bases.append(base)
        return out

    monkeypatch.setattr(owner, name, racing)
    assert t.compact(full=True).snapshot_id is not None
    assert len(bases) == 2 and bases[1] > bases[0]  # computed again on the newer snapshot
    monkeypatch.undo()
    t.upsert({"k": [4], "v": ["d"]})
    t.compact(full=True)
    # The racing write is in the first full compaction's change, and only there.
    assert by_key(changes(t)) == [
        ("compact", [(1, "A", "+I"), (2, "b", "+I"), (3, "c", "+I")]),
        ("compact", [(4, "d", "+I")]),
    ]
    lake.close()


def _drain(stream: al.Stream) -> list:
    out = []
    while (change := stream.poll()) is not None:
        out.append(change)
    return out


@pytest.mark.parametrize("vectors", [False, True])
def test_full_compaction_streams_start_and_catch_up_at_a_full_compaction(vectors, tmp_path):
    """On a full-compaction table a stream's state is what full compactions left: a full
    start reads the last one's state and a catch-up ends at the last one, so the writes after
    it reach the stream once, in the next full compaction's change (as Paimon's first scan
    of such a table does)."""
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.t", SCHEMA, primary_key=["k"], buckets=2,
                          deletion_vectors=vectors, changelog_producer="full-compaction")
    t.upsert({"k": [1, 2], "v": ["a", "b"]})
    # No full compaction yet: a full start reads nothing; the first one brings every row.
    early = t.stream(start="full", consumer="early", include_row_kind=True)
    assert [c.to_arrow().num_rows for c in _drain(early)] == []
    t.compact(full=True)
    t.upsert({"k": [1, 3], "v": ["A", "c"]})  # after the last full compaction
    full = t.stream(start="full", include_row_kind=True)
    [first] = _drain(full)
    assert sorted((r["k"], r["v"]) for r in first.to_arrow().to_pylist()) == [(1, "a"), (2, "b")]
    # A consumer far behind: catch-up ends at the last full compaction too.
    behind = t.stream(start="earliest", catch_up_threshold=1, include_row_kind=True)
    caught = [sorted((r["k"], r["v"], r["_row_kind"]) for r in c.to_arrow().to_pylist())
              for c in _drain(behind)]
    assert caught == [[(1, "a", "+I"), (2, "b", "+I")]]
    t.upsert({"k": [2], "v": ["B"]})
    t.compact(full=True)
    # The full compaction's change; caught up, the same net change without before-images.
    changed = [(1, "A", "+U"), (1, "a", "-U"), (2, "B", "+U"), (2, "b", "-U"), (3, "c", "+I")]
    net = [(1, "A", "+U"), (2, "B", "+U"), (3, "c", "+I")]
    for stream, expected in ((full, changed), (behind, net)):
        [change] = _drain(stream)
        assert sorted((r["k"], r["v"], r["_row_kind"]) for r in change.to_arrow().to_pylist()) \
            == expected
        stream.close()
    got = [sorted((r["k"], r["v"], r["_row_kind"]) for r in c.to_arrow().to_pylist())
           for c in _drain(early)]
    assert got == [[(1, "a", "+I"), (2, "b", "+I")], changed]
    early.close()
    lake.close()


@pytest.mark.parametrize("vectors", [False, True])
def test_an_overwrite_of_a_full_compaction_table_streams_in_the_next_full_compaction(
        vectors, tmp_path):
    """Streams of a full-compaction table change only at full compactions: an overwrite
    shows in the next one's change, not at its own snapshot (where it retracted rows the
    stream had never been given)."""
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.t", SCHEMA, primary_key=["k"], buckets=2,
                          deletion_vectors=vectors, changelog_producer="full-compaction")
    t.upsert({"k": [1, 2], "v": ["a", "b"]})
    t.overwrite(pa.table({"k": [2, 3], "v": ["B", "c"]}, schema=SCHEMA))
    assert changes(t) == []
    t.compact(full=True)
    t.overwrite(pa.table({"k": [3, 4], "v": ["c", "d"]}, schema=SCHEMA))
    t.compact(full=True)
    assert by_key(changes(t)) == [
        ("compact", [(2, "B", "+I"), (3, "c", "+I")]),
        ("compact", [(2, "B", "-D"), (4, "d", "+I")])]
    lake.close()


seq_ops = st.lists(
    st.one_of(
        st.tuples(st.just("upsert"), st.lists(
            st.tuples(st.sampled_from(["x", "y"]), st.sampled_from(["a", "b", "c", "d"]),
                      st.sampled_from("uvw"), st.integers(0, 3)), min_size=1, max_size=6)),
        st.tuples(st.just("delete"), st.lists(st.sampled_from(["a", "b", "c", "d"]),
                                              min_size=1, max_size=2)),
        st.tuples(st.just("compact"), st.just(None)),
    ),
    min_size=1, max_size=7)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=seq_ops)
def test_lookup_matches_a_model_for_partitioned_string_keys_with_a_sequence_field(
        tmp_path_factory, history):
    """Composite string keys, a partition column in the key and a sequence field: each
    write's changelog is exactly the difference between the table's rows before and after it
    (as a scan reads them: tombstones keep their sequence value until a full compaction drops
    them, so the table, not a simpler model, says which row won)."""
    schema = pa.schema([pa.field("p", pa.string(), nullable=False),
                        pa.field("k", pa.string(), nullable=False), ("v", pa.string()),
                        ("s", pa.int64())])
    lake = al.connect(tmp_path_factory.mktemp("lookup-seq"))
    t = lake.create_table("s.t", schema, primary_key=["p", "k"], partition_by=["p"],
                          buckets=2, sequence_field="s", changelog_producer="lookup")

    def rows_now() -> dict[tuple[str, str], tuple[str, int]]:
        return {(r["p"], r["k"]): (r["v"], r["s"]) for r in t.to_arrow().to_pylist()}

    state: dict[tuple[str, str], tuple[str, int]] = {}
    expected: list[list[tuple]] = []
    for op, arg in history:
        if op == "upsert":
            t.upsert({"p": [r[0] for r in arg], "k": [r[1] for r in arg],
                      "v": [r[2] for r in arg], "s": [r[3] for r in arg]})
        elif op == "delete":
            t.delete(al.col("k").isin(arg))
        else:
            t.compact(full=True)
            continue
        new = rows_now()
        rows: list[tuple] = []
        for pk in sorted(set(state) | set(new)):
            if pk not in new:
                rows.append((*pk, *state[pk], "-D"))
            elif pk not in state:
                rows.append((*pk, *new[pk], "+I"))
            elif state[pk] != new[pk]:
                rows += [(*pk, *state[pk], "-U"), (*pk, *new[pk], "+U")]
        expected.append(rows)
        state = new
    got = [sorted(rows, key=lambda r: (r[0], r[1], r[-1] != "-U"))
           for kind, rows in changes(t) if kind != "compact"]
    assert [r for r in got if r] == [r for r in expected if r]
    lake.close()


@pytest.mark.parametrize("cache", ["0", "1", None])
@pytest.mark.parametrize("engine", ["deduplicate", "partial-update"])
def test_lookup_is_the_same_with_and_without_the_run_cache(sqlite_lake, cache, engine):
    """Decoded runs cached (default), none cached (0), or evicted at once (1 byte): the same
    changes, also when a fresh process (an empty cache) writes next."""
    from arrowlake.table.keys import run_cache

    props = {} if cache is None else {"changelog.lookup-cache-size": cache}
    t = sqlite_lake.create_table("s.t", SCHEMA, primary_key=["k"], buckets=2,
                                 deletion_vectors=False,
                                 merge_engine=engine, changelog_producer="lookup",
                                 properties=props)
    t.upsert({"k": [1, 2, 1], "v": ["a", "b", "a2"]})
    run_cache.RUNS.clear()  # as if another process wrote the first runs
    _dedupe_history(t)  # its first upsert writes the same rows again: no change
    assert by_key(changes(t)) == EXPECTED_DEDUPE["lookup"]


def test_lookup_cache_size_must_be_a_byte_count(sqlite_lake):
    with pytest.raises(ValidationError, match="changelog.lookup-cache-size"):
        sqlite_lake.create_table("s.t", SCHEMA, primary_key=["k"], changelog_producer="lookup",
                                 properties={"changelog.lookup-cache-size": "-1"})
    t = sqlite_lake.create_table("s.t", SCHEMA, primary_key=["k"], changelog_producer="lookup")
    with pytest.raises(ValidationError, match="number of bytes"):
        t.set_properties(**{"changelog.lookup-cache-size": "lots"})


def test_run_cache_stays_within_its_bound_and_evicts_the_least_recently_used():
    from arrowlake.table.keys.run_cache import RUNS, DecodedRun

    def run(n: int) -> DecodedRun:
        return DecodedRun.of(pa.table({"k": pa.array(range(n), pa.int64())}), "k", True)

    RUNS.clear()
    try:
        one = run(100)  # 800 bytes
        RUNS.put(("a", 0), one, limit=2000)
        RUNS.put(("b", 0), run(100), limit=2000)
        assert RUNS.get(("a", 0)) is one  # now the most recently used
        RUNS.put(("c", 0), run(100), limit=2000)
        assert RUNS.get(("b", 0)) is None and RUNS.get(("a", 0)) is one
        assert RUNS.get(("c", 0)) is not None
        RUNS.put(("d", 0), run(1000), limit=2000)  # larger than the bound: not kept
        assert RUNS.get(("d", 0)) is None
    finally:
        RUNS.clear()
    assert one.sorted_unique and not DecodedRun.of(pa.table({"k": [2, 1]}), "k", True).sorted_unique


@pytest.mark.parametrize("engine", ["deduplicate", "partial-update"])
def test_a_failing_lookup_leaves_the_table_and_its_files_as_they_were(sqlite_lake, monkeypatch,
                                                                      engine):
    """The lookup runs while the write's runs are written: when it fails, every run and
    changelog file written so far is deleted and nothing is committed."""
    import os

    from arrowlake.table.changelogs import lookup as lookup_changelog

    t = sqlite_lake.create_table("s.t", SCHEMA, primary_key=["k"], buckets=2,
                                 deletion_vectors=False,
                                 merge_engine=engine, changelog_producer="lookup")
    t.upsert({"k": [1, 2, 3], "v": ["a", "b", "c"]})
    snapshot = t.current_snapshot_id
    root = t._record.location

    def on_disk() -> set[str]:
        return {os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs}

    before = on_disk()
    assert any("/data/" in p for p in before)

    def broken(*args, **kwargs):
        raise OSError("disk gone")

    # Both lookup paths: the deduplicate fast path and the merge of the other engines.
    monkeypatch.setattr(lookup_changelog, "_newest_wins_changes", broken)
    monkeypatch.setattr(lookup_changelog, "_merge_units", broken)
    with pytest.raises(OSError, match="disk gone"):
        t.upsert({"k": [1, 4], "v": ["x", "d"]})
    monkeypatch.undo()
    t.refresh()
    assert t.current_snapshot_id == snapshot
    assert on_disk() == before
    assert sorted(t.to_arrow().column("v").to_pylist()) == ["a", "b", "c"]
    t.upsert({"k": [1, 4], "v": ["x", "d"]})
    assert by_key(changes(t))[-1][1] == [(1, "a", "-U"), (1, "x", "+U"), (4, "d", "+I")]
    assert sorted(t.to_arrow().column("v").to_pylist()) == ["b", "c", "d", "x"]


# -- lookup changelog formats ------------------------------------------------------------------


def test_lookup_changelogs_of_format_1_still_read(sqlite_lake):
    """Snapshots written before format 2 (every changelog row holding its values, no summary
    entry) read as they did, next to format-2 snapshots of the same table."""
    from arrowlake.merge import RowKind
    from arrowlake.metastore.store import SnapshotChange
    from arrowlake.table.changelogs import files as changelog_files
    from arrowlake.table.keys import runs as sorted_runs
    from arrowlake.table.writes import keyed as primary_key

    t = sqlite_lake.create_table("s.old", SCHEMA, primary_key=["k"], buckets=2,
                                 deletion_vectors=False,
                                 changelog_producer="lookup")
    t.upsert({"k": [1, 2, 3], "v": ["a", "b", "c"]})  # format 2
    before = t.to_arrow()
    # A writer of format 1: runs, and the whole difference as the changelog.
    new = pa.table({"k": pa.array([2, 3, 4], pa.int64()), "v": ["B", "c", "d"]},
                   schema=before.schema)
    rows = primary_key.with_kinds(new, RowKind.INSERT)
    runs = sorted_runs.write_runs(t.state, rows)
    after = pa.concat_tables([before.filter(pa.compute.equal(before.column("k"), 1)), new])
    log = changelog_files.write_changelog(t.state, changelog_files.diff(before, after, ["k"]))
    t._metastore.commit(t._record.table_id, t.current_snapshot_id, SnapshotChange(
        kind="upsert", schema_id=t._record.current_schema_id, add=runs,
        summary={"changelog": "lookup"}, changelog=log))
    t.refresh()
    t.upsert({"k": [4, 5], "v": ["D", "e"]})  # format 2 again
    summaries = t.snapshots().column("summary").to_pylist()
    assert ["changelog-format" in s for s in summaries] == [True, False, True]
    assert by_key(changes(t)) == [
        ("upsert", [(1, "a", "+I"), (2, "b", "+I"), (3, "c", "+I")]),
        ("upsert", [(2, "b", "-U"), (2, "B", "+U"), (4, "d", "+I")]),
        ("upsert", [(4, "d", "-U"), (4, "D", "+U"), (5, "e", "+I")]),
    ]


def test_lookup_format_2_with_filter_columns_and_shards(sqlite_lake):
    """A filter on a non-key column sees the values read from the runs, a column projection
    keeps the order, and shards split every change by bucket."""
    t = sqlite_lake.create_table("s.f2", SCHEMA, primary_key=["k"], buckets=4,
                                 deletion_vectors=False,
                                 changelog_producer="lookup")
    t.upsert({"k": list(range(20)), "v": ["x" if k % 3 else "y" for k in range(20)]})
    t.upsert({"k": list(range(0, 30, 2)), "v": ["y" if k % 4 else "x" for k in range(0, 30, 2)]})
    t.delete("k >= 25")
    t.upsert({"k": [1, 3, 5], "v": ["x", "x", "x"]})  # some unchanged
    whole = changes(t)
    assert [kind for kind, _ in whole] == ["upsert", "upsert", "delete", "upsert"]
    for _, rows in whole:  # each -U directly before its +U, of the same key
        for i, row in enumerate(rows):
            if row[2] == "-U":
                assert rows[i + 1][0] == row[0] and rows[i + 1][2] == "+U"
    filtered = changes(t, filter="v = 'y'", columns=["v", "k"])
    assert filtered == [(kind, [(r[1], r[0], r[2]) for r in rows if r[1] == "y"])
                        for kind, rows in whole if any(r[1] == "y" for r in rows)]
    keyed = changes(t, filter="k < 10")
    assert keyed == [(kind, [r for r in rows if r[0] < 10]) for kind, rows in whole
                     if any(r[0] < 10 for r in rows)]
    shards = [changes(t, shard=(i, 2)) for i in range(2)]
    assert sorted(r for _, rows in whole for r in rows) == sorted(
        r for shard in shards for _, rows in shard for r in rows)


# -- replaying a change stream -------------------------------------------------------------------


def replayed(t: al.Table) -> dict[object, dict]:
    """The table rebuilt from its change stream read from the start, checking each row against
    the rows before it: ``+I`` only for an absent key, ``-U`` and ``-D`` carrying exactly the
    key's row before, each ``-U`` directly followed by its key's ``+U``."""
    key = t.primary_key
    state: dict[object, dict] = {}
    stream = t.stream(start="earliest", include_row_kind=True, catch_up_threshold=None,
                      stop_at_latest=True)
    for change in stream:
        rows = change.to_arrow().to_pylist()
        kinds = [r.pop(next(reversed(r))) for r in rows]
        i = 0
        while i < len(rows):
            row, kind = rows[i], kinds[i]
            k = tuple(row[c] for c in key)
            where = f"snapshot {change.snapshot_id} ({change.kind}), row {i}: {kind} {row}"
            if kind == "+I":
                assert k not in state, f"{where}: the key has {state[k]}"
                state[k] = row
            elif kind == "-D":
                assert state.get(k) == row, f"{where}: the key has {state.get(k)}"
                del state[k]
            else:
                assert kind == "-U" and i + 1 < len(rows) and kinds[i + 1] == "+U" \
                    and tuple(rows[i + 1][c] for c in key) == k, f"{where}: not a -U/+U pair"
                assert state.get(k) == row, f"{where}: the key has {state.get(k)}"
                state[k] = rows[i + 1]
                i += 1
            i += 1
    return state


def as_rows(t: al.Table) -> dict[object, dict]:
    return {tuple(r[c] for c in t.primary_key): r for r in t.to_arrow().to_pylist()}


# -- a06: lookup changelogs of racing writers ---------------------------------------------------


def racing_before(lake: al.Lake, monkeypatch, race) -> list[int]:
    """Make ``race()`` run (another writer, through its own connection) right before each of
    the next commit's tries of an upsert through ``lake``; returns the number of races."""
    real = lake.metastore.commit
    races = [0]

    def commit(table_id, base, change):
        if change.kind == "upsert" and races[0] < 12:
            races[0] += 1
            race(races[0])
        return real(table_id, base, change)

    monkeypatch.setattr(lake.metastore, "commit", commit)
    return races


AGG_SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), ("n", pa.int64())])


def reopened(lake: al.Lake) -> al.Lake:
    """Another connection to ``lake``'s metastore and warehouse (another writer)."""
    return al.connect(lake.metastore.engine.url.render_as_string(hide_password=False),
                      warehouse=lake.warehouse)


@pytest.mark.parametrize(("kind", "engine"), [
    ("sqlite", "deduplicate"), ("postgres", "deduplicate"), ("sqlite", "partial-update"),
    ("sqlite", "aggregation")])
def test_a06_lookup_upsert_over_racing_upserts_of_the_same_keys_commits_exact_changes(
        tmp_path, monkeypatch, request, kind, engine):
    # The racing writer writes the same key (1) and others (2, 5) before each try, and its
    # writes compact the bucket (max-runs 2): the upsert used to redo its lookup at each try and
    # fail after 10 with CommitConflict("stale changelog").
    lake = make_lake(kind, tmp_path, request)
    t = lake.create_table("s.t", AGG_SCHEMA, primary_key=["k"], buckets=2, merge_engine=engine,
                          deletion_vectors=False,
                          changelog_producer="lookup", properties={"compaction.max-runs": "2"},
                          **({"aggregations": {"n": "sum"}} if engine == "aggregation" else {}))
    t.upsert({"k": [1, 2, 3], "n": [1, 1, 1]})
    other_lake = reopened(lake)
    other = other_lake.table("s.t")
    races = racing_before(lake, monkeypatch, lambda i: other.upsert(
        {"k": [1, 2, 5], "n": [10 * i, 10 * i, i]}))
    result = t.upsert({"k": [1, 3, 4, 5], "n": [100, 100, 100, 100]})
    monkeypatch.undo()
    assert result.snapshot_id is not None and races[0] == 1
    assert replayed(t) == as_rows(t)
    assert as_rows(t)[1,]["n"] == (111 if engine == "aggregation" else 100)
    other.upsert({"k": [1], "n": [7]})  # and after it, a write that sees it
    assert replayed(t) == as_rows(t)
    other_lake.close()
    lake.close()


def test_a06_lookup_upsert_over_a_racing_compaction_or_overwrite(tmp_path, monkeypatch):
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.t", SCHEMA, primary_key=["k"], buckets=1,
                          changelog_producer="lookup")
    for i in range(3):
        t.upsert({"k": [1, 2], "v": [f"a{i}", f"b{i}"]})
    other = al.connect(tmp_path / "lake").table("s.t")
    # A compaction changes no value: the changelog computed before it stays.
    racing_before(lake, monkeypatch, lambda i: other.compact(full=True))
    t.upsert({"k": [1, 3], "v": ["x", "c"]})
    monkeypatch.undo()
    assert [c[1] for c in by_key(changes(t))][-1] == [
        (1, "a2", "-U"), (1, "x", "+U"), (3, "c", "+I")]
    # An overwrite may remove any key: every key is looked up again (1 is new again).
    racing_before(lake, monkeypatch, lambda i: other.overwrite({"k": [2], "v": ["o"]}))
    t.upsert({"k": [1, 2], "v": ["y", "z"]})
    monkeypatch.undo()
    assert by_key(changes(t))[-1] == ("upsert", [(1, "y", "+I"), (2, "o", "-U"), (2, "z", "+U")])
    assert replayed(t) == as_rows(t) == {(1,): {"k": 1, "v": "y"}, (2,): {"k": 2, "v": "z"}}
    lake.close()


def test_a06_lookup_upsert_into_a_partition_another_writer_created_meanwhile(
        tmp_path, monkeypatch):
    schema = pa.schema([pa.field("p", pa.string(), nullable=False),
                        pa.field("k", pa.int64(), nullable=False), ("v", pa.string())])
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.t", schema, primary_key=["p", "k"], partition_by=["p"],
                          buckets=1, changelog_producer="lookup")
    t.upsert({"p": ["a"], "k": [1], "v": ["a1"]})
    other = al.connect(tmp_path / "lake").table("s.t")
    racing_before(lake, monkeypatch, lambda i: other.upsert({"p": ["b"], "k": [1], "v": ["b1"]}))
    t.upsert({"p": ["b", "b"], "k": [1, 2], "v": ["mine", "two"]})
    monkeypatch.undo()
    assert sorted(changes(t)[-1][1], key=lambda r: r[1]) == [
        ("b", 1, "b1", "-U"), ("b", 1, "mine", "+U"), ("b", 2, "two", "+I")]
    assert replayed(t) == as_rows(t)
    lake.close()


A06_WORKER = r"""
import random, sys, arrowlake as al
path, worker, writes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t = al.connect(path).table("s.t")
rng = random.Random(worker)
for i in range(writes):
    keys = rng.sample(range(20), 8)
    # Never 0: with deletion vectors an aggregation write adding 0 to live keys commits nothing.
    t.upsert({"k": keys, "n": [worker * 1000 + i + 1] * len(keys)})
"""


@pytest.mark.slow
@pytest.mark.parametrize("vectors", [False, True], ids=["mor", "dv"])
@pytest.mark.parametrize("engine", ["deduplicate", "aggregation"])
def test_a06_three_processes_upserting_the_same_keys_never_fail_and_the_changelog_replays(
        tmp_path, engine, vectors):
    lake = al.connect(tmp_path / "lake")
    # With deletion vectors, two writers compacting after nearly every write (max-runs 2)
    # used to overtake the third's lookups 50 times in about one run in ten; after a few
    # attempts a write now holds the table from its lookup to its commit.
    t = lake.create_table("s.t", AGG_SCHEMA, primary_key=["k"], buckets=2, merge_engine=engine,
                          changelog_producer="lookup", properties={"compaction.max-runs": "2"},
                          deletion_vectors=vectors,
                          **({"aggregations": {"n": "sum"}} if engine == "aggregation" else {}))
    writes = 30
    procs = [subprocess.Popen([sys.executable, "-c", A06_WORKER, str(tmp_path / "lake"),
                               str(w), str(writes)], stderr=subprocess.PIPE) for w in range(3)]
    errors = [p.communicate(timeout=300)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(errors)
    kinds = t.snapshots()["kind"].to_pylist()
    assert kinds.count("upsert") == 3 * writes
    assert replayed(t) == as_rows(t)
    lake.close()


# -- a16: batches of retractions only -----------------------------------------------------------

SUM = {"aggregations": {"n": "sum"}}
RETRACTIONS = [  # engine, options, whether the engine drops retractions
    ("deduplicate", {}, False),
    ("deduplicate", {"ignore_delete": True}, True),
    ("first-row", {}, True),
    ("first-row", {"ignore_delete": True}, True),
    ("partial-update", {}, False),
    ("partial-update", {"ignore_delete": True}, True),
    ("partial-update", {"partial_update_ignore_delete": True}, True),
    ("aggregation", SUM, False),  # a retraction subtracts
    ("aggregation", {**SUM, "properties": {"aggregation.remove-record-on-delete": "true"}},
     False),
]


@pytest.mark.parametrize("key_type", [pa.int64(), pa.string()], ids=["int", "str"])
@pytest.mark.parametrize(("engine", "options", "dropped"), RETRACTIONS,
                         ids=[f"{e}-{'-'.join(sorted(o)) or 'plain'}" for e, o, _ in RETRACTIONS])
def test_a16_write_changes_of_retractions_only_into_a_lookup_table(
        sqlite_lake, engine, options, dropped, key_type):
    # A CDC batch of -U/-D rows only: on engines that drop retractions the lookup used to fail
    # ("Comparing column 'k' with NULL"), and a feed stopped there for good.
    schema = pa.schema([pa.field("k", key_type, nullable=False), ("n", pa.int64())])
    keys = [1, 2, 3, 9] if key_type == pa.int64() else ["1", "2", "3", "9"]
    tables = {producer: sqlite_lake.create_table(
        f"s.{producer}", schema, primary_key=["k"], buckets=2, merge_engine=engine,
        deletion_vectors=False,
        changelog_producer=producer, **options) for producer in ("none", "lookup")}
    for t in tables.values():
        t.upsert({"k": keys[:3], "n": [1, 2, 3]})
        result = t.write_changes({"k": [keys[0], keys[1], keys[3]], "n": [1, 2, 9],
                                  "op": ["-D", "-U", "-D"]}, commit_id="batch-1")
        # As with every producer: one commit (of nothing, where the engine drops the rows), so
        # the feed's commit id is recorded and a resend is known.
        assert result.snapshot_id == 2
        assert t.write_changes({"k": [keys[0]], "n": [1], "op": ["-D"]},
                               commit_id="batch-1").duplicate
    t = tables["lookup"]
    assert as_rows(t) == as_rows(tables["none"])
    assert replayed(t) == as_rows(t)
    if dropped:
        before = zip(keys[:3], [1, 2, 3], strict=True)
        assert as_rows(t) == {(k,): {"k": k, "n": n} for k, n in before}
        assert [kind for kind, _ in changes(t)] == ["upsert"]  # the batch shows nothing
    else:
        assert [kind for kind, _ in changes(t)] == ["upsert", "changes"]
