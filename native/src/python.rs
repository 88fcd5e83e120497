//! The Python module `arrowlake._native`: Arrow arrays in and out through the Arrow C data
//! interface (the PyCapsule protocol, `__arrow_c_array__`), without a copy; every kernel runs
//! with the GIL released. The typed API is `arrowlake/native.py`; call that, not this.
//!
//! Errors: a refused input raises `NativeInvalid` (a `ValueError`), a type the kernels do not
//! handle `NativeUnsupported` (a `TypeError`), and a panic `NativePanic` naming the operation
//! (caught, never unwound into Python or aborting the process).

use std::panic::{catch_unwind, AssertUnwindSafe};

use arrow_array::ffi::{from_ffi, FFI_ArrowArray, FFI_ArrowSchema};
use arrow_array::{
    make_array, Array, ArrayRef, BooleanArray, FixedSizeBinaryArray, Int32Array, Int64Array,
    UInt64Array,
};
use arrow_buffer::{Buffer, ScalarBuffer, ToByteSlice};
use arrow_data::ArrayData;
use arrow_schema::DataType;
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule, PyCapsuleMethods, PyList};

use crate::error::{ErrorKind, KernelError};
use crate::index::{self, Image, Kind};
use crate::keys::SortKeys;
use crate::{hash, runs, vectors, versions};

create_exception!(_native, NativeInvalid, PyValueError, "Input a native kernel refused.");
create_exception!(_native, NativeUnsupported, PyTypeError, "A type a native kernel does not handle.");
create_exception!(_native, NativePanic, PyRuntimeError, "A native kernel failed (a defect).");

fn to_py(e: KernelError) -> PyErr {
    match e.kind {
        ErrorKind::Invalid => NativeInvalid::new_err(e.message),
        ErrorKind::Unsupported => NativeUnsupported::new_err(e.message),
    }
}

/// Run `kernel` without the GIL; a panic becomes `NativePanic` naming `operation`.
fn run<T: Send>(
    py: Python<'_>,
    operation: &str,
    kernel: impl FnOnce() -> Result<T, KernelError> + Send,
) -> PyResult<T> {
    let outcome = py.detach(|| catch_unwind(AssertUnwindSafe(kernel)));
    match outcome {
        Ok(result) => result.map_err(to_py),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            Err(NativePanic::new_err(format!("native kernel '{operation}' panicked: {what}")))
        }
    }
}

/// An Arrow array from any object with `__arrow_c_array__` (a pyarrow Array), zero-copy.
fn import(obj: &Bound<'_, PyAny>) -> PyResult<ArrayRef> {
    let pair = obj.call_method0("__arrow_c_array__")?;
    let (schema, array): (Bound<'_, PyCapsule>, Bound<'_, PyCapsule>) = pair.extract()?;
    let schema_ptr = schema.pointer_checked(Some(c"arrow_schema"))?.cast::<FFI_ArrowSchema>();
    let array_ptr = array.pointer_checked(Some(c"arrow_array"))?.cast::<FFI_ArrowArray>();
    // SAFETY: the capsules are the producer's, named as the C data interface requires, so the
    // pointers are to a valid FFI_ArrowSchema and FFI_ArrowArray. `from_raw` moves the array
    // struct out and leaves a released one behind, so the capsule's destructor does not
    // release it again; the schema is only borrowed while its capsule is alive.
    let data = unsafe {
        let array = FFI_ArrowArray::from_raw(array_ptr.as_ptr());
        from_ffi(array, schema_ptr.as_ref())
    }
    .map_err(|e| NativeInvalid::new_err(format!("Cannot import an Arrow array: {e}")))?;
    Ok(make_array(data))
}

fn import_all(list: &Bound<'_, PyList>) -> PyResult<Vec<ArrayRef>> {
    list.iter().map(|o| import(&o)).collect()
}

