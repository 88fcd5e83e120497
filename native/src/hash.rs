//! The bucket hash of primary-key tables, bit for bit the one `merge/bucketing.py` documents:
//!
//! - integers, booleans, dates, times, timestamps, durations: the value as a signed 64-bit
//!   integer, mixed with the SplitMix64 finalizer;
//! - strings and binaries (every width and view): 64-bit FNV-1a of the bytes, then mixed;
//! - decimals: their string form (as Arrow C++ casts a decimal to a string), hashed as a string;
//! - null: the constant `0x9E3779B97F4A7C15`, not mixed;
//! - dictionary-encoded columns: the hash of each value.
//!
//! Several key columns combine left to right as `h = mix(h * 31 + column_hash)`, wrapping.

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, PrimitiveArray};
use arrow_buffer::i256;
use arrow_schema::{DataType, TimeUnit};
use rayon::prelude::*;

use crate::error::{check_lengths, KernelError, Result};

pub const FNV_OFFSET: u64 = 0xCBF2_9CE4_8422_2325;
pub const FNV_PRIME: u64 = 0x0000_0100_0000_01B3;
pub const NULL_HASH: u64 = 0x9E37_79B9_7F4A_7C15;

/// Rows per parallel task: below this, splitting costs more than it gains.
const MIN_ROWS: usize = 16_384;

/// The SplitMix64 finalizer.
#[inline]
pub fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// 64-bit FNV-1a.
#[inline]
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = FNV_OFFSET;
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(FNV_PRIME);
    }
    h
}

/// Whether a column of this type can be hashed (the types `bucketing.py` accepts).
pub fn hashable(t: &DataType) -> bool {
    match t {
        DataType::Dictionary(_, value) => hashable(value),
        _ => integer_like(t) || bytes_like(t) || decimal(t),
    }
}

fn integer_like(t: &DataType) -> bool {
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

fn bytes_like(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
            | DataType::FixedSizeBinary(_)
    )
}

fn decimal(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Decimal32(_, _)
            | DataType::Decimal64(_, _)
            | DataType::Decimal128(_, _)
            | DataType::Decimal256(_, _)
    )
}

fn unsupported(t: &DataType) -> KernelError {
    KernelError::unsupported(format!("Cannot hash key values of type {t}"))
}

/// Hash every row with `f` (rows that are null get [`NULL_HASH`]), in parallel.
fn per_row<F>(array: &dyn Array, f: F) -> Vec<u64>
where
    F: Fn(usize) -> u64 + Sync + Send,
{
    let n = array.len();
    match array.logical_nulls() {
        Some(nulls) if nulls.null_count() > 0 => (0..n)
            .into_par_iter()
            .with_min_len(MIN_ROWS)
            .map(|i| if nulls.is_valid(i) { f(i) } else { NULL_HASH })
            .collect(),
        _ => (0..n).into_par_iter().with_min_len(MIN_ROWS).map(f).collect(),
    }
}

fn ints<T>(array: &dyn Array, as_i64: fn(T::Native) -> i64) -> Vec<u64>
where
    T: ArrowPrimitiveType,
{
    let values: &PrimitiveArray<T> = array.as_primitive::<T>();
    let raw = values.values();
    per_row(array, |i| mix(as_i64(raw[i]) as u64))
}

