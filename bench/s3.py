"""Scanning tables on S3 at 0, 20 and 100 ms per request: arrowlake vs pyarrow vs one at a time.

A TCP proxy in front of a local moto S3 server delays the first bytes of every request by a
fixed latency and counts the bytes it moves. Two tables: 64 files of ~8 MiB and 64 small files.
For each latency it prints full and one-column scans with

* arrowlake (concurrent footers + projected column chunks, prefetched),
* ``pyarrow.dataset`` over ``pyarrow.fs.S3FileSystem`` at its defaults,
* the files read one at a time (``pq.read_table`` per file over S3FileSystem),

as medians of ``--runs`` runs, with ratios and bytes moved.

    .venv/bin/python bench/s3.py                       # ~2-4 minutes
    .venv/bin/python bench/s3.py --latencies 20 --runs 3 --big-mib 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

import arrowlake as al
from arrowlake.io import prefetch
from tests.services import start_s3


class DelayProxy:
    """Forwards TCP connections to ``target``; delays each request (a client->server chunk
    after the server has answered or at connection start) by ``delay`` seconds."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.delay = 0.0
        self.bytes_up = 0
        self.bytes_down = 0
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.port = 0

        async def start() -> None:
            server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()

        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(start(), self.loop)
        ready.wait()

    def reset_counts(self) -> None:
        self.bytes_up = self.bytes_down = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        state = {"awaiting_request": True}

        async def client_to_server() -> None:
            while data := await reader.read(1 << 16):
                if state["awaiting_request"] and self.delay:
                    await asyncio.sleep(self.delay)  # one round trip per request
                state["awaiting_request"] = False
                self.bytes_up += len(data)
                up_w.write(data)
                await up_w.drain()
            up_w.close()

        async def server_to_client() -> None:
            while data := await up_r.read(1 << 16):
                state["awaiting_request"] = True
                self.bytes_down += len(data)
                writer.write(data)
                await writer.drain()
            writer.close()

        await asyncio.gather(client_to_server(), server_to_client(), return_exceptions=True)


def make_table(rows: int, seed: int) -> pa.Table:
    import numpy as np

    rng = np.random.default_rng(seed)
    return pa.table({
        "id": pa.array(np.arange(seed * rows, (seed + 1) * rows, dtype=np.int64)),
        "a": pa.array(rng.random(rows)),
        "b": pa.array(rng.integers(0, 1 << 40, rows)),
        "c": pa.array(rng.random(rows)),
        "d": pa.array(rng.integers(0, 1 << 30, rows).astype(np.int32)),
    })


def median_time(fn, runs: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=64)
    ap.add_argument("--big-mib", type=float, default=8.0, help="size of each big file")
    ap.add_argument("--small-rows", type=int, default=1000, help="rows of each small file")
    ap.add_argument("--latencies", default="0,20,100", help="ms per request, comma-separated")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--in-flight", type=int, default=32)
    args = ap.parse_args()
    latencies = [float(x) for x in args.latencies.split(",")]

    s3 = start_s3(threads=32)
    s3.create_bucket("bench")
    proxy = DelayProxy(s3.port)
    endpoint = f"http://127.0.0.1:{proxy.port}"
    opts = {**s3.storage_options(), "endpoint": endpoint, "max_in_flight": args.in_flight}
    import tempfile

    meta = tempfile.mkdtemp(prefix="arrowlake-bench-")
    lake = al.connect(f"sqlite:///{meta}/meta.db", warehouse="s3://bench/lake",
                      storage_options=opts)
    # random values compress to ~26 bytes a row
    big_rows = int(args.big_mib * 2**20 / 26)
    tables = {}
    t0 = time.perf_counter()
    for name, rows in (("big", big_rows), ("small", args.small_rows)):
        schema = make_table(1, 0).schema
        t = lake.create_table(f"bench.{name}", schema, properties={
            "write.row-group-rows": str(max(rows // 2, 1))})
        # one append per file, so each file is one split's worth of rows
        for i in range(args.files):
            t.append(make_table(rows, i))
        tables[name] = t
    write_s = time.perf_counter() - t0
    pafs = s3.pyarrow_filesystem(endpoint_override=f"127.0.0.1:{proxy.port}")
    print(f"moto at {s3.endpoint}, delay proxy at {endpoint}; wrote the tables in "
          f"{write_s:.1f}s (no delay)")
    for name, t in tables.items():
        sizes = t.files().column("file_size").to_pylist()
        print(f"  {name}: {len(sizes)} files, {sum(sizes) / 2**20:.1f} MiB "
              f"(mean {statistics.mean(sizes) / 2**10:.0f} KiB)")

    def paths(t: al.Table) -> list[str]:
        return [p.removeprefix("s3://") for p in t.files().column("path").to_pylist()]

    def run_arrowlake(t: al.Table, cols: list[str] | None) -> int:
        prefetch.FOOTERS.clear()  # cold: every run fetches footers again
        return t.scan(columns=cols).to_arrow().num_rows

    def run_pyarrow(t: al.Table, cols: list[str] | None) -> int:
        d = ds.dataset(paths(t), format="parquet", filesystem=pafs)
        return d.to_table(columns=cols).num_rows

    def run_one_at_a_time(t: al.Table, cols: list[str] | None) -> int:
        return sum(pq.read_table(p, columns=cols, filesystem=pafs).num_rows for p in paths(t))

    readers = {"arrowlake": run_arrowlake, "pyarrow.dataset": run_pyarrow,
               "one at a time": run_one_at_a_time}
    header = (f"{'delay':>6} {'table':>6} {'scan':>8} {'reader':>15} {'median s':>9} "
              f"{'MiB moved':>10} {'vs arrowlake':>13}")
    print()
    print(header)
    print("-" * len(header))
    summary = []
    for delay in latencies:
        proxy.delay = delay / 1000
        for name, t in tables.items():
            for scan, cols in (("full", None), ("1 column", ["c"])):
                results = {}
                for reader, fn in readers.items():
                    expected = t.count()
                    proxy.reset_counts()
                    assert fn(t, cols) == expected
                    moved = proxy.bytes_down + proxy.bytes_up
                    secs = median_time(lambda fn=fn, t=t, cols=cols: fn(t, cols), args.runs)
                    results[reader] = (secs, moved)
                base = results["arrowlake"][0]
                for reader, (secs, moved) in results.items():
                    ratio = "" if reader == "arrowlake" else f"{secs / base:.1f}x slower"
                    print(f"{delay:>4.0f}ms {name:>6} {scan:>8} {reader:>15} {secs:>9.3f} "
                          f"{moved / 2**20:>10.2f} {ratio:>13}")
                summary.append((delay, name, scan, results))
        print()
    print("Targets at 20 ms:")
    for delay, name, scan, results in summary:
        if delay != 20:
            continue
        al_s = results["arrowlake"][0]
        print(f"  {name:>5} {scan:>8}: {results['one at a time'][0] / al_s:5.1f}x faster than "
              f"one at a time, {results['pyarrow.dataset'][0] / al_s:5.1f}x faster than "
              f"pyarrow.dataset")
    for delay, name, scan, results in summary:
        if scan == "1 column":
            full = next(r for d, n, s, r in summary if d == delay and n == name and s == "full")
            print(f"  {delay:>3.0f} ms {name:>5}: one-column scan moves "
                  f"{results['arrowlake'][1] / full['arrowlake'][1]:.0%} of a full scan's bytes")
    lake.close()
    s3.stop()
    os._exit(0)  # the proxy thread and obstore runtime need no orderly shutdown


if __name__ == "__main__":
    main()
