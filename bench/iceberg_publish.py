"""Publishing Iceberg metadata incrementally: what one snapshot costs on a table of many files.

A table of ``--files`` data files (one commit, one file per partition value), published once
(a full build); then ``--commits`` appends of one file, each published after it (a manifest
of one entry, a manifest list, a metadata file: the cost should not grow with the table); a
delete of one file (its manifest is rewritten without it), and a publication with nothing new
(writes nothing). The baseline in the same run is a full build of the last snapshot from
nothing (a copy of the lake with the history expired and nothing published), which is what
every publication would cost without reuse.

Also ``--kind dv``: a primary-key table with deletion vectors, ``--commits`` upserts of
``--rows-per-commit`` existing keys (each records vectors, published one per Puffin file).

    python bench/iceberg_publish.py [--files 1000] [--commits 20] [--kind append|dv]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import arrowlake as al
from arrowlake.iceberg import publish


def metadata_bytes(table: al.Table) -> tuple[int, int]:
    folder = Path(table.location) / "metadata"
    files = list(folder.iterdir()) if folder.exists() else []
    return len(files), sum(f.stat().st_size for f in files)


def timed_publish(table: al.Table) -> tuple[float, int, int]:
    """Seconds, files and bytes one publication wrote."""
    files, size = metadata_bytes(table)
    started = time.perf_counter()
    publish(table)
    seconds = time.perf_counter() - started
    after_files, after_size = metadata_bytes(table)
    return seconds, after_files - files, after_size - size


def build_append(lake: al.Lake, files: int) -> al.Table:
    schema = pa.schema([("p", pa.int64()), ("id", pa.int64()), ("name", pa.string()),
                        ("amount", pa.float64())])
    table = lake.create_table("bench.events", schema, partition_by=["p"])
    rows = files * 10
    table.append(pa.table({"p": np.arange(rows) % files, "id": np.arange(rows),
                           "name": [f"n{i}" for i in range(rows)],
                           "amount": np.random.default_rng(1).random(rows)}, schema))
    return table


def append_one(table: al.Table, i: int) -> None:
    table.append(pa.table({"p": [-1 - i] * 10, "id": np.arange(10) + 10_000_000 + 10 * i,
                           "name": ["x"] * 10, "amount": np.zeros(10)}, table.schema))


def build_dv(lake: al.Lake, files: int) -> al.Table:
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])
    table = lake.create_table("bench.users", schema, primary_key=["id"], buckets=files,
                              deletion_vectors=True, properties={"compaction.mode": "off"})
    rows = files * 100
    table.upsert(pa.table({"id": np.arange(rows), "name": [f"n{i}" for i in range(rows)],
                           "amount": np.zeros(rows)}, schema))
    return table


def upsert_some(table: al.Table, i: int, n: int, keys: int) -> None:
    ids = np.random.default_rng(i).choice(keys, n, replace=False)
    table.upsert(pa.table({"id": ids, "name": [f"u{i}"] * n, "amount": np.ones(n)},
                          table.schema))


def full_build(lake_path: Path, name: str) -> tuple[float, int, int]:
    """A full build of the current snapshot from nothing, in a copy of the lake."""
    copy = Path(tempfile.mkdtemp(prefix="al-iceberg-full-"))
    try:
        shutil.copytree(lake_path, copy / "lake")
        lake = al.connect(copy / "lake")
        table = lake.table(name)
        table.expire_snapshots(retain_last=1)
        with lake.metastore.engine.begin() as conn:
            for t in ("al_iceberg_metadata", "al_iceberg_snapshots", "al_iceberg_manifests",
                      "al_iceberg_vectors", "al_iceberg_tables"):
                conn.exec_driver_sql(f"DELETE FROM {t}")
        result = timed_publish(table)
        lake.close()
        return result
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--commits", type=int, default=20)
    parser.add_argument("--kind", choices=("append", "dv"), default="append")
    parser.add_argument("--rows-per-commit", type=int, default=200)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="al-iceberg-bench-"))
    try:
        lake = al.connect(root / "lake")
        if args.kind == "append":
            table = build_append(lake, args.files)
        else:
            table = build_dv(lake, args.files)
        live = len(table.files())
        rows = [("first publication (full build)", *timed_publish(table))]
        steps = []
        for i in range(args.commits):
            if args.kind == "append":
                append_one(table, i)
            else:
                upsert_some(table, i, args.rows_per_commit, args.files * 100)
            steps.append(timed_publish(table))
        label = "one append" if args.kind == "append" else \
            f"one upsert of {args.rows_per_commit} keys"
        rows.append((f"{label}, median of {len(steps)}",
                     statistics.median(s[0] for s in steps),
                     int(statistics.median(s[1] for s in steps)),
                     int(statistics.median(s[2] for s in steps))))
        rows.append((f"{label}, the slowest",
                     *max(steps, key=lambda s: s[0])))
        if args.kind == "append":
            table.delete("p = 0")
            rows.append(("a delete of one file (its manifest rewritten)",
                         *timed_publish(table)))
        rows.append(("nothing new (idempotent)", *timed_publish(table)))
        rows.append(("baseline: full build of the last snapshot", *full_build(
            root / "lake", table.name)))
        lake.close()
        print(f"{args.kind} table, {live} live data files at first, then {args.commits} "
              "commits, each published")
        print(f"{'publication':<52} {'seconds':>8} {'files':>6} {'bytes':>10}")
        for name, seconds, files, size in rows:
            print(f"{name:<52} {seconds:>8.3f} {files:>6} {size:>10,}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