fn import_optional(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<ArrayRef>> {
    match obj {
        Some(o) if !o.is_none() => Ok(Some(import(o)?)),
        _ => Ok(None),
    }
}

/// An Arrow array handed to Python through `__arrow_c_array__` (`pyarrow.array(out)`).
#[pyclass(frozen, module = "arrowlake._native")]
pub struct ArrowOut {
    data: ArrayData,
}

#[pymethods]
impl ArrowOut {
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyCapsule>, Bound<'py, PyCapsule>)> {
        let _ = requested_schema; // the array is exported in its own type
        let schema = FFI_ArrowSchema::try_from(self.data.data_type())
            .map_err(|e| NativePanic::new_err(format!("Cannot export an Arrow array: {e}")))?;
        let array = FFI_ArrowArray::new(&self.data);
        Ok((
            PyCapsule::new_with_value(py, schema, c"arrow_schema")?,
            PyCapsule::new_with_value(py, array, c"arrow_array")?,
        ))
    }

    fn __len__(&self) -> usize {
        self.data.len()
    }
}

fn out(data: ArrayData) -> ArrowOut {
    ArrowOut { data }
}

fn int64s(values: Vec<i64>) -> ArrowOut {
    out(Int64Array::from(values).into_data())
}

/// The values of an int64 array, shared with the producer (no copy).
fn as_i64s(array: &ArrayRef, what: &str) -> PyResult<ScalarBuffer<i64>> {
    let ints = array
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or_else(|| NativeInvalid::new_err(format!("{what} must be int64, not {}", array.data_type())))?;
    if ints.null_count() > 0 {
        return Err(NativeInvalid::new_err(format!("{what} may not be null")));
    }
    Ok(ints.values().clone())
}

/// The values of a uint64 array, shared with the producer (no copy).
fn as_u64s(array: &ArrayRef, what: &str) -> PyResult<ScalarBuffer<u64>> {
    let ints = array
        .as_any()
        .downcast_ref::<UInt64Array>()
        .ok_or_else(|| NativeInvalid::new_err(format!("{what} must be uint64, not {}", array.data_type())))?;
    if ints.null_count() > 0 {
        return Err(NativeInvalid::new_err(format!("{what} may not be null")));
    }
    Ok(ints.values().clone())
}

// -- bucket hash ----------------------------------------------------------------------------

/// The combined 64-bit hash of the key columns of every row (uint64).
#[pyfunction]
fn key_hash(py: Python<'_>, columns: &Bound<'_, PyList>) -> PyResult<ArrowOut> {
    let columns = import_all(columns)?;
    let h = run(py, "key_hash", || hash::key_hash(&columns))?;
    Ok(out(UInt64Array::from(h).into_data()))
}

/// The bucket of every row (int32).
#[pyfunction]
fn bucket_of(py: Python<'_>, columns: &Bound<'_, PyList>, buckets: u32) -> PyResult<ArrowOut> {
    let columns = import_all(columns)?;
    let b = run(py, "bucket_of", || hash::bucket_of(&columns, buckets))?;
    Ok(out(Int32Array::from(b).into_data()))
}

// -- merge kernel ---------------------------------------------------------------------------

/// `(order, starts)`: rows by key then version, and where each key's versions start.
#[pyfunction]
#[pyo3(signature = (keys, sequence_field, seq))]
fn group_versions(
    py: Python<'_>,
    keys: &Bound<'_, PyList>,
    sequence_field: Option<&Bound<'_, PyAny>>,
    seq: &Bound<'_, PyAny>,
) -> PyResult<(ArrowOut, ArrowOut)> {
    let keys = import_all(keys)?;
    let field = import_optional(sequence_field)?;
    let seq = as_i64s(&import(seq)?, "'_seq'")?;
    let v = run(py, "group_versions", || {
        let sort_keys = SortKeys::new(&keys)?;
        let words = versions::VersionWords::new(field.as_deref(), &seq)?;
        versions::group_versions(&sort_keys, &words)
    })?;
    Ok((int64s(v.order), int64s(v.starts)))
}

