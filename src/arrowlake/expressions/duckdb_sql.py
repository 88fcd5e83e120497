"""Filters as DuckDB SQL, with the results :func:`~arrowlake.expressions.to_arrow` gives.

The bound tree (:mod:`arrowlake.expressions.binding`) is printed, so literals have already been
coerced to their column's type: each is printed as a ``CAST`` of its exact text to the DuckDB
type of that Arrow type, and a column compared in a wider type is cast to it, as Arrow does.
Identifiers are double-quoted, strings single-quoted with quotes doubled; no value is ever
printed unquoted except integers and the words TRUE/FALSE.

Where DuckDB's semantics differ from Arrow's the SQL says so explicitly: DuckDB treats NaN as
equal to itself and greater than every number, Arrow as IEEE 754 does (NaN compares false,
``!=`` true), so comparisons on floating columns test ``isnan`` where the two differ.
Whatever has no such form (types DuckDB would compare differently, time and duration
literals, 256-bit decimals, strings holding NUL) gives None: the caller must then filter
with Arrow instead.
"""

from __future__ import annotations

import datetime as _dt
import math
from decimal import Decimal

import pyarrow as pa

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
    value_type,
)
from arrowlake.expressions.parser import to_expression
from arrowlake.expressions.tree import Expr

_SQL_OPS = {"=": "=", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}

_INTEGERS = {
    pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INTEGER", pa.int64(): "BIGINT",
    pa.uint8(): "UTINYINT", pa.uint16(): "USMALLINT", pa.uint32(): "UINTEGER",
    pa.uint64(): "UBIGINT",
}
_TIMESTAMPS = {"s": "TIMESTAMP_S", "ms": "TIMESTAMP_MS", "us": "TIMESTAMP", "ns": "TIMESTAMP_NS"}


class _NoSql(Exception):
    """The filter has no DuckDB form with Arrow's results."""


def quote_identifier(name: str) -> str:
    """``name`` as a DuckDB identifier (double-quoted, quotes doubled)."""
    if "\x00" in name:
        raise _NoSql(name)
    return '"' + name.replace('"', '""') + '"'


def quote_string(text: str) -> str:
    """``text`` as a DuckDB string literal (single-quoted, quotes doubled; no escapes)."""
    if "\x00" in text:
        raise _NoSql(text)
    return "'" + text.replace("'", "''") + "'"


def duckdb_type(typ: pa.DataType) -> str | None:
    """The DuckDB type DuckDB gives an Arrow column of ``typ`` (``con.from_arrow``), for the
    types filters compare; None for the others."""
    t = value_type(typ)
    if t in _INTEGERS:
        return _INTEGERS[t]
    if t == pa.float32():
        return "FLOAT"
    if t == pa.float64():
        return "DOUBLE"
    if pa.types.is_boolean(t):
        return "BOOLEAN"
    if pa.types.is_decimal128(t):
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "VARCHAR"
    if (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)
            or pa.types.is_fixed_size_binary(t)):
        return "BLOB"
    if pa.types.is_date(t):
        return "DATE"
    if pa.types.is_timestamp(t):
        if t.tz is None:
            return _TIMESTAMPS[t.unit]
        return "TIMESTAMPTZ_NS" if t.unit == "ns" else "TIMESTAMPTZ"
    return None


def to_duckdb_sql(expr: Expr | str | None, schema: pa.Schema) -> str | None:
    """The filter as a DuckDB SQL condition over columns named and typed as in ``schema``
    (as DuckDB reads an Arrow table of that schema), or None when it has no form that keeps
    exactly the rows Arrow keeps.

    >>> to_duckdb_sql("x > 3 AND s LIKE 'a''b%'", pa.schema([("x", pa.int32()),
    ...                                                     ("s", pa.string())]))
    '(("x" > CAST(3 AS INTEGER)) AND starts_with("s", \\'a\\'\\'b\\'))'
    """
    bound = bind(to_expression(expr), schema)
    try:
        return _sql(bound)
    except _NoSql:
        return None


def _sql(node: BoundExpr) -> str:
    if isinstance(node, BoundConst):
        return "TRUE" if node.value else "FALSE"
    if isinstance(node, (BoundAnd, BoundOr)):
        word = " AND " if isinstance(node, BoundAnd) else " OR "
        return "(" + word.join(_sql(c) for c in node.children) + ")"
    if isinstance(node, BoundCompare):
        text = _compare(node)
    elif isinstance(node, BoundColumnCompare):
        text = _column_compare(node)
    elif isinstance(node, BoundIn):
        return _in(node)
    elif isinstance(node, BoundIsNull):
        return f"({_column(node.column)} IS {'NOT ' if node.negated else ''}NULL)"
    elif isinstance(node, BoundStartsWith):
        text = f"starts_with({_column(node.column)}, {quote_string(node.prefix)})"
    else:
        raise _NoSql(repr(node))
    return f"(NOT {text})" if node.negated else text


