"""Statistics pruning: which files may hold matching rows, and which hold nothing else.

Both functions take a statistics table with one row per data file:

- ``row_count`` (int64),
- for each column ``c`` with statistics: ``min.c`` and ``max.c`` (typed like the column, null
  when unknown) and ``nulls.c`` (int64, null when unknown).

and answer with one boolean per file, vectorized over files with Arrow compute.

:func:`may_match` is false only where the file certainly has no matching row, so skipping those
files never changes a result. :func:`all_match` is true only where every row of the file
certainly matches, so those files can be counted from metadata or deleted whole. Anything
unknown (missing columns, null statistics) answers "may match" and "not all match".

The same functions prune partitions: a table of partition values with ``min == max == value``
and ``nulls`` 0 or ``row_count`` makes both answers exact.

Two facts shape the rules:

- Min/max statistics skip NaN, and NaN fails every comparison but ``!=`` (``IN`` is a
  disjunction of ``=``), so it satisfies ``!=`` and negated predicates like ``NOT (x < v)``.
  Float columns carry ``nans.c``, the NaN count: a file with NaN may match a predicate NaN
  satisfies, and every row matches only if the NaN rows do too. Where ``nans.c`` is unknown
  (statistics from before it was counted) the file may hold NaN. Bounds compare as Arrow
  compares values, so ``-0.0`` and ``0.0`` are equal bounds.
- Under SQL's three-valued logic a predicate on a null value is null, so a value predicate needs
  at least one non-null value to match (``nulls < row_count``) and no nulls to match everywhere
  (``nulls == 0``). ``NOT`` is pushed down to the leaves at binding; a negated leaf ``NOT p``
  may match where not all non-null values satisfy ``p``, and matches everywhere where ``p``
  matches nowhere and there are no nulls.
"""

from __future__ import annotations

from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.errors import ValidationError
from arrowlake.expressions.binding import (
    BoundAnd,
    BoundColumn,
    BoundColumnCompare,
    BoundCompare,
    BoundConst,
    BoundExpr,
    BoundIn,
    BoundIsNull,
    BoundOr,
    BoundStartsWith,
    bind,
    is_floating,
    value_type,
)
from arrowlake.expressions.parser import to_expression
from arrowlake.expressions.tree import Expr

#: Above this many values, ``IN`` is pruned with the range of the values instead of per value.
IN_LIST_PER_VALUE_LIMIT = 32

# A pair of per-file answers: (may match, all match). Neither array has nulls.
_Answer = tuple[pa.BooleanArray, pa.BooleanArray]


def may_match(expr: Expr | str | None, stats: pa.Table, schema: pa.Schema) -> pa.BooleanArray:
    """Per file: false where no row of the file can match the filter, true elsewhere.

    >>> import pyarrow as pa
    >>> stats = pa.table({"row_count": [10, 10], "min.x": [0, 50], "max.x": [40, 90],
    ...                   "nulls.x": [0, 2]})
    >>> may_match("x > 45", stats, pa.schema({"x": pa.int64()})).to_pylist()
    [False, True]
    """
    return _FileStats(stats).evaluate(bind(to_expression(expr), schema))[0]


def all_match(expr: Expr | str | None, stats: pa.Table, schema: pa.Schema) -> pa.BooleanArray:
    """Per file: true where every row of the file certainly matches the filter.

    >>> import pyarrow as pa
    >>> stats = pa.table({"row_count": [10, 10], "min.x": [0, 50], "max.x": [40, 90],
    ...                   "nulls.x": [0, 2]})
    >>> all_match("x < 45", stats, pa.schema({"x": pa.int64()})).to_pylist()
    [True, False]
    """
    return _FileStats(stats).evaluate(bind(to_expression(expr), schema))[1]


def _known(condition: pa.Array | None, n: int, default: bool) -> pa.BooleanArray:
    """A condition with unknown (null) entries replaced by ``default``."""
    if condition is None:
        return _full(n, default)
    filled: pa.BooleanArray = pc.fill_null(condition, default)
    return filled


def _full(n: int, value: bool) -> pa.BooleanArray:
    full: pa.BooleanArray = pa.repeat(pa.scalar(value), n)
    return full