/// The row of each key's newest version (oldest with `oldest`), in key order.
#[pyfunction]
#[pyo3(signature = (keys, sequence_field, seq, oldest))]
fn key_winners(
    py: Python<'_>,
    keys: &Bound<'_, PyList>,
    sequence_field: Option<&Bound<'_, PyAny>>,
    seq: &Bound<'_, PyAny>,
    oldest: bool,
) -> PyResult<ArrowOut> {
    let keys = import_all(keys)?;
    let field = import_optional(sequence_field)?;
    let seq = as_i64s(&import(seq)?, "'_seq'")?;
    let rows = run(py, "key_winners", || {
        let sort_keys = SortKeys::new(&keys)?;
        let words = versions::VersionWords::new(field.as_deref(), &seq)?;
        versions::winners(&sort_keys, &words, oldest)
    })?;
    Ok(int64s(rows))
}

type GroupsOut = Option<(ArrowOut, ArrowOut, ArrowOut)>;

fn groups_out(groups: Option<runs::Groups>) -> GroupsOut {
    groups.map(|g| (int64s(g.order), int64s(g.starts), int64s(g.codes)))
}

/// Rows sorted by group code then key: `(order, starts, codes)`, or None if a key repeats
/// within a group.
#[pyfunction]
fn sorted_groups(py: Python<'_>, keys: &Bound<'_, PyList>, codes: &Bound<'_, PyAny>) -> PyResult<GroupsOut> {
    let keys = import_all(keys)?;
    let codes = as_i64s(&import(codes)?, "Group codes")?;
    let groups = run(py, "sorted_groups", || {
        let sort_keys = SortKeys::new(&keys)?;
        runs::sorted_groups(&sort_keys, &codes)
    })?;
    Ok(groups_out(groups))
}

/// A write cut into sorted groups in one call: the bucket of every row (hashing
/// `hash_columns`), and the rows sorted by (bucket + buckets * partition code, `sort_columns`)
/// as `sorted_groups` gives them.
#[pyfunction]
#[pyo3(signature = (hash_columns, sort_columns, buckets, partition_codes=None))]
fn cut_groups(
    py: Python<'_>,
    hash_columns: &Bound<'_, PyList>,
    sort_columns: &Bound<'_, PyList>,
    buckets: u32,
    partition_codes: Option<&Bound<'_, PyAny>>,
) -> PyResult<(ArrowOut, GroupsOut)> {
    let hash_columns = import_all(hash_columns)?;
    let sort_columns = import_all(sort_columns)?;
    let partitions = match import_optional(partition_codes)? {
        Some(p) => Some(as_i64s(&p, "Partition codes")?),
        None => None,
    };
    let (of_rows, groups) = run(py, "cut_groups", || {
        let of_rows = hash::bucket_of(&hash_columns, buckets)?;
        if let Some(p) = &partitions {
            if p.len() != of_rows.len() {
                return Err(KernelError::invalid(format!(
                    "{} partition codes for {} rows",
                    p.len(),
                    of_rows.len()
                )));
            }
        }
        let codes = runs::group_codes(&of_rows, partitions.as_deref(), buckets);
        let sort_keys = SortKeys::new(&sort_columns)?;
        Ok((of_rows, runs::sorted_groups(&sort_keys, &codes)?))
    })?;
    Ok((out(Int32Array::from(of_rows).into_data()), groups_out(groups)))
}

// -- key index ------------------------------------------------------------------------------

/// An owned copy of an image's type and bytes (so the kernel runs without the GIL).
struct OwnedImage {
    kind: Kind,
    width: usize,
    data_type: DataType,
    array: ArrayRef,
}

