"""Table schemas: Arrow schemas whose fields carry stable ids, and what data may be written to them.

Every field of a table schema (nested children included) has an integer id in its metadata under
``PARQUET:field_id``, the key pyarrow's Parquet writer stores as the column's field id. Ids never
change and are never reused, so a column keeps its identity through renames, and a file written
before a column was added or dropped still reads correctly: columns are matched by id, not name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import pyarrow as pa

from arrowlake.errors import ColumnNotFound, InvalidName, SchemaMismatch

FIELD_ID_KEY = b"PARQUET:field_id"
PANDAS_DTYPE_KEY = b"arrowlake.pandas_dtype"

# Columns arrowlake keeps in data files for its own use; user columns may not take these names.
RESERVED_PREFIX = "_al_"

_COLUMN_NAME = re.compile(r"[^\x00-\x1f/\\]+")  # fullmatch: `$` would pass a trailing newline


def field_id(field: pa.Field) -> int:
    """The stable id of a table field."""
    meta = field.metadata or {}
    try:
        return int(meta[FIELD_ID_KEY])
    except KeyError:
        raise SchemaMismatch(f"Field '{field.name}' carries no field id") from None


def _with_id(field: pa.Field, fid: int) -> pa.Field:
    meta = dict(field.metadata or {})
    meta[FIELD_ID_KEY] = str(fid).encode()
    return field.with_metadata(meta)


def _assign_type_ids(typ: pa.DataType, next_id: int) -> tuple[pa.DataType, int]:
    """Give ids to the children of nested types, depth first."""
    if pa.types.is_struct(typ):
        children = []
        for i in range(typ.num_fields):
            child, next_id = _assign_field(typ.field(i), next_id)
            children.append(child)
        return pa.struct(children), next_id
    if pa.types.is_map(typ):
        key, next_id = _assign_field(typ.key_field, next_id)
        item, next_id = _assign_field(typ.item_field, next_id)
        return pa.map_(key, item, keys_sorted=typ.keys_sorted), next_id
    if pa.types.is_large_list(typ):
        child, next_id = _assign_field(typ.value_field, next_id)
        return pa.large_list(child), next_id
    if pa.types.is_fixed_size_list(typ):
        child, next_id = _assign_field(typ.value_field, next_id)
        return pa.list_(child, typ.list_size), next_id
    if pa.types.is_list(typ):
        child, next_id = _assign_field(typ.value_field, next_id)
        return pa.list_(child), next_id
    return typ, next_id


def _assign_field(field: pa.Field, next_id: int) -> tuple[pa.Field, int]:
    meta = field.metadata or {}
    if FIELD_ID_KEY in meta:
        fid = int(meta[FIELD_ID_KEY])
        next_id = max(next_id, fid + 1)
    else:
        fid = next_id
        next_id += 1
    typ, next_id = _assign_type_ids(field.type, next_id)
    return _with_id(field.with_type(typ), fid), next_id


def assign_field_ids(schema: pa.Schema, next_id: int = 1) -> tuple[pa.Schema, int]:
    """Return ``schema`` with an id on every field that has none, and the next free id."""
    fields = []
    for field in schema:
        field, next_id = _assign_field(field, next_id)
        fields.append(field)
    return pa.schema(fields, metadata=schema.metadata), next_id


def max_field_id(schema: pa.Schema) -> int:
    _, next_id = assign_field_ids(schema, 1)
    return next_id - 1


def validate_column_name(name: str) -> None:
    if not isinstance(name, str) or not name or not _COLUMN_NAME.fullmatch(name):
        raise InvalidName(
            f"Column name {name!r} is not allowed: use a non-empty name without control "
            "characters, '/' or '\\'"
        )
    if name.startswith(RESERVED_PREFIX):
        raise InvalidName(
            f"Column name {name!r} is reserved: names starting with '{RESERVED_PREFIX}' are "
            "arrowlake's own"
        )


def normalize_type(typ: pa.DataType) -> pa.DataType:
    """The storage type for an inferred column type.

    View and large string/binary types become their plain forms and dictionaries their value
    type: data files then hold one representation whatever tool produced the first batch, and
    any of the forms can still be written later (they cast safely).
    """
    if pa.types.is_dictionary(typ):
        return normalize_type(typ.value_type)
    if typ in (pa.large_string(), pa.string_view()):
        return pa.string()
    if typ in (pa.large_binary(), pa.binary_view()):
        return pa.binary()
    nested = _with_children(typ, normalize_type, keep_large=False)
    return typ if nested is None else nested


def without_views(typ: pa.DataType) -> pa.DataType:
    """``typ`` with string and binary views (at any depth) as plain strings and binaries.

    Tables store views as their plain forms: Parquet has no view types, and many Arrow kernels
    (take, filter, sort) have no view implementations, while views from Polars and others
    still write (they cast safely)."""
    if typ == pa.string_view():
        return pa.string()
    if typ == pa.binary_view():
        return pa.binary()
    if pa.types.is_dictionary(typ):
        return pa.dictionary(typ.index_type, without_views(typ.value_type), typ.ordered)
    nested = _with_children(typ, without_views, keep_large=True)
    return typ if nested is None else nested


def _with_children(typ: pa.DataType, convert: Callable[[pa.DataType], pa.DataType], *,
                   keep_large: bool) -> pa.DataType | None:
    """A nested ``typ`` rebuilt with ``convert`` applied to its child types (list views become
    lists; large lists stay large with ``keep_large``), or None when ``typ`` is not nested."""
    t = pa.types
    if t.is_struct(typ):
        return pa.struct([f.with_type(convert(f.type)) for f in typ])
    if t.is_map(typ):
        return pa.map_(typ.key_field.with_type(convert(typ.key_type)),
                       typ.item_field.with_type(convert(typ.item_type)))
    if not (t.is_list(typ) or t.is_list_view(typ) or t.is_large_list(typ)
            or t.is_large_list_view(typ) or t.is_fixed_size_list(typ)):
        return None
    value = typ.value_field.with_type(convert(typ.value_type))
    if t.is_fixed_size_list(typ):
        return pa.list_(value, typ.list_size)
    if keep_large and (t.is_large_list(typ) or t.is_large_list_view(typ)):
        return pa.large_list(value)
    return pa.list_(value)


def schema_without_views(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_type(without_views(f.type)) for f in schema], schema.metadata)


def normalize_schema(schema: pa.Schema) -> pa.Schema:
    fields = []
    for f in schema:
        meta = dict(f.metadata or {})
        if pa.types.is_dictionary(f.type):
            meta.setdefault(PANDAS_DTYPE_KEY, b"category")
        fields.append(pa.field(f.name, normalize_type(f.type), f.nullable, meta or None))
    return pa.schema(fields)


def validate_schema(schema: pa.Schema) -> None:
    names = schema.names
    for name in names:
        validate_column_name(name)
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SchemaMismatch(f"Column names must be unique; repeated: {', '.join(dupes)}")


# ---------------------------------------------------------------------------------------------
# Which types may be written into which: safe casts only.

_STRINGS = (pa.string(), pa.large_string(), pa.string_view())
_BINARIES = (pa.binary(), pa.large_binary(), pa.binary_view())


def can_write(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether values of type ``src`` may be written to a column of type ``dst``.

    Allowed are the casts that keep every value's meaning: the same type in another layout
    (string views, large strings, dictionaries), integers into integers (overflow is checked
    per value), integers into floats, narrower floats into wider, dates and timestamps between
    units (lost precision is checked per value) and zones, decimals into decimals that hold them,
    and nested types whose children are allowed. Naive and zoned timestamps are not mixed, and
    nothing is parsed from strings.
    """
    if src == dst or pa.types.is_null(src):
        return True
    if pa.types.is_dictionary(src):
        return can_write(src.value_type, dst)
    if src in _STRINGS:
        return dst in _STRINGS
    if src in _BINARIES or pa.types.is_fixed_size_binary(src):
        return dst in _BINARIES
    if pa.types.is_integer(src):
        return pa.types.is_integer(dst) or pa.types.is_floating(dst) or (
            pa.types.is_decimal(dst) and dst.precision - dst.scale >= 19
        )
    if pa.types.is_floating(src):
        return pa.types.is_floating(dst) and dst.bit_width >= src.bit_width
    if pa.types.is_decimal(src):
        return pa.types.is_decimal(dst) and dst.scale >= src.scale and (
            dst.precision - dst.scale >= src.precision - src.scale
        )
    if pa.types.is_date(src):
        return pa.types.is_date(dst)
    if pa.types.is_timestamp(src):
        return pa.types.is_timestamp(dst) and (src.tz is None) == (dst.tz is None)
    if pa.types.is_time(src):
        return pa.types.is_time(dst)
    if pa.types.is_duration(src):
        return pa.types.is_duration(dst)
    if pa.types.is_struct(src):
        if not pa.types.is_struct(dst):
            return False
        dst_children = {f.name: f for f in dst}
        return all(f.name in dst_children and can_write(f.type, dst_children[f.name].type)
                   for f in src)
    if _is_list_like(src):
        return _is_list_like(dst) and can_write(src.value_type, dst.value_type)
    if pa.types.is_map(src):
        return pa.types.is_map(dst) and can_write(src.key_type, dst.key_type) and can_write(
            src.item_type, dst.item_type
        )
    return False


