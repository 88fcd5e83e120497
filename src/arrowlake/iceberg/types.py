"""Arrow types as Iceberg v3 types, and values as Iceberg stores them.

A table's Arrow schema carries a field id on every field (nested children too), and those ids
are the Iceberg field ids as they are. Which Arrow types map, and to what:

======================================  ==========================================
Arrow                                   Iceberg v3
======================================  ==========================================
bool                                    boolean
int8, int16, int32 / int64              int / long
float32 / float64                       float / double
decimal (precision <= 38)               decimal(P, S)
string (and large, view)                string
binary (and large, view)                binary
fixed_size_binary(n) / arrow.uuid       fixed[n] / uuid
date32, date64 (written as days)        date
time32, time64[us]                      time (microseconds)
timestamp[s, ms, us] without/with zone  timestamp / timestamptz
timestamp[ns] without/with zone         timestamp_ns / timestamptz_ns
struct, list (large, fixed size), map   struct, list, map (with the children's ids)
======================================  ==========================================

Refused (the table has no Iceberg view, and the message names the column): unsigned integers,
float16, decimals above 38 digits, time64[ns], durations, intervals, the null type and other
extension types. Iceberg has none of them, and a wider type would make readers misread the
files, which hold the original one.
"""

from __future__ import annotations

import struct
from decimal import Decimal
from typing import Any

import pyarrow as pa

from arrowlake.schema import FIELD_ID_KEY

IcebergType = str | dict[str, Any]

#: Days between 1970-01-01 and a ``date64`` value's milliseconds.
_MS_PER_DAY = 86_400_000
_TO_MICROS = {"s": 1_000_000, "ms": 1_000, "us": 1}
_TIME_TO_MICROS = {"s": 1_000_000, "ms": 1_000, "us": 1}


class Unsupported(Exception):
    """A column whose type Iceberg v3 lacks."""

    def __init__(self, column: str, typ: pa.DataType, why: str) -> None:
        super().__init__(f"column '{column}' has type {typ}, which Iceberg lacks ({why})")
        self.column = column
        self.type = typ


def _fid(field: pa.Field, path: str) -> int:
    meta = field.metadata or {}
    if FIELD_ID_KEY not in meta:
        raise Unsupported(path, field.type, "it carries no field id")
    return int(meta[FIELD_ID_KEY])


def iceberg_type(typ: pa.DataType, path: str) -> IcebergType:
    """The Iceberg type of a column of Arrow type ``typ`` (``path`` names it in errors)."""
    t = pa.types
    if t.is_dictionary(typ):
        return iceberg_type(typ.value_type, path)
    if t.is_boolean(typ):
        return "boolean"
    if t.is_unsigned_integer(typ):
        raise Unsupported(path, typ, "Iceberg has no unsigned integers")
    if t.is_integer(typ):
        return "long" if typ.bit_width == 64 else "int"
    if t.is_float16(typ):
        raise Unsupported(path, typ, "Iceberg has no 16-bit floats")
    if t.is_float32(typ):
        return "float"
    if t.is_float64(typ):
        return "double"
    if t.is_decimal(typ):
        if typ.precision > 38:
            raise Unsupported(path, typ, "Iceberg decimals have at most 38 digits")
        return f"decimal({typ.precision}, {typ.scale})"
    if t.is_string(typ) or t.is_large_string(typ) or t.is_string_view(typ):
        return "string"
    if t.is_binary(typ) or t.is_large_binary(typ) or t.is_binary_view(typ):
        return "binary"
    if isinstance(typ, pa.ExtensionType):
        if typ.extension_name == "arrow.uuid":
            return "uuid"
        raise Unsupported(path, typ, f"the extension type {typ.extension_name} has no "
                                     "Iceberg counterpart")
    if t.is_fixed_size_binary(typ):
        return f"fixed[{typ.byte_width}]"
    if t.is_date(typ):
        return "date"
    if t.is_time(typ):
        if typ.unit == "ns":
            raise Unsupported(path, typ, "Iceberg times are microseconds")
        return "time"
    if t.is_timestamp(typ):
        zoned = typ.tz is not None
        if typ.unit == "ns":
            return "timestamptz_ns" if zoned else "timestamp_ns"
        return "timestamptz" if zoned else "timestamp"
    if t.is_struct(typ):
        return {"type": "struct", "fields": [_field(typ.field(i), f"{path}.{typ.field(i).name}")
                                             for i in range(typ.num_fields)]}
    if t.is_list(typ) or t.is_large_list(typ) or t.is_fixed_size_list(typ):
        item = typ.value_field
        return {"type": "list", "element-id": _fid(item, f"{path}.element"),
                "element": iceberg_type(item.type, f"{path}.element"),
                "element-required": False}
    if t.is_map(typ):
        key, item = typ.key_field, typ.item_field
        return {"type": "map", "key-id": _fid(key, f"{path}.key"),
                "key": iceberg_type(key.type, f"{path}.key"),
                "value-id": _fid(item, f"{path}.value"),
                "value": iceberg_type(item.type, f"{path}.value"), "value-required": False}
    if t.is_duration(typ):
        raise Unsupported(path, typ, "Iceberg has no durations")
    if t.is_interval(typ):
        raise Unsupported(path, typ, "Iceberg has no intervals")
    raise Unsupported(path, typ, "there is no Iceberg type for it")


