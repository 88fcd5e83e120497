"""The native core of the key path: typed entry points to the Rust extension ``arrowlake._native``.

The extension (``native/`` in the repository, built by maturin with the package) holds the hot
loops of primary-key writes and merges: the bucket hash, cutting a write into sorted groups, the
per-bucket key index, deletion vectors and the merge kernel's sort. Arrow arrays cross into it
through the Arrow C data interface without a copy; each kernel runs with the GIL released, on
Rayon's threads. Kernels return indices, hashes or bytes; Arrow does the column work here.

It is the only implementation: ``pip install -e .`` builds it (Rust and cargo needed), and a
call without it raises :class:`~arrowlake.errors.ArrowlakeError` saying so. Errors map onto
arrowlake's: input a kernel refuses raises :class:`~arrowlake.errors.ValidationError` (a type
it does not take, :class:`NativeUnsupported`, is one), and a panic inside a kernel (a defect)
raises :class:`~arrowlake.errors.ArrowlakeError` naming the operation; the process never aborts.

>>> import pyarrow as pa
>>> from arrowlake import native
>>> native.bucket_of([pa.array([1, 2, 3])], 16).to_pylist()
[5, 10, 0]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from arrowlake.errors import ArrowlakeError, ValidationError

_T = TypeVar("_T")

_module: ModuleType | None = None
_import_error: ImportError | None = None
try:
    import arrowlake._native

    _module = arrowlake._native
except ImportError as _exc:  # not built (a source tree without `pip install -e .`)
    _import_error = _exc


class NativeUnsupported(ValidationError):
    """Input of a type a kernel does not take (a nested key column, a key image of another
    dtype than integers or fixed-width bytes)."""


def available() -> bool:
    """Whether the extension was built and imports."""
    return _module is not None


def _lib() -> Any:
    if _module is None:
        raise ArrowlakeError(
            f"arrowlake's native core (arrowlake._native) is not built ({_import_error}); "
            "primary-key tables need it. Build it with `pip install -e .` (needs Rust 1.90+ "
            "and cargo)")
    return _module


def _call(operation: str, kernel: Callable[..., _T], *args: Any) -> _T:
    """Call a kernel, mapping its errors onto arrowlake's."""
    lib = _lib()
    try:
        return kernel(*args)
    except lib.NativeUnsupported as exc:
        raise NativeUnsupported(f"{exc} (in {operation})") from None
    except lib.NativeInvalid as exc:
        raise ValidationError(f"{exc} (in {operation})") from None
    except lib.NativePanic as exc:
        raise ArrowlakeError(
            f"arrowlake's native kernel '{operation}' failed: {exc}. This is a defect in "
            "arrowlake; please report it") from None
    except BaseException as exc:
        # pyo3's PanicException (a BaseException) for a panic outside a kernel's guard.
        if type(exc).__name__ == "PanicException":
            raise ArrowlakeError(
                f"arrowlake's native kernel '{operation}' failed: {exc}. This is a defect in "
                "arrowlake; please report it") from None
        raise


# -- conversions ------------------------------------------------------------------------------


def _array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks()
    return column


def _ints(values: np.ndarray, dtype: type[np.generic]) -> pa.Array:
    return pa.array(np.ascontiguousarray(values, dtype=dtype))


def _numpy(out: Any) -> np.ndarray:
    """A kernel's Arrow output as numpy (zero-copy for integers)."""
    return np.asarray(pa.array(out).to_numpy(zero_copy_only=False))


def image_array(image: np.ndarray) -> pa.Array:
    """A key image (``sortable_key``: integers, or ``S<width>`` byte strings) as Arrow, without
    a copy: integers as themselves, byte strings as ``fixed_size_binary(width)``."""
    if image.dtype.kind == "S":
        width = image.dtype.itemsize
        data = np.ascontiguousarray(image)
        return pa.Array.from_buffers(pa.binary(width), len(data),
                                     [None, pa.py_buffer(data.view(np.uint8))])
    if image.dtype.kind in "iu":
        return pa.array(np.ascontiguousarray(image))
    raise NativeUnsupported(f"Key images of dtype {image.dtype}")