impl OwnedImage {
    fn new(array: ArrayRef) -> PyResult<Self> {
        let data_type = array.data_type().clone();
        let (kind, width) = match &data_type {
            DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
                (Kind::Signed, data_type.primitive_width().unwrap_or(8))
            }
            DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => {
                (Kind::Unsigned, data_type.primitive_width().unwrap_or(8))
            }
            DataType::FixedSizeBinary(w) if *w > 0 => (Kind::Bytes, *w as usize),
            other => {
                return Err(NativeUnsupported::new_err(format!(
                    "Key images are integers or fixed-size binaries, not {other}"
                )))
            }
        };
        if array.null_count() > 0 {
            return Err(NativeInvalid::new_err("Key images may not be null"));
        }
        Ok(OwnedImage { kind, width, data_type, array })
    }

    fn bytes(&self) -> &[u8] {
        match self.kind {
            Kind::Bytes => self
                .array
                .as_any()
                .downcast_ref::<FixedSizeBinaryArray>()
                .map(|a| a.value_data())
                .unwrap_or(&[]),
            _ => primitive_bytes(self.array.as_ref()),
        }
    }

    fn image(&self) -> Result<Image<'_>, KernelError> {
        Image::new(self.kind, self.width, self.bytes())
    }

    /// A new array of this image's type holding `data`.
    fn with(&self, data: Vec<u8>) -> PyResult<ArrowOut> {
        let len = data.len() / self.width;
        let built = ArrayData::builder(self.data_type.clone())
            .len(len)
            // Copied into an aligned buffer: a Vec<u8> is only byte-aligned.
            .add_buffer(Buffer::from_slice_ref(&data))
            .build()
            .map_err(|e| NativePanic::new_err(format!("Cannot build a key image: {e}")))?;
        Ok(out(built))
    }
}

fn primitive_bytes(array: &dyn Array) -> &[u8] {
    use arrow_array::cast::AsArray;
    use arrow_array::types::*;
    match array.data_type() {
        DataType::Int8 => array.as_primitive::<Int8Type>().values().to_byte_slice(),
        DataType::Int16 => array.as_primitive::<Int16Type>().values().to_byte_slice(),
        DataType::Int32 => array.as_primitive::<Int32Type>().values().to_byte_slice(),
        DataType::Int64 => array.as_primitive::<Int64Type>().values().to_byte_slice(),
        DataType::UInt8 => array.as_primitive::<UInt8Type>().values().to_byte_slice(),
        DataType::UInt16 => array.as_primitive::<UInt16Type>().values().to_byte_slice(),
        DataType::UInt32 => array.as_primitive::<UInt32Type>().values().to_byte_slice(),
        DataType::UInt64 => array.as_primitive::<UInt64Type>().values().to_byte_slice(),
        _ => &[],
    }
}

fn image_of(obj: &Bound<'_, PyAny>) -> PyResult<OwnedImage> {
    OwnedImage::new(import(obj)?)
}

/// `(found, at)`: whether each key is in the sorted level, and where it is or would go.
#[pyfunction]
fn index_find(py: Python<'_>, level: &Bound<'_, PyAny>, keys: &Bound<'_, PyAny>) -> PyResult<(ArrowOut, ArrowOut)> {
    let (level, keys) = (image_of(level)?, image_of(keys)?);
    let (found, at) = run(py, "index_find", || index::find(&level.image()?, &keys.image()?))?;
    Ok((out(BooleanArray::from(found).into_data()), int64s(at)))
}

/// numpy's bools viewed as uint8: shared, not converted (a base can hold millions).
fn dead_flags(obj: &Bound<'_, PyAny>) -> PyResult<ScalarBuffer<u8>> {
    let dead = import(obj)?;
    Ok(dead
        .as_any()
        .downcast_ref::<arrow_array::UInt8Array>()
        .ok_or_else(|| NativeInvalid::new_err("Dead flags must be uint8 (numpy bools as bytes)"))?
        .values()
        .clone())
}

/// `KeyIndex.search`: `(slots, incoming)`.
#[pyfunction]
fn index_search(
    py: Python<'_>,
    base: &Bound<'_, PyAny>,
    dead: &Bound<'_, PyAny>,
    recent: &Bound<'_, PyAny>,
    keys: &Bound<'_, PyAny>,
) -> PyResult<(ArrowOut, ArrowOut)> {
    let (base, recent, keys) = (image_of(base)?, image_of(recent)?, image_of(keys)?);
    let dead = dead_flags(dead)?;
    let (slots, incoming) = run(py, "index_search", || {
        index::search(&base.image()?, &dead, &recent.image()?, &keys.image()?)
    })?;
    Ok((int64s(slots), int64s(incoming)))
}

