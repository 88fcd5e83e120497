"""Primary-key tables' options: checking a definition and its properties, and the merge
engine and sequence field they give (options follow columns by field id)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import pyarrow as pa

from arrowlake.errors import SchemaMismatch, ValidationError
from arrowlake.io.writer import (
    WriteOptions,
)
from arrowlake.merge import (
    ENGINES,
    ROW_KIND,
    SEQUENCE,
    MergeEngine,
    engine_from_options,
)
from arrowlake.merge.runs import KIND_COLUMN
from arrowlake.metastore.records import (
    DELETION_VECTORS_PROPERTY,
    MODE_SWITCHES_PROPERTY,
    TableRecord,
)
from arrowlake.schema import field_id, find_field
from arrowlake.table.options.compaction import CompactionOptions, compaction_options
from arrowlake.table.options.maintenance import maintenance_policy


class KeyedTable(Protocol):
    """What these options read of a table (a :class:`~arrowlake.table.state.TableState`)."""

    record: TableRecord

    @property
    def schema(self) -> pa.Schema: ...

    @property
    def name(self) -> str: ...

DEFAULT_BUCKETS = 4

_KEY_TYPES = "integers, strings, binaries, dates, times, timestamps, booleans and decimals"


def _key_type_ok(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_string_view(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
            or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_timestamp(t)
            or pa.types.is_boolean(t) or pa.types.is_decimal(t))


_OPTION_NAMES = ("merge_engine", "sequence_field", "aggregations", "ignore_delete",
                 "partial_update_ignore_delete", "default_aggregation", "changelog_producer",
                 "deletion_vectors")


def validate_pk_options(schema: pa.Schema, primary_key: Sequence[str],
                        partition_by: Sequence[str], buckets: int | None,
                        props: dict[str, str], options: Mapping[str, Any]
                        ) -> tuple[pa.Schema, int | None, dict[str, str]]:
    """Check a primary-key table's definition; return its schema (keys non-null), buckets and
    properties. Every problem is a clear error before anything is created."""
    if MODE_SWITCHES_PROPERTY in props:
        raise ValidationError(f"Property '{MODE_SWITCHES_PROPERTY}' is written by mode switches "
                              "only; a new table has none")
    unknown = sorted(set(options) - set(_OPTION_NAMES))
    if unknown:
        raise ValidationError(
            f"Unknown table options: {', '.join(unknown)}; valid ones are "
            f"{', '.join(_OPTION_NAMES)}")
    if not primary_key:
        if options or buckets is not None:
            raise ValidationError(
                "merge_engine, sequence_field, aggregations and buckets need a primary_key")
        return schema, None, props
    if len(set(primary_key)) != len(primary_key):
        raise ValidationError(f"primary_key repeats columns: {list(primary_key)}")
    for name in primary_key:
        field = find_field(schema, name)
        if not _key_type_ok(field.type):
            raise SchemaMismatch(
                f"Column '{name}' of type {field.type} cannot be part of a primary key: key "
                f"columns may be {_KEY_TYPES}")
    for name in (ROW_KIND, SEQUENCE, KIND_COLUMN):
        if name in schema.names:
            raise SchemaMismatch(
                f"Column name '{name}' is reserved in primary-key tables; rename the column")
    missing = [p for p in partition_by if p not in primary_key]
    if missing:
        raise ValidationError(
            f"Partition columns must be part of the primary key; not in it: {missing}. Add them "
            "to primary_key (a key must map to one partition)")
    if buckets is None:
        buckets = DEFAULT_BUCKETS
    if not isinstance(buckets, int) or isinstance(buckets, bool) or buckets < 1:
        raise ValidationError(f"buckets must be a positive integer, got {buckets!r}")
    given = props.get("merge-engine")
    engine_name = str(options.get("merge_engine", given or "deduplicate"))
    if given is not None and given != engine_name:
        raise ValidationError(
            f"merge_engine='{engine_name}' and property 'merge-engine'='{given}' disagree; "
            "give one of them")
    if engine_name not in ENGINES:
        raise ValidationError(
            f"Unknown merge_engine '{engine_name}' (property 'merge-engine'); valid engines "
            f"are {', '.join(ENGINES)}")
    seq = options.get("sequence_field")
    if seq is not None:
        field = find_field(schema, seq)
        if seq in primary_key:
            raise ValidationError(f"sequence_field '{seq}' may not be part of the primary key")
        if not (pa.types.is_integer(field.type) or pa.types.is_timestamp(field.type)
                or pa.types.is_date(field.type) or pa.types.is_floating(field.type)
                or pa.types.is_decimal(field.type)):
            raise SchemaMismatch(
                f"sequence_field '{seq}' has type {field.type}; it must be a number, date or "
                "timestamp")
    aggregations = options.get("aggregations")
    if aggregations is not None and engine_name != "aggregation":
        raise ValidationError("aggregations= needs merge_engine='aggregation'")
    # Key columns never hold nulls: make that part of the schema, so writes check it.
    fields = [f.with_nullable(False) if f.name in primary_key else f for f in schema]
    schema = pa.schema(fields, metadata=schema.metadata)
    props = dict(props)
    props["merge-engine"] = engine_name
    if seq is not None:
        props["sequence-field"] = str(seq)
    for flag in ("ignore_delete", "partial_update_ignore_delete"):
        if options.get(flag):
            props[flag.replace("_", "-").replace("partial-update-", "partial-update.")] = "true"
    if aggregations:
        if not isinstance(aggregations, Mapping):
            raise ValidationError("aggregations must be a dict of column name to function")
        for column, function in aggregations.items():
            props[f"fields.{column}.aggregate-function"] = str(function)
    if options.get("default_aggregation"):
        props["fields.default-aggregate-function"] = str(options["default_aggregation"])
    props.setdefault("compaction.max-runs", str(CompactionOptions().max_runs))
    if "changelog_producer" in options:
        props["changelog-producer"] = check_producer(options["changelog_producer"],
                                                               primary_key)
    props[DELETION_VECTORS_PROPERTY] = _deletion_vectors_flag(options, props)
    # Builds the engine once so bad aggregation functions fail now.
    engine_from_options(engine_name, schema, list(primary_key), _engine_options(props))
    return schema, buckets, props


#: Changelog producers that work with deletion vectors: all of them (``input`` and
#: ``full-compaction`` through :mod:`arrowlake.table.changelogs.vectors`).
DELETION_VECTOR_PRODUCERS = frozenset({"none", "lookup", "input", "full-compaction"})


def default_deletion_vectors(props: Mapping[str, str]) -> bool:
    """The mode a new primary-key table with these properties gets when its creator does not
    choose one: deletion vectors (merge on write), unless its changelog producer needs
    merge-on-read (not in :data:`DELETION_VECTOR_PRODUCERS`; today every producer is in it)."""
    return props.get("changelog-producer", "none") in DELETION_VECTOR_PRODUCERS


def _deletion_vectors_flag(options: Mapping[str, Any], props: Mapping[str, str]) -> str:
    """The ``deletion-vectors.enabled`` value a new primary-key table records: the option
    ``deletion_vectors=``, else the property, else :func:`default_deletion_vectors`. Recorded
    either way, so the table keeps its mode if the default ever changes."""
    flag = options.get("deletion_vectors")
    given = props.get(DELETION_VECTORS_PROPERTY)
    if flag is None:
        if given is not None:
            return str(given).strip().lower()  # validate_properties checks the value
        return "true" if default_deletion_vectors(props) else "false"
    if not isinstance(flag, bool):
        raise ValidationError(f"deletion_vectors must be True or False, not {flag!r}")
    value = "true" if flag else "false"
    if given is not None and str(given).strip().lower() != value:
        raise ValidationError(
            f"deletion_vectors={flag} and property '{DELETION_VECTORS_PROPERTY}'={given!r} "
            "disagree; give one of them")
    return value


#: Properties that say how the runs already written merge: fixed once the table exists.
#: (``deletion-vectors.enabled`` is not: see :mod:`arrowlake.table.maintenance.mode_switch`.)
FIXED_PROPERTIES = ("merge-engine", "sequence-field", "ignore-delete",
                    "partial-update.ignore-delete", "aggregation.remove-record-on-delete",
                    "fields.default-aggregate-function")
_FLAG_PROPERTIES = ("ignore-delete", "partial-update.ignore-delete",
                    "aggregation.remove-record-on-delete")


def is_engine_property(name: str) -> bool:
    return name in FIXED_PROPERTIES or name.startswith("fields.")


def validate_properties(props: Mapping[str, str], primary_key: Sequence[str]) -> None:
    """Check every property arrowlake reads, so a malformed one fails when it is set, never
    in a later write. Unknown properties are kept as user metadata."""
    if "buckets" in props:
        raise ValidationError(
            "'buckets' is not a property: give buckets= to create_table(); a table's bucket "
            "count is fixed once rows are written")
    WriteOptions.from_properties(dict(props))
    compaction_options(props)
    maintenance_policy(props)
    run_cache_bytes(props)
    engine_props = sorted(k for k in props if is_engine_property(k)
                          or k in (DELETION_VECTORS_PROPERTY, MODE_SWITCHES_PROPERTY))
    if engine_props and not primary_key:
        raise ValidationError(
            f"Properties {engine_props} configure merge engines and need a table with a "
            "primary key")
    engine = props.get("merge-engine", "deduplicate")
    if engine not in ENGINES:
        raise ValidationError(
            f"Property 'merge-engine' must be one of {', '.join(ENGINES)}, not {engine!r}")
    rewrite_threshold(props)
    if DELETION_VECTORS_PROPERTY in props:
        value = str(props[DELETION_VECTORS_PROPERTY]).strip().lower()
        if value not in ("true", "false"):
            raise ValidationError(f"Property '{DELETION_VECTORS_PROPERTY}' must be 'true' or "
                                  f"'false', not {props[DELETION_VECTORS_PROPERTY]!r}")
        if value == "true" and not primary_key:
            raise ValidationError(f"Property '{DELETION_VECTORS_PROPERTY}' needs a table with "
                                  "a primary key (other tables have one row per write anyway)")
        producer = props.get("changelog-producer", "none")
        if value == "true" and producer not in DELETION_VECTOR_PRODUCERS:
            raise ValidationError(
                f"changelog-producer '{producer}' is not supported with deletion vectors; use "
                f"one of {', '.join(sorted(DELETION_VECTOR_PRODUCERS))}, or "
                "deletion_vectors=False")
    flags = [k for k in props if k in _FLAG_PROPERTIES or
             (k.startswith("fields.") and k.endswith(".ignore-retract"))]
    for name in flags:
        if str(props[name]).strip().lower() not in ("true", "false"):
            raise ValidationError(
                f"Property '{name}' must be 'true' or 'false', not {props[name]!r}")


def _engine_options(props: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in props.items()
            if k.startswith("fields.") or k in ("ignore-delete", "partial-update.ignore-delete",
                                                "aggregation.remove-record-on-delete")}


def translate_properties(props: Mapping[str, str], old: pa.Schema, new: pa.Schema
                         ) -> dict[str, str]:
    """``props`` with the columns its merge options name (``sequence-field``,
    ``fields.<column>.*``) renamed from ``old`` to ``new`` by field id. Options of columns
    ``new`` lacks are left out (a column added after an old snapshot)."""
    ids = {f.name: field_id(f) for f in old}
    names = {field_id(f): f.name for f in new}

    def renamed(column: str) -> str | None:
        fid = ids.get(column)
        return column if fid is None else names.get(fid)

    out: dict[str, str] = {}
    for name, value in props.items():
        if name == "sequence-field":
            out[name] = renamed(value) or value
        elif name.startswith("fields.") and name != "fields.default-aggregate-function":
            parts = name.split(".")
            column = renamed(".".join(parts[1:-1]))
            if column is not None:
                out[f"fields.{column}.{parts[-1]}"] = value
        else:
            out[name] = value
    return out


def _properties_for(table: KeyedTable, schema: pa.Schema | None) -> dict[str, str]:
    props = table.record.properties
    if schema is None or schema.equals(table.schema, check_metadata=True):
        return dict(props)
    return translate_properties(props, table.schema, schema)


def merge_engine(table: KeyedTable, schema: pa.Schema | None = None) -> MergeEngine:
    """The table's merge engine for reading files in ``schema`` (the current one by default):
    options follow columns by field id, so renames and time travel keep them."""
    props = _properties_for(table, schema)
    return engine_from_options(props.get("merge-engine", "deduplicate"),
                               table.schema if schema is None else schema,
                               list(table.record.primary_key), _engine_options(props))


def sequence_field(table: KeyedTable, schema: pa.Schema | None = None) -> str | None:
    return _properties_for(table, schema).get("sequence-field")


#: Column names primary-key tables use internally.
RESERVED_NAMES = (ROW_KIND, SEQUENCE, KIND_COLUMN)


def engine_columns(table: KeyedTable) -> list[str]:
    """Columns the table's merge options name: they may be renamed, not dropped."""
    props = table.record.properties
    names = [props["sequence-field"]] if "sequence-field" in props else []
    names += [".".join(k.split(".")[1:-1]) for k in props
              if k.startswith("fields.") and k != "fields.default-aggregate-function"]
    return names


