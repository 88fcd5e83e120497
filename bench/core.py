"""Core write/scan benchmark: arrowlake against raw pyarrow on the same rows, in one run.

2,000,000 rows (int64 id, string, float64, int64, 4-value partition column). Prints medians of
``--runs`` runs and the ratios the foundation issue sets targets for:
append <= 1.3x pq.write_table, full scan <= 1.2x a pyarrow.dataset scan of the same files, and a
filter selecting 1/1000 of the rows <= 0.1 s. The same rows sorted by their float column
give a float range filter of 1/1000 of the rows, against pyarrow.dataset with the same filter
(both prune row groups by statistics).

    python bench/core.py [--rows 2000000] [--runs 5]
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
import pyarrow.dataset as ds
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import arrowlake as al


def make_rows(n: int) -> pa.Table:
    rng = np.random.default_rng(42)
    return pa.table({
        "id": pa.array(np.arange(n, dtype=np.int64)),
        "name": pa.array([f"customer-{i:06d}" for i in rng.integers(0, 100_000, n)]),
        "amount": pa.array(rng.random(n) * 1000),
        "ts": pa.array(rng.integers(1_700_000_000_000, 1_800_000_000_000, n)),
        "region": pa.array(np.array(["eu", "us", "apac", "latam"])[rng.integers(0, 4, n)]),
    })


def timed(fn, runs: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(runs):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    data = make_rows(args.rows)
    root = Path(tempfile.mkdtemp(prefix="arrowlake-bench-"))
    rows = []
    try:
        raw = root / "raw.parquet"
        t_raw, _ = timed(lambda: pq.write_table(data, raw, compression="zstd"), args.runs)
        t_raw_snappy, _ = timed(lambda: pq.write_table(data, root / "raw-snappy.parquet"),
                                args.runs)

        # Each append goes to a fresh table, created before the clock starts.
        tables = []
        for i in range(args.runs):
            lake = al.connect(root / f"lake-{i}")
            tables.append(lake.create_table("bench.t", data.schema, partition_by=["region"]))
        fresh = iter(tables)

        def append_once() -> al.Table:
            table = next(fresh)
            table.append(data)
            return table

        t_append, table = timed(append_once, args.runs)
        assert isinstance(table, al.Table)
        files = table.files()["path"].to_pylist()

        def raw_scan() -> pa.Table:
            return ds.dataset(files, format="parquet").to_table()

        t_raw_scan, raw_out = timed(raw_scan, args.runs)
        t_scan, out = timed(lambda: table.to_arrow(), args.runs)
        assert out.num_rows == raw_out.num_rows == args.rows

        lo = args.rows // 2
        hi = lo + args.rows // 1000 - 1
        t_filter, sel = timed(lambda: table.scan(filter=f"id between {lo} and {hi}").to_arrow(),
                              args.runs)
        assert sel.num_rows == args.rows // 1000
        t_raw_filter, _ = timed(lambda: ds.dataset(files, format="parquet").to_table(
            filter=(ds.field("id") >= lo) & (ds.field("id") <= hi)), args.runs)
        t_count, n = timed(lambda: table.count(), args.runs)
        assert n == args.rows

        by_amount = al.connect(root / "lake-sorted").create_table("bench.s", data.schema)
        by_amount.append(data.sort_by("amount"))
        sorted_files = by_amount.files()["path"].to_pylist()
        amounts = data["amount"].to_numpy()
        a_lo, a_hi = float(np.quantile(amounts, 0.5)), float(np.quantile(amounts, 0.501))
        t_ffilter, fsel = timed(lambda: by_amount.scan(
            filter=f"amount >= {a_lo!r} and amount < {a_hi!r}").to_arrow(), args.runs)
        t_raw_ffilter, raw_fsel = timed(lambda: ds.dataset(sorted_files, format="parquet")
                                        .to_table(filter=(ds.field("amount") >= a_lo)
                                                  & (ds.field("amount") < a_hi)), args.runs)
        assert fsel.num_rows == raw_fsel.num_rows

        rows = [
            ("append (4 partitions, zstd)", t_append, "pq.write_table zstd", t_raw, 1.3),
            ("append", t_append, "pq.write_table default (snappy)", t_raw_snappy, None),
            ("full scan", t_scan, "pyarrow.dataset same files", t_raw_scan, 1.2),
            ("filter 1/1000 rows", t_filter, "pyarrow.dataset + filter", t_raw_filter, None),
            ("count()", t_count, "-", float("nan"), None),
            ("float filter 1/1000 (sorted)", t_ffilter, "pyarrow.dataset + filter",
             t_raw_ffilter, None),
        ]
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(f"rows={args.rows:,}  runs={args.runs}  (medians, seconds)")
    print(f"{'operation':30} {'arrowlake':>10} {'baseline':>10} {'ratio':>7}  target  baseline")
    for name, ours, base_name, base, target in rows:
        ratio = ours / base if base == base else float("nan")
        goal = f"<={target}x" if target else ""
        print(f"{name:30} {ours:10.3f} {base:10.3f} {ratio:7.2f}  {goal:6}  {base_name}")
    print(f"filter 1/1000 rows absolute: {t_filter:.3f} s (target <= 0.1 s)")


if __name__ == "__main__":
    main()
