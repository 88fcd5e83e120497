"""Spark's pushed filters as arrowlake filters, where the scan applies them exactly.

A scan applies its filter to every row (after the merge on primary-key tables), so a filter it
accepts needs no second evaluation by Spark. Only filters whose meaning is the same on both
sides are accepted: comparisons, ``IN``, prefix ``LIKE`` and ``NOT`` of those, on top-level
columns of integer, string, boolean, date and decimal types, and ``IS [NOT] NULL`` on any
top-level column. Floats (Spark
orders NaN above every number and equals it to itself, Arrow does neither), timestamps (Spark
hands over session-local datetimes), and columns whose type Spark sees differently (unsigned
integers, decimals over 38 digits) are given back to Spark, as are suffix and infix ``LIKE``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import datasource as sds

from arrowlake.errors import ValidationError
from arrowlake.expressions import (
    Column,
    Comparison,
    Expr,
    In,
    IsNotNull,
    IsNull,
    Literal,
    Not,
    StartsWith,
    and_all,
    to_arrow,
)

_COMPARISONS: dict[type, str] = {
    sds.EqualTo: "=",
    sds.GreaterThan: ">",
    sds.GreaterThanOrEqual: ">=",
    sds.LessThan: "<",
    sds.LessThanOrEqual: "<=",
}


def _exact_type(typ: pa.DataType) -> bool:
    t = pa.types
    return (t.is_signed_integer(typ) or t.is_string(typ) or t.is_large_string(typ)
            or t.is_string_view(typ) or t.is_boolean(typ) or t.is_date32(typ)
            or (t.is_decimal(typ) and typ.precision <= 38))


def _column(schema: pa.Schema, attribute: tuple[str, ...], *, any_type: bool = False
            ) -> str | None:
    if len(attribute) != 1:
        return None
    name = attribute[0]
    index = schema.get_field_index(name)
    if index < 0 or not (any_type or _exact_type(schema.field(index).type)):
        return None
    return name


def _value_ok(value: Any) -> bool:
    return value is not None and not isinstance(value, (list, tuple, dict, float))


def to_expression(f: sds.Filter, schema: pa.Schema) -> Expr | None:
    """``f`` as an arrowlake filter, or None when the scan cannot apply it exactly."""
    if type(f) in _COMPARISONS:
        attribute, value = f.attribute, f.value  # type: ignore[attr-defined]
        name = _column(schema, attribute)
        if name is None or not _value_ok(value):
            return None
        return Comparison(_COMPARISONS[type(f)], Column(name),  # type: ignore[arg-type]
                          Literal(value))
    if isinstance(f, sds.In):
        name = _column(schema, f.attribute)
        if name is None or not f.value or not all(_value_ok(v) for v in f.value):
            return None
        return In(Column(name), tuple(f.value))
    if isinstance(f, (sds.IsNull, sds.IsNotNull)):
        # Null is null on both sides for every type (NaN is not null in either).
        name = _column(schema, f.attribute, any_type=True)
        if name is None:
            return None
        return IsNull(Column(name)) if isinstance(f, sds.IsNull) else IsNotNull(Column(name))
    if isinstance(f, sds.StringStartsWith):
        name = _column(schema, f.attribute)
        if name is None or not isinstance(f.value, str):
            return None
        if not pa.types.is_string(schema.field(name).type) and \
                not pa.types.is_large_string(schema.field(name).type):
            return None
        return StartsWith(Column(name), f.value)
    if isinstance(f, sds.Not):
        child = to_expression(f.child, schema)
        return None if child is None else Not(child)
    return None


def split_filters(filters: Sequence[sds.Filter], schema: pa.Schema
                  ) -> tuple[Expr, list[sds.Filter]]:
    """The filters the scan applies, as one expression, and those Spark must apply."""
    accepted: list[Expr] = []
    rejected: list[sds.Filter] = []
    for f in filters:
        expr = to_expression(f, schema)
        if expr is not None:
            try:
                to_arrow(expr, schema)  # a literal the column's type cannot hold is Spark's
            except ValidationError:
                expr = None
        if expr is None:
            rejected.append(f)
        else:
            accepted.append(expr)
    return and_all(accepted), rejected