def _field(field: pa.Field, path: str, required: bool = False) -> dict[str, Any]:
    return {"id": _fid(field, path), "name": field.name, "required": required,
            "type": iceberg_type(field.type, path)}


def schema_json(schema: pa.Schema, schema_id: int, identifier: tuple[str, ...] = ()
                ) -> dict[str, Any]:
    """The Iceberg schema (its JSON form) of an Arrow table schema. The ``identifier`` columns
    (a primary key) are required and listed as ``identifier-field-ids`` when Iceberg allows
    them as such (not floating point); other columns are optional, which Iceberg readers
    accept for files holding required columns too."""
    floats = {n for n in identifier if pa.types.is_floating(schema.field(n).type)}
    keys = set(identifier) if identifier and not floats else set()
    fields = [_field(f, f.name, required=f.name in keys) for f in schema]
    out: dict[str, Any] = {"type": "struct", "schema-id": schema_id, "fields": fields}
    if keys:
        out["identifier-field-ids"] = [f["id"] for f in fields if f["name"] in keys]
    return out


def max_field_id(iceberg: IcebergType) -> int:
    """The highest field id in an Iceberg type (its nested fields included)."""
    if isinstance(iceberg, str):
        return 0
    kind = iceberg["type"]
    if kind == "struct":
        return max((max(f["id"], max_field_id(f["type"])) for f in iceberg["fields"]),
                   default=0)
    if kind == "list":
        return max(iceberg["element-id"], max_field_id(iceberg["element"]))
    return max(iceberg["key-id"], iceberg["value-id"], max_field_id(iceberg["key"]),
               max_field_id(iceberg["value"]))


def promotes(old: IcebergType, new: IcebergType) -> bool:
    """Whether Iceberg readers read a file column of type ``old`` as ``new``: the same type,
    or one of Iceberg's promotions (int to long, float to double, a decimal's precision
    raised), for nested types child by child where the ids match."""
    if old == new:
        return True
    if isinstance(old, str) and isinstance(new, str):
        if (old, new) in (("int", "long"), ("float", "double")):
            return True
        if old.startswith("decimal(") and new.startswith("decimal("):
            p0, s0 = _decimal(old)
            p1, s1 = _decimal(new)
            return s0 == s1 and p1 >= p0
        return False
    if isinstance(old, str) or isinstance(new, str) or old["type"] != new["type"]:
        return False
    if old["type"] == "struct":
        before = {f["id"]: f["type"] for f in old["fields"]}
        return all(promotes(before[f["id"]], f["type"]) for f in new["fields"]
                   if f["id"] in before)
    if old["type"] == "list":
        return old["element-id"] == new["element-id"] and promotes(old["element"],
                                                                   new["element"])
    return (old["key-id"], old["value-id"]) == (new["key-id"], new["value-id"]) and \
        old["key"] == new["key"] and promotes(old["value"], new["value"])


def _decimal(text: str) -> tuple[int, int]:
    precision, scale = text[len("decimal("):-1].split(",")
    return int(precision), int(scale)


# -- values ----------------------------------------------------------------------------------

#: Iceberg types whose stored statistics and partition values this module converts.
def has_values(typ: pa.DataType) -> bool:
    """Whether stored values (statistics, partition values: :mod:`arrowlake.io.stats`) of a
    column of ``typ`` convert to Iceberg values."""
    t = pa.types
    return (t.is_boolean(typ) or t.is_signed_integer(typ) or t.is_float32(typ)
            or t.is_float64(typ) or t.is_string(typ) or t.is_large_string(typ)
            or t.is_date(typ) or (t.is_time(typ) and typ.unit != "ns")
            or t.is_timestamp(typ) or (t.is_decimal(typ) and typ.precision <= 38))