def check_pk_schema(table: KeyedTable, schema: pa.Schema) -> dict[str, str]:
    """The properties a primary-key table gets with its new ``schema``, after checking that its
    merge engine still works on it (a new column must suit the default aggregate function)."""
    props = translate_properties(table.record.properties, table.schema, schema)
    engine_from_options(props.get("merge-engine", "deduplicate"), schema,
                        list(table.record.primary_key), _engine_options(props))
    return props


def require_primary_key(table: KeyedTable, what: str) -> None:
    if not table.record.primary_key:
        raise ValidationError(
            f"{what} needs a table with a primary key; '{table.name}' has none. Use append(), "
            "overwrite() or delete(), or create the table with primary_key=[...]")


REWRITE_THRESHOLD = "deletion-vectors.rewrite-threshold"
DEFAULT_REWRITE_THRESHOLD = 0.3


def rewrite_threshold(props: Mapping[str, str]) -> float:
    """The deleted fraction at which a file is rewritten (checked when the property is set)."""
    text = props.get(REWRITE_THRESHOLD)
    if text is None:
        return DEFAULT_REWRITE_THRESHOLD
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:
        raise ValidationError(
            f"Property '{REWRITE_THRESHOLD}' must be a fraction above 0 and at most 1 (the "
            f"share of a file's rows deleted before it is rewritten), not {text!r}")
    return value


