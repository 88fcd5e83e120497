"""Overwrites of primary-key tables forget what they replace, in both modes: the rows, and the
deletes remembered for a sequence field (merge-on-read keeps them as retractions in the runs
an overwrite removes; deletion vectors keep them as tombstone files)."""

from __future__ import annotations

import pyarrow as pa
import pytest

import arrowlake as al

SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), ("p", pa.string()),
                    ("ts", pa.int64())])


@pytest.mark.parametrize("vectors", [False, True], ids=["merge-on-read", "deletion-vectors"])
def test_an_overwrite_forgets_the_deletes_of_what_it_replaces(tmp_path, vectors):
    lake = al.connect(tmp_path / "lake")
    t = lake.create_table("s.t", SCHEMA, primary_key=["k", "p"], partition_by=["p"],
                          buckets=1, sequence_field="ts", deletion_vectors=vectors)
    t.upsert({"k": [1, 2], "p": ["a", "b"], "ts": [5, 5]})
    t.write_changes({"k": [1, 2], "p": ["a", "b"], "ts": [9, 9], "op": ["-D", "-D"]})
    t.upsert({"k": [1, 2], "p": ["a", "b"], "ts": [7, 7]})  # older than the deletes: dropped
    assert t.count() == 0
    t.overwrite(t.schema.empty_table(), "p = 'a'")
    t.upsert({"k": [1, 2], "p": ["a", "b"], "ts": [7, 7]})
    # Partition a was replaced, its delete with it; partition b still remembers its delete.
    assert t.to_arrow().to_pylist() == [{"k": 1, "p": "a", "ts": 7}]
    assert t.count() == 1
    lake.close()