/// `index_search` of many buckets in one call, the buckets in parallel:
/// `[(base, dead, recent, keys)]` -> `[(slots, incoming)]`.
#[pyfunction]
fn index_search_many(py: Python<'_>, buckets: &Bound<'_, PyList>) -> PyResult<Vec<(ArrowOut, ArrowOut)>> {
    let mut owned = Vec::new();
    for bucket in buckets.iter() {
        let (base, dead, recent, keys): (Bound<'_, PyAny>, Bound<'_, PyAny>, Bound<'_, PyAny>, Bound<'_, PyAny>) =
            bucket.extract()?;
        owned.push((image_of(&base)?, dead_flags(&dead)?, image_of(&recent)?, image_of(&keys)?));
    }
    let found = run(py, "index_search_many", || {
        use rayon::prelude::*;
        owned
            .par_iter()
            .map(|(base, dead, recent, keys)| {
                index::search(&base.image()?, dead, &recent.image()?, &keys.image()?)
            })
            .collect::<Result<Vec<_>, KernelError>>()
    })?;
    Ok(found.into_iter().map(|(slots, incoming)| (int64s(slots), int64s(incoming))).collect())
}

/// One bucket's step for `index_advance_many` as Python gives it.
type StepIn<'py> = (
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyList>,
    i64,
);

/// One bucket's step for `index_advance_many`, owned so that the kernel runs without the GIL.
struct Step {
    base: OwnedImage,
    base_locators: ScalarBuffer<i64>,
    dead: ScalarBuffer<u8>,
    recent: OwnedImage,
    recent_locators: ScalarBuffer<i64>,
    removed: ScalarBuffer<i64>,
    added: Vec<OwnedImage>,
    first_file: i64,
}

/// What `index_advance_many` gives per bucket: `(dead, recent, recent locators)` over the same
/// base, `(base, base locators)` for a new base, or None.
type Stepped = Option<(ArrowOut, ArrowOut, Option<ArrowOut>)>;

/// `KeyIndex.advanced` of many buckets in one call, the buckets in parallel: `[(base, base
/// locators, dead, recent, recent locators, removed slots, [added images], first file
/// number)]` and the recent level's share -> per bucket `(dead, recent, recent locators)`,
/// `(base, base locators, None)`, or None (see `index::advance`).
#[pyfunction]
fn index_advance_many(py: Python<'_>, steps: &Bound<'_, PyList>, recent_share: usize) -> PyResult<Vec<Stepped>> {
    let mut owned = Vec::new();
    for step in steps.iter() {
        let (base, base_locators, dead, recent, recent_locators, removed, added, first_file): StepIn<'_> =
            step.extract()?;
        owned.push(Step {
            base: image_of(&base)?,
            base_locators: as_i64s(&import(&base_locators)?, "Locators")?,
            dead: dead_flags(&dead)?,
            recent: image_of(&recent)?,
            recent_locators: as_i64s(&import(&recent_locators)?, "Locators")?,
            removed: as_i64s(&import(&removed)?, "Removed slots")?,
            added: added.iter().map(|a| image_of(&a)).collect::<PyResult<_>>()?,
            first_file,
        });
    }
    let advanced = run(py, "index_advance_many", || {
        use rayon::prelude::*;
        owned
            .par_iter()
            .map(|step| {
                let added = step.added.iter().map(|a| a.image()).collect::<Result<Vec<_>, KernelError>>()?;
                index::advance(
                    &step.base.image()?,
                    &step.base_locators,
                    &step.dead,
                    &step.recent.image()?,
                    &step.recent_locators,
                    &step.removed,
                    &added,
                    step.first_file,
                    recent_share,
                )
            })
            .collect::<Result<Vec<_>, KernelError>>()
    })?;
    owned
        .iter()
        .zip(advanced)
        .map(|(step, a)| {
            a.map(|a| match a {
                index::Advanced::Levels { dead, recent, recent_locators } => Ok((
                    out(arrow_array::UInt8Array::from(dead).into_data()),
                    step.recent.with(recent)?,
                    Some(int64s(recent_locators)),
                )),
                index::Advanced::Base { base, base_locators } => {
                    Ok((step.base.with(base)?, int64s(base_locators), None))
                }
            })
            .transpose()
        })
        .collect()
}

