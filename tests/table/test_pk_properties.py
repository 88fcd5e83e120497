"""Property-based tests of primary-key tables against a plain Python model, for every engine.

Random sequences of upsert / delete / write_changes / merge / compact / overwrite over a small key
domain (so versions collide) and random bucket counts are applied to a real table on a SQLite
lake. The model keeps every version of every key, in version order, and folds them with the
engine's documented semantics (:mod:`arrowlake.merge.engines`, ``aggregation``); the table
must show the same rows after every step, through key and non-key filters and ``count()``, and at
every earlier snapshot (time travel).
"""

from __future__ import annotations

import itertools
import os
import pickle
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrowlake as al

KEYS = range(6)
PARTS = range(2)
STRINGS = ["a", "b", "c", None]
SMALL = st.one_of(st.none(), st.integers(0, 5))

ENGINES = {
    "deduplicate": {},
    # Two variants: in "deduplicate-seq" versions with any sequence value arrive in any order
    # (late, older versions must stay hidden behind tombstones, compacted or not); in
    # "deduplicate-seq-compacted" each step's sequence values are higher than the previous
    # steps' (ties and disorder only inside one write).
    "deduplicate-seq": {"sequence_field": "ts"},
    "deduplicate-seq-compacted": {"sequence_field": "ts"},
    "partial-update": {"merge_engine": "partial-update"},
    "aggregation": {
        "merge_engine": "aggregation",
        "aggregations": {"v": "sum", "m": "max", "s": "last_non_null_value"},
    },
    "first-row": {"merge_engine": "first-row"},
}
# max cannot retract; Paimon's ignore-retract makes it skip -U/-D rows (deletes reach it).
ENGINE_PROPERTIES = {"aggregation": {"fields.m.ignore-retract": "true"}}

#: Engines where a -D never removes a key, so delete() and merge deletes are refused.
NO_DELETES = ("first-row", "aggregation")
VALUE_COLUMNS = ("v", "m", "s", "ts")
PLUS_I, MINUS_U, PLUS_U, MINUS_D = 0, 1, 2, 3
KIND_NAMES = ("+I", "-U", "+U", "-D")


def schema_for(partitioned: bool) -> pa.Schema:
    fields = [("k", pa.int64())]
    if partitioned:
        fields.append(("p", pa.int64()))
    fields += [("v", pa.int64()), ("m", pa.int64()), ("s", pa.string()), ("ts", pa.int64())]
    return pa.schema(fields)


# -- the model ------------------------------------------------------------------------------------


@dataclass
class Version:
    row: dict[str, Any]
    kind: int
    commit: int
    position: int


