"""The key index kernels (and table/keys/index.py, which calls them) equal the plain oracles of
tests/native/reference.py on the same key images (integers of every width, fixed-width byte
strings): find, search, merge of levels, build, advancing after a commit."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowlake import native
from arrowlake.merge.versions import sortable_key
from arrowlake.table.keys import index as key_index
from tests.native import reference
from tests.native.support import key_columns

DTYPES = [np.int64, np.int32, np.int16, np.int8, np.uint64, np.uint32, np.uint8, "S1", "S5"]


@st.composite
def images(draw: st.DrawFn, dtype: object, max_size: int = 60) -> np.ndarray:
    """A sorted, unique key image."""
    kind = np.dtype(dtype)
    if kind.kind == "S":
        values = draw(st.lists(st.binary(min_size=kind.itemsize, max_size=kind.itemsize),
                               max_size=max_size, unique=True))
        return np.sort(np.array(values, dtype=kind))
    info = np.iinfo(kind)
    values = draw(st.lists(st.integers(int(info.min), int(info.max)) | st.integers(-3, 3).filter(
        lambda v: info.min <= v <= info.max), max_size=max_size, unique=True))
    return np.sort(np.array(values, dtype=kind))


@settings(max_examples=150, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES))
def test_find_and_search_equal_the_reference(data: st.DataObject, dtype: object) -> None:
    base = data.draw(images(dtype))
    recent = np.setdiff1d(data.draw(images(dtype)), base)
    keys = data.draw(images(dtype))
    if len(keys):
        keys = np.concatenate([keys, base[: len(base) // 2]])  # some live in the base
    dead = np.asarray(data.draw(st.lists(st.booleans(), min_size=len(base),
                                         max_size=len(base))), dtype=bool)
    found, at = native.index_find(base, keys)
    expected_found, expected_at = reference.find(base, keys)
    np.testing.assert_array_equal(found, expected_found)
    np.testing.assert_array_equal(at, expected_at)
    index = key_index.KeyIndex(base, np.arange(len(base), dtype=np.int64), dead, recent,
                               np.arange(len(recent), dtype=np.int64), (), frozenset())
    expected_slots, expected_incoming = reference.search(base, dead, recent, keys)
    for slots, incoming in (native.index_search(base, dead, recent, keys), index.search(keys)):
        np.testing.assert_array_equal(slots, expected_slots)
        np.testing.assert_array_equal(incoming, expected_incoming)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES))
def test_merge_of_levels_equals_the_reference(data: st.DataObject, dtype: object) -> None:
    a, b = data.draw(images(dtype)), data.draw(images(dtype))
    if data.draw(st.booleans()):
        b = np.setdiff1d(b, a)  # most merges share no key
    a_loc = np.arange(len(a), dtype=np.int64) + 1000
    b_loc = np.arange(len(b), dtype=np.int64) + 5000
    image, locators = native.index_merge(a, a_loc, b, b_loc)
    expected_image, expected_locators = reference.merge(a, a_loc, b, b_loc)
    if expected_image is None:
        assert image is None and locators is None
        return
    assert image is not None and image.dtype == expected_image.dtype
    np.testing.assert_array_equal(image, expected_image)
    np.testing.assert_array_equal(locators, expected_locators)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES), files=st.integers(1, 4))
def test_build_equals_the_reference(data: st.DataObject, dtype: object, files: int) -> None:
    parts = []
    for i in range(files):
        image = data.draw(images(dtype, 30))
        deleted = None
        if len(image) and data.draw(st.booleans()):
            deleted = np.unique(np.asarray(data.draw(st.lists(
                st.integers(0, len(image) + 2), max_size=5)), dtype=np.uint64))
        parts.append((f"file-{i}", image, deleted))
    built = native.index_build([(image, deleted) for _, image, deleted in parts])
    index = key_index.build(parts, frozenset({("x", files)}))
    expected = reference.build([(image, deleted) for _, image, deleted in parts])
    if expected is None:
        assert built is None and index is None
        return
    assert built is not None and index is not None
    np.testing.assert_array_equal(built[0], expected[0])
    np.testing.assert_array_equal(built[1], expected[1])
    assert built[0].dtype == expected[0].dtype == np.dtype(dtype)
    np.testing.assert_array_equal(index.base, expected[0])
    np.testing.assert_array_equal(index.base_locators, expected[1])
    assert not index.dead.any() and len(index.dead) == len(index.base)
    assert len(index.recent) == len(index.recent_locators) == 0
    assert index.files == tuple(p for p, _, _ in parts)
    assert index.state == frozenset({("x", files)})


def test_build_refuses_mixed_dtypes_and_no_parts() -> None:
    one = np.array([1, 2], dtype=np.int64)
    assert key_index.build([("a", one, None), ("b", np.array([3], np.int32), None)],
                           frozenset()) is None
    assert key_index.build([], frozenset()) is None
    assert reference.build([(one, None), (np.array([3], np.int32), None)]) is None
    built = key_index.build_many([([("a", one, None)], frozenset()), ([], frozenset()),
                                  ([("a", one, None), ("b", one, None)], frozenset())])
    assert built[0] is not None and built[1] is None and built[2] is None


@settings(max_examples=120, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES), buckets=st.integers(1, 4))
def test_advancing_many_buckets_equals_the_reference(data: st.DataObject, dtype: object,
                                                     buckets: int) -> None:
    """Buckets advanced in one native call equal each advanced by the reference: rows marked
    deleted, written files merged in (keys rewritten, new, or still live: then None; images
    of another dtype: None), and the recent level merged into the base once it passes a
    quarter of it."""
    steps = []
    for _ in range(buckets):
        keys = data.draw(images(dtype, 40))
        cut = data.draw(st.integers(0, len(keys)))
        base, recent = keys[:cut], keys[cut:]
        index = key_index.KeyIndex(
            base, np.arange(len(base), dtype=np.int64) + 7, np.zeros(len(base), dtype=bool),
            recent, np.arange(len(recent), dtype=np.int64) + 900, ("a.parquet", "b.parquet"),
            frozenset())
        slots = np.arange(len(keys), dtype=np.int64)
        removed = np.unique(np.asarray(data.draw(st.lists(st.sampled_from(slots), max_size=8))
                                       if len(slots) else [], dtype=np.int64))
        added = []
        for f in range(data.draw(st.integers(0, 2))):
            written = data.draw(images(dtype, 20))
            if data.draw(st.booleans()):  # usually what was removed and some new keys
                written = np.union1d(keys[removed], np.setdiff1d(written, keys))
            if data.draw(st.integers(0, 15)) == 0:  # rarely, an image of another dtype
                other = np.int32 if np.dtype(dtype) == np.int64 else np.int64
                written = np.arange(len(written), dtype=other)
            added.append((f"new-{f}.parquet", written))
        steps.append((index, removed, added, frozenset({("x", len(added))})))
    got = key_index.advance_many(steps)
    assert len(got) == buckets
    for mine, (index, removed, added, state) in zip(got, steps, strict=True):
        levels = (index.base, index.base_locators, index.dead, index.recent,
                  index.recent_locators)
        expected = reference.advance(levels, len(index.files), removed,
                                     [image for _, image in added], key_index.RECENT_SHARE)
        if expected is None:
            assert mine is None
            continue
        assert mine is not None
        for level, want in zip(("base", "base_locators", "dead", "recent", "recent_locators"),
                               expected, strict=True):
            np.testing.assert_array_equal(getattr(mine, level), want)
        assert mine.base.dtype == mine.recent.dtype == np.dtype(dtype)
        assert mine.files == (*index.files, *(path for path, _ in added))
        assert mine.state == state


@pytest.mark.parametrize("dtype", [np.int64, np.uint32, "S7"])
def test_a_recent_level_past_its_share_joins_the_base(dtype: object) -> None:
    """Past a quarter of the base (and of 4096 entries), the recent level and the base's live
    entries become one new base, as in the reference."""
    rng = np.random.default_rng(3)
    values = rng.choice(1 << 30, 6000, replace=False)
    keys = (np.array([v.to_bytes(7, "big") for v in values.tolist()], dtype="S7")
            if dtype == "S7" else values.astype(dtype))
    keys = np.sort(keys)
    pick = rng.permutation(len(keys))
    base, recent, new = (np.sort(keys[pick[:4000]]), np.sort(keys[pick[4000:4500]]),
                         keys[pick[4500:]])
    index = key_index.KeyIndex(base, np.arange(len(base), dtype=np.int64),
                               np.zeros(len(base), dtype=bool), recent,
                               np.arange(len(recent), dtype=np.int64) + (1 << 40),
                               ("a.parquet", "b.parquet"), frozenset())
    removed = np.sort(rng.choice(len(base) + len(recent), 300, replace=False)).astype(np.int64)
    rewritten = np.concatenate([base, recent])[removed]
    step = (index, removed, [("c.parquet", np.sort(np.concatenate([new, rewritten])))],
            frozenset({("c.parquet", 0)}))
    got = key_index.advance_many([step])[0]
    expected = reference.advance((index.base, index.base_locators, index.dead, index.recent,
                                  index.recent_locators), len(index.files), removed,
                                 [step[2][0][1]], key_index.RECENT_SHARE)
    assert got is not None and expected is not None
    assert len(got.recent) == 0 and len(got.base) == len(keys)  # every key, once
    for level, want in zip(("base", "base_locators", "dead", "recent", "recent_locators"),
                           expected, strict=True):
        np.testing.assert_array_equal(getattr(got, level), want)
    assert got.files == ("a.parquet", "b.parquet", "c.parquet")


@settings(max_examples=60, deadline=None)
@given(data=st.data(), kinds=st.lists(st.sampled_from(["int64", "int32", "uint64", "bool",
                                                        "date32", "ts_tz", "fixed_binary"]),
                                       min_size=1, max_size=3))
def test_images_of_real_keys(data: st.DataObject, kinds: list[str]) -> None:
    # The images sortable_key gives (composite keys as big-endian bytes) search alike.
    columns = data.draw(key_columns(40, kinds))
    table = pa.table({f"k{i}": c for i, c in enumerate(columns)})
    image = sortable_key(table, table.column_names)
    assert image is not None
    level = np.unique(image)
    found, at = native.index_find(level, image)
    expected_found, expected_at = reference.find(level, image)
    np.testing.assert_array_equal(found, expected_found)
    np.testing.assert_array_equal(at, expected_at)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES), buckets=st.integers(0, 5))
def test_many_buckets_searched_at_once(data: st.DataObject, dtype: object, buckets: int) -> None:
    given_buckets = []
    for _ in range(buckets):
        base = data.draw(images(dtype))
        recent = np.setdiff1d(data.draw(images(dtype)), base)
        dead = np.asarray(data.draw(st.lists(st.booleans(), min_size=len(base),
                                             max_size=len(base))), dtype=bool)
        keys = np.concatenate([data.draw(images(dtype)), recent[:3], base[:3]])
        given_buckets.append((base, dead, recent, keys))
    together = native.index_search_many(given_buckets)
    assert len(together) == buckets
    for (slots, incoming), bucket in zip(together, given_buckets, strict=True):
        alone = native.index_search(*bucket)
        np.testing.assert_array_equal(slots, alone[0])
        np.testing.assert_array_equal(incoming, alone[1])


@pytest.mark.parametrize("dtype", [np.int64, np.uint64, np.int32, "S12"])
@pytest.mark.parametrize("shape", ["ascending", "runs", "shuffled"])
def test_find_of_many_keys_equals_searchsorted(dtype: object, shape: str) -> None:
    # Keys past one task's share (they are searched in parallel), ascending (each search
    # gallops from the last answer), in ascending runs that restart, or in no order at all.
    rng = np.random.default_rng(7)
    raw = rng.choice(1 << 30, 300_000, replace=False)
    kind = np.dtype(dtype)
    values = (np.array([int(v).to_bytes(12, "big") for v in raw], dtype=kind)
              if kind.kind == "S" else raw.astype(kind))
    level = np.sort(values[:200_000])
    keys = np.concatenate([values[150_000:], level[::7]])  # found and missing keys
    if shape == "ascending":
        keys = np.sort(keys)
    elif shape == "runs":
        keys = np.concatenate([np.sort(part) for part in np.array_split(keys, 9)])
    else:
        rng.shuffle(keys)
    found, at = native.index_find(level, keys)
    expected_at = np.searchsorted(level, keys)
    np.testing.assert_array_equal(at, expected_at)
    inside = expected_at < len(level)
    expected_found = np.zeros(len(keys), dtype=bool)
    expected_found[inside] = level[expected_at[inside]] == keys[inside]
    np.testing.assert_array_equal(found, expected_found)
    assert 0 < expected_found.sum() < len(keys)