class _FileStats:
    def __init__(self, stats: pa.Table) -> None:
        if not isinstance(stats, pa.Table):
            raise ValidationError(f"Statistics must be a pyarrow Table, got {type(stats).__name__}")
        self.table = stats
        self.n = stats.num_rows
        # Long filters read the same statistics columns once per leaf: read each once.
        self._columns: dict[tuple[str, pa.DataType], pa.Array] = {}
        self._derived: dict[tuple[str, str, bool], _Answer] = {}
        self.row_count = self._raw("row_count", pa.int64())

    def _raw(self, name: str, t: pa.DataType) -> pa.Array:
        key = (name, t)
        values = self._columns.get(key)
        if values is None:
            values = self._columns[key] = self._read(name, t)
        return values

    def _read(self, name: str, t: pa.DataType) -> pa.Array:
        if name not in self.table.column_names:
            return pa.nulls(self.n, t)
        chunked = self.table.column(name)
        values = chunked.combine_chunks() if chunked.num_chunks else pa.nulls(self.n, t)
        if values.type != t:
            try:
                values = pc.cast(values, t)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                return pa.nulls(self.n, t)  # statistics we cannot read are unknown
        return values

    def bounds(self, column: BoundColumn, t: pa.DataType) -> tuple[pa.Array, pa.Array]:
        """min and max of ``column`` as ``t``; NaN bounds of float columns count as unknown."""
        lo, hi = self._raw(f"min.{column.name}", t), self._raw(f"max.{column.name}", t)
        if is_floating(t):
            lo = pc.if_else(pc.is_nan(lo), pa.scalar(None, t), lo)
            hi = pc.if_else(pc.is_nan(hi), pa.scalar(None, t), hi)
        return lo, hi

    def nan_counts(self, column: BoundColumn) -> tuple[pa.BooleanArray, pa.BooleanArray]:
        """(the file may hold NaN, the file certainly holds no NaN) of a float column."""
        key = ("nans", column.name, is_floating(value_type(column.type)))
        answer = self._derived.get(key)
        if answer is None:
            if not key[2]:
                answer = _full(self.n, False), _full(self.n, True)
            else:
                nans = self._raw(f"nans.{column.name}", pa.int64())
                answer = (_known(pc.greater(nans, 0), self.n, True),
                          _known(pc.equal(nans, 0), self.n, False))
            self._derived[key] = answer
        return answer

    def null_counts(self, column: BoundColumn) -> tuple[pa.BooleanArray, pa.BooleanArray]:
        """(the file may have a non-null value, the file certainly has no null)."""
        key = ("nulls", column.name, True)
        answer = self._derived.get(key)
        if answer is None:
            nulls = self._raw(f"nulls.{column.name}", pa.int64())
            some_values = _known(pc.less(nulls, self.row_count), self.n, True)
            no_nulls = _known(pc.equal(nulls, 0), self.n, False)
            answer = self._derived[key] = some_values, no_nulls
        return answer

    # -- the visitor --------------------------------------------------------------------------

    def evaluate(self, bound: BoundExpr) -> _Answer:
        may, every = self.visit(bound)
        # An empty file matches nothing, and vacuously all of its rows match.
        empty = _known(pc.equal(self.row_count, 0), self.n, False)
        return pc.and_(may, pc.invert(empty)), pc.or_(every, empty)

    def visit(self, node: BoundExpr) -> _Answer:
        if isinstance(node, BoundConst):
            return _full(self.n, node.value), _full(self.n, node.value)
        if isinstance(node, (BoundAnd, BoundOr)):
            combine = pc.and_ if isinstance(node, BoundAnd) else pc.or_
            answers = [self.visit(child) for child in node.children]
            # all_match of an OR is the OR of the sides' all_match: sound, if not complete.
            return (
                reduce(combine, (may for may, _ in answers)),
                reduce(combine, (every for _, every in answers)),
            )
        if isinstance(node, BoundIsNull):
            nulls = self._raw(f"nulls.{node.column.name}", pa.int64())
            has_null = pc.greater(nulls, 0)
            all_null = pc.equal(nulls, self.row_count)
            if node.negated:  # IS NOT NULL
                return (
                    _known(pc.invert(all_null), self.n, True),
                    _known(pc.equal(nulls, 0), self.n, False),
                )
            return _known(has_null, self.n, True), _known(all_null, self.n, False)
        if isinstance(node, BoundColumnCompare):
            left_values, _ = self.null_counts(node.left)
            right_values, _ = self.null_counts(node.right)
            return pc.and_(left_values, right_values), _full(self.n, False)
        if isinstance(node, BoundIn) and node.negated and node.has_null:
            # x NOT IN (..., NULL) is never true: a match makes it false, a miss makes it null.
            return _full(self.n, False), _full(self.n, False)

        if isinstance(node, BoundCompare):
            may, every_value = self.compare(node)
        elif isinstance(node, BoundIn):
            may, every_value = self.in_list(node)
        elif isinstance(node, BoundStartsWith):
            may, every_value = self.starts_with(node)
        else:
            raise TypeError(f"Unknown bound node {node!r}")
        # may/every_value speak of the non-null, non-NaN values (bounds skip NaN); NaN rows
        # satisfy the leaf when NaN satisfies p (only !=) xor the leaf is negated.
        some_values, no_nulls = self.null_counts(node.column)
        has_nan, no_nan = self.nan_counts(node.column)
        may_known = pc.and_(_known(may, self.n, True), some_values)
        every_value_known = _known(every_value, self.n, False)
        nan_satisfies = (isinstance(node, BoundCompare) and node.op == "!=") != node.negated
        if node.negated:  # NOT p is true only on non-null rows where p is false.
            may_known, every_value_known = (pc.and_(pc.invert(every_value_known), some_values),
                                            pc.invert(may_known))
        if nan_satisfies:
            return pc.or_(may_known, has_nan), pc.and_(every_value_known, no_nulls)
        return may_known, pc.and_(pc.and_(every_value_known, no_nulls), no_nan)

    # Value leaves answer (may match, every non-null value matches), either possibly null
    # (unknown) or None (unknown everywhere).

    def compare(self, node: BoundCompare) -> tuple[pa.Array | None, pa.Array | None]:
        t = node.column.compare_type
        lo, hi = self.bounds(node.column, t)
        v = node.value
        op = node.op
        may: pa.Array | None
        if op == "=":
            may = pc.and_kleene(pc.less_equal(lo, v), pc.greater_equal(hi, v))
        elif op == "!=":
            may = pc.invert(pc.and_kleene(pc.equal(lo, v), pc.equal(hi, v)))
        elif op == "<":
            may = pc.less(lo, v)
        elif op == "<=":
            may = pc.less_equal(lo, v)
        elif op == ">":
            may = pc.greater(hi, v)
        else:
            may = pc.greater_equal(hi, v)
        if op == "=":
            every = pc.and_kleene(pc.equal(lo, v), pc.equal(hi, v))
        elif op == "!=":
            every = pc.or_kleene(pc.less(hi, v), pc.greater(lo, v))
        elif op == "<":
            every = pc.less(hi, v)
        elif op == "<=":
            every = pc.less_equal(hi, v)
        elif op == ">":
            every = pc.greater(lo, v)
        else:
            every = pc.greater_equal(lo, v)
        return may, every

    def in_list(self, node: BoundIn) -> tuple[pa.Array | None, pa.Array | None]:
        t = node.column.compare_type
        lo, hi = self.bounds(node.column, t)
        values = node.values  # no NaN (binding drops it: NaN equals nothing)
        may: pa.Array
        if len(values) <= IN_LIST_PER_VALUE_LIMIT:
            may = reduce(
                pc.or_kleene,
                (pc.and_kleene(pc.less_equal(lo, v), pc.greater_equal(hi, v)) for v in values),
            )
        else:
            extremes = pc.min_max(values)
            may = pc.and_kleene(
                pc.less_equal(lo, extremes["max"]), pc.greater_equal(hi, extremes["min"])
            )
        # Every value is in the list when the file holds a single value that is in it; for
        # floats, a single value as = sees it (-0.0 and 0.0 are one, in bounds and in the list).
        if is_floating(t):
            lo = pc.add(lo, pa.scalar(0.0, t))
        every = pc.and_kleene(pc.equal(lo, hi), pc.is_in(lo, value_set=values, skip_nulls=True))
        return may, every

    def starts_with(self, node: BoundStartsWith) -> tuple[pa.Array | None, pa.Array | None]:
        prefix = node.prefix
        if not prefix:
            return _full(self.n, True), _full(self.n, True)
        t = node.column.compare_type
        lo, hi = self.bounds(node.column, t)
        p = pa.scalar(prefix, t)
        # Strings starting with p lie in [p, next string after all p-prefixed ones); the file's
        # range [lo, hi] meets that interval iff hi >= p and lo's first len(p) characters
        # are <= p (UTF-8 byte order is code point order, so characters slice safely).
        lo_head = pc.utf8_slice_codeunits(lo, 0, len(prefix))
        hi_head = pc.utf8_slice_codeunits(hi, 0, len(prefix))
        may = pc.and_kleene(pc.greater_equal(hi, p), pc.less_equal(lo_head, p))
        every = pc.and_kleene(pc.equal(lo_head, p), pc.equal(hi_head, p))
        return may, every