def _column(column: BoundColumn) -> str:
    """The column, cast to the type it is compared in (as :func:`to_arrow` casts it)."""
    own = duckdb_type(column.type)
    compare = duckdb_type(column.compare_type)
    if own is None or compare is None:
        raise _NoSql(column.name)
    name = quote_identifier(column.name)
    return name if own == compare else f"CAST({name} AS {compare})"


def _floating(column: BoundColumn) -> bool:
    return bool(pa.types.is_floating(column.compare_type))


def _compare(node: BoundCompare) -> str:
    column = _column(node.column)
    op = _SQL_OPS[node.op]
    if not _floating(node.column):
        return f"({column} {op} {literal(node.value)})"
    value = node.value.as_py()
    if value is not None and math.isnan(value):
        # IEEE 754, as Arrow compares: NaN makes every comparison false but !=.
        unequal = "TRUE" if node.op == "!=" else "FALSE"
        return f"(CASE WHEN {column} IS NULL THEN NULL ELSE {unequal} END)"
    # DuckDB orders NaN above every number, IEEE 754 nowhere: <, <=, = and != a number give
    # Arrow's answer for a NaN row as they are; > and >= must rule NaN out. (Kept as plain
    # comparisons, DuckDB prunes row groups with them.)
    if node.op in (">", ">="):
        return f"({column} {op} {literal(node.value)} AND NOT isnan({column}))"
    return f"({column} {op} {literal(node.value)})"


def _column_compare(node: BoundColumnCompare) -> str:
    left, right = node.left.compare_type, node.right.compare_type
    lt, rt = duckdb_type(left), duckdb_type(right)
    # Only pairs both engines bring to the same common type (Arrow and DuckDB differ on e.g.
    # int64 against uint64, or decimals of different scales).
    same_kind = (
        lt == rt
        or (pa.types.is_signed_integer(left) and pa.types.is_signed_integer(right))
        or (pa.types.is_unsigned_integer(left) and pa.types.is_unsigned_integer(right))
        or (pa.types.is_floating(left) and pa.types.is_floating(right))
    )
    if lt is None or rt is None or not same_kind:
        raise _NoSql(repr(node))
    a, b = _column(node.left), _column(node.right)
    op = _SQL_OPS[node.op]
    nans = [f"isnan({c})" for c, bc in ((a, node.left), (b, node.right)) if _floating(bc)]
    if not nans:
        return f"({a} {op} {b})"
    unequal = "TRUE" if node.op == "!=" else "FALSE"
    return (f"(CASE WHEN {a} IS NULL OR {b} IS NULL THEN NULL "
            f"WHEN {' OR '.join(nans)} THEN {unequal} ELSE {a} {op} {b} END)")


def _in(node: BoundIn) -> str:
    column = _column(node.column)
    if _floating(node.column):
        # The values hold no NaN and only +0.0 (see binding); -0.0 is made +0.0 likewise.
        column = f"({column} + CAST(0 AS {duckdb_type(node.column.compare_type)}))"
    values = ", ".join(literal(v) for v in node.values)
    found = f"({column} IN ({values}))"
    if not node.negated:
        return found
    if node.has_null:
        return "FALSE"  # NOT IN a list holding NULL is never true
    return f"({column} IS NOT NULL AND NOT {found})"


def literal(value: pa.Scalar) -> str:
    """A typed DuckDB literal of ``value`` (a valid scalar of a type :func:`duckdb_type`
    names): the exact text of the value cast to that type."""
    typ = value.type
    name = duckdb_type(typ)
    if name is None or not value.is_valid:
        raise _NoSql(repr(value))
    py = value.as_py()
    if pa.types.is_boolean(typ):
        return "TRUE" if py else "FALSE"
    if pa.types.is_integer(typ):
        return f"CAST({int(py)} AS {name})"
    if pa.types.is_floating(typ):
        return f"CAST({quote_string(repr(float(py)))} AS {name})"
    if pa.types.is_decimal(typ):
        assert isinstance(py, Decimal)
        return f"CAST({quote_string(str(py))} AS {name})"
    if name == "VARCHAR":
        return quote_string(str(py))
    if name == "BLOB":
        return f"from_hex({quote_string(bytes(py).hex())})"
    if name == "DATE":
        assert isinstance(py, _dt.date)
        return f"CAST({quote_string(py.isoformat())} AS DATE)"
    if pa.types.is_timestamp(typ):
        return f"CAST({quote_string(_timestamp_text(value))} AS {name})"
    raise _NoSql(repr(value))


def _timestamp_text(value: pa.TimestampScalar) -> str:
    """The timestamp as ISO text to the nanosecond, in UTC with ``+00:00`` when tz-aware
    (built from the stored integer: Python's datetime stops at microseconds)."""
    typ = value.type
    per_second = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[typ.unit]
    seconds, fraction = divmod(int(value.value), per_second)
    nanos = fraction * (1_000_000_000 // per_second)
    moment = _dt.datetime(1970, 1, 1) + _dt.timedelta(seconds=seconds)
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    if moment.year < 1000:
        text = f"{moment.year:04d}" + text[text.index("-"):]
    text += f".{nanos:09d}"
    return text + ("+00:00" if typ.tz is not None else "")