@dataclass
class Model:
    """Every version of every key; ``rows()`` folds them by the engine's documented semantics."""

    engine: str
    key: tuple[str, ...]
    versions: dict[tuple, list[Version]] = field(default_factory=dict)
    commits: int = 0

    def key_of(self, row: dict[str, Any]) -> tuple:
        return tuple(row[k] for k in self.key)

    def write(self, rows: list[dict[str, Any]], kinds: list[int]) -> None:
        """One commit: versions in input order."""
        if not rows:
            return
        self.commits += 1
        for i, (row, kind) in enumerate(zip(rows, kinds, strict=True)):
            self.versions.setdefault(self.key_of(row), []).append(
                Version(dict(row), kind, self.commits, i))

    def clear(self, partition: int | None) -> None:
        for k in [k for k in self.versions if partition is None or k[1] == partition]:
            del self.versions[k]

    def ordered(self, versions: list[Version]) -> list[Version]:
        if self.engine.startswith("deduplicate-seq"):
            # sequence_field first (nulls oldest), then commit order, then input order.
            return sorted(versions, key=lambda v: (v.row["ts"] is not None, v.row["ts"] or 0,
                                                   v.commit, v.position))
        return sorted(versions, key=lambda v: (v.commit, v.position))

    def fold(self, versions: list[Version]) -> dict[str, Any] | None:
        vs = self.ordered(versions)
        retract = [v.kind in (MINUS_U, MINUS_D) for v in vs]
        if self.engine.startswith("deduplicate"):
            return None if retract[-1] else dict(vs[-1].row)
        if self.engine == "first-row":
            adds = [v for v, r in zip(vs, retract, strict=True) if not r]
            return dict(adds[0].row) if adds else None
        if self.engine == "partial-update":
            if retract[-1]:
                return None
            last_reset = max((i for i, r in enumerate(retract) if r), default=-1)
            segment = vs[last_reset + 1:]
            row = dict(vs[-1].row)
            for c in VALUE_COLUMNS:
                row[c] = next((v.row[c] for v in reversed(segment) if v.row[c] is not None),
                              None)
            return row
        assert self.engine == "aggregation"
        # A retraction never removes the key. sum subtracts retracted values (null if no value
        # ever took part); max ignores retractions (ignore-retract); last_non_null_value (s, and
        # ts by default) skips retractions and nulls.
        row = dict(vs[-1].row)
        valued = [(v.row["v"], r) for v, r in zip(vs, retract, strict=True)
                  if v.row["v"] is not None]
        row["v"] = sum(-x if r else x for x, r in valued) if valued else None
        ms = [v.row["m"] for v, r in zip(vs, retract, strict=True)
              if not r and v.row["m"] is not None]
        row["m"] = max(ms) if ms else None
        for c in ("s", "ts"):
            row[c] = next((v.row[c] for v, r in zip(reversed(vs), reversed(retract), strict=True)
                           if not r and v.row[c] is not None), None)
        return row

    def rows(self) -> dict[tuple, dict[str, Any]]:
        out = {}
        for k, versions in self.versions.items():
            row = self.fold(versions)
            if row is not None:
                out[k] = row
        return out


def sorted_rows(rows, key) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: tuple(r[k] for k in key))


# -- operations -----------------------------------------------------------------------------------


def row_strategy(partitioned: bool, part: int | None = None,
                 ts: st.SearchStrategy[int | None] = SMALL) -> st.SearchStrategy[dict]:
    fields: dict[str, st.SearchStrategy[Any]] = {
        "k": st.sampled_from(KEYS), "v": SMALL, "m": SMALL, "s": st.sampled_from(STRINGS),
        "ts": ts}
    if partitioned:
        fields["p"] = st.just(part) if part is not None else st.sampled_from(PARTS)
    return st.fixed_dictionaries(fields)


MERGE_CLAUSES = ["matched_delete", "matched_update_all", "matched_update_set", "insert",
                 "insert_where"]


@st.composite
def operations(draw, partitioned: bool, engine: str) -> list[tuple]:
    key = ("k", "p") if partitioned else ("k",)
    kinds = ["upsert", "upsert", "delete_keys", "delete_where", "changes", "merge", "compact",
             "overwrite"]
    ops = []
    for step in range(draw(st.integers(1, 8))):
        ts = SMALL
        if engine == "deduplicate-seq-compacted":
            ts = st.integers(10 * step, 10 * step + 5)
        rows = row_strategy(partitioned, ts=ts)
        kind = draw(st.sampled_from(kinds))
        if kind == "upsert":
            ops.append(("upsert", draw(st.lists(rows, max_size=12))))
        elif kind == "delete_keys":
            ops.append(("delete_keys", draw(st.lists(st.sampled_from(KEYS), max_size=3))))
        elif kind == "delete_where":
            ops.append(("delete_where", draw(st.integers(0, 5))))
        elif kind == "changes":
            changes = st.lists(st.tuples(rows, st.sampled_from(range(4))), max_size=12)
            ops.append(("changes", draw(changes)))
        elif kind == "merge":
            source = draw(st.lists(
                st.tuples(rows, st.one_of(st.none(), st.booleans())), max_size=10,
                unique_by=lambda t: tuple(t[0][k] for k in key)))
            clauses = draw(st.lists(st.sampled_from(MERGE_CLAUSES), min_size=1, max_size=4,
                                    unique=True))
            ops.append(("merge", source, clauses))
        elif kind == "compact":
            ops.append(("compact", draw(st.booleans())))
        else:
            part = draw(st.sampled_from([None, *PARTS])) if partitioned else None
            ops.append(("overwrite", part,
                        draw(st.lists(row_strategy(partitioned, part, ts), max_size=10))))
    return ops


