"""Schema evolution: add, rename, drop and widen columns without rewriting data files.

Every change makes a new schema version. Files keep the version they were written in; readers
match columns by field id, so old files read correctly under the new schema.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from arrowlake.errors import SchemaMismatch, ValidationError
from arrowlake.schema import (
    assign_field_ids,
    can_widen,
    find_field,
    validate_column_name,
    without_views,
)
from arrowlake.table.options.primary_key import RESERVED_NAMES, check_pk_schema, engine_columns

if TYPE_CHECKING:
    from arrowlake.table.state import TableState


def _commit_schema(table: TableState, schema: pa.Schema, last_field_id: int) -> None:
    """Make ``schema`` current; on a primary-key table, after checking the merge engine still
    works on it, and with its merge options following renamed columns (by field id), in the
    same transaction."""
    rec = table.record
    props = check_pk_schema(table, schema) if rec.primary_key else None
    table.metastore.add_schema(rec.table_id, schema, expected_schema_id=rec.current_schema_id,
                                last_field_id=last_field_id,
                                properties=None if props == rec.properties else props,
                                expected_properties=rec.properties)
    table.refresh()


def _protected(table: TableState, name: str, action: str) -> None:
    rec = table.record
    if name in rec.partition_by:
        raise SchemaMismatch(f"Cannot {action} column '{name}': the table is partitioned by it")
    if name in rec.primary_key:
        raise SchemaMismatch(f"Cannot {action} column '{name}': it is part of the primary key")


def _not_reserved(table: TableState, name: str) -> None:
    if table.record.primary_key and name in RESERVED_NAMES:
        raise SchemaMismatch(
            f"Column name '{name}' is reserved in primary-key tables (used internally for row "
            "kinds and version order); choose another name")


def add_column(table: TableState, name: str, type: pa.DataType, *, nullable: bool = True) -> None:
    table.refresh()
    validate_column_name(name)
    _not_reserved(table, name)
    schema = table.schema
    if name in schema.names:
        raise SchemaMismatch(f"Column '{name}' exists already")
    if not nullable:
        raise SchemaMismatch(
            f"Column '{name}' must be nullable: rows written before it was added have no value")
    field, next_id = assign_field_ids(pa.schema([pa.field(name, without_views(type), True)]),
                                      table.record.last_field_id + 1)
    _commit_schema(table, schema.append(field.field(0)), next_id - 1)


def rename_column(table: TableState, old: str, new: str) -> None:
    table.refresh()
    _protected(table, old, "rename")
    validate_column_name(new)
    _not_reserved(table, new)
    schema = table.schema
    field = find_field(schema, old)
    if new in schema.names:
        raise SchemaMismatch(f"Cannot rename '{old}' to '{new}': '{new}' exists already")
    idx = schema.get_field_index(old)
    _commit_schema(table, schema.set(idx, field.with_name(new)), table.record.last_field_id)


def drop_column(table: TableState, name: str) -> None:
    table.refresh()
    _protected(table, name, "drop")
    schema = table.schema
    find_field(schema, name)
    if name in engine_columns(table):
        raise SchemaMismatch(
            f"Cannot drop column '{name}': the merge engine of '{table.name}' uses it (as its "
            "sequence_field or through a fields.* option); rename it instead if the name is "
            "in the way")
    if len(schema) == 1:
        raise SchemaMismatch(f"Cannot drop '{name}': it is the table's only column")
    _commit_schema(table, schema.remove(schema.get_field_index(name)),
                   table.record.last_field_id)


def alter_column(table: TableState, name: str, type: pa.DataType) -> None:
    """Widen a column's type (int32→int64, float32→float64, decimal precision up, ...)."""
    type = without_views(type)
    table.refresh()
    schema = table.schema
    field = find_field(schema, name)
    if not can_widen(field.type, type):
        raise SchemaMismatch(
            f"Cannot change column '{name}' from {field.type} to {type}: only widening changes "
            "are allowed (int8→int16→int32→int64, float32→float64, int→float64 for up to 32-bit "
            "ints, larger decimal precision at the same scale)")
    if name in table.record.primary_key:
        raise ValidationError(f"Cannot change the type of primary-key column '{name}'")
    idx = schema.get_field_index(name)
    _commit_schema(table, schema.set(idx, field.with_type(type)), table.record.last_field_id)
