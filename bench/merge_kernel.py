"""The merge kernel alone: merging sorted runs of a primary-key bucket, per engine.

Data: one 2,000,000-row run plus ``--runs`` runs of ``--small`` rows (half of them keys of the
big run), columns id int64 key, 12-char string, float64, int64. Baseline in the same run: a plain
``pa.Table.sort_by`` of the same rows. Prints medians.

    python bench/merge_kernel.py [--big 2000000] [--small 200000] [--runs 5] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from arrowlake.merge import Aggregation, Deduplicate, FirstRow, PartialUpdate


def runs_table(n_big: int, n_small: int, runs: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    big = np.arange(0, 2 * n_big, 2, dtype=np.int64)

    def run(ids: np.ndarray, seq0: int) -> pa.Table:
        n = len(ids)
        letters = rng.integers(97, 123, size=n * 12, dtype=np.uint8).tobytes()
        offsets = np.arange(0, 12 * (n + 1), 12, dtype=np.int32)
        names = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(letters))
        return pa.table({"id": ids, "name": names, "price": rng.random(n),
                         "ts": rng.integers(0, 10**9, n),
                         "_row_kind": np.zeros(n, np.int8),
                         "_seq": np.arange(seq0, seq0 + n, dtype=np.int64)})

    tables = [run(big, 0)]
    seq = n_big
    for _ in range(runs):
        old = rng.choice(big, n_small // 2, replace=False)
        new = rng.choice(np.arange(2 * n_big, 4 * n_big), n_small // 2, replace=False)
        tables.append(run(np.sort(np.concatenate([old, new])), seq))
        seq += n_small
    return pa.concat_tables(tables)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--big", type=int, default=2_000_000)
    parser.add_argument("--small", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    t = runs_table(args.big, args.small, args.runs)
    cases = [
        ("baseline: pa.Table.sort_by(id, _seq)",
         lambda: t.sort_by([("id", "ascending"), ("_seq", "ascending")])),
        ("deduplicate", lambda: Deduplicate().merge(t, ["id"])),
        ("deduplicate, sequence_field=ts", lambda: Deduplicate().merge(t, ["id"], "ts")),
        ("partial-update", lambda: PartialUpdate().merge(t, ["id"])),
        ("aggregation (sum, sum)",
         lambda: Aggregation({"price": "sum", "ts": "sum"}).merge(t, ["id"])),
        ("first-row", lambda: FirstRow().merge(t, ["id"])),
    ]
    print(f"{t.num_rows:,} rows in {args.runs + 1} runs; medians of {args.repeat}")
    base = None
    for name, fn in cases:
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        med = statistics.median(times)
        base = base or med
        print(f"{name:40} {med * 1000:8.1f} ms  {med / base:5.2f}x baseline")


if __name__ == "__main__":
    main()