def _gt(a, b) -> bool:
    return a is not None and b is not None and a > b


def apply_merge(model: Model, source, clauses) -> tuple[list[dict], list[int], dict[str, int]]:
    """SQL MERGE on the model: per source row the first clause whose condition holds."""
    current = model.rows()
    out_rows, out_kinds = [], []
    counts = {"insert": 0, "update": 0, "delete": 0}
    for src, flag in source:
        target = current.get(model.key_of(src))
        for clause in clauses:
            if clause.startswith("matched") != (target is not None):
                continue
            if clause == "matched_delete":
                if not flag:
                    continue
                out_rows.append(dict(target))
                out_kinds.append(MINUS_D)
                counts["delete"] += 1
            elif clause == "matched_update_all":
                out_rows.append(dict(src))
                out_kinds.append(PLUS_U)
                counts["update"] += 1
            elif clause == "matched_update_set":
                if not _gt(src["v"], target["v"]):
                    continue
                out_rows.append({**target, "v": src["v"], "s": src["s"]})
                out_kinds.append(PLUS_U)
                counts["update"] += 1
            elif clause == "insert":
                out_rows.append(dict(src))
                out_kinds.append(PLUS_I)
                counts["insert"] += 1
            else:  # insert_where
                if not _gt(src["v"], 2):
                    continue
                out_rows.append(dict(src))
                out_kinds.append(PLUS_I)
                counts["insert"] += 1
            break
    return out_rows, out_kinds, counts


def run_merge(table, schema: pa.Schema, key, source, clauses):
    src = pa.Table.from_pylist([r for r, _ in source], schema=schema).append_column(
        "flag", pa.array([f for _, f in source], pa.bool_()))
    builder = table.merge(src, on=list(key))
    for clause in clauses:
        if clause == "matched_delete":
            builder = builder.when_matched_delete(where="source.flag")
        elif clause == "matched_update_all":
            builder = builder.when_matched_update()
        elif clause == "matched_update_set":
            builder = builder.when_matched_update(set={"v": "source.v", "s": "source.s"},
                                                  where="source.v > target.v")
        elif clause == "insert":
            builder = builder.when_not_matched_insert()
        else:
            builder = builder.when_not_matched_insert(where="source.v > 2")
    return builder.execute()


def apply(table, model: Model, schema: pa.Schema, op: tuple) -> None:
    """Run ``op`` on the table and on the model."""
    kind = op[0]
    refuses_deletes = model.engine in NO_DELETES
    if refuses_deletes and (kind.startswith("delete") or (
            kind == "merge" and "matched_delete" in op[2])):
        # These engines never remove a key on a -D: delete() and merge deletes are refused.
        with pytest.raises(al.ValidationError, match="cannot delete rows"):
            if kind == "merge":
                run_merge(table, schema, model.key, op[1], op[2])
            else:
                table.delete("v < 3")
        return
    if kind == "upsert":
        table.upsert(pa.Table.from_pylist(op[1], schema=schema))
        model.write(op[1], [PLUS_I] * len(op[1]))
    elif kind == "delete_keys":
        table.delete(al.col("k").isin(op[1]))
        gone = [r for r in model.rows().values() if r["k"] in op[1]]
        model.write(gone, [MINUS_D] * len(gone))
    elif kind == "delete_where":
        table.delete(f"v < {op[1]}")
        gone = [r for r in model.rows().values() if r["v"] is not None and r["v"] < op[1]]
        model.write(gone, [MINUS_D] * len(gone))
    elif kind == "changes":
        rows = [r for r, _ in op[1]]
        data = pa.Table.from_pylist(rows, schema=schema).append_column(
            "op", pa.array([KIND_NAMES[c] for _, c in op[1]], pa.string()))
        table.write_changes(data, row_kind="op")
        model.write(rows, [c for _, c in op[1]])
    elif kind == "merge":
        _, source, clauses = op
        rows, kinds, counts = apply_merge(model, source, clauses)
        result = run_merge(table, schema, model.key, source, clauses)
        assert (result.inserted, result.updated, result.deleted) == (
            counts["insert"], counts["update"], counts["delete"])
        assert result.unchanged == len(source) - sum(counts.values())
        model.write(rows, kinds)
    elif kind == "compact":
        table.compact(full=op[1])
    elif kind == "overwrite":
        _, part, rows = op
        table.overwrite(pa.Table.from_pylist(rows, schema=schema),
                        None if part is None else f"p = {part}")
        model.clear(part)
        model.write(rows, [PLUS_I] * len(rows))
    else:  # pragma: no cover
        raise AssertionError(op)


