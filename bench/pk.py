"""Primary-key tables: upserts and merged reads against raw pyarrow and Delta Lake, in one run.

The workload of the primary-key issue: ``--rows`` rows (default 2,000,000: id int64, a 12-char
string, float64, int64 timestamp, a 4-value ``region`` column), 4 buckets; then 5 upserts of
``--rows / 10`` rows (half existing ids, half new); then a full read of the live rows
(2,500,000 by default) and a read of ids 1000-2000 with 2 columns; then the same reads after
``compact(full=True)``.

``region`` is the table's partition column. Partition columns must be part of the primary key,
so the key is ``(region, id)`` with ``region`` a function of ``id`` (``id % 4``): the key is
still the id, and upserts of an existing id land in its partition. ``compaction.max-runs`` is set
to 10 (the default since the long run below) so the 5 upserts leave 6 runs per bucket and the
"before compaction" read merges them; a table with ``max-runs`` 5 would compact on the 5th.

Baselines in the same run: ``pq.write_table`` (zstd, as arrowlake writes) of the same rows for the
writes; a threaded ``pyarrow.dataset`` read of one file holding exactly the live rows, written by
``pq.write_table`` (zstd, pyarrow's default encodings), for the reads. arrowlake writes integers,
floats and strings in denser encodings (docs/architecture.md), which read faster than that file;
so the merged read is also timed against the live rows written in those same encodings, as a
reference row without a target, showing what merging costs over reading files of equal format;
``deltalake`` (when installed): the same load, the upserts as ``merge`` with
``when_matched_update_all`` / ``when_not_matched_insert_all``, and the full read. pypaimon is
not measured: pypaimon 2.0 and 2.1 require pyarrow < 20, pandas < 3 and polars < 2, so they cannot
share an environment with the pyarrow this benchmark is run against; the issue's reference
figures are printed instead. Medians of ``--runs`` runs, each on a fresh table; every timing
is taken next to its baseline (each write right after the raw write of the same rows, reads
alternating with the raw read), so that the machine's slow spells weigh on both.

Peak memory of a read is the high-water mark of Arrow's allocations above the level before the
read (``pa.total_allocated_bytes()`` sampled by a thread every millisecond), against the Arrow
size of the result; numpy arrays the merge allocates are not Arrow allocations, so the growth of
the process's resident memory is shown too.

The long run (``--long-upserts``, default 50; ``--long-only`` runs nothing else): a table with
default compaction settings, ``--rows`` rows, then that many upserts of ``--rows / 10`` rows
(half existing ids, half new), each timed right after ``pq.write_table`` of the same rows. It
prints the per-upsert median and max (compaction included: writes compact as they go), the bytes
rewritten by compaction per byte upserted (``WriteResult.compaction``), the total against
``pq.write_table`` of the same batches, and after every 10 upserts the merged full read against
a ``pyarrow.dataset`` read of the same live rows written by ``pq.write_table`` (paired medians).
``--set NAME=VALUE`` (repeatable) sets a table property of every table the run creates, to
measure what another setting trades, e.g. ``--set compaction.max-runs=20``, ``--set
write.compression=lz4`` or ``--set deletion-vectors.enabled=true`` (merge on write; the range
read's target is then 0.02 s). Without that, the tables are merge-on-read: the run sets
``deletion-vectors.enabled=false`` itself, since new tables get deletion vectors by default.
``count()`` is timed on the five-upsert table (target 5 ms).

``--service`` (with ``--set compaction.mode=deferred``): the long run is made twice, first with
``compaction.mode=inline`` (writers compact), then as set with ``arrowlake maintain`` running in
a second process from before the initial load to after the last read, and the measurements of
the maintenance issue are printed side by side: the writer's total against ``pq.write_table``,
the slowest upsert against the median, the full read after every 10th upsert against raw, and
runs and files per bucket at the end (just after the last upsert, while the service runs).

    python bench/pk.py [--rows 2000000] [--runs 3] [--no-deltalake] [--encodings auto|plain]
                       [--long-upserts 50] [--long-only] [--set NAME=VALUE ...] [--service]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import arrowlake as al
from arrowlake.io.writer import column_encodings, dictionary_columns

REGIONS = np.array(["eu", "us", "apac", "latam"])
UPSERTS = 5
ID_RANGE = "id >= 1000 and id <= 2000"


# -- data -----------------------------------------------------------------------------------------


def strings12(rng: np.random.Generator, n: int) -> pa.Array:
    letters = rng.integers(97, 123, size=n * 12, dtype=np.uint8).tobytes()
    offsets = np.arange(0, 12 * (n + 1), 12, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(letters))


def rows_for(rng: np.random.Generator, ids: np.ndarray) -> pa.Table:
    n = len(ids)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "name": strings12(rng, n),
        "price": pa.array(rng.random(n) * 1000),
        "ts": pa.array(rng.integers(1_700_000_000_000, 1_800_000_000_000, n)),
        "region": pa.array(REGIONS[ids % 4]),
    })


@dataclass
class Workload:
    initial: pa.Table
    upserts: list[pa.Table]
    live: pa.Table  # the rows a reader must see at the end, sorted by id

    @classmethod
    def make(cls, n: int) -> Workload:
        rng = np.random.default_rng(42)
        initial = rows_for(rng, rng.permutation(n).astype(np.int64))
        size = n // 10
        upserts = []
        next_new = n
        for _ in range(UPSERTS):
            old = rng.choice(n, size // 2, replace=False)
            new = np.arange(next_new, next_new + size - size // 2)
            next_new += len(new)
            upserts.append(rows_for(rng, rng.permutation(np.concatenate([old, new]))))
        # The expected live rows: the last version of each id, by numpy scatter.
        everything = pa.concat_tables([initial, *upserts])
        ids = everything["id"].to_numpy()
        last = np.full(next_new, -1, np.int64)
        last[ids] = np.arange(len(ids))  # later writes overwrite earlier ones
        live = everything.take(pa.array(last))
        return cls(initial, upserts, live)


def same_rows(got: pa.Table, expected: pa.Table) -> bool:
    """Same rows (by id) and values; the table's schema adds field ids and non-null keys."""
    got, expected = got.sort_by("id"), expected.select(got.column_names).sort_by("id")
    return got.num_rows == expected.num_rows and all(
        got[c].combine_chunks().equals(expected[c].combine_chunks()) for c in got.column_names)