/// The hash of every value of one column.
pub fn column_hash(array: &dyn Array) -> Result<Vec<u64>> {
    let t = array.data_type();
    Ok(match t {
        DataType::Boolean => {
            let values = array.as_boolean().values();
            per_row(array, |i| mix(values.value(i) as u64))
        }
        DataType::Int8 => ints::<Int8Type>(array, |v| v as i64),
        DataType::Int16 => ints::<Int16Type>(array, |v| v as i64),
        DataType::Int32 => ints::<Int32Type>(array, |v| v as i64),
        DataType::Int64 => ints::<Int64Type>(array, |v| v),
        DataType::UInt8 => ints::<UInt8Type>(array, |v| v as i64),
        DataType::UInt16 => ints::<UInt16Type>(array, |v| v as i64),
        DataType::UInt32 => ints::<UInt32Type>(array, |v| v as i64),
        DataType::UInt64 => ints::<UInt64Type>(array, |v| v as i64),
        DataType::Date32 => ints::<Date32Type>(array, |v| v as i64),
        DataType::Date64 => ints::<Date64Type>(array, |v| v),
        DataType::Time32(TimeUnit::Second) => ints::<Time32SecondType>(array, |v| v as i64),
        DataType::Time32(_) => ints::<Time32MillisecondType>(array, |v| v as i64),
        DataType::Time64(TimeUnit::Microsecond) => ints::<Time64MicrosecondType>(array, |v| v),
        DataType::Time64(_) => ints::<Time64NanosecondType>(array, |v| v),
        DataType::Timestamp(TimeUnit::Second, _) => ints::<TimestampSecondType>(array, |v| v),
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            ints::<TimestampMillisecondType>(array, |v| v)
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            ints::<TimestampMicrosecondType>(array, |v| v)
        }
        DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            ints::<TimestampNanosecondType>(array, |v| v)
        }
        DataType::Duration(TimeUnit::Second) => ints::<DurationSecondType>(array, |v| v),
        DataType::Duration(TimeUnit::Millisecond) => ints::<DurationMillisecondType>(array, |v| v),
        DataType::Duration(TimeUnit::Microsecond) => ints::<DurationMicrosecondType>(array, |v| v),
        DataType::Duration(TimeUnit::Nanosecond) => ints::<DurationNanosecondType>(array, |v| v),
        DataType::Utf8 => {
            let a = array.as_string::<i32>();
            per_row(array, |i| mix(fnv1a(a.value(i).as_bytes())))
        }
        DataType::LargeUtf8 => {
            let a = array.as_string::<i64>();
            per_row(array, |i| mix(fnv1a(a.value(i).as_bytes())))
        }
        DataType::Utf8View => {
            let a = array.as_string_view();
            per_row(array, |i| mix(fnv1a(a.value(i).as_bytes())))
        }
        DataType::Binary => {
            let a = array.as_binary::<i32>();
            per_row(array, |i| mix(fnv1a(a.value(i))))
        }
        DataType::LargeBinary => {
            let a = array.as_binary::<i64>();
            per_row(array, |i| mix(fnv1a(a.value(i))))
        }
        DataType::BinaryView => {
            let a = array.as_binary_view();
            per_row(array, |i| mix(fnv1a(a.value(i))))
        }
        DataType::FixedSizeBinary(_) => {
            let a = array.as_fixed_size_binary();
            per_row(array, |i| mix(fnv1a(a.value(i))))
        }
        DataType::Decimal32(_, scale) => {
            let raw = array.as_primitive::<Decimal32Type>().values();
            let scale = *scale as i32;
            per_row(array, |i| mix(fnv1a(decimal_string(&raw[i].to_string(), scale).as_bytes())))
        }
        DataType::Decimal64(_, scale) => {
            let raw = array.as_primitive::<Decimal64Type>().values();
            let scale = *scale as i32;
            per_row(array, |i| mix(fnv1a(decimal_string(&raw[i].to_string(), scale).as_bytes())))
        }
        DataType::Decimal128(_, scale) => {
            let raw = array.as_primitive::<Decimal128Type>().values();
            let scale = *scale as i32;
            per_row(array, |i| mix(fnv1a(decimal_string(&raw[i].to_string(), scale).as_bytes())))
        }
        DataType::Decimal256(_, scale) => {
            let raw = array.as_primitive::<Decimal256Type>().values();
            let scale = *scale as i32;
            per_row(array, |i| {
                let v: i256 = raw[i];
                mix(fnv1a(decimal_string(&v.to_string(), scale).as_bytes()))
            })
        }
        DataType::Dictionary(key_type, value_type) => {
            if !hashable(value_type) {
                return Err(unsupported(value_type));
            }
            dictionary_hash(array, key_type)?
        }
        other => return Err(unsupported(other)),
    })
}

/// Hash each distinct value once and gather; a null code hashes as null.
fn dictionary_hash(array: &dyn Array, key_type: &DataType) -> Result<Vec<u64>> {
    macro_rules! gather {
        ($k:ty) => {{
            let dict = array.as_dictionary::<$k>();
            let per_value = column_hash(dict.values().as_ref())?;
            let keys = dict.keys();
            let codes = keys.values();
            let gathered = |i: usize| {
                let code = codes[i] as usize;
                per_value.get(code).copied().unwrap_or(NULL_HASH)
            };
            match keys.nulls() {
                Some(nulls) if nulls.null_count() > 0 => (0..array.len())
                    .into_par_iter()
                    .with_min_len(MIN_ROWS)
                    .map(|i| if nulls.is_valid(i) { gathered(i) } else { NULL_HASH })
                    .collect(),
                _ => (0..array.len()).into_par_iter().with_min_len(MIN_ROWS).map(gathered).collect(),
            }
        }};
    }
    Ok(match key_type {
        DataType::Int8 => gather!(Int8Type),
        DataType::Int16 => gather!(Int16Type),
        DataType::Int32 => gather!(Int32Type),
        DataType::Int64 => gather!(Int64Type),
        DataType::UInt8 => gather!(UInt8Type),
        DataType::UInt16 => gather!(UInt16Type),
        DataType::UInt32 => gather!(UInt32Type),
        DataType::UInt64 => gather!(UInt64Type),
        other => return Err(unsupported(other)),
    })
}