def check(table, model: Model) -> None:
    key = model.key
    expected = sorted_rows(model.rows().values(), key)
    assert sorted_rows(table.to_arrow().to_pylist(), key) == expected
    assert table.count() == len(expected)
    # A key filter prunes buckets and files; a non-key filter is applied after the merge.
    assert sorted_rows(table.scan(filter="k = 3").to_arrow().to_pylist(), key) == [
        r for r in expected if r["k"] == 3]
    assert sorted_rows(table.scan(filter="v > 2").to_arrow().to_pylist(), key) == [
        r for r in expected if r["v"] is not None and r["v"] > 2]
    assert table.scan(filter="k = 3").count() == sum(r["k"] == 3 for r in expected)


_names = itertools.count()


@pytest.fixture(scope="module")
def pk_lake(tmp_path_factory):
    with al.connect(str(tmp_path_factory.mktemp("pk-properties"))) as lake:
        yield lake


def run_sequence(lake, engine: str, buckets: int, partitioned: bool, max_runs: str,
                 ops: list[tuple]) -> None:
    schema = schema_for(partitioned)
    key = ("k", "p") if partitioned else ("k",)
    table = lake.create_table(
        f"props.t{next(_names)}", schema, primary_key=list(key), buckets=buckets,
        partition_by=["p"] if partitioned else [],
        properties={"compaction.max-runs": max_runs, **ENGINE_PROPERTIES.get(engine, {})},
        **ENGINES[engine])
    model = Model(engine, key)
    at_snapshot: dict[int, list[dict[str, Any]]] = {}
    for op in ops:
        apply(table, model, schema, op)
        check(table, model)
        # Every snapshot the step made (its commit and any compaction it triggered) shows the
        # model's state after the step.
        state = sorted_rows(model.rows().values(), key)
        for snap in table.snapshots().column("snapshot_id").to_pylist():
            at_snapshot.setdefault(snap, state)
    for snap, state in at_snapshot.items():
        got = table.scan(snapshot=snap).to_arrow().to_pylist()
        assert sorted_rows(got, key) == state, f"time travel to snapshot {snap}"


@pytest.mark.parametrize("engine", list(ENGINES))
@settings(max_examples=int(os.environ.get("PK_PROPERTY_EXAMPLES", "25")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), buckets=st.integers(1, 5), partitioned=st.booleans(),
       max_runs=st.sampled_from(["2", "5"]))
def test_table_matches_model(pk_lake, engine, data, buckets, partitioned, max_runs):
    ops = data.draw(operations(partitioned, engine), label="operations")
    run_sequence(pk_lake, engine, buckets, partitioned, max_runs, ops)


# -- regressions found by the property tests -------------------------------------------------------