# -- measuring ------------------------------------------------------------------------------------


def median_time(fn: Callable[..., Any], runs: int, setup: Callable[[], Any] | None = None
                ) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(runs):
        arg = setup() if setup else None
        gc.collect()
        start = time.perf_counter()
        out = fn(arg) if setup else fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def paired_medians(ours: Callable[[], Any], base: Callable[[], Any], runs: int
                   ) -> tuple[float, Any, float]:
    """Medians of ``ours`` and ``base`` timed alternately, so that a slow spell of the machine
    weighs on both sides alike: ``(ours, its last result, base)``."""
    mine, theirs, out = [], [], None
    for _ in range(runs):
        gc.collect()
        start = time.perf_counter()
        base()
        theirs.append(time.perf_counter() - start)
        gc.collect()
        start = time.perf_counter()
        out = ours()
        mine.append(time.perf_counter() - start)
    return statistics.median(mine), out, statistics.median(theirs)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@dataclass
class Peak:
    """High-water marks of Arrow allocations and resident memory while ``fn`` runs."""

    arrow: int = 0
    rss: int = 0
    result_bytes: int = 0
    samples: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, fn: Callable[[], pa.Table]) -> Peak:
        gc.collect()
        arrow0, rss0 = pa.total_allocated_bytes(), _rss()
        peak = [arrow0, rss0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], pa.total_allocated_bytes())
                peak[1] = max(peak[1], _rss())
                time.sleep(0.001)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            out = fn()
        finally:
            done.set()
            thread.join()
        peak[0] = max(peak[0], pa.total_allocated_bytes())
        peak[1] = max(peak[1], _rss())
        return cls(peak[0] - arrow0, peak[1] - rss0, out.nbytes)


# -- the systems ----------------------------------------------------------------------------------