/// Two sorted levels as one: `(image, locators)`, or None if they share a key.
#[pyfunction]
fn index_merge(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    a_locators: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
    b_locators: &Bound<'_, PyAny>,
) -> PyResult<Option<(ArrowOut, ArrowOut)>> {
    let (a, b) = (image_of(a)?, image_of(b)?);
    let a_loc = as_i64s(&import(a_locators)?, "Locators")?;
    let b_loc = as_i64s(&import(b_locators)?, "Locators")?;
    let merged = run(py, "index_merge", || index::merge(&a.image()?, &a_loc, &b.image()?, &b_loc))?;
    match merged {
        None => Ok(None),
        Some((data, locators)) => Ok(Some((a.with(data)?, int64s(locators)))),
    }
}

/// `key_index.build` of many buckets in one call, the buckets in parallel: per bucket
/// `[(sorted image, deleted positions or None)]` -> `(image, locators)`, or None when its
/// images differ in type or a key is live twice.
#[pyfunction]
fn index_build_many(py: Python<'_>, buckets: &Bound<'_, PyList>) -> PyResult<Vec<Option<(ArrowOut, ArrowOut)>>> {
    let mut owned: Vec<Vec<(OwnedImage, Option<ScalarBuffer<u64>>)>> = Vec::new();
    for parts in buckets.iter() {
        let mut bucket = Vec::new();
        for part in parts.cast::<PyList>()?.iter() {
            let (image, deleted): (Bound<'_, PyAny>, Bound<'_, PyAny>) = part.extract()?;
            let deleted = match import_optional(Some(&deleted))? {
                Some(d) => Some(as_u64s(&d, "Deleted positions")?),
                None => None,
            };
            bucket.push((image_of(&image)?, deleted));
        }
        owned.push(bucket);
    }
    let built = run(py, "index_build_many", || {
        use rayon::prelude::*;
        owned
            .par_iter()
            .map(|bucket| {
                if bucket.is_empty() || bucket.iter().any(|(i, _)| i.data_type != bucket[0].0.data_type) {
                    return Ok(None);
                }
                let parts: Vec<(Image<'_>, Option<&[u64]>)> = bucket
                    .iter()
                    .map(|(image, deleted)| Ok((image.image()?, deleted.as_deref())))
                    .collect::<Result<_, KernelError>>()?;
                index::build(&parts)
            })
            .collect::<Result<Vec<_>, KernelError>>()
    })?;
    owned
        .iter()
        .zip(built)
        .map(|(bucket, b)| b.map(|(data, locators)| Ok((bucket[0].0.with(data)?, int64s(locators)))).transpose())
        .collect()
}

// -- deletion vectors -----------------------------------------------------------------------

/// The `deletion-vector-v1` blob of `new` positions united with `old` (uint64 arrays), and
/// its cardinality.
#[pyfunction]
#[pyo3(signature = (new, old=None))]
fn vector_encode<'py>(
    py: Python<'py>,
    new: &Bound<'py, PyAny>,
    old: Option<&Bound<'py, PyAny>>,
) -> PyResult<(Bound<'py, PyBytes>, u64)> {
    let new = as_u64s(&import(new)?, "Positions")?;
    let old = match import_optional(old)? {
        Some(o) => Some(as_u64s(&o, "Positions")?),
        None => None,
    };
    let (blob, cardinality) = run(py, "vector_encode", || Ok(vectors::encode(&new, old.as_deref())))?;
    Ok((PyBytes::new(py, &blob), cardinality))
}