# -- changelog producers and the run cache ----------------------------------------------------

PRODUCERS = ("none", "input", "lookup", "full-compaction")
def changelog_producer(table: KeyedTable) -> str:
    return table.record.properties.get("changelog-producer", "none")


def check_producer(value: object, primary_key: Sequence[str]) -> str:
    if value not in PRODUCERS:
        raise ValidationError(
            f"Unknown changelog_producer {value!r}; valid ones are {', '.join(PRODUCERS)}")
    if value != "none" and not primary_key:
        raise ValidationError(
            "changelog_producer needs a primary-key table: append tables' streams are exact "
            "without one")
    return str(value)


RUN_CACHE_PROPERTY = "write.run-cache-size"
LOOKUP_CACHE_PROPERTY = "changelog.lookup-cache-size"  # the older name, read first
DEFAULT_RUN_CACHE_BYTES = 256 * 1024 * 1024


def run_cache_bytes(props: Mapping[str, str]) -> int:
    """How many bytes of decoded runs a writer of the table keeps in memory between writes:
    the table property ``changelog.lookup-cache-size`` when set, else ``write.run-cache-size``;
    by default 256 MiB on ``lookup`` tables and 0 (off) on others. A malformed value of either
    raises :class:`~arrowlake.errors.ValidationError` naming it."""
    sizes = [_cache_size(props, name) for name in (LOOKUP_CACHE_PROPERTY, RUN_CACHE_PROPERTY)]
    default = DEFAULT_RUN_CACHE_BYTES if props.get("changelog-producer") == "lookup" else 0
    return next((size for size in sizes if size is not None), default)


def _cache_size(props: Mapping[str, str], name: str) -> int | None:
    value = props.get(name)
    if value is None or str(value).strip() == "":
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        number = -1
    if number < 0:
        raise ValidationError(
            f"Table property '{name}' must be a number of bytes (0 or more), not {value!r}")
    return number
