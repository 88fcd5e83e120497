//! Keys as one sortable form per row: what the sorts of the merge kernel and the cutting of a
//! write into sorted groups compare.
//!
//! A single integer-like column (integers of every width, booleans, dates, times, timestamps,
//! durations) becomes order-preserving `u64`s; any other key (strings, binaries, views,
//! decimals, dictionaries, several columns) becomes Arrow's row format, whose bytes compare
//! like the key columns in turn, as Arrow's `sort_indices` orders them.
//!
//! Floating-point keys (which tables refuse, but the merge engines take on their own) compare
//! as numbers with `-0.0` equal to `0.0`, and every NaN equal to every other NaN and above
//! `+inf`, as SQL's `GROUP BY` and Spark's grouping treat them: each value is normalized
//! first (`-0.0` to `0.0`, each NaN to one NaN), so the integer image and the row format both
//! see one bit pattern per value.

use std::cmp::Ordering;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, Float64Array};
use arrow_row::{RowConverter, Rows, SortField};
use arrow_schema::{DataType, TimeUnit};
use rayon::prelude::*;

use crate::error::{check_lengths, KernelError, Result};

const SIGN: u64 = 1 << 63;

/// The key of every row, in a form that orders and compares like the key.
pub enum SortKeys {
    Ints(Vec<u64>),
    Rows(Rows),
}

/// Whether a type can be part of a key the native kernels sort.
pub fn sortable(t: &DataType) -> bool {
    match t {
        DataType::Dictionary(_, value) => sortable(value),
        _ => integer_like(t)
            || floating(t)
            || matches!(
                t,
                DataType::Utf8
                    | DataType::LargeUtf8
                    | DataType::Utf8View
                    | DataType::Binary
                    | DataType::LargeBinary
                    | DataType::BinaryView
                    | DataType::FixedSizeBinary(_)
                    | DataType::Decimal32(_, _)
                    | DataType::Decimal64(_, _)
                    | DataType::Decimal128(_, _)
                    | DataType::Decimal256(_, _)
            ),
    }
}

fn floating(t: &DataType) -> bool {
    matches!(t, DataType::Float16 | DataType::Float32 | DataType::Float64)
}

/// A float as the one value that stands for it in a key: `-0.0` as `0.0`, every NaN as one.
#[inline]
fn key_float(v: f64) -> f64 {
    if v.is_nan() {
        f64::NAN
    } else if v == 0.0 {
        0.0
    } else {
        v
    }
}

/// A float's bits in numeric order (`-0.0` before `0.0`, negative NaNs first, positive ones
/// last): normalize with [`key_float`] first for key equality.
#[inline]
pub fn float_word(v: f64) -> u64 {
    let bits = v.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | SIGN
    }
}

/// A floating-point column (or a dictionary of one) as normalized `f64`s, one per row.
fn key_floats(array: &dyn Array) -> Option<Vec<f64>> {
    if let Some(dictionary) = array.as_any_dictionary_opt() {
        let values = key_floats(dictionary.values().as_ref())?;
        return Some(dictionary.normalized_keys().iter().map(|k| values[*k]).collect());
    }
    let values: Vec<f64> = match array.data_type() {
        DataType::Float16 => {
            array.as_primitive::<Float16Type>().values().iter().map(|v| v.to_f64()).collect()
        }
        DataType::Float32 => {
            array.as_primitive::<Float32Type>().values().iter().map(|v| *v as f64).collect()
        }
        DataType::Float64 => array.as_primitive::<Float64Type>().values().to_vec(),
        _ => return None,
    };
    Some(values.into_par_iter().with_min_len(65_536).map(key_float).collect())
}

pub fn integer_like(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Boolean
            | DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
            | DataType::Date32
            | DataType::Date64
            | DataType::Time32(_)
            | DataType::Time64(_)
            | DataType::Timestamp(_, _)
            | DataType::Duration(_)
    )
}

fn signed<T: ArrowPrimitiveType>(array: &dyn Array, f: fn(T::Native) -> i64) -> Vec<u64> {
    let values = array.as_primitive::<T>().values();
    values.par_iter().with_min_len(65_536).map(|v| (f(*v) as u64) ^ SIGN).collect()
}

fn unsigned<T: ArrowPrimitiveType>(array: &dyn Array, f: fn(T::Native) -> u64) -> Vec<u64> {
    let values = array.as_primitive::<T>().values();
    values.par_iter().with_min_len(65_536).map(|v| f(*v)).collect()
}

/// An integer-like column as `u64`s in the same order (values under nulls included as stored).
pub fn ordered_ints(array: &dyn Array) -> Option<Vec<u64>> {
    Some(match array.data_type() {
        DataType::Boolean => {
            let b = array.as_boolean().values();
            (0..array.len()).map(|i| b.value(i) as u64).collect()
        }
        DataType::Int8 => signed::<Int8Type>(array, |v| v as i64),
        DataType::Int16 => signed::<Int16Type>(array, |v| v as i64),
        DataType::Int32 => signed::<Int32Type>(array, |v| v as i64),
        DataType::Int64 => signed::<Int64Type>(array, |v| v),
        DataType::UInt8 => unsigned::<UInt8Type>(array, |v| v as u64),
        DataType::UInt16 => unsigned::<UInt16Type>(array, |v| v as u64),
        DataType::UInt32 => unsigned::<UInt32Type>(array, |v| v as u64),
        DataType::UInt64 => unsigned::<UInt64Type>(array, |v| v),
        DataType::Date32 => signed::<Date32Type>(array, |v| v as i64),
        DataType::Date64 => signed::<Date64Type>(array, |v| v),
        DataType::Time32(TimeUnit::Second) => signed::<Time32SecondType>(array, |v| v as i64),
        DataType::Time32(_) => signed::<Time32MillisecondType>(array, |v| v as i64),
        DataType::Time64(TimeUnit::Microsecond) => signed::<Time64MicrosecondType>(array, |v| v),
        DataType::Time64(_) => signed::<Time64NanosecondType>(array, |v| v),
        DataType::Timestamp(TimeUnit::Second, _) => signed::<TimestampSecondType>(array, |v| v),
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            signed::<TimestampMillisecondType>(array, |v| v)
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            signed::<TimestampMicrosecondType>(array, |v| v)
        }
        DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            signed::<TimestampNanosecondType>(array, |v| v)
        }
        DataType::Duration(TimeUnit::Second) => signed::<DurationSecondType>(array, |v| v),
        DataType::Duration(TimeUnit::Millisecond) => {
            signed::<DurationMillisecondType>(array, |v| v)
        }
        DataType::Duration(TimeUnit::Microsecond) => {
            signed::<DurationMicrosecondType>(array, |v| v)
        }
        DataType::Duration(TimeUnit::Nanosecond) => signed::<DurationNanosecondType>(array, |v| v),
        _ => return None,
    })
}