@dataclass
class ArrowlakeRun:
    load: float
    upserts: list[float]
    compact: float
    raw_load: float = float("nan")  # pq.write_table of the same rows, timed just before
    raw_upserts: list[float] = field(default_factory=list)


def raw_write(batch: pa.Table, path: Path) -> float:
    gc.collect()
    start = time.perf_counter()
    pq.write_table(batch, path, compression="zstd")
    return time.perf_counter() - start


def arrowlake_run(root: Path, w: Workload, encodings: str = "auto",
                  properties: dict[str, str] | None = None) -> tuple[ArrowlakeRun, al.Table]:
    lake = al.connect(str(root))
    table = lake.create_table("bench.pk", w.initial.schema, primary_key=["region", "id"],
                              partition_by=["region"], buckets=4,
                              properties={"compaction.max-runs": "10",
                                          "write.encodings": encodings, **(properties or {})})
    raw_load = raw_write(w.initial, root / "raw-load.parquet")
    gc.collect()
    start = time.perf_counter()
    table.upsert(w.initial)
    load = time.perf_counter() - start
    upserts, raw_upserts = [], []
    for batch in w.upserts:
        raw_upserts.append(raw_write(batch, root / "raw-upsert.parquet"))
        gc.collect()
        start = time.perf_counter()
        table.upsert(batch)
        upserts.append(time.perf_counter() - start)
    return ArrowlakeRun(load, upserts, float("nan"), raw_load, raw_upserts), table


@dataclass
class LongRun:
    upserts: list[float] = field(default_factory=list)
    raw_upserts: list[float] = field(default_factory=list)
    upserted_bytes: int = 0  # the upserts' own runs
    compacted_read: int = 0  # bytes of the runs compactions merged
    compacted_written: int = 0  # bytes compactions wrote in their place
    compactions: int = 0  # upserts that committed a compaction
    # (upserts so far, files per bucket, merged read, raw read of the same rows)
    reads: list[tuple[int, float, float, float]] = field(default_factory=list)
    runs_max: int = 0  # the most runs one bucket holds just after the last upsert
    files_per_bucket: float = 0.0  # likewise, files
    service_actions: list[dict[str, Any]] = field(default_factory=list)  # --service only


SRC = Path(__file__).resolve().parents[1] / "src"


