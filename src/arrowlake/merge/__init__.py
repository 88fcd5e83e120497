"""Merging the versions of primary keys: the vectorized kernel behind merge-on-read and compaction.

>>> import pyarrow as pa
>>> from arrowlake.merge import Deduplicate
>>> runs = pa.table({"id": [1, 2, 1], "v": ["old", "x", "new"],
...                  "_row_kind": pa.array([0, 0, 2], pa.int8()), "_seq": [1, 2, 3]})
>>> Deduplicate().merge(runs, ["id"]).to_pydict()
{'id': [1, 2], 'v': ['new', 'x'], '_row_kind': [2, 0], '_seq': [3, 2]}
"""

from arrowlake.merge.aggregation import (
    FUNCTIONS as AGGREGATE_FUNCTIONS,
)
from arrowlake.merge.aggregation import (
    RETRACTABLE as RETRACTABLE_FUNCTIONS,
)
from arrowlake.merge.aggregation import validate_aggregations
from arrowlake.merge.engines import (
    ENGINES,
    Aggregation,
    Deduplicate,
    FirstRow,
    MergeEngine,
    PartialUpdate,
    dedupe_within_write,
    engine_from_options,
)
from arrowlake.merge.versions import (
    ROW_KIND,
    SEQUENCE,
    KeyVersions,
    RowKind,
    group_versions,
    sort_by_key,
)

__all__ = [
    "AGGREGATE_FUNCTIONS",
    "ENGINES",
    "RETRACTABLE_FUNCTIONS",
    "ROW_KIND",
    "SEQUENCE",
    "Aggregation",
    "Deduplicate",
    "FirstRow",
    "KeyVersions",
    "MergeEngine",
    "PartialUpdate",
    "RowKind",
    "dedupe_within_write",
    "engine_from_options",
    "group_versions",
    "sort_by_key",
    "validate_aggregations",
]
