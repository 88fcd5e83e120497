"""Reading published Iceberg metadata with pyiceberg and DuckDB in their own environment,
compared row for row with arrowlake's own scan."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyarrow import ipc

CLIENT_SCRIPT = Path(__file__).with_name("client_read.py")
ENGINES = ("pyiceberg", "duckdb")


@dataclass
class Read:
    engine: str  # pyiceberg, duckdb, or manifests (the manifests of each snapshot, as JSON)
    metadata: str
    snapshot_id: int | None = None
    timestamp_ms: int | None = None
    ref: str | None = None
    sql: str | None = None  # DuckDB: a WHERE clause
    pyiceberg_filter: str | None = None


class ClientError(Exception):
    pass


def read_all(python: Path, reads: Sequence[Read], tmp_path: Path,
             storage: dict[str, str] | None = None,
             duckdb: Sequence[str] = ()) -> list[Any]:
    """Run ``reads`` in one process of the clients' environment: a table per read (a dict for
    ``manifests``), or the :class:`ClientError` it raised. ``storage``: pyiceberg's file IO
    properties; ``duckdb``: statements DuckDB runs first."""
    folder = tmp_path / f"reads-{len(list(tmp_path.glob('reads-*')))}"
    folder.mkdir()
    requests = [{**asdict(r), "out": str(folder / f"{i}.out")} for i, r in enumerate(reads)]
    spec = folder / "requests.json"
    spec.write_text(json.dumps({"requests": requests, "storage": storage or {},
                                "duckdb": list(duckdb)}))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(python), str(CLIENT_SCRIPT), str(spec)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    out: list[Any] = []
    for request in requests:
        path = Path(request["out"])
        error = Path(str(path) + ".error")
        if error.exists():
            out.append(ClientError(json.loads(error.read_text())["error"]))
        elif request["engine"] == "manifests":
            out.append(json.loads(path.read_text()))
        else:
            with ipc.open_file(str(path)) as f:
                out.append(f.read_all())
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal values, NaN equal to NaN (and never to null), nested values compared inside."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b) and (a is None) == (b is None)


def _values(column: pa.ChunkedArray, typ: pa.DataType) -> list[Any]:
    if column.type != typ:
        # Nested types whose children are named otherwise are compared as values.
        with contextlib.suppress(pa.ArrowInvalid, pa.ArrowNotImplementedError):
            column = column.cast(typ)
    return column.to_pylist()


def assert_same_rows(expected: pa.Table, got: Any, keys: Sequence[str], what: str = "") -> None:
    """``got`` (a client's read) holds exactly ``expected``'s rows: same columns, same count,
    and after sorting both by ``keys`` the same value in every cell (nulls and NaNs told
    apart)."""
    if isinstance(got, Exception):
        raise AssertionError(f"{what}: the client failed: {got}")
    assert sorted(got.column_names) == sorted(expected.column_names), what
    assert got.num_rows == expected.num_rows, f"{what}: {got.num_rows} != {expected.num_rows}"
    order = [(k, "ascending") for k in keys]
    expected = expected.sort_by(order)
    got = got.select(expected.column_names).sort_by(order)
    for name in expected.column_names:
        want = expected.column(name).to_pylist()
        have = _values(got.column(name), expected.schema.field(name).type)
        bad = [i for i, (x, y) in enumerate(zip(want, have, strict=True)) if not _same(x, y)]
        assert not bad, (f"{what}: column {name} differs in {len(bad)} rows, first at "
                         f"{bad[0]}: {want[bad[0]]!r} != {have[bad[0]]!r}")
