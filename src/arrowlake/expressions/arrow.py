"""Filters as Arrow compute: a ``pyarrow.compute.Expression`` for scans, a mask for writers.

Both walk the same bound tree with the same kernels; they differ only in how a column is read
(``pc.field`` or the data's own array). SQL semantics throughout: a comparison with a null is
null, AND/OR are Kleene logic, and a null result filters the row out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

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
)
from arrowlake.expressions.parser import to_expression
from arrowlake.expressions.tree import Expr

COMPARE_KERNELS: dict[str, Callable[..., Any]] = {
    "=": pc.equal,
    "!=": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}


def _convert(
    bound: BoundExpr,
    column: Callable[[BoundColumn], Any],
    const: Callable[[bool], Any],
    expression: bool = False,
) -> Any:
    """Apply the kernels of ``bound`` to columns obtained from ``column``; the kernels accept
    expressions and arrays alike, which is what keeps scans and masks in agreement."""

    def visit(node: BoundExpr) -> Any:
        if isinstance(node, BoundConst):
            return const(node.value)
        if isinstance(node, BoundAnd):
            return _junction(pc.and_kleene, [visit(c) for c in node.children], expression)
        if isinstance(node, BoundOr):
            return _junction(pc.or_kleene, [visit(c) for c in node.children], expression)
        if isinstance(node, BoundCompare):
            result = COMPARE_KERNELS[node.op](column(node.column), node.value)
        elif isinstance(node, BoundColumnCompare):
            result = COMPARE_KERNELS[node.op](column(node.left), column(node.right))
        elif isinstance(node, BoundIn):
            # SQL makes ``x IN (...)`` null for a null x, and a miss null when the list holds
            # NULL; is_in says false instead. In negation normal form every leaf sits in a
            # positive position, where false and null filter alike, so only the negated leaf
            # needs care: NOT IN is never true for a null x, nor at all with a NULL in the list.
            values = column(node.column)
            if is_floating(node.column.compare_type):  # -0.0 as 0.0, like = (see binding)
                values = pc.add(values, pa.scalar(0.0, node.column.compare_type))
            found = pc.is_in(values, value_set=node.values, skip_nulls=True)
            if not node.negated:
                return found
            if node.has_null:
                return const(False)
            return pc.and_kleene(pc.is_valid(values), pc.invert(found))
        elif isinstance(node, BoundIsNull):
            values = column(node.column)
            return pc.is_valid(values) if node.negated else pc.is_null(values)
        elif isinstance(node, BoundStartsWith):
            result = pc.starts_with(column(node.column), pattern=node.prefix)
        else:
            raise TypeError(f"Unknown bound node {node!r}")
        return pc.invert(result) if node.negated else result

    return visit(bound)


#: Most operands of one AND/OR that Arrow sees in one flattenable chain (see _junction).
ARROW_CHAIN_LIMIT = 256


def _balanced(combine: Callable[[Any, Any], Any], items: list[Any]) -> Any:
    """``combine`` over ``items`` as a balanced tree (log2(n) deep, not n)."""
    while len(items) > 1:
        paired = [combine(a, b) for a, b in zip(items[::2], items[1::2], strict=False)]
        items = [*paired, items[-1]] if len(items) % 2 else paired
    return items[0]


def _junction(combine: Callable[[Any, Any], Any], items: list[Any], expression: bool) -> Any:
    """AND/OR of ``items``. Arrow canonicalizes an expression by flattening nested calls of
    one associative function into one chain, which it then walks recursively: some thousand
    operands overflow the C stack (a segfault, not an error). So an expression's operands are
    combined in groups of ARROW_CHAIN_LIMIT, each behind ``if_else(g, true, false)`` (the
    identity on booleans, nulls included), which Arrow does not flatten through."""
    if expression:
        while len(items) > ARROW_CHAIN_LIMIT:
            items = [
                pc.if_else(_balanced(combine, items[i : i + ARROW_CHAIN_LIMIT]), True, False)
                for i in range(0, len(items), ARROW_CHAIN_LIMIT)
            ]
    return _balanced(combine, items)


def to_arrow(expr: Expr | str | None, schema: pa.Schema) -> pc.Expression:
    """The filter as a ``pyarrow.compute.Expression`` checked against ``schema``.

    Unknown columns raise :class:`~arrowlake.errors.ColumnNotFound`, literals that do not fit
    their column :class:`~arrowlake.errors.ValidationError`. Literals are converted to the
    column's type, e.g. a string to a date for a date32 column (see
    :mod:`arrowlake.expressions.binding` for all rules; naive timestamps against a tz-aware
    column are UTC).

    >>> import pyarrow as pa
    >>> from arrowlake.expressions import col
    >>> table = pa.table({"d": pa.array([0, 20758], pa.int32()).cast(pa.date32())})
    >>> table.filter(to_arrow(col("d") >= "2026-11-01", table.schema)).num_rows
    1
    """
    bound = bind(to_expression(expr), schema)

    def field(column: BoundColumn) -> pc.Expression:
        ref = pc.field(column.name)
        return ref.cast(column.compare_type, safe=False) if column.needs_cast else ref

    result: pc.Expression = _convert(bound, field, pc.scalar, expression=True)
    return result


Data: TypeAlias = pa.Table | pa.RecordBatch


def evaluate(expr: Expr | str | None, data: Data) -> pa.BooleanArray:
    """A mask with one entry per row: true where the filter holds, false elsewhere (a null
    result counts as false).

    The rows a DELETE keeps are ``~evaluate(expr, data)``: rows where the filter is null stay.
    (``to_arrow(~expr)`` would drop them too, since NOT of null is null.)

    >>> import pyarrow as pa
    >>> evaluate("x > 1 OR x IS NULL", pa.table({"x": [1, 2, None]})).to_pylist()
    [False, True, True]
    """
    if not isinstance(data, (pa.Table, pa.RecordBatch)):
        raise ValidationError(
            f"evaluate() needs a pyarrow Table or RecordBatch, got {type(data).__name__}"
        )
    bound = bind(to_expression(expr), data.schema)

    def array(column: BoundColumn) -> Any:
        values = data.column(column.name)
        return pc.cast(values, column.compare_type, safe=False) if column.needs_cast else values

    result = _convert(bound, array, pa.scalar)
    if isinstance(result, pa.Scalar):
        result = pa.repeat(result, data.num_rows)
    if isinstance(result, pa.ChunkedArray):
        result = result.combine_chunks() if result.num_chunks else pa.array([], pa.bool_())
    mask: pa.BooleanArray = pc.fill_null(result, False)
    return mask
