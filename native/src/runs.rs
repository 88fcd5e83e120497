//! Cutting a write into sorted groups: the rows of each (partition, bucket) sorted by key.
//!
//! This is what `merge/engines.py`'s `unique_run_order` computes for
//! `table/sorted_runs.py`: row indices sorted by group (the bucket plus the partition's code
//! times the bucket count), then by key; `None` when a key repeats within a group (then the
//! write's versions must be merged per group first).

use rayon::prelude::*;

use crate::error::{KernelError, Result};
use crate::keys::{check_rows, SortKeys};

/// Row indices by group then key, the position where each group starts, and its code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Groups {
    pub order: Vec<i64>,
    pub starts: Vec<i64>,
    pub codes: Vec<i64>,
}

/// The rows sorted by `(codes[row], key)`; `None` if two rows of a group share a key.
pub fn sorted_groups(keys: &SortKeys, codes: &[i64]) -> Result<Option<Groups>> {
    let n = keys.len();
    check_rows(n)?;
    if codes.len() != n {
        return Err(KernelError::invalid(format!(
            "{} group codes for {n} rows",
            codes.len()
        )));
    }
    let mut order: Vec<u32> = (0..n as u32).collect();
    match keys {
        SortKeys::Ints(v) => {
            let mut rows: Vec<(i64, u64, u32)> =
                (0..n).map(|i| (codes[i], v[i], i as u32)).collect();
            rows.par_sort_unstable();
            for (p, row) in rows.iter().enumerate() {
                order[p] = row.2;
            }
        }
        SortKeys::Rows(_) => order.par_sort_unstable_by(|a, b| {
            let (a, b) = (*a as usize, *b as usize);
            codes[a].cmp(&codes[b]).then_with(|| keys.cmp(a, b)).then(a.cmp(&b))
        }),
    }
    let repeated = (1..n).into_par_iter().with_min_len(65_536).any(|p| {
        let (a, b) = (order[p - 1] as usize, order[p] as usize);
        codes[a] == codes[b] && keys.eq(a, b)
    });
    if repeated {
        return Ok(None);
    }
    let mut starts = Vec::new();
    let mut group_codes = Vec::new();
    for p in 0..n {
        let code = codes[order[p] as usize];
        if p == 0 || code != codes[order[p - 1] as usize] {
            starts.push(p as i64);
            group_codes.push(code);
        }
    }
    Ok(Some(Groups { order: order.into_iter().map(|i| i as i64).collect(), starts, codes: group_codes }))
}

/// The group code of every row: its bucket plus `buckets` times its partition's code.
pub fn group_codes(buckets_of_rows: &[i32], partitions: Option<&[i64]>, buckets: u32) -> Vec<i64> {
    match partitions {
        None => buckets_of_rows.iter().map(|b| *b as i64).collect(),
        Some(p) => buckets_of_rows
            .iter()
            .zip(p)
            .map(|(b, p)| *b as i64 + buckets as i64 * p)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, Int64Array, StringArray};
    use std::sync::Arc;

    #[test]
    fn groups_then_keys() {
        let keys: ArrayRef = Arc::new(StringArray::from(vec!["b", "a", "c", "a"]));
        let keys = SortKeys::new(&[keys]).unwrap();
        let g = sorted_groups(&keys, &[1, 1, 0, 0]).unwrap().unwrap();
        assert_eq!(g.order, vec![3, 2, 1, 0]);
        assert_eq!(g.starts, vec![0, 2]);
        assert_eq!(g.codes, vec![0, 1]);
    }

    #[test]
    fn a_repeated_key_in_a_group_gives_none() {
        let keys: ArrayRef = Arc::new(Int64Array::from(vec![5, 5, 5]));
        let keys = SortKeys::new(&[keys]).unwrap();
        assert!(sorted_groups(&keys, &[0, 1, 0]).unwrap().is_none());
        assert!(sorted_groups(&keys, &[0, 1, 2]).unwrap().is_some());
    }
}
