"""Writes tests/native/data/buckets_v1.arrow: key values of every key type with the hashes and
buckets the numpy hash (the code every existing lake was written by, now
tests/native/reference.py) gives them. It was run once, as ``python -m tests.native.make_fixture``;
the file is committed and never regenerated: it pins the buckets of existing lakes."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather

from tests.native.reference import bucket_of, key_hash
from tests.native.support import KEY_TYPES, column

FIXTURE = Path(__file__).parent / "data" / "buckets_v1.arrow"
ROWS = 64


def _values(kind: str, rng: np.random.Generator) -> list:
    """ROWS values of ``kind``, about one in eight null, spread over the type's range."""
    ints = rng.integers(-(2**62), 2**62, ROWS)
    small = rng.integers(-1000, 1000, ROWS)
    words = ["", "a", "\x00", "z\x00", "\u00e9t\u00e9", "\u4e2d\u6587", "a" * 12,
             "a long string past twelve bytes", "key-0001", "\U0001f600"]
    text = [words[i % len(words)] + (str(v) if i % 3 else "") for i, v in enumerate(small)]
    values: list = {
        "int64": ints.tolist(), "int32": (ints % 2**31).tolist(), "int8": (small % 128).tolist(),
        "uint64": [int(v) + 2**63 if v > 0 else int(-v) for v in ints],
        "uint16": (small % 2**16).tolist(), "bool": (small % 2 == 0).tolist(),
        "date32": [dt.date(2000, 1, 1) + dt.timedelta(days=int(v)) for v in small],
        "time64": [dt.time(int(v) % 24, int(v) % 60, 0, int(v) % 1000) for v in small + 1000],
        "ts_tz": (ints // 2**20).tolist(), "ts_ns": ints.tolist(), "duration": small.tolist(),
        "decimal": [Decimal(int(v)) / 1000 for v in ints % 10**9],
        "decimal_neg_scale": [Decimal(int(v)) * 100 for v in small],
        "decimal256": [Decimal(int(v)) * 10**20 / 100 for v in ints],
        "string": text, "large_string": text, "string_view": text, "dictionary": text,
        "binary": [t.encode() for t in text], "large_binary": [t.encode() for t in text],
        "binary_view": [t.encode() for t in text],
        "fixed_binary": [int(v).to_bytes(3, "big", signed=True) for v in small],
    }[kind]
    return [None if i % 8 == 5 else v for i, v in enumerate(values)]


def build() -> pa.Table:
    rng = np.random.default_rng(20_240_034)
    table = pa.table({kind: column(kind, _values(kind, rng)) for kind in KEY_TYPES})
    hashes = {f"hash_{kind}": pa.array(key_hash(table, [kind])) for kind in KEY_TYPES}
    composite = ["string", "ts_tz", "decimal", "int32"]
    extra = {
        "bucket_composite_16": bucket_of(table, composite, 16),
        "hash_composite": pa.array(key_hash(table, composite)),
    }
    return pa.Table.from_arrays([*table.columns, *hashes.values(), *extra.values()],
                                names=[*table.column_names, *hashes, *extra])


if __name__ == "__main__":
    FIXTURE.parent.mkdir(exist_ok=True)
    # Arrow IPC keeps every type exactly (Parquet has no negative decimal scales or views).
    feather.write_feather(build(), FIXTURE, compression="uncompressed")
    written = feather.read_table(FIXTURE)
    np.testing.assert_array_equal(written["hash_int64"].to_numpy(),
                                  key_hash(written, ["int64"]))
    print(f"wrote {FIXTURE}: {written.num_rows} rows")