def start_service(lake: Path, log: Path) -> subprocess.Popen[bytes]:
    """``arrowlake maintain`` on ``lake`` in a second process, its JSON lines into ``log``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "arrowlake.cli.main", "--lake", str(lake),
                                 "--json", "maintain"], stdout=out, env=env)


def stop_service(service: subprocess.Popen[bytes], log: Path) -> list[dict[str, Any]]:
    service.send_signal(signal.SIGTERM)
    if service.wait(timeout=600) != 0:
        raise RuntimeError(f"arrowlake maintain exited with {service.returncode}")
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def long_run(root: Path, rows: int, upserts: int, runs: int, encodings: str,
             properties: dict[str, str] | None = None, service: bool = False) -> LongRun:
    """``upserts`` upserts of ``rows / 10`` rows into ``rows`` rows, default settings (but for
    ``properties``); with ``service``, ``arrowlake maintain`` runs in a second process."""
    rng = np.random.default_rng(7)
    lake = al.connect(str(root / "long"))
    initial = rows_for(rng, rng.permutation(rows).astype(np.int64))
    table = lake.create_table("bench.long", initial.schema, primary_key=["region", "id"],
                              partition_by=["region"], buckets=4,
                              properties={"write.encodings": encodings, **(properties or {})})
    log = root / "maintain.jsonl"
    process = start_service(root / "long", log) if service else None
    try:
        out = _long_upserts(table, initial, rng, root, rows, upserts, runs)
    finally:
        if process is not None:
            actions = stop_service(process, log)
    if process is not None:
        out.service_actions = actions
        out.compactions = sum(a["action"] == "compact" and a["snapshot_id"] is not None
                              for a in actions)
        out.compacted_read = sum(a["read_bytes"] for a in actions if a["action"] == "compact")
        out.compacted_written = sum(a["written_bytes"] for a in actions
                                    if a["action"] == "compact")
    lake.close()
    return out


def _long_upserts(table: al.Table, initial: pa.Table, rng: np.random.Generator, root: Path,
                  rows: int, upserts: int, runs: int) -> LongRun:
    table.upsert(initial)
    live = initial  # the rows a reader must see, kept up to date outside the timings
    del initial
    out = LongRun()
    size = rows // 10
    next_new = rows
    for i in range(upserts):
        old = rng.choice(rows, size // 2, replace=False)
        new = np.arange(next_new, next_new + size - size // 2)
        next_new += len(new)
        batch = rows_for(rng, rng.permutation(np.concatenate([old, new])))
        out.raw_upserts.append(raw_write(batch, root / "raw-long.parquet"))
        gc.collect()
        start = time.perf_counter()
        result = table.upsert(batch)
        out.upserts.append(time.perf_counter() - start)
        mine = table.files(snapshot=result.snapshot_id)
        out.upserted_bytes += sum(
            size for size, snap in zip(mine["file_size"].to_pylist(),
                                       mine["added_snapshot"].to_pylist(), strict=True)
            if snap == result.snapshot_id)
        if result.compaction is not None and result.compaction.snapshot_id is not None:
            out.compactions += 1
            out.compacted_read += result.compaction.removed_bytes
            out.compacted_written += result.compaction.added_bytes
        live = pa.concat_tables([
            live.filter(pc.invert(pc.is_in(live["id"], value_set=batch["id"]))), batch])
        if (i + 1) % 10 == 0 or i + 1 == upserts:
            raw_file = root / "raw-long-live.parquet"
            pq.write_table(live, raw_file, compression="zstd")
            per_bucket = table.files().num_rows / 16  # a run is one file at this size

            def raw_read(f: Path = raw_file) -> pa.Table:
                return ds.dataset(f, format="parquet").to_table(use_threads=True)

            if i + 1 == upserts:
                health = table.health()  # before the read: what the writer leaves
                out.runs_max, out.files_per_bucket = health.runs_max, per_bucket
            t_read, got, t_raw = paired_medians(lambda: table.to_arrow(), raw_read, runs)
            assert same_rows(got, live), f"merged read after {i + 1} upserts differs"
            del got
            out.reads.append((i + 1, per_bucket, t_read, t_raw))
    return out


def print_long(rows: int, upserts: int, r: LongRun, properties: dict[str, str]) -> None:
    each = statistics.median(r.upserts)
    worst = max(r.upserts)
    amp = r.compacted_written / r.upserted_bytes
    total, raw_total = sum(r.upserts), sum(r.raw_upserts)
    settings = ", ".join(f"{k}={v}" for k, v in properties.items()) or "default settings"
    print(f"long run: {rows:,} rows, then {upserts} upserts of {rows // 10:,} with {settings}; "
          f"{r.compactions} of them compacted (seconds)")
    # Deletion-vector tables: the native core issue's targets (its total, 2.0x, replaced the
    # deletion-vector issue's 1.3x); merge-on-read tables: the merge-on-read issue's.
    vectors = properties.get("deletion-vectors.enabled") == "true"
    total_x, worst_x, read_x = (2.0, 3, 1.2) if vectors else (1.5, 4, 1.5)
    table = [
        Row("upsert (median)", each, "pq.write_table zstd (median)",
            statistics.median(r.raw_upserts)),
        Row("upsert (max) vs upsert median", worst, "arrowlake upsert median", each,
            f"<={worst_x}x", worst <= worst_x * each),
        Row(f"{upserts} upserts (total, compaction included)", total,
            "pq.write_table zstd (total)", raw_total, f"<={total_x}x",
            total <= total_x * raw_total),
        Row("compaction bytes written / bytes upserted", amp, "-", float("nan"), "<=3",
            amp <= 3),
        Row("compaction bytes read / bytes upserted", r.compacted_read / r.upserted_bytes, "-",
            float("nan")),
    ]
    for n, per_bucket, t_read, t_raw in r.reads:
        table.append(Row(f"full read after {n} upserts ({per_bucket:.1f} files/bucket)", t_read,
                         "pyarrow.dataset same rows", t_raw, f"<={read_x}x",
                         t_read <= read_x * t_raw))
    print_table("", table)


def print_service(rows: int, upserts: int, inline: LongRun, deferred: LongRun,
                  properties: dict[str, str]) -> None:
    """The maintenance issue's measurements: the deferred run with the service beside the
    inline run, each against raw pyarrow of the same run."""
    vectors = properties.get("deletion-vectors.enabled", "").lower() == "true"
    limit = 1.25 if vectors else 1.15
    settings = ", ".join(f"{k}={v}" for k, v in properties.items())
    print(f"maintenance service: {rows:,} rows, then {upserts} upserts of {rows // 10:,}; "
          f"{settings} with 'arrowlake maintain' in a second process, beside "
          "compaction.mode=inline (seconds; ratio = against the baseline of the same run)")
    print(f"{'measurement':44} {'deferred':>10} {'ratio':>7} {'inline':>10} {'ratio':>7}  "
          f"{'target':8} met  baseline")

    def line(name: str, d: float, d_base: float, i: float, i_base: float, target: str,
             met: bool | None, base: str) -> None:
        def ratio(a: float, b: float) -> str:
            return f"{a / b:7.2f}" if b == b and b else f"{'-':>7}"
        flag = "" if met is None else ("yes" if met else "NO")
        print(f"{name:44} {d:10.3f} {ratio(d, d_base)} {i:10.3f} {ratio(i, i_base)}  "
              f"{target:8} {flag:4} {base}")

    d_total, d_raw = sum(deferred.upserts), sum(deferred.raw_upserts)
    i_total, i_raw = sum(inline.upserts), sum(inline.raw_upserts)
    line("writer's total upsert time", d_total, d_raw, i_total, i_raw, f"<={limit}x",
         d_total <= limit * d_raw, "pq.write_table zstd (total)")
    d_med, i_med = statistics.median(deferred.upserts), statistics.median(inline.upserts)
    line("slowest upsert", max(deferred.upserts), d_med, max(inline.upserts), i_med, "<=2x",
         max(deferred.upserts) <= 2 * d_med, "upsert median")
    for (n, _, d_read, d_base), (_, _, i_read, i_base) in zip(
            deferred.reads, inline.reads, strict=True):
        line(f"full read after {n} upserts", d_read, d_base, i_read, i_base, "<=1.2x",
             d_read <= 1.2 * d_base, "pyarrow.dataset same rows")
    print(f"{'runs per bucket at the end (max)':44} {deferred.runs_max:10d} {'':7} "
          f"{inline.runs_max:10d} {'':7}  {'<=inline':8} "
          f"{'yes' if deferred.runs_max <= inline.runs_max else 'NO':4}")
    print(f"{'files per bucket at the end (mean)':44} {deferred.files_per_bucket:10.1f} "
          f"{'':7} {inline.files_per_bucket:10.1f} {'':7}  {'<=inline':8} "
          f"{'yes' if deferred.files_per_bucket <= inline.files_per_bucket else 'NO':4}")
    written = deferred.compacted_written / max(1, deferred.upserted_bytes)
    i_written = inline.compacted_written / max(1, inline.upserted_bytes)
    print(f"{'compaction bytes written / bytes upserted':44} {written:10.2f} {'':7} "
          f"{i_written:10.2f}")
    errors = [a for a in deferred.service_actions if a.get("error")]
    print(f"service: {deferred.compactions} compactions, "
          f"{sum(a.get('dropped', False) for a in deferred.service_actions)} dropped, "
          f"{len(errors)} errors" + (f" (first: {errors[0]['error']})" if errors else ""))


def deltalake_upserts(root: Path, w: Workload) -> tuple[float, list[float], str]:
    from deltalake import DeltaTable, write_deltalake

    path = str(root)
    start = time.perf_counter()
    write_deltalake(path, w.initial, partition_by=["region"])
    load = time.perf_counter() - start
    upserts = []
    for batch in w.upserts:
        start = time.perf_counter()
        (DeltaTable(path)
         .merge(batch, predicate="t.id = s.id AND t.region = s.region", source_alias="s",
                target_alias="t")
         .when_matched_update_all()
         .when_not_matched_insert_all()
         .execute())
        upserts.append(time.perf_counter() - start)
    return load, upserts, path


# -- the report -----------------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    ours: float
    base_name: str
    base: float
    target: str = ""
    met: bool | None = None


def print_table(title: str, rows: list[Row]) -> None:
    print(title)
    print(f"{'operation':44} {'arrowlake':>10} {'baseline':>10} {'ratio':>7}  {'target':10} "
          f"{'met':4} baseline")
    for r in rows:
        ratio = r.ours / r.base if r.base == r.base and r.base else float("nan")
        met = "" if r.met is None else ("yes" if r.met else "NO")
        base = f"{r.base:10.3f}" if r.base == r.base else f"{'-':>10}"
        print(f"{r.name:44} {r.ours:10.3f} {base} {ratio:7.2f}  {r.target:10} {met:4} "
              f"{r.base_name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-deltalake", action="store_true")
    parser.add_argument("--encodings", choices=["auto", "plain"], default="auto",
                        help="the table's write.encodings (plain: what the merge alone costs "
                             "against the default-encoded baseline file)")
    parser.add_argument("--long-upserts", type=int, default=50,
                        help="upserts of the long run (0: skip it)")
    parser.add_argument("--long-only", action="store_true", help="run only the long run")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a table property of the long run's table (repeatable)")
    parser.add_argument("--service", action="store_true",
                        help="with --long-only: run 'arrowlake maintain' beside the long run "
                             "and print it beside compaction.mode=inline")
    args = parser.parse_args()
    if any("=" not in item for item in args.set):
        parser.error("--set takes NAME=VALUE")
    properties = dict(item.split("=", 1) for item in args.set)
    # Each run measures one mode, named explicitly: merge on read unless --set says otherwise.
    properties.setdefault("deletion-vectors.enabled", "false")
    runs = args.runs
    if args.service:
        if not args.long_only:
            parser.error("--service needs --long-only")
        if properties.get("compaction.mode") != "deferred":
            parser.error("--service measures writers that leave compaction to the service: "
                         "pass --set compaction.mode=deferred")
        results = {}
        for mode, service in (("inline", False), ("deferred", True)):
            root = Path(tempfile.mkdtemp(prefix=f"arrowlake-bench-pk-{mode}-"))
            try:
                results[mode] = long_run(root, args.rows, args.long_upserts, runs,
                                         args.encodings,
                                         {**properties, "compaction.mode": mode}, service)
            finally:
                shutil.rmtree(root, ignore_errors=True)
        print_service(args.rows, args.long_upserts, results["inline"], results["deferred"],
                      properties)
        return
    if args.long_only:
        root = Path(tempfile.mkdtemp(prefix="arrowlake-bench-pk-long-"))
        try:
            long = long_run(root, args.rows, args.long_upserts, runs, args.encodings,
                            properties)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print_long(args.rows, args.long_upserts, long, properties)
        if properties.get("deletion-vectors.enabled") == "true":
            # The same long run on a merge-on-read table, printed beside it.
            mor = {**properties, "deletion-vectors.enabled": "false"}
            root = Path(tempfile.mkdtemp(prefix="arrowlake-bench-pk-long-mor-"))
            try:
                long = long_run(root, args.rows, args.long_upserts, runs, args.encodings, mor)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            print()
            print_long(args.rows, args.long_upserts, long, mor)
        return
    w = Workload.make(args.rows)
    n_live = w.live.num_rows
    root = Path(tempfile.mkdtemp(prefix="arrowlake-bench-pk-"))
    try:
        # -- writes: arrowlake on a fresh table per run, each write right after the raw
        # pyarrow write of the same rows --
        lake_runs: list[ArrowlakeRun] = []
        tables = []
        for i in range(runs):
            result, table = arrowlake_run(root / f"lake-{i}", w, args.encodings, properties)
            lake_runs.append(result)
            tables.append(table)
        table = tables[-1]
        runs_per_bucket = table.files().num_rows / (4 * 4)

        # -- reads before compaction --
        live_file = root / "live.parquet"
        pq.write_table(w.live, live_file, compression="zstd")
        # The same rows in the encodings arrowlake writes: a reference showing what the
        # merge costs over reading files of equal format (no target is judged against it).
        same_file = root / "live-same-encodings.parquet"
        dictionary = dictionary_columns(w.live)
        encodings = column_encodings(w.live.schema, dictionary) \
            if args.encodings == "auto" else None
        pq.write_table(w.live, same_file, compression="zstd", use_dictionary=dictionary,
                       column_encoding=encodings)

        def raw_read() -> pa.Table:
            return ds.dataset(live_file, format="parquet").to_table(use_threads=True)

        def same_read() -> pa.Table:
            return ds.dataset(same_file, format="parquet").to_table(use_threads=True)

        def raw_range() -> pa.Table:
            return ds.dataset(live_file, format="parquet").to_table(
                columns=["id", "price"], filter=(ds.field("id") >= 1000) & (ds.field("id") <= 2000),
                use_threads=True)

        t_read, out, t_raw_read = paired_medians(lambda: table.to_arrow(), raw_read, runs)
        assert out.num_rows == n_live, (out.num_rows, n_live)
        assert same_rows(out, w.live), "merged read differs from the expected live rows"
        t_read_same, _, t_same_read = paired_medians(lambda: table.to_arrow(), same_read, runs)
        t_range, sel, t_raw_range = paired_medians(
            lambda: table.scan(filter=ID_RANGE, columns=["id", "price"]).to_arrow(), raw_range,
            runs)
        assert sel.num_rows == 1001
        t_count, counted = median_time(lambda: table.count(), max(runs, 5))
        assert counted == n_live, (counted, n_live)
        mem_raw = Peak.of(raw_read)
        mem_before = Peak.of(lambda: table.to_arrow())
        del out

        # -- compaction, then the same reads --
        compact_times = []
        for lake_run, t in zip(lake_runs, tables, strict=True):
            start = time.perf_counter()
            t.compact(full=True)
            lake_run.compact = time.perf_counter() - start
            compact_times.append(lake_run.compact)
        t_read_c, out_c, t_raw_read_c = paired_medians(lambda: table.to_arrow(), raw_read, runs)
        assert out_c.num_rows == n_live
        assert same_rows(out_c, w.live), "read after compaction differs from the live rows"
        del out_c
        t_range_c, sel, t_raw_range_c = paired_medians(
            lambda: table.scan(filter=ID_RANGE, columns=["id", "price"]).to_arrow(), raw_range,
            runs)
        assert sel.num_rows == 1001
        mem_after = Peak.of(lambda: table.to_arrow())

        # -- Delta Lake --
        delta: dict[str, float] = {}
        delta_note = ""
        if args.no_deltalake:
            delta_note = "deltalake: skipped (--no-deltalake)"
        else:
            try:
                import deltalake
                from deltalake import DeltaTable
            except ImportError:
                delta_note = "deltalake: not installed, skipped"
            else:
                loads, ups, paths = [], [], []
                for i in range(runs):
                    load, upserts, path = deltalake_upserts(root / f"delta-{i}", w)
                    loads.append(load)
                    ups.append(upserts)
                    paths.append(path)
                delta["load"] = statistics.median(loads)
                delta["upsert"] = statistics.median(statistics.median(u) for u in ups)
                delta["upserts"] = statistics.median(sum(u) for u in ups)
                delta["read"], dout = median_time(
                    lambda: DeltaTable(paths[-1]).to_pyarrow_table(), runs)
                assert dout.num_rows == n_live, (dout.num_rows, n_live)
                delta_note = f"deltalake {deltalake.__version__}"
        tail_run: LongRun | None = long_run(root, args.rows, args.long_upserts, runs,
                                            args.encodings, properties) \
            if args.long_upserts else None
        paimon_note = ("pypaimon: not measured (2.x pins pyarrow<20, pandas<3, polars<2); issue "
                       "reference: 58 s upserts, 57 s full read")
    finally:
        shutil.rmtree(root, ignore_errors=True)

    load = statistics.median(r.load for r in lake_runs)
    upsert_each = statistics.median(statistics.median(r.upserts) for r in lake_runs)
    upsert_total = statistics.median(sum(r.upserts) for r in lake_runs)
    t_raw_load = statistics.median(r.raw_load for r in lake_runs)
    raw_upsert_each = statistics.median(statistics.median(r.raw_upserts) for r in lake_runs)
    raw_upsert_total = statistics.median(sum(r.raw_upserts) for r in lake_runs)
    compact_t = statistics.median(compact_times)

    print(f"rows={args.rows:,} (+{UPSERTS} upserts of {len(w.upserts[0]):,}; "
          f"{n_live:,} live rows)  buckets=4 x 4 partitions  runs={runs}  (medians, seconds)")
    vectors = properties.get("deletion-vectors.enabled") == "true"
    print(f"runs per bucket before compaction: {runs_per_bucket:.1f}; "
          f"write.encodings={args.encodings}; "
          f"{'deletion vectors' if vectors else 'merge on read'}"
          + (f"; set {properties}" if properties else ""))
    # The deletion-vector issue's targets are tighter for the range read and count(); the
    # native core issue's for the first write and an upsert (1.15x each) on such tables.
    range_target = 0.02 if vectors else 0.05
    write_x = 1.15 if vectors else 1.5
    rows = [
        Row("initial load (upsert into empty table)", load, "pq.write_table zstd", t_raw_load,
            *((f"<={write_x}x", load <= write_x * t_raw_load) if vectors else ())),
        Row(f"upsert of {len(w.upserts[0]):,} (each)", upsert_each, "pq.write_table zstd",
            raw_upsert_each, f"<={write_x}x", upsert_each <= write_x * raw_upsert_each),
        Row(f"{UPSERTS} upserts (total)", upsert_total, "pq.write_table zstd",
            raw_upsert_total),
        Row("full read, before compaction", t_read, "pyarrow.dataset live rows",
            t_raw_read, "<=1.5x", t_read <= 1.5 * t_raw_read),
        Row("  (reference: same, vs equal encodings)", t_read_same,
            f"pyarrow.dataset, {args.encodings} encodings", t_same_read),
        Row("ids 1000-2000, 2 cols, before compaction", t_range, "pyarrow.dataset + filter",
            t_raw_range, f"<={range_target} s", t_range <= range_target),
        Row("count(), before compaction", t_count, "-", float("nan"), "<=0.005 s",
            t_count <= 0.005),
        Row("compact(full=True)", compact_t, "-", float("nan")),
        Row("full read, after compaction", t_read_c, "pyarrow.dataset live rows",
            t_raw_read_c, "<=1.1x", t_read_c <= 1.1 * t_raw_read_c),
        Row("ids 1000-2000, 2 cols, after compaction", t_range_c, "pyarrow.dataset + filter",
            t_raw_range_c, "<=0.05 s", t_range_c <= 0.05),
    ]
    print_table("", rows)
    if delta:
        print()
        print_table(delta_note + " (baseline column = Delta Lake)", [
            Row("initial load", load, "write_deltalake", delta["load"]),
            Row("upsert (each)", upsert_each, "merge update_all/insert_all", delta["upsert"]),
            Row(f"{UPSERTS} upserts (total)", upsert_total, "merge update_all/insert_all",
                delta["upserts"]),
            Row("full read, before compaction", t_read, "to_pyarrow_table", delta["read"]),
        ])
    else:
        print(delta_note)
    print(paimon_note)
    print()
    if tail_run is not None:
        print_long(args.rows, args.long_upserts, tail_run, properties)
        print()
    mb = 1 << 20
    print(f"{'peak memory of the full read (MiB)':44} {'arrow':>10} {'rss':>10} "
          f"{'result':>10} {'arrow/res':>9}  target")
    for name, m in (("arrowlake, before compaction", mem_before),
                    ("arrowlake, after compaction", mem_after),
                    ("pyarrow.dataset live rows", mem_raw)):
        ratio = m.arrow / m.result_bytes
        met = ("yes" if ratio <= 2.5 else "NO") if name.startswith("arrowlake") else ""
        print(f"{name:44} {m.arrow / mb:10.0f} {m.rss / mb:10.0f} {m.result_bytes / mb:10.0f} "
              f"{ratio:9.2f}  <=2.5x {met}")


if __name__ == "__main__":
    main()