/// A decimal's unscaled integer `digits` ("-123") written with `scale` as Arrow C++ writes it
/// (`Decimal128::ToString`): plain notation, or scientific when the scale is negative or the
/// adjusted exponent is below -6.
pub fn decimal_string(digits: &str, scale: i32) -> String {
    if scale == 0 {
        return digits.to_string();
    }
    let negative = digits.starts_with('-');
    let sign = negative as usize;
    let len = digits.len() as i32;
    let num_digits = len - sign as i32;
    let adjusted = num_digits - 1 - scale;
    let mut s = String::with_capacity(digits.len() + 8);
    if scale < 0 || adjusted < -6 {
        s.push_str(&digits[..sign + 1]);
        if num_digits > 1 {
            s.push('.');
            s.push_str(&digits[sign + 1..]);
        }
        s.push('E');
        if adjusted >= 0 {
            s.push('+');
        }
        s.push_str(&adjusted.to_string());
        return s;
    }
    if num_digits > scale {
        let n = (len - scale) as usize;
        s.push_str(&digits[..n]);
        s.push('.');
        s.push_str(&digits[n..]);
        return s;
    }
    // 0.00ddd: as many zeros after the point as the scale has more places than digits.
    s.push_str(&digits[..sign]);
    s.push_str("0.");
    for _ in 0..(scale - num_digits) {
        s.push('0');
    }
    s.push_str(&digits[sign..]);
    s
}

/// The combined hash of the key columns of every row.
pub fn key_hash(columns: &[ArrayRef]) -> Result<Vec<u64>> {
    if columns.is_empty() {
        return Err(KernelError::invalid("A bucket hash needs at least one key column"));
    }
    check_lengths(columns.iter().map(|c| c.len()), "Bucket hash")?;
    let mut h = column_hash(columns[0].as_ref())?;
    for column in &columns[1..] {
        let next = column_hash(column.as_ref())?;
        h.par_iter_mut()
            .with_min_len(MIN_ROWS)
            .zip(next.par_iter())
            .for_each(|(h, n)| *h = mix(h.wrapping_mul(31).wrapping_add(*n)));
    }
    Ok(h)
}

/// The bucket of every row: `key_hash % buckets`.
pub fn bucket_of(columns: &[ArrayRef], buckets: u32) -> Result<Vec<i32>> {
    if buckets == 0 {
        return Err(KernelError::invalid("A table needs at least one bucket"));
    }
    let h = key_hash(columns)?;
    Ok(h.par_iter().with_min_len(MIN_ROWS).map(|h| (h % buckets as u64) as i32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, StringArray};
    use std::sync::Arc;

    #[test]
    fn fnv_of_empty_is_the_offset() {
        assert_eq!(fnv1a(b""), FNV_OFFSET);
        // Known FNV-1a 64 vector: "a".
        assert_eq!(fnv1a(b"a"), 0xAF63_DC4C_8601_EC8C);
    }

    #[test]
    fn decimal_strings_match_arrow_cpp() {
        assert_eq!(decimal_string("150", 2), "1.50");
        assert_eq!(decimal_string("-5", 2), "-0.05");
        assert_eq!(decimal_string("0", 2), "0.00");
        assert_eq!(decimal_string("12300", -2), "1.2300E+6");
        assert_eq!(decimal_string("123", -2), "1.23E+4");
        assert_eq!(decimal_string("0", -2), "0E+2");
        assert_eq!(decimal_string("123", 9), "1.23E-7");
        assert_eq!(decimal_string("-1", 9), "-1E-9");
        assert_eq!(decimal_string("1230", 9), "0.000001230");
        assert_eq!(decimal_string("-7", 0), "-7");
    }

    #[test]
    fn composite_keys_mix_left_to_right() {
        let a: ArrayRef = Arc::new(Int64Array::from(vec![1, 2]));
        let b: ArrayRef = Arc::new(StringArray::from(vec!["x", "y"]));
        let h = key_hash(&[a.clone(), b.clone()]).unwrap();
        let ha = column_hash(a.as_ref()).unwrap();
        let hb = column_hash(b.as_ref()).unwrap();
        assert_eq!(h[1], mix(ha[1].wrapping_mul(31).wrapping_add(hb[1])));
    }

    #[test]
    fn nulls_hash_to_the_constant() {
        let a: ArrayRef = Arc::new(StringArray::from(vec![Some("x"), None]));
        assert_eq!(column_hash(a.as_ref()).unwrap()[1], NULL_HASH);
    }

    #[test]
    fn mismatched_lengths_are_refused() {
        let a: ArrayRef = Arc::new(Int64Array::from(vec![1, 2]));
        let b: ArrayRef = Arc::new(Int64Array::from(vec![1]));
        assert!(key_hash(&[a, b]).is_err());
    }
}
