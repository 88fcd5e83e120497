"""The per-bucket index of live keys a merge-on-write process keeps between its writes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import arrowlake as al
from arrowlake.table.keys import index as key_index
from arrowlake.table.keys.index import build


def _live(index: key_index.KeyIndex) -> dict[int, tuple[int, int]]:
    """key -> (file number, position) of every live entry, from both levels."""
    keys = np.concatenate([index.base[~index.dead], index.recent])
    slots = np.concatenate([np.flatnonzero(~index.dead),
                            len(index.base) + np.arange(len(index.recent))])
    files, positions = index.where(slots.astype(np.int64))
    return dict(zip(keys.tolist(), zip(files.tolist(), positions.tolist(), strict=True),
                    strict=True))


def test_build_drops_deleted_positions_and_finds_each_live_key() -> None:
    first = np.array([1, 3, 5, 7], dtype=np.int64)
    second = np.array([2, 3, 8], dtype=np.int64)
    # Key 3 was replaced: its row in the first file (position 1) is deleted.
    index = build([("a", first, np.array([1], dtype=np.uint64)), ("b", second, None)],
                  frozenset())
    assert index is not None
    assert _live(index) == {1: (0, 0), 2: (1, 0), 3: (1, 1), 5: (0, 2), 7: (0, 3), 8: (1, 2)}
    slots, incoming = index.search(np.array([0, 3, 4, 8], dtype=np.int64))
    assert incoming.tolist() == [1, 3]
    files, positions = index.where(slots)
    assert files.tolist() == [1, 1] and positions.tolist() == [1, 2]


def test_a_key_live_in_two_files_gives_no_index() -> None:
    both = np.array([1, 2], dtype=np.int64)
    assert build([("a", both, None), ("b", both, None)], frozenset()) is None


def test_advancing_matches_a_rebuild_through_many_writes_and_merges() -> None:
    rng = np.random.default_rng(3)
    files = {"f0": np.arange(0, 20_000, 2, dtype=np.int64)}
    deleted: dict[str, set[int]] = {"f0": set()}
    index = build([("f0", files["f0"], None)], frozenset())
    assert index is not None
    folded = False
    for write in range(1, 30):
        live = _live(index)
        old = rng.choice(np.array(sorted(live), dtype=np.int64), 700, replace=False)
        new = np.arange(100_000 + write * 1000, 100_000 + write * 1000 + 300, dtype=np.int64)
        written = np.sort(np.concatenate([old, new]))
        slots, incoming = index.search(written)
        assert sorted(written[incoming].tolist()) == sorted(old.tolist())
        numbers, positions = index.where(slots)
        names = index.files
        for number, position in zip(numbers.tolist(), positions.tolist(), strict=True):
            deleted[names[number]].add(position)
        path = f"f{write}"
        files[path], deleted[path] = written, set()
        index = index.advanced(slots, [(path, written)], frozenset())
        assert index is not None
        folded |= len(index.recent) == 0
        rebuilt = build([(p, image, np.array(sorted(deleted[p]), dtype=np.uint64))
                         for p, image in files.items()], frozenset())
        assert rebuilt is not None
        mine = {k: (index.files[f], p) for k, (f, p) in _live(index).items()}
        theirs = {k: (rebuilt.files[f], p) for k, (f, p) in _live(rebuilt).items()}
        assert mine == theirs
    assert folded, "the recent level never merged into the base"


def test_advancing_refuses_a_written_key_still_live() -> None:
    index = build([("a", np.array([1, 2, 3], dtype=np.int64), None)], frozenset())
    assert index is not None
    # Key 2 written again without its live row being removed: not an index any more.
    assert index.advanced(np.zeros(0, dtype=np.int64),
                          [("b", np.array([2], dtype=np.int64))], frozenset()) is None


@pytest.mark.parametrize("engine", ["deduplicate", "partial-update"])
def test_a_second_writer_invalidates_the_first_ones_index(tmp_path, engine: str) -> None:
    """Two handles of one table (as two processes would be): each one's commits change the
    bucket under the other's cached index, which must then be rebuilt, not trusted."""
    schema = pa.schema([("id", pa.int64()), ("v", pa.int64())])
    lake = al.connect(str(tmp_path))
    first = lake.create_table("t", schema, primary_key=["id"], buckets=2,
                              deletion_vectors=True, merge_engine=engine)
    second = al.connect(str(tmp_path)).table("t")
    expected: dict[int, int] = {}
    rng = np.random.default_rng(5)
    for step in range(12):
        ids = rng.choice(200, 40, replace=False)
        values = rng.integers(0, 1000, 40)
        (first if step % 3 else second).upsert(pa.table({"id": ids, "v": values}))
        expected.update(zip(ids.tolist(), values.tolist(), strict=True))
        for reader in (first, second):
            got = reader.to_arrow().sort_by("id")
            assert dict(zip(got["id"].to_pylist(), got["v"].to_pylist(), strict=True)) \
                == expected
            assert reader.count() == len(expected)
