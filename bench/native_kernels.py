"""The key path's kernels at the sizes of issue 34: a batch of ``--rows`` (200,000) upserted
into a table of ``--table-rows`` (2,000,000) in ``--buckets`` (16) buckets.

The table prints medians of ``--repeat`` runs, and beside a kernel the plain way to get the
same answer from numpy, pyarrow or pyroaring where there is one (the baseline), with the ratio.
The numpy implementation of the key path itself is gone (issue 34); these baselines are what a
user without the native core would write. Kernels:

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


#: A kernel: its name, the call, and its baseline (None: nothing does the same thing).
Case = tuple[str, Callable[[], object], Callable[[], object] | None]


def cases(rows: int, table_rows: int, buckets: int) -> list[Case]:
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

    def search() -> None:
        for s, idx in zip(searched, indexes, strict=True):
            assert idx is not None
            idx.search(s)

    def searchsorted() -> None:
        for s, idx in zip(searched, indexes, strict=True):
            assert idx is not None
            at = np.searchsorted(idx.base, s)
            inside = at < len(idx.base)
            _ = idx.base[at[inside]] == s[inside]

    def merge_levels() -> None:
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
                                   "w": pa.array(rng.integers(0, 9, n), pa.int64(),
                                                 mask=rng.random(n) < 0.3),
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

    def numpy_dedupe() -> object:
        # What numpy alone does for a deduplicate of runs concatenated oldest first: a stable
        # argsort of the keys and each key's last row, then the same take.
        out = []
        for t in bucket_runs:
            keys = t["id"].to_numpy()
            order = np.argsort(keys, kind="stable")
            ordered = keys[order]
            last = np.r_[ordered[1:] != ordered[:-1], True]
            out.append(t.take(pa.array(order[last])))
        return out

    def arrow_sort(table: pa.Table, names: list[str]) -> Callable[[], object]:
        codes = pa.array(bucket_of(table, names, buckets).to_numpy().astype(np.int64))
        keyed = table.select(names).append_column("_code", codes)
        order = [("_code", "ascending"), *((n, "ascending") for n in names)]
        return lambda: pa.compute.sort_indices(keyed, sort_keys=order)

    def pyroaring_encode() -> object:
        from pyroaring import BitMap64
        out = []
        for f, e in zip(fresh, earlier, strict=True):
            bitmap = BitMap64(np.concatenate([f.astype(np.uint64), e]))
            bitmap.run_optimize()
            out.append(bitmap.serialize())
        return out

    def pyroaring_decode() -> object:
        from pyroaring import BitMap64
        return [np.frombuffer(BitMap64.deserialize(b[8:-4]).to_array(), np.uint64)
                for b in blobs]

    return [
        ("bucket hash, int64 key", lambda: bucket_of(batch, ["id"], buckets), None),
        ("bucket hash, string key", lambda: bucket_of(text, ["name"], buckets), None),
        ("cut into sorted groups, int64 key",
         lambda: unique_run_order(batch, ["id"],
                                  bucket_of(batch, ["id"], buckets).to_numpy().astype(np.int64)),
         arrow_sort(batch, ["id"])),
        ("cut into sorted groups, string key",
         lambda: unique_run_order(text, ["name"],
                                  bucket_of(text, ["name"], buckets).to_numpy().astype(np.int64)),
         arrow_sort(text, ["name"])),
        ("key index: build every bucket",
         lambda: [key_index.build(f, frozenset()) for f in files], None),
        ("key index: search the batch", search, searchsorted),
        ("key index: merge recent into base", merge_levels, None),
        ("deletion vectors: encode (union)",
         lambda: [dv.encode_positions(f, e) for f, e in zip(fresh, earlier, strict=True)],
         pyroaring_encode),
        ("deletion vectors: decode",
         lambda: [dv.decode_positions(b, "bench") for b in blobs], pyroaring_decode),
        ("merge 6 runs a bucket: deduplicate", merge_all(Deduplicate(), 1), numpy_dedupe),
        ("merge 6 runs a bucket: deduplicate, 2 threads", merge_all(Deduplicate(), 2), None),
        ("merge 6 runs a bucket: partial-update", merge_all(PartialUpdate(), 1), None),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--table-rows", type=int, default=2_000_000)
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if not native.available():
        sys.exit("arrowlake._native is not built: pip install -e . first")
    kernels = cases(args.rows, args.table_rows, args.buckets)
    print(f"{args.rows:,} rows into {args.table_rows:,} in {args.buckets} buckets, "
          f"median of {args.repeat}")
    print(f"{'kernel':<48} {'native ms':>10} {'baseline ms':>12} {'native/base':>12}")
    for name, call, baseline in kernels:
        fast = timed(call, args.repeat)
        if baseline is None:
            print(f"{name:<48} {fast * 1000:>10.1f} {'-':>12} {'-':>12}")
            continue
        slow = timed(baseline, args.repeat)
        print(f"{name:<48} {fast * 1000:>10.1f} {slow * 1000:>12.1f} {fast / slow:>12.2f}")


if __name__ == "__main__":
    main()
