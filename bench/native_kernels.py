"""The key path's kernels, numpy against native, at the sizes of issue 34: a batch of ``--rows``
(200,000) upserted into a table of ``--table-rows`` (2,000,000) in ``--buckets`` (16) buckets.

Each kernel runs on the same inputs both ways (``ARROWLAKE_NATIVE=0`` and ``=1``); the table
prints medians of ``--repeat`` runs and the ratio. Kernels:

- bucket hash of the batch (an int64 key, and a 12-char string key);
- cutting the batch into sorted groups per bucket (hash + ``unique_run_order``);
- building the 16 buckets' key indexes from their files' key images (2M keys) and searching
  the batch's keys in them; merging a bucket's recent level into its base;
- deletion vectors: one per bucket file, the batch's replaced positions united with earlier
  ones, encoded; and decoded back;
- the merge kernel: every bucket's 6 runs merged by deduplicate and by partial-update
  (merge-on-read and compaction), one bucket after another, and on 2 threads.

    python bench/native_kernels.py [--rows 200000] [--table-rows 2000000] [--buckets 16]
                                   [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from arrowlake import native
from arrowlake.io import deletion_vectors as dv
from arrowlake.merge import Deduplicate, PartialUpdate
from arrowlake.merge.bucketing import bucket_of
from arrowlake.merge.engines import unique_run_order
from arrowlake.table.keys import index as key_index


def strings(rng: np.random.Generator, n: int) -> pa.Array:
    letters = rng.integers(97, 123, size=n * 12, dtype=np.uint8).tobytes()
    offsets = np.arange(0, 12 * (n + 1), 12, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(letters))


def timed(call: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def on_path(flag: str, call: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        before = os.environ.get(native.ENV)
        os.environ[native.ENV] = flag
        try:
            return call()
        finally:
            if before is None:
                os.environ.pop(native.ENV, None)
            else:
                os.environ[native.ENV] = before
    return run


Case = tuple[str, Callable[[], object] | None]
Pair = tuple[Callable[[], object], Callable[[], object]]


def cases(rows: int, table_rows: int, buckets: int) -> tuple[list[Case], dict[str, Pair]]:
    rng = np.random.default_rng(34)
    live = np.sort(rng.choice(np.arange(4 * table_rows, dtype=np.int64), table_rows,
                              replace=False))
    batch_keys = np.concatenate([rng.choice(live, rows // 2, replace=False),
                                 rng.integers(4 * table_rows, 8 * table_rows, rows - rows // 2)])
    batch = pa.table({"id": batch_keys, "name": strings(rng, rows),
                      "v": rng.integers(0, 1000, rows), "_row_kind": np.zeros(rows, np.int8)})
    text = pa.table({"name": batch["name"]})
    codes = bucket_of(batch, ["id"], buckets).to_numpy().astype(np.int64)

    # Each bucket's key index: its live keys in 4 files, a quarter deleted in the first.
    bucket_of_live = np.asarray(bucket_of(pa.table({"id": live}), ["id"], buckets))
    files = []
    for b in range(buckets):
        keys = live[bucket_of_live == b]
        parts = np.array_split(keys, 4)
        deleted = np.arange(0, len(parts[0]), 4, dtype=np.uint64)
        files.append([(f"b{b}-f{i}", part, deleted if i == 0 else None)
                      for i, part in enumerate(parts)])
    indexes = [key_index.build(f, frozenset()) for f in files]
    searched = [np.sort(batch_keys[codes == b]) for b in range(buckets)]
    recents = [np.setdiff1d(s, idx.base) if idx else s for s, idx in zip(searched, indexes,
                                                                          strict=True)]

    def numpy_search() -> None:
        for s, idx in zip(searched, indexes, strict=True):
            assert idx is not None
            idx.search(s)

    def native_search() -> None:
        for s, idx in zip(searched, indexes, strict=True):
            assert idx is not None
            native.index_search(idx.base, idx.dead, idx.recent, s)

    def numpy_merge_levels() -> None:
        for r, idx in zip(recents, indexes, strict=True):
            assert idx is not None
            key_index._merge(idx.base, idx.base_locators, r, np.arange(len(r), dtype=np.int64))

    def native_merge_levels() -> None:
        for r, idx in zip(recents, indexes, strict=True):
            assert idx is not None
            native.index_merge(idx.base, idx.base_locators, r, np.arange(len(r), dtype=np.int64))

    # Vectors: per bucket file, the batch's replaced positions and 4x as many earlier ones.
    per_file = max(rows // (2 * buckets), 1)
    size = max(table_rows // buckets, 8 * per_file)
    earlier = [np.unique(rng.integers(0, size, 4 * per_file)).astype(np.uint64)
               for _ in range(buckets)]
    fresh = [rng.integers(0, size, per_file) for _ in range(buckets)]
    blobs = [dv.encode_positions(f, e)[0] for f, e in zip(fresh, earlier, strict=True)]

    # The merge kernel: per bucket a base run of its live keys and 5 upsert runs.
    bucket_runs = []
    for b in range(buckets):
        keys = live[bucket_of_live == b]
        parts = []
        for seq, run_keys in enumerate([keys, *(np.sort(rng.choice(keys, max(rows // buckets, 1)))
                                                for _ in range(5))]):
            run_keys = np.unique(run_keys)
            n = len(run_keys)
            parts.append(pa.table({"id": run_keys, "v": rng.integers(0, 1000, n),
                                   "w": pa.array(np.where(rng.random(n) < 0.3, None,
                                                          rng.integers(0, 9, n)), pa.int64()),
                                   "_row_kind": np.zeros(n, np.int8),
                                   "_seq": np.full(n, seq, np.int64)}))
        bucket_runs.append(pa.concat_tables(parts))

    def merge_all(engine: Deduplicate | PartialUpdate, threads: int) -> Callable[[], object]:
        def run() -> object:
            if threads == 1:
                return [engine.merge(t, ["id"]) for t in bucket_runs]
            with ThreadPoolExecutor(threads) as pool:
                return list(pool.map(lambda t: engine.merge(t, ["id"]), bucket_runs))
        return run

    return [
        ("bucket hash, int64 key", lambda: bucket_of(batch, ["id"], buckets)),
        ("bucket hash, string key", lambda: bucket_of(text, ["name"], buckets)),
        ("cut into sorted groups, int64 key",
         lambda: unique_run_order(batch, ["id"],
                                  bucket_of(batch, ["id"], buckets).to_numpy().astype(np.int64))),
        ("cut into sorted groups, string key",
         lambda: unique_run_order(text, ["name"],
                                  bucket_of(text, ["name"], buckets).to_numpy().astype(np.int64))),
        ("key index: build every bucket", None),  # filled below (two functions)
        ("key index: search the batch", None),
        ("key index: merge recent into base", None),
        ("deletion vectors: encode (union)",
         lambda: [dv.encode_positions(f, e) for f, e in zip(fresh, earlier, strict=True)]),
        ("deletion vectors: decode",
         lambda: [dv.decode_positions(b, "bench") for b in blobs]),
        ("merge 6 runs a bucket: deduplicate", merge_all(Deduplicate(), 1)),
        ("merge 6 runs a bucket: deduplicate, 2 threads", merge_all(Deduplicate(), 2)),
        ("merge 6 runs a bucket: partial-update", merge_all(PartialUpdate(), 1)),
    ], {
        "key index: build every bucket": (
            lambda: [key_index.build(f, frozenset()) for f in files],
            lambda: [native.index_build([(i, d) for _, i, d in f]) for f in files]),
        "key index: search the batch": (numpy_search, native_search),
        "key index: merge recent into base": (numpy_merge_levels, native_merge_levels),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--table-rows", type=int, default=2_000_000)
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if not native.available():
        sys.exit("arrowlake._native is not built: pip install -e . first")
    same, pairs = cases(args.rows, args.table_rows, args.buckets)
    print(f"{args.rows:,} rows into {args.table_rows:,} in {args.buckets} buckets, "
          f"median of {args.repeat}")
    print(f"{'kernel':<48} {'numpy ms':>9} {'native ms':>10} {'native/numpy':>13}")
    for name, call in same:
        if call is None:
            numpy_call, native_call = pairs[name]
        else:
            numpy_call, native_call = on_path("0", call), on_path("1", call)
        slow = timed(numpy_call, args.repeat)
        fast = timed(native_call, args.repeat)
        print(f"{name:<48} {slow * 1000:>9.1f} {fast * 1000:>10.1f} {fast / slow:>13.2f}")


if __name__ == "__main__":
    main()