def image_numpy(array: Any, like: np.dtype) -> np.ndarray:
    """A kernel's key image back as numpy, in dtype ``like``."""
    arrow = pa.array(array)
    if like.kind == "S":
        width = like.itemsize
        n = len(arrow)
        buffer = arrow.buffers()[1]
        if n == 0 or buffer is None:
            return np.empty(0, like)
        return np.frombuffer(buffer, dtype=like, count=n, offset=arrow.offset * width)
    return np.asarray(arrow.to_numpy(zero_copy_only=False), dtype=like)


# -- the bucket hash --------------------------------------------------------------------------


def key_hash(columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """The combined 64-bit bucket hash of the key columns of every row (uint64)."""
    arrays = [_array(c) for c in columns]
    return _numpy(_call("key_hash", _lib().key_hash, arrays))


def bucket_of(columns: Sequence[pa.Array | pa.ChunkedArray], buckets: int) -> pa.Array:
    """The bucket of every row, as an int32 array."""
    arrays = [_array(c) for c in columns]
    return pa.array(_call("bucket_of", _lib().bucket_of, arrays, int(buckets)))


# -- the merge kernel -------------------------------------------------------------------------


def sortable(kind: pa.DataType) -> bool:
    """Whether the native kernels sort key columns of this type (not nested types)."""
    if pa.types.is_dictionary(kind):
        return sortable(kind.value_type)
    t = pa.types
    return bool(
        t.is_integer(kind) or t.is_floating(kind) or t.is_boolean(kind) or t.is_date(kind)
        or t.is_time(kind)
        or t.is_timestamp(kind) or t.is_duration(kind) or t.is_decimal(kind)
        or t.is_string(kind) or t.is_large_string(kind) or t.is_string_view(kind)
        or t.is_binary(kind) or t.is_large_binary(kind) or t.is_binary_view(kind)
        or t.is_fixed_size_binary(kind))


def group_versions(keys: Sequence[pa.Array | pa.ChunkedArray],
                   sequence_field: pa.Array | pa.ChunkedArray | None,
                   seq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(order, starts)``: row indices sorted by key, then from the oldest version to the
    newest (by ``sequence_field``, nulls oldest, then ``seq``, then input position), and where
    each key's versions start in ``order``. Raises :class:`NativeUnsupported` for key types
    the kernel does not sort."""
    arrays = [_array(c) for c in keys]
    if not all(sortable(a.type) for a in arrays):
        raise NativeUnsupported("key type")
    field = None if sequence_field is None else _array(sequence_field)
    order, starts = _call("group_versions", _lib().group_versions, arrays, field,
                          _ints(seq, np.int64))
    return _numpy(order), _numpy(starts)


def winners(keys: Sequence[pa.Array | pa.ChunkedArray],
            sequence_field: pa.Array | pa.ChunkedArray | None, seq: np.ndarray, *,
            oldest: bool = False) -> np.ndarray:
    """The row of each key's newest version (with ``oldest``, its oldest), in key order: the
    last (first) row of each key in :func:`group_versions`' order, without ordering every
    key's versions. Raises :class:`NativeUnsupported` for key types the kernel does not
    sort."""
    arrays = [_array(c) for c in keys]
    if not all(sortable(a.type) for a in arrays):
        raise NativeUnsupported("key type")
    field = None if sequence_field is None else _array(sequence_field)
    return _numpy(_call("key_winners", _lib().key_winners, arrays, field,
                        _ints(seq, np.int64), bool(oldest)))


def sorted_groups(keys: Sequence[pa.Array | pa.ChunkedArray], codes: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Rows sorted by ``codes`` (one write's group per row: bucket plus buckets times the
    partition's code), then by key: ``(order, starts, codes)`` with each group's first
    position in ``order`` and its code; None when a key repeats within a group."""
    arrays = [_array(c) for c in keys]
    if not all(sortable(a.type) for a in arrays):
        raise NativeUnsupported("key type")
    found = _call("sorted_groups", _lib().sorted_groups, arrays, _ints(codes, np.int64))
    if found is None:
        return None
    order, starts, group_codes = found
    return _numpy(order), _numpy(starts), _numpy(group_codes)


def cut_groups(hash_columns: Sequence[pa.Array | pa.ChunkedArray],
               sort_columns: Sequence[pa.Array | pa.ChunkedArray], buckets: int,
               partition_codes: np.ndarray | None = None
               ) -> tuple[pa.Array, tuple[np.ndarray, np.ndarray, np.ndarray] | None]:
    """One write cut into sorted groups in one call: ``(bucket of every row, groups)``, where
    ``groups`` is what :func:`sorted_groups` returns for the codes ``bucket + buckets *
    partition_codes`` (``partition_codes``: the row's partition as a small integer, the
    combined dictionary codes of the partition columns; None without partitions)."""
    hashed = [_array(c) for c in hash_columns]
    arrays = [_array(c) for c in sort_columns]
    if not all(sortable(a.type) for a in arrays):
        raise NativeUnsupported("key type")
    codes = None if partition_codes is None else _ints(partition_codes, np.int64)
    of_rows, found = _call("cut_groups", _lib().cut_groups, hashed, arrays, int(buckets), codes)
    groups = None
    if found is not None:
        order, starts, group_codes = found
        groups = (_numpy(order), _numpy(starts), _numpy(group_codes))
    return pa.array(of_rows), groups


# -- the key index ----------------------------------------------------------------------------


def index_find(level: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per key, whether the sorted ``level`` holds it and where it is or would go (numpy's
    ``searchsorted``)."""
    found, at = _call("index_find", _lib().index_find, image_array(level), image_array(keys))
    return _numpy(found).astype(bool, copy=False), _numpy(at)


def index_search(base: np.ndarray, dead: np.ndarray, recent: np.ndarray, keys: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``KeyIndex.search``: ``(slots, indices into keys)`` of the keys live in the index."""
    slots, incoming = _call("index_search", _lib().index_search, image_array(base),
                            pa.array(np.ascontiguousarray(dead, dtype=bool).view(np.uint8)),
                            image_array(recent),
                            image_array(keys))
    return _numpy(slots), _numpy(incoming)


def index_search_many(buckets: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
                      ) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`index_search` of many buckets (``(base, dead, recent, keys)`` each) in one call,
    the buckets searched in parallel."""
    given = [(image_array(base), pa.array(np.ascontiguousarray(dead, dtype=bool).view(np.uint8)),
              image_array(recent), image_array(keys)) for base, dead, recent, keys in buckets]
    found = _call("index_search_many", _lib().index_search_many, given)
    return [(_numpy(slots), _numpy(incoming)) for slots, incoming in found]


#: One bucket after :func:`index_advance_many`: ``("levels", dead, recent, recent locators)``
#: over the same base, or ``("base", base, base locators)``.
Advanced = tuple[str, np.ndarray, np.ndarray] | tuple[str, np.ndarray, np.ndarray, np.ndarray]


def index_advance_many(steps: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                             np.ndarray, np.ndarray, Sequence[np.ndarray], int]],
                       recent_share: int) -> list[Advanced | None]:
    """``KeyIndex.advanced`` of many buckets in one call, in parallel: each ``(base, base
    locators, dead, recent, recent locators, removed slots, added images, first file number)``
    to its new levels, or to a new base once the recent level holds more than
    ``1/recent_share`` of the base; None when the index would not hold each key once."""
    given = [(image_array(base), _ints(base_locators, np.int64),
              pa.array(np.ascontiguousarray(dead, dtype=bool).view(np.uint8)),
              image_array(recent), _ints(recent_locators, np.int64), _ints(removed, np.int64),
              [image_array(image) for image in added], int(first_file))
             for base, base_locators, dead, recent, recent_locators, removed, added, first_file
             in steps]
    advanced = _call("index_advance_many", _lib().index_advance_many, given, int(recent_share))
    out: list[Advanced | None] = []
    for step, result in zip(steps, advanced, strict=True):
        if result is None:
            out.append(None)
        elif result[2] is None:
            out.append(("base", image_numpy(result[0], step[0].dtype), _numpy(result[1])))
        else:
            out.append(("levels", _numpy(result[0]).view(bool),
                        image_numpy(result[1], step[3].dtype), _numpy(result[2])))
    return out


def index_merge(a: np.ndarray, a_locators: np.ndarray, b: np.ndarray, b_locators: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
    """Two sorted levels of a key index as one, ``(None, None)`` if they share a key."""
    merged = _call("index_merge", _lib().index_merge, image_array(a), _ints(a_locators, np.int64),
                   image_array(b), _ints(b_locators, np.int64))
    if merged is None:
        return None, None
    image, locators = merged
    return image_numpy(image, a.dtype), _numpy(locators)


def index_build(parts: Sequence[tuple[np.ndarray, np.ndarray | None]]
                ) -> tuple[np.ndarray, np.ndarray] | None:
    """A key index's level built from files' sorted images (each with its deleted positions or
    None) as one sorted image with locators; None when the images differ in dtype or a key
    is live twice."""
    return index_build_many([parts])[0]


def index_build_many(buckets: Sequence[Sequence[tuple[np.ndarray, np.ndarray | None]]]
                     ) -> list[tuple[np.ndarray, np.ndarray] | None]:
    """:func:`index_build` of many buckets in one call, the buckets built in parallel."""
    fits = [bool(parts) and all(image.dtype == parts[0][0].dtype for image, _ in parts)
            for parts in buckets]
    given = [[(image_array(image), None if deleted is None else _ints(deleted, np.uint64))
              for image, deleted in parts] for parts, ok in zip(buckets, fits, strict=True) if ok]
    built = iter(_call("index_build_many", _lib().index_build_many, given))
    out: list[tuple[np.ndarray, np.ndarray] | None] = []
    for parts, ok in zip(buckets, fits, strict=True):
        one = next(built) if ok else None
        out.append(None if one is None else (image_numpy(one[0], parts[0][0].dtype),
                                             _numpy(one[1])))
    return out


# -- deletion vectors -------------------------------------------------------------------------


def vector_encode(new: np.ndarray, old: np.ndarray | None = None) -> tuple[bytes, int]:
    """The ``deletion-vector-v1`` blob of positions ``new`` united with ``old``, and its
    cardinality."""
    values = np.asarray(new)
    if values.size and values.min() < 0:
        raise ValueError("Row positions are never negative")
    old_array = None if old is None else _ints(old, np.uint64)
    blob, cardinality = _call("vector_encode", _lib().vector_encode, _ints(values, np.uint64),
                              old_array)
    return bytes(blob), int(cardinality)


def vector_extend_many(files: Sequence[tuple[np.ndarray, bytes | None, int]]
                       ) -> list[tuple[bytes, int]]:
    """Many files' new vectors in one call, in parallel: ``(new positions, the file's current
    blob or None, its cardinality)`` each, to ``(blob, cardinality)`` of their union. A
    damaged blob raises :class:`~arrowlake.errors.ValidationError` naming its place in the
    list."""
    given = []
    for new, old, cardinality in files:
        values = np.asarray(new)
        if values.size and values.min() < 0:
            raise ValueError("Row positions are never negative")
        given.append((_ints(values, np.uint64), old, int(cardinality)))
    extended = _call("vector_extend_many", _lib().vector_extend_many, given)
    return [(bytes(blob), int(cardinality)) for blob, cardinality in extended]


def vector_decode(blob: bytes | memoryview) -> np.ndarray:
    """The positions of a ``deletion-vector-v1`` blob (uint64, ascending); a damaged blob
    raises :class:`~arrowlake.errors.ValidationError` saying what is damaged."""
    lib = _lib()
    try:
        return _numpy(lib.vector_decode(bytes(blob)))
    except lib.NativeInvalid as exc:
        raise ValidationError(str(exc)) from None


def bitmap_serialize(positions: np.ndarray) -> bytes:
    """The portable 64-bit roaring bytes of ``positions``, run-optimized (what
    ``pyroaring.BitMap64.serialize()`` writes after ``run_optimize()``)."""
    return bytes(_call("bitmap_serialize", _lib().bitmap_serialize, _ints(positions, np.uint64)))


def bitmap_positions(data: bytes) -> np.ndarray:
    """The positions of portable 64-bit roaring bytes, ascending."""
    return _numpy(_call("bitmap_positions", _lib().bitmap_positions, bytes(data)))


__all__ = [
    "NativeUnsupported",
    "available",
    "bitmap_positions",
    "bitmap_serialize",
    "bucket_of",
    "cut_groups",
    "group_versions",
    "image_array",
    "image_numpy",
    "index_advance_many",
    "index_build",
    "index_build_many",
    "index_find",
    "index_merge",
    "index_search",
    "index_search_many",
    "key_hash",
    "sortable",
    "sorted_groups",
    "vector_decode",
    "vector_encode",
    "vector_extend_many",
    "winners",
]