impl SortKeys {
    /// The sortable form of the key `columns` (all of one length, no nulls).
    pub fn new(columns: &[ArrayRef]) -> Result<SortKeys> {
        if columns.is_empty() {
            return Err(KernelError::invalid("A primary-key merge needs at least one key column"));
        }
        check_lengths(columns.iter().map(|c| c.len()), "Key columns")?;
        for (i, column) in columns.iter().enumerate() {
            if !sortable(column.data_type()) {
                return Err(KernelError::unsupported(format!(
                    "Key column {i} has type {}, which the native kernels do not sort",
                    column.data_type()
                )));
            }
            if column.logical_null_count() > 0 {
                return Err(KernelError::invalid(format!(
                    "Key column {i} holds {} nulls; a primary key may not be null",
                    column.logical_null_count()
                )));
            }
        }
        if columns.len() == 1 {
            if let Some(ints) = ordered_ints(columns[0].as_ref()) {
                return Ok(SortKeys::Ints(ints));
            }
            if let Some(floats) = key_floats(columns[0].as_ref()) {
                return Ok(SortKeys::Ints(
                    floats.into_par_iter().with_min_len(65_536).map(float_word).collect(),
                ));
            }
        }
        // Floats among several columns: their normalized values, which the row format orders
        // by their bits as `float_word` does.
        let columns: Vec<ArrayRef> = columns
            .iter()
            .map(|c| match key_floats(c.as_ref()) {
                Some(floats) => Arc::new(Float64Array::from(floats)) as ArrayRef,
                None => c.clone(),
            })
            .collect();
        let fields = columns.iter().map(|c| SortField::new(c.data_type().clone())).collect();
        let converter = RowConverter::new(fields)
            .map_err(|e| KernelError::unsupported(format!("Key columns cannot be sorted: {e}")))?;
        let rows = converter
            .convert_columns(&columns)
            .map_err(|e| KernelError::unsupported(format!("Key columns cannot be sorted: {e}")))?;
        Ok(SortKeys::Rows(rows))
    }

    pub fn len(&self) -> usize {
        match self {
            SortKeys::Ints(v) => v.len(),
            SortKeys::Rows(r) => r.num_rows(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    pub fn cmp(&self, a: usize, b: usize) -> Ordering {
        match self {
            SortKeys::Ints(v) => v[a].cmp(&v[b]),
            SortKeys::Rows(r) => r.row(a).cmp(&r.row(b)),
        }
    }

    #[inline]
    pub fn eq(&self, a: usize, b: usize) -> bool {
        match self {
            SortKeys::Ints(v) => v[a] == v[b],
            SortKeys::Rows(r) => r.row(a) == r.row(b),
        }
    }

    /// Whether the rows are strictly increasing (sorted, each key once).
    pub fn strictly_increasing(&self) -> bool {
        let n = self.len();
        n < 2 || (1..n).into_par_iter().with_min_len(65_536).all(|i| self.cmp(i - 1, i).is_lt())
    }

    /// Row indices in key order; equal keys keep their input order (a stable sort, which
    /// merges already sorted runs in near-linear time).
    pub fn stable_order(&self) -> Vec<u32> {
        let n = self.len();
        match self {
            SortKeys::Ints(v) => {
                let mut pairs: Vec<(u64, u32)> = (0..n).map(|i| (v[i], i as u32)).collect();
                pairs.par_sort_by_key(|p| p.0);
                pairs.into_iter().map(|p| p.1).collect()
            }
            SortKeys::Rows(r) => {
                let mut order: Vec<u32> = (0..n as u32).collect();
                order.par_sort_by(|a, b| r.row(*a as usize).cmp(&r.row(*b as usize)));
                order
            }
        }
    }

    /// Where each group of equal keys starts in `order` (positions).
    pub fn group_starts(&self, order: &[u32]) -> Vec<i64> {
        let n = order.len();
        if n == 0 {
            return Vec::new();
        }
        let mut starts = vec![0i64];
        let changes: Vec<i64> = (1..n)
            .into_par_iter()
            .with_min_len(65_536)
            .filter(|&p| !self.eq(order[p - 1] as usize, order[p] as usize))
            .map(|p| p as i64)
            .collect();
        starts.extend(changes);
        starts
    }
}

/// The row count above which the indices of a table no longer fit the kernels' `u32`s.
pub fn check_rows(n: usize) -> Result<()> {
    if n > u32::MAX as usize {
        return Err(KernelError::unsupported(format!(
            "{n} rows in one call: the native kernels take at most {} rows at once",
            u32::MAX
        )));
    }
    Ok(())
}
