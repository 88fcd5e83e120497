"""``native.cut_groups`` (hash, bucket and sort in one call, for table/'s cutting of a write)
gives the buckets :func:`bucket_of` gives, and the rows in the order of a plain-Python model:
by group code ``bucket + buckets * partition code``, then by key; none where a key repeats
within a group."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowlake import native
from arrowlake.merge.bucketing import bucket_of
from tests.native.support import composite_kinds, key_columns, row_keys


@settings(max_examples=120, deadline=None)
@given(data=st.data(), kinds=composite_kinds, n=st.integers(1, 40), buckets=st.integers(1, 8),
       partitioned=st.booleans())
def test_cut_groups_equals_bucket_of_and_the_model_order(
        data: st.DataObject, kinds: list[str], n: int, buckets: int, partitioned: bool) -> None:
    keys = data.draw(key_columns(n, kinds, distinct=data.draw(st.integers(2, 40))))
    table = pa.table({f"k{i}": c for i, c in enumerate(keys)})
    key = table.column_names
    partition_codes = None
    sort_key = key
    if partitioned and len(key) > 1:
        # The first key column is the partition column: constant within a group, left out of
        # the sort (as table/ passes `constant=partition_by`).
        encoded = pc.dictionary_encode(table[key[0]].combine_chunks(), null_encoding="encode")
        partition_codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        sort_key = key[1:]
    expected_buckets = bucket_of(table, key, buckets)
    codes = expected_buckets.to_numpy().astype(np.int64)
    if partition_codes is not None:
        codes = codes + buckets * partition_codes
    of_rows, groups = native.cut_groups([table[k] for k in key], [table[k] for k in sort_key],
                                        buckets, partition_codes)
    assert of_rows == expected_buckets
    rows = row_keys(table, sort_key)
    model = sorted(range(n), key=lambda i: (int(codes[i]), rows[i], i))
    if any((codes[a], rows[a]) == (codes[b], rows[b])
           for a, b in pairwise(model)):
        assert groups is None
        return
    assert groups is not None
    order, starts, group_codes = groups
    assert order.tolist() == model
    ordered = codes[order]
    np.testing.assert_array_equal(group_codes, ordered[starts])
    np.testing.assert_array_equal(starts, np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), kinds=composite_kinds, n=st.integers(1, 60), groups=st.integers(1, 9))
def test_counted_and_compared_group_sorts_agree(data: st.DataObject, kinds: list[str], n: int,
                                                groups: int) -> None:
    """Close group codes are counted into their groups, codes far apart (beyond 2**16 and the
    row count) sorted with the keys: the same codes, spread or not, give the same order."""
    keys = data.draw(key_columns(n, kinds, distinct=data.draw(st.integers(2, 60))))
    codes = np.asarray(data.draw(st.lists(st.integers(0, groups - 1), min_size=n, max_size=n)),
                       dtype=np.int64)
    close = native.sorted_groups(keys, codes)
    far = native.sorted_groups(keys, codes * (1 << 40) - (1 << 50))
    if close is None or far is None:
        assert close is None and far is None
        return
    np.testing.assert_array_equal(close[0], far[0])
    np.testing.assert_array_equal(close[1], far[1])
    np.testing.assert_array_equal(close[2] * (1 << 40) - (1 << 50), far[2])