def iceberg_value(typ: pa.DataType, stored: Any) -> Any:
    """The Iceberg value of a value stored for a column of ``typ`` (statistics and partition
    values are stored by :mod:`arrowlake.io.stats`: dates, times and timestamps as integers
    in the column's unit, decimals as strings): microseconds for times and timestamps (but
    nanoseconds for ``timestamp_ns``), days for dates, the unscaled integer for decimals."""
    t = pa.types
    if t.is_timestamp(typ):
        return int(stored) if typ.unit == "ns" else int(stored) * _TO_MICROS[typ.unit]
    if t.is_date64(typ):
        return int(stored) // _MS_PER_DAY
    if t.is_time(typ):
        return int(stored) * _TIME_TO_MICROS[typ.unit]
    if t.is_decimal(typ):
        return int(Decimal(stored).scaleb(typ.scale))
    if t.is_floating(typ):
        return float(stored)
    if t.is_boolean(typ):
        return bool(stored)
    if t.is_integer(typ) or t.is_date(typ):
        return int(stored)
    return stored


_PACK = {"int": struct.Struct("<i"), "date": struct.Struct("<i"), "long": struct.Struct("<q"),
         "time": struct.Struct("<q"), "timestamp": struct.Struct("<q"),
         "timestamptz": struct.Struct("<q"), "timestamp_ns": struct.Struct("<q"),
         "timestamptz_ns": struct.Struct("<q"), "float": struct.Struct("<f"),
         "double": struct.Struct("<d")}


def bound_bytes(iceberg: str, value: Any) -> bytes:
    """An Iceberg value in Iceberg's single-value serialization (bounds of statistics and of
    partition summaries)."""
    packer = _PACK.get(iceberg)
    if packer is not None:
        return packer.pack(value)
    if iceberg == "boolean":
        return b"\x01" if value else b"\x00"
    if iceberg == "string":
        return str(value).encode("utf-8")
    if iceberg.startswith("decimal("):
        return unscaled_bytes(int(value))
    return bytes(value)


def unscaled_bytes(unscaled: int, size: int | None = None) -> bytes:
    """A decimal's unscaled value as big-endian two's complement: in the fewest bytes, or in
    ``size`` bytes (sign-extended, as Avro's fixed decimals are)."""
    if size is None:
        size = max(1, (unscaled.bit_length() + 8) // 8)
    return unscaled.to_bytes(size, "big", signed=True)


def decimal_bytes(precision: int) -> int:
    """The bytes a fixed-size decimal of ``precision`` digits takes (Iceberg's rule)."""
    size = 1
    while 2 ** (8 * size - 1) < 10 ** precision:
        size += 1
    return size


def avro_type(iceberg: str, defined: set[str]) -> Any:
    """The Avro schema of a primitive Iceberg type (partition values in manifests). Named Avro
    types (fixed) are defined once per file: ``defined`` holds the names defined so far."""
    simple = {"boolean": "boolean", "int": "int", "long": "long", "float": "float",
              "double": "double", "string": "string", "binary": "bytes"}
    if iceberg in simple:
        return simple[iceberg]
    logical = {"date": ("int", "date"), "time": ("long", "time-micros"),
               "timestamp": ("long", "timestamp-micros"),
               "timestamptz": ("long", "timestamp-micros"),
               "timestamp_ns": ("long", "timestamp-nanos"),
               "timestamptz_ns": ("long", "timestamp-nanos")}
    if iceberg in logical:
        base, name = logical[iceberg]
        out: dict[str, Any] = {"type": base, "logicalType": name}
        if iceberg.startswith("timestamp"):
            out["adjust-to-utc"] = "tz" in iceberg
        return out
    if iceberg == "uuid":
        name, spec = "uuid_fixed", {"size": 16, "logicalType": "uuid"}
    elif iceberg.startswith("fixed["):
        size = int(iceberg[len("fixed["):-1])
        name, spec = f"fixed_{size}", {"size": size}
    elif iceberg.startswith("decimal("):
        precision, scale = _decimal(iceberg)
        name = f"decimal_{precision}_{scale}"
        spec = {"size": decimal_bytes(precision), "logicalType": "decimal",
                "precision": precision, "scale": scale}
    else:
        raise ValueError(f"No Avro type for Iceberg type {iceberg}")
    if name in defined:
        return name
    defined.add(name)
    return {"type": "fixed", "name": name, **spec}


def avro_value(iceberg: str, value: Any) -> Any:
    """An Iceberg value as its Avro field holds it (decimals: fixed-size two's complement)."""
    if value is None:
        return None
    if iceberg.startswith("decimal("):
        return unscaled_bytes(int(value), decimal_bytes(_decimal(iceberg)[0]))
    return value