def test_partial_update_reset_inside_one_write(pk_lake):
    schema = schema_for(False)
    table = pk_lake.create_table(f"props.t{next(_names)}", schema, primary_key=["k"],
                                 buckets=1, merge_engine="partial-update")
    table.upsert(pa.Table.from_pylist([{"k": 1, "v": 5, "m": 5, "s": "a", "ts": 1}],
                                      schema=schema))
    changes = pa.Table.from_pylist(
        [{"k": 1, "v": 5, "m": 5, "s": "a", "ts": 1}, {"k": 1, "v": 7, "m": None, "s": None,
                                                       "ts": None}], schema=schema)
    table.write_changes(changes.append_column("op", pa.array(["-U", "+U"])), row_kind="op")
    # The -U reset the row, so the +U alone defines it (as it does when written separately).
    assert table.to_arrow().to_pylist() == [{"k": 1, "v": 7, "m": None, "s": None, "ts": None}]


def test_write_changes_of_no_rows_is_a_no_op(pk_lake):
    schema = schema_for(False)
    table = pk_lake.create_table(f"props.t{next(_names)}", schema, primary_key=["k"])
    empty = schema.empty_table().append_column("op", pa.array([], pa.string()))
    assert table.write_changes(empty, row_kind="op").snapshot_id is None


def test_compaction_keeps_tombstones_that_hide_late_older_versions(pk_lake):
    schema = pa.schema([("k", pa.int64()), ("ts", pa.int64())])
    table = pk_lake.create_table(f"props.t{next(_names)}", schema, primary_key=["k"],
                                 buckets=1, sequence_field="ts")
    table.upsert(pa.table({"k": [1], "ts": [5]}, schema=schema))
    table.delete("k = 1")  # the tombstone carries ts = 5
    table.compact(full=True)
    table.upsert(pa.table({"k": [1], "ts": [3]}, schema=schema))  # older (3 < 5), arrives late
    assert table.to_arrow().num_rows == 0


# -- splits in another process --------------------------------------------------------------------


def test_pickled_splits_read_in_a_subprocess_give_the_same_rows(tmp_path):
    lake = al.connect(str(tmp_path / "lake"))
    schema = schema_for(True)
    table = lake.create_table("props.splits", schema, primary_key=["k", "p"], buckets=3,
                              partition_by=["p"], properties={"compaction.max-runs": "50"})
    rows = [{"k": k, "p": k % 2, "v": k, "m": -k, "s": "abc"[k % 3], "ts": k}
            for k in range(300)]
    table.upsert(pa.Table.from_pylist(rows, schema=schema))
    table.upsert(pa.Table.from_pylist([{**r, "v": 1000 + r["v"]} for r in rows[::3]],
                                      schema=schema))
    table.delete(al.col("k").isin(list(range(0, 300, 7))))
    table.write_changes(pa.Table.from_pylist(rows[1:40:2], schema=schema).append_column(
        "op", pa.array(["-D"] * 20)), row_kind="op")
    table.compact()
    table.upsert(pa.Table.from_pylist([{**r, "s": None} for r in rows[::5]], schema=schema))
    for scan in (table.scan(), table.scan(filter="v > 500", columns=["k", "v", "s"])):
        splits = scan.plan(target_bytes=1)
        assert len(splits) > 1
        path = tmp_path / "splits.pickle"
        path.write_bytes(pickle.dumps(splits))
        script = textwrap.dedent("""
            import pickle, sys
            import pyarrow as pa, pyarrow.ipc as ipc
            from arrowlake.scan.read import read_split_table
            splits = pickle.loads(open(sys.argv[1], "rb").read())
            result = pa.concat_tables([read_split_table(s) for s in splits])
            with ipc.new_stream(sys.stdout.buffer, result.schema) as out:
                out.write_table(result)
        """)
        proc = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                              check=True)
        got = ipc.open_stream(proc.stdout).read_all()
        expected = scan.to_arrow()
        assert got.schema == expected.schema
        assert got.sort_by("k").equals(expected.sort_by("k"))
        assert got.num_rows > 0