def _is_list_like(t: pa.DataType) -> bool:
    return (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    )


def can_widen(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether a column's type may be changed from ``src`` to ``dst`` by schema evolution.

    Unlike :func:`can_write` this must hold for every value ever written, so only widenings are
    allowed: int8→int16→int32→int64, float32→float64, int→float64 for up to 32-bit ints,
    decimal precision increases at the same scale, date32→timestamp is not included.
    """
    if src == dst:
        return True
    if pa.types.is_integer(src) and pa.types.is_integer(dst):
        same_sign = pa.types.is_signed_integer(src) == pa.types.is_signed_integer(dst)
        unsigned_into_signed = pa.types.is_unsigned_integer(src) and pa.types.is_signed_integer(
            dst
        ) and dst.bit_width > src.bit_width
        return (same_sign and dst.bit_width >= src.bit_width) or unsigned_into_signed
    if pa.types.is_integer(src) and dst == pa.float64():
        return src.bit_width <= 32
    if pa.types.is_floating(src) and pa.types.is_floating(dst):
        return dst.bit_width >= src.bit_width
    if pa.types.is_decimal(src) and pa.types.is_decimal(dst):
        return dst.scale == src.scale and dst.precision >= src.precision
    if src in _STRINGS and dst in _STRINGS:
        return True
    return bool(src in _BINARIES and dst in _BINARIES)


def _has_nulls(arr: pa.Array | pa.ChunkedArray) -> bool:
    return arr.null_count > 0


def conform(
    data: pa.RecordBatch, schema: pa.Schema, *, where: str = "input"
) -> pa.RecordBatch:
    """Return ``data`` in the table's ``schema``: columns reordered, cast, missing ones null.

    Raises :class:`SchemaMismatch` naming the column and both types when a column cannot be
    cast safely, when the input has columns the table does not, or when a non-nullable column
    would get nulls.
    """
    names = data.schema.names
    known = set(schema.names)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SchemaMismatch(
            f"The {where} has columns the table does not: {', '.join(map(repr, unknown))}. "
            f"Table columns: {', '.join(schema.names)}. Add them with table.add_column() first "
            "or drop them from the data."
        )
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise SchemaMismatch(f"The {where} repeats columns: {', '.join(dupes)}")
    arrays = []
    for field in schema:
        idx = data.schema.get_field_index(field.name)
        if idx < 0:
            if not field.nullable:
                raise SchemaMismatch(
                    f"Column '{field.name}' is not nullable and missing from the {where}"
                )
            arrays.append(pa.nulls(data.num_rows, field.type))
            continue
        arr = data.column(idx)
        if arr.type != field.type:
            arr = cast_column(arr, field, where=where)
        if not field.nullable and _has_nulls(arr):
            raise SchemaMismatch(
                f"Column '{field.name}' is not nullable but the {where} has "
                f"{arr.null_count} null values"
            )
        arrays.append(arr)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def cast_column(arr: pa.Array, field: pa.Field, *, where: str = "input") -> pa.Array:
    src = arr.type
    if not can_write(src, field.type):
        hint = ""
        if pa.types.is_timestamp(src) and pa.types.is_timestamp(field.type):
            hint = (
                " Naive and time-zone-aware timestamps are not mixed: localize or strip the "
                "zone first."
            )
        raise SchemaMismatch(
            f"Column '{field.name}' has type {field.type} in the table but {src} in the "
            f"{where}, which cannot be cast safely.{hint}"
        )
    try:
        if pa.types.is_dictionary(src):
            arr = arr.dictionary_decode()
        return arr.cast(field.type, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaMismatch(
            f"Column '{field.name}': values of type {src} in the {where} do not fit the table "
            f"type {field.type}: {exc}"
        ) from None


def find_field(schema: pa.Schema, name: str) -> pa.Field:
    idx = schema.get_field_index(name)
    if idx < 0:
        raise ColumnNotFound(
            f"Column '{name}' does not exist; columns are: {', '.join(schema.names)}"
        )
    return schema.field(idx)


def select(schema: pa.Schema, columns: Iterable[str]) -> pa.Schema:
    return pa.schema([find_field(schema, c) for c in columns], metadata=schema.metadata)


def serialize(schema: pa.Schema) -> bytes:
    return bytes(schema.serialize().to_pybytes())


def deserialize(data: bytes) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(data))


def describe(schema: pa.Schema) -> list[dict[str, object]]:
    """A JSON-friendly description of the top-level fields."""
    return [
        {"id": field_id(f), "name": f.name, "type": str(f.type), "nullable": f.nullable}
        for f in schema
    ]