/// Many files' new vectors in one call, in parallel: `[(new positions, current blob or None,
/// its cardinality)]` -> `[(blob, cardinality)]`, each the union of the file's current vector
/// and its new positions. A damaged blob fails the call naming its place in the list.
#[pyfunction]
fn vector_extend_many<'py>(py: Python<'py>, files: &Bound<'py, PyList>) -> PyResult<Vec<(Bound<'py, PyBytes>, u64)>> {
    let mut owned = Vec::new();
    for file in files.iter() {
        let (new, old, cardinality): (Bound<'py, PyAny>, Option<Vec<u8>>, u64) = file.extract()?;
        owned.push((as_u64s(&import(&new)?, "Positions")?, old, cardinality));
    }
    let extended = run(py, "vector_extend_many", || {
        use rayon::prelude::*;
        owned
            .par_iter()
            .enumerate()
            .map(|(i, (new, old, cardinality))| {
                vectors::extend(new, old.as_deref().map(|b| (b, *cardinality)))
                    .map_err(|e| KernelError::invalid(format!("file {i} of the list: {e}")))
            })
            .collect::<Result<Vec<_>, KernelError>>()
    })?;
    Ok(extended.into_iter().map(|(blob, card)| (PyBytes::new(py, &blob), card)).collect())
}

/// The positions of a `deletion-vector-v1` blob, ascending (uint64).
#[pyfunction]
fn vector_decode(py: Python<'_>, blob: &[u8]) -> PyResult<ArrowOut> {
    let blob = blob.to_vec();
    let positions = run(py, "vector_decode", || vectors::decode(&blob))?;
    Ok(out(UInt64Array::from(positions).into_data()))
}

/// The portable 64-bit roaring bytes of `positions` (run-optimized), unframed.
#[pyfunction]
fn bitmap_serialize<'py>(py: Python<'py>, positions: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let positions = as_u64s(&import(positions)?, "Positions")?;
    let bytes = run(py, "bitmap_serialize", || Ok(vectors::serialize(&mut vectors::bitmap(&positions))))?;
    Ok(PyBytes::new(py, &bytes))
}

/// The positions of portable 64-bit roaring bytes (unframed), ascending.
#[pyfunction]
fn bitmap_positions(py: Python<'_>, data: &[u8]) -> PyResult<ArrowOut> {
    let data = data.to_vec();
    let positions = run(py, "bitmap_positions", || vectors::positions(&data))?;
    Ok(out(UInt64Array::from(positions).into_data()))
}

/// Panics inside a kernel, on a worker thread: the tests check it surfaces as an error.
#[pyfunction]
fn _panic(py: Python<'_>) -> PyResult<()> {
    run(py, "_panic", || {
        use rayon::prelude::*;
        let total: u64 = (0..4u64).into_par_iter().map(|i| if i == 3 { panic!("deliberate") } else { i }).sum();
        Ok(total).map(|_| ())
    })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("NativeInvalid", py.get_type::<NativeInvalid>())?;
    m.add("NativeUnsupported", py.get_type::<NativeUnsupported>())?;
    m.add("NativePanic", py.get_type::<NativePanic>())?;
    m.add_class::<ArrowOut>()?;
    m.add_function(wrap_pyfunction!(key_hash, m)?)?;
    m.add_function(wrap_pyfunction!(bucket_of, m)?)?;
    m.add_function(wrap_pyfunction!(group_versions, m)?)?;
    m.add_function(wrap_pyfunction!(key_winners, m)?)?;
    m.add_function(wrap_pyfunction!(sorted_groups, m)?)?;
    m.add_function(wrap_pyfunction!(cut_groups, m)?)?;
    m.add_function(wrap_pyfunction!(index_find, m)?)?;
    m.add_function(wrap_pyfunction!(index_search, m)?)?;
    m.add_function(wrap_pyfunction!(index_search_many, m)?)?;
    m.add_function(wrap_pyfunction!(index_advance_many, m)?)?;
    m.add_function(wrap_pyfunction!(index_merge, m)?)?;
    m.add_function(wrap_pyfunction!(index_build_many, m)?)?;
    m.add_function(wrap_pyfunction!(vector_encode, m)?)?;
    m.add_function(wrap_pyfunction!(vector_extend_many, m)?)?;
    m.add_function(wrap_pyfunction!(vector_decode, m)?)?;
    m.add_function(wrap_pyfunction!(bitmap_serialize, m)?)?;
    m.add_function(wrap_pyfunction!(bitmap_positions, m)?)?;
    m.add_function(wrap_pyfunction!(_panic, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
